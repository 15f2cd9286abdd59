//! The `wharf` command, and the process's memory allocator.
//!
//! jemalloc instead of the system allocator: the host allocates and frees many small objects
//! per message (envelopes, settlements, a fresh instance's state), and with the system
//! allocator about a sixth of a Redis drain's host CPU went to `malloc` and `free`. Freed pages
//! go back to the system within a second (a background thread purges them), so an idle host
//! after compiling its handlers holds less than with the system allocator.

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read when it starts: purge freed pages from one background thread,
/// dirty pages after a second, and do not keep them as lazily-freed ("muzzy") pages.
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8] =
    b"background_thread:true,max_background_threads:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() -> std::process::ExitCode {
    wharf_host::cli::main()
}
