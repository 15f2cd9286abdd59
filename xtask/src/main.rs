//! Project automation: `cargo xtask demo | test | bench | fuzz | chaos | guests | lint | image`.
//!
//! Every command installs what it needs (the `wasm32-wasip2` target, cargo-nextest) so it
//! works the same on a fresh machine and in CI.

mod bench;
mod browser;
mod chaos;
mod demo;
mod image;
mod polyglot;
mod services;
mod tools;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Wharf's project tasks.
#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build everything and show Wharf processing messages and hot-deploying a handler.
    Demo {
        /// Leave the host running after the demo (stop it with Ctrl-C).
        #[arg(long)]
        keep_running: bool,
    },
    /// Install what the tests need, build the guests, check formatting, run every test.
    Test {
        /// Extra arguments for `cargo nextest run` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the criterion benchmarks (release build).
    Bench {
        /// Extra arguments for `cargo bench` (e.g. `--bench invoke`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the property tests (parsers and hostile enqueues) with a long budget.
    Fuzz {
        /// Generated cases per property, relative to the 256 every test run uses.
        #[arg(long, default_value_t = 25_600)]
        cases: u32,
    },
    /// Run the fault matrix's long form and write its table into docs/guarantees.md.
    Chaos {
        /// Messages per case.
        #[arg(long, default_value_t = 5_000)]
        messages: u64,
        /// Seconds each network cut lasts.
        #[arg(long, default_value_t = 10)]
        cut_secs: u64,
        /// Messages of the cases with repeated SIGKILLs and key-value state (the `kills` rows
        /// and the state crash test, `state_crash`).
        #[arg(long, default_value_t = 100_000)]
        crash_messages: u64,
        /// Only the cases whose names contain one of these (e.g. `kafka_network_cut`); their
        /// rows replace the same rows of the table in docs/guarantees.md, which must have been
        /// made with the same `--messages` and `--cut-secs`.
        cases: Vec<String>,
    },
    /// Build the sample and fixture handlers for wasm32-wasip2.
    Guests,
    /// cargo fmt --check and cargo clippy with warnings as errors.
    Lint,
    /// Build the container image `localhost/wharf:latest` with buildah (release build; no
    /// registry), then run it once where the machine allows containers.
    Image,
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Demo { keep_running } => demo::run(keep_running),
        Task::Test { args } => test(&args),
        Task::Bench { args } => bench::run(&args),
        Task::Fuzz { cases } => {
            tools::ensure_nextest()?;
            services::ensure_postgres()?;
            let mut cmd = tools::nextest_one("properties");
            cmd.env("PROPTEST_CASES", cases.to_string());
            tools::run(cmd)
        }
        Task::Chaos {
            messages,
            cut_secs,
            crash_messages,
            cases,
        } => chaos::run(messages, cut_secs, crash_messages, &cases),
        Task::Guests => tools::build_guests(),
        Task::Lint => lint(),
        Task::Image => image::run(),
    }
}

fn test(args: &[String]) -> Result<()> {
    tools::ensure_nextest()?;
    // Type-checked while the services start and the guests build (mostly on one core).
    let one_provider = check_one_provider_builds()?;
    services::ensure_postgres()?;
    services::ensure_redis()?;
    services::ensure_rabbitmq()?;
    services::ensure_kafka()?;
    tools::build_guests()?;
    browser::ensure_browser()?;
    tools::ensure_kubernetes_validate()?;
    check_format()?;
    tools::wait(one_provider)?;
    let mut cmd = tools::cargo(&["nextest", "run", "--workspace", "--no-fail-fast"]);
    cmd.args(args);
    tools::run(cmd)
}

/// Start checking that the host builds with one provider alone (the others' clients left
/// out): the default build has every provider, so a `cfg` that only holds with all of them
/// shows here. [`tools::wait`] for the result.
fn check_one_provider_builds() -> Result<tools::Running> {
    tools::start(tools::cargo(&[
        "check",
        "--package",
        "wharf-host",
        "--no-default-features",
        "--features",
        "redis",
    ]))
}

fn check_format() -> Result<()> {
    tools::run(tools::cargo(&["fmt", "--all", "--", "--check"]))?;
    let mut guests = tools::cargo(&["fmt", "--all", "--", "--check"]);
    guests.current_dir(tools::root().join("sample-handlers"));
    tools::run(guests)
}

fn lint() -> Result<()> {
    check_format()?;
    tools::run(tools::cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    let mut guests = tools::cargo(&[
        "clippy",
        "--target",
        "wasm32-wasip2",
        "--",
        "-D",
        "warnings",
    ]);
    guests.current_dir(tools::root().join("sample-handlers"));
    tools::run(guests)
}
