//! `wharf handlers list`: asks the running host's admin API which versions are serving (with
//! `handlers_source = "store"`: the store's current versions and which host serves which);
//! `deploy`, `rollback`, `history`: the versions in the shared store ([`super::store_deploys`]);
//! `wharf handlers new`: writes a handler project (see [`super::scaffold`]).

use std::process::ExitCode;

use clap::Subcommand;

use super::client::AdminClient;
use super::format::{print_json, table};
use super::scaffold::{Lang, build_command, write_project};
use super::{Cli, load_config};
use crate::admin::HandlerInfo;
use crate::config::HandlersSource;

/// `wharf handlers …`.
#[derive(Debug, Subcommand)]
pub enum HandlersCommand {
    /// List the deployed handlers: name, file, content hash, loaded at (asks the running
    /// host).
    List,
    /// Write a new handler project that builds with one command (needs no running host).
    New {
        /// Handler name (also the project folder and the component's file name).
        name: String,
        /// The language to write it in.
        #[arg(long, value_enum, default_value = "rust")]
        lang: Lang,
        /// Where to write it (default: `./NAME`).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Store a component as the next version of its handler in the shared store and make it
    /// current: every host with `handlers_source = "store"` serves it within seconds. The
    /// component is checked first, here, against this configuration (name, memory, world,
    /// grants); one that fails is not stored.
    Deploy {
        /// The component (`.wasm`).
        file: std::path::PathBuf,
        /// The handler name (default: the file name without `.wasm`).
        #[arg(long)]
        name: Option<String>,
    },
    /// Make an earlier version current again (default: the one before the current).
    Rollback {
        /// The handler.
        name: String,
        /// The version to make current.
        #[arg(long)]
        to: Option<i64>,
    },
    /// A handler's versions in the store, and which host served which version since when.
    History {
        /// The handler.
        name: String,
    },
}

/// Run a handlers subcommand.
pub async fn run(cli: &Cli, cmd: &HandlersCommand) -> anyhow::Result<ExitCode> {
    if let HandlersCommand::New { name, lang, dir } = cmd {
        let dir = dir
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from(name));
        let project = write_project(name, *lang, &dir)?;
        let (build, output) = build_command(*lang, name);
        println!("wrote {}", project.display());
        println!("build: cd {} && {build}", project.display());
        println!("then deploy {output} as handlers/{name}.wasm");
        return Ok(ExitCode::SUCCESS);
    }
    match cmd {
        HandlersCommand::Deploy { file, name } => {
            return super::store_deploys::deploy(cli, file, name.as_deref()).await;
        }
        HandlersCommand::Rollback { name, to } => {
            return super::store_deploys::rollback(cli, name, *to).await;
        }
        HandlersCommand::History { name } => return super::store_deploys::history(cli, name).await,
        HandlersCommand::List | HandlersCommand::New { .. } => {}
    }
    let config = load_config(&cli.config)?;
    if config.host.handlers_source == HandlersSource::Store {
        return super::store_deploys::list(cli).await;
    }
    let handlers: Vec<HandlerInfo> = AdminClient::new(&config).get("/handlers").await?;
    if cli.json {
        print_json(&handlers)?;
    } else {
        let mut t = table(&["name", "file", "sha256", "size", "loaded at", "memory"]);
        for h in &handlers {
            t.add_row(vec![
                h.name.clone(),
                h.file.clone(),
                h.sha256[..16].to_string(),
                bytesize::ByteSize::b(h.size).to_string(),
                h.loaded_at.clone(),
                h.memory_limit.clone(),
            ]);
        }
        println!("{t}");
    }
    Ok(ExitCode::SUCCESS)
}
