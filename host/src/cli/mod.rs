//! The `wharf` command line: `run`, `enqueue`, `messages list|show`, `handlers list`,
//! `config check`. Human-readable tables by default, `--json` for scripts.

mod bulk;
mod client;
mod format;
mod handlers;
mod message_views;
mod messages;
mod replay;
mod run;
mod scaffold;
mod schedules;
mod sessions;
mod state;
mod status;
mod store_deploys;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Config;

/// Run message handlers compiled to WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "wharf", version, about)]
pub struct Cli {
    /// The configuration file.
    #[arg(
        short,
        long,
        global = true,
        env = "WHARF_CONFIG",
        default_value = "wharf.toml"
    )]
    pub config: PathBuf,
    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Log line format: `text` or `json` (one JSON object per event).
    #[arg(
        long,
        global = true,
        env = "WHARF_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
    /// Same as `--log-format json`.
    #[arg(long, global = true, hide = true)]
    pub log_json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per event, with every field.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the host: deploy handlers, process queues, serve the admin API.
    Run,
    /// Enqueue one message.
    Enqueue(messages::EnqueueArgs),
    /// Inspect messages.
    #[command(subcommand)]
    Messages(messages::MessagesCommand),
    /// Ordered sessions: which are blocked, and by what.
    #[command(subcommand)]
    Sessions(sessions::SessionsCommand),
    /// Handlers: list the deployed ones (asks the running host), or write a new project
    /// (`new`, needs no host).
    #[command(subcommand)]
    Handlers(handlers::HandlersCommand),
    /// One screen from the running host: readiness, queues with counts and rates, handlers.
    Status,
    /// Run stored messages against a candidate component, without side effects.
    Replay(replay::ReplayArgs),
    /// Handlers' key-value state (`wasi:keyvalue` buckets): get, list or delete keys.
    #[command(subcommand)]
    State(state::StateCommand),
    /// Periodic messages (`[schedules.NAME]`): next and last tick, and which host enqueued it.
    #[command(subcommand)]
    Schedules(schedules::SchedulesCommand),
    /// The hosts sharing the queue storage, with their ids, alive or not.
    Hosts,
    /// Work with the configuration file.
    #[command(subcommand)]
    Config(ConfigCommand),
}

/// `wharf config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a configuration file without starting anything.
    Check {
        /// The file (default: the global `--config`).
        file: Option<PathBuf>,
    },
}

/// Entry point of the `wharf` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(cli: &Cli) {
    // The AMQP client logs every failed reconnection attempt itself; Wharf reports each
    // outage once, so only its errors are kept.
    let default = if matches!(cli.command, Command::Run) {
        "info,lapin=error"
    } else {
        "warn,lapin=error"
    };
    // `WHARF_LOG` first, then `RUST_LOG`, e.g. `WHARF_LOG=info,wharf_host::dispatch=debug`.
    let filter = tracing_subscriber::EnvFilter::try_from_env("WHARF_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.log_json || cli.log_format == LogFormat::Json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Load the configuration or explain why not.
pub fn load_config(path: &std::path::Path) -> anyhow::Result<Config> {
    crate::host::load_config(path).map_err(anyhow::Error::new)
}

/// The configuration and its queue store, for a command that reads or changes messages.
pub(super) async fn open_store(
    cli: &Cli,
) -> anyhow::Result<(crate::Config, std::sync::Arc<dyn crate::queue::QueueStore>)> {
    let config = load_config(&cli.config)?;
    let store = crate::queue::open(&config.storage.url, config.storage.schema.as_deref(), 2)
        .await
        .with_context(|| {
            format!(
                "opening the queue storage at {}",
                crate::config::redacted_url(&config.storage.url)
            )
        })?;
    Ok((config, store))
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Config(ConfigCommand::Check { file }) => {
            let path = file.as_ref().unwrap_or(&cli.config);
            match crate::host::load_config(path) {
                Ok(config) => {
                    // What `wharf run` refuses (the token may come from the service's
                    // environment, so only running the host requires it).
                    if let Some(reason) = config.admin.refusal(config.host.admin_listen) {
                        eprintln!("error: {}: admin.token: {reason}", path.display());
                        return Ok(ExitCode::from(2));
                    }
                    for warning in run::deployment_warnings(&config) {
                        println!("warning: {warning}");
                    }
                    println!("{}: ok ({} queues)", path.display(), config.queues.len());
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    Ok(ExitCode::from(2))
                }
            }
        }
        Command::Run => {
            let config = match crate::host::load_config(&cli.config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(ExitCode::from(2));
                }
            };
            run::run(config).await.context("wharf run")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Enqueue(args) => messages::enqueue(&cli, args).await,
        Command::Messages(cmd) => messages::run(&cli, cmd).await,
        Command::Sessions(cmd) => sessions::run(&cli, cmd).await,
        Command::Handlers(cmd) => handlers::run(&cli, cmd).await,
        Command::Status => status::run(&cli).await,
        Command::Replay(args) => replay::run(&cli, args).await,
        Command::State(cmd) => state::run(&cli, cmd).await,
        Command::Schedules(cmd) => schedules::run(&cli, cmd).await,
        Command::Hosts => schedules::hosts(&cli).await,
    }
}
