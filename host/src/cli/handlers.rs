//! `wharf handlers list`: asks the running host's admin API which versions are serving;
//! `wharf handlers new`: writes a handler project (see [`super::scaffold`]).

use std::process::ExitCode;

use clap::Subcommand;

use super::client::AdminClient;
use super::format::{print_json, table};
use super::scaffold::{Lang, build_command, write_project};
use super::{Cli, load_config};
use crate::admin::HandlerInfo;

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
    let config = load_config(&cli.config)?;
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
