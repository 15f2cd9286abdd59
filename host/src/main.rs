//! The `wharf` command.

fn main() -> std::process::ExitCode {
    wharf_host::cli::main()
}
