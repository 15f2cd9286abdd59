//! The `wharf` command.

wharf_host::use_jemalloc!();

fn main() -> std::process::ExitCode {
    wharf_host::cli::main()
}
