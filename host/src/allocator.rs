//! The memory allocator of the `wharf` binary (and of the benchmarks, which measure what it
//! does): jemalloc instead of the system allocator. The host allocates and frees many small
//! objects per message (envelopes, settlements, a fresh instance's state); with the system
//! allocator about a sixth of a Redis drain's host CPU went to `malloc` and `free`. Freed
//! pages go back to the system within a second (a background thread purges them), so an idle
//! host after compiling its handlers holds less than with the system allocator.
//!
//! A library does not choose its users' allocator: a program opts in with
//! [`use_jemalloc!`](crate::use_jemalloc) at its crate root.

#[doc(hidden)]
pub use tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read when it starts: purge freed pages from one background thread,
/// dirty pages after a second, and do not keep them as lazily-freed ("muzzy") pages.
#[doc(hidden)]
pub const SETTINGS: &[u8] =
    b"background_thread:true,max_background_threads:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// Make jemalloc, with [`SETTINGS`], the global allocator of the calling program. Use once,
/// at the crate root of a binary.
#[macro_export]
macro_rules! use_jemalloc {
    () => {
        #[global_allocator]
        static WHARF_ALLOCATOR: $crate::allocator::Jemalloc = $crate::allocator::Jemalloc;

        /// Read by jemalloc when it starts.
        #[allow(non_upper_case_globals)]
        #[unsafe(export_name = "_rjem_malloc_conf")]
        pub static malloc_conf: &[u8] = $crate::allocator::SETTINGS;
    };
}
