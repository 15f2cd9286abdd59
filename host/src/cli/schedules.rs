//! `wharf schedules list` and `wharf hosts`: periodic messages (next and last tick, which
//! host enqueued the last) and the hosts sharing the store, read from the store directly (no
//! running host needed).

use std::process::ExitCode;

use clap::Subcommand;

use super::Cli;
use super::format::{print_json, table, time};
use super::open_store;
use crate::clock::now_ms;

/// `wharf schedules …`.
#[derive(Debug, Subcommand)]
pub enum SchedulesCommand {
    /// Every schedule of the configuration: its next tick, its last, and which host
    /// enqueued the last.
    List,
}

/// `wharf schedules …`.
pub async fn run(cli: &Cli, cmd: &SchedulesCommand) -> anyhow::Result<ExitCode> {
    let SchedulesCommand::List = cmd;
    let (config, store) = open_store(cli).await?;
    let rows = store.schedules().await?;
    let listed = crate::schedule::views(&config.schedules, &rows, now_ms());
    if cli.json {
        print_json(&listed)?;
    } else if listed.is_empty() {
        println!(
            "no schedules in {} (add [schedules.NAME])",
            cli.config.display()
        );
    } else {
        let mut t = table(&[
            "schedule",
            "cron",
            "queue",
            "next tick",
            "last tick",
            "by host",
            "enqueued",
            "missed",
        ]);
        for l in &listed {
            t.add_row(vec![
                l.name.clone(),
                format!("{} ({})", l.cron, l.timezone),
                l.queue.clone(),
                l.next_tick_ms.map_or("never".into(), time),
                l.last_tick_ms.map_or("-".into(), time),
                l.last_host.clone().unwrap_or_else(|| "-".into()),
                l.enqueued.to_string(),
                l.missed.to_string(),
            ]);
        }
        println!("{t}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `wharf hosts`: the hosts that used this store, alive or not.
pub async fn hosts(cli: &Cli) -> anyhow::Result<ExitCode> {
    let (_, store) = open_store(cli).await?;
    let hosts = crate::schedule::hosts::views(store.hosts().await?, now_ms());
    if cli.json {
        print_json(&hosts)?;
    } else if hosts.is_empty() {
        println!("no host has run on this store yet");
    } else {
        let mut t = table(&["host", "state", "started", "last seen"]);
        for h in &hosts {
            let state = match (h.alive, h.stopped_at_ms) {
                (true, _) => "alive".to_string(),
                (false, Some(at)) => format!("stopped {}", time(at)),
                (false, None) => "gone (no heartbeat)".to_string(),
            };
            t.add_row(vec![
                h.id.clone(),
                state,
                time(h.started_at_ms),
                time(h.seen_at_ms),
            ]);
        }
        println!("{t}");
    }
    Ok(ExitCode::SUCCESS)
}
