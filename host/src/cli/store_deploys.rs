//! `wharf handlers deploy|rollback|history|list` with `[host] handlers_source = "store"`: the
//! handler versions in the queue's SQL store that every host sharing it serves. A deploy
//! checks the component here, against the same configuration the hosts use (name, memory,
//! the handler world, grants), before anything is stored.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use super::format::{print_json, table, time};
use super::{Cli, open_store};
use crate::config::{Config, HandlersSource};
use crate::queue::{ServedVersion, VersionChange};
use crate::runtime::HandlerRegistry;

/// The configuration must have hosts follow the store, or a deploy there serves nowhere.
fn require_store_mode(config: &Config) -> anyhow::Result<()> {
    if config.host.handlers_source != HandlersSource::Store {
        bail!(
            "set handlers_source = \"store\" in [host] of {} to deploy through the store (hosts with this configuration load handlers from the directory {}: copy the file there as NAME.wasm instead)",
            config.source.display(),
            config.host.handlers_dir.display()
        );
    }
    Ok(())
}

/// `wharf handlers deploy FILE [--name NAME]`.
pub async fn deploy(cli: &Cli, file: &Path, name: Option<&str>) -> anyhow::Result<ExitCode> {
    let (config, store) = open_store(cli).await?;
    require_store_mode(&config)?;
    let name = match name {
        Some(name) => name.to_string(),
        None => HandlerRegistry::name_of(file).with_context(|| {
            format!(
                "{}: name the handler with --name NAME (the file name does not end in .wasm)",
                file.display()
            )
        })?,
    };
    let bytes = std::fs::read(file).with_context(|| format!("{}: cannot read", file.display()))?;
    let checked = {
        let (config, name, file, bytes) = (
            Arc::new(config),
            name.clone(),
            file.to_path_buf(),
            bytes.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let registry = HandlerRegistry::new(config).map_err(|e| anyhow::anyhow!("{e:#}"))?;
            registry
                .check(&name, &file, &bytes)
                .map_err(anyhow::Error::new)
        })
        .await?
    };
    if let Err(e) = checked {
        bail!("{e:#}; nothing was stored, every host keeps its version");
    }
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let change = store.handler_deploy(&name, &bytes, &sha256).await?;
    report(cli, &change, "deployed")
}

/// `wharf handlers rollback NAME [--to VERSION]`.
pub async fn rollback(cli: &Cli, name: &str, to: Option<i64>) -> anyhow::Result<ExitCode> {
    let (config, store) = open_store(cli).await?;
    require_store_mode(&config)?;
    let change = store.handler_rollback(name, to).await?;
    report(cli, &change, "rolled back")
}

fn report(cli: &Cli, change: &VersionChange, verb: &str) -> anyhow::Result<ExitCode> {
    if cli.json {
        print_json(change)?;
    } else if !change.changed {
        println!(
            "{}: version {} is already current; nothing changed",
            change.name, change.to
        );
    } else {
        let from = change
            .from
            .map_or("none".to_string(), |v| format!("version {v}"));
        println!(
            "{verb} {} to version {} (was {from}); every host following the store serves it within seconds: `wharf handlers history {}` shows which host serves which version",
            change.name, change.to, change.name
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `wharf handlers history NAME`.
pub async fn history(cli: &Cli, name: &str) -> anyhow::Result<ExitCode> {
    let (_, store) = open_store(cli).await?;
    let versions = store.handler_versions(name).await?;
    if versions.is_empty() {
        bail!(
            "handler `{name}` has no version in the store: deploy one with `wharf handlers deploy FILE --name {name}`"
        );
    }
    let served = store.handler_served(Some(name)).await?;
    if cli.json {
        print_json(&serde_json::json!({ "versions": versions, "hosts": served }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table(&["version", "sha256", "size", "deployed at", "current"]);
    for v in &versions {
        t.add_row(vec![
            v.version.to_string(),
            v.sha256[..16].to_string(),
            bytesize::ByteSize::b(v.size as u64).to_string(),
            time(v.deployed_at_ms),
            if v.current { "yes" } else { "" }.to_string(),
        ]);
    }
    println!("{t}");
    println!("{}", served_table(&served));
    Ok(ExitCode::SUCCESS)
}

/// `wharf handlers list` in store mode: each handler's current version and what each host
/// serves now.
pub async fn list(cli: &Cli) -> anyhow::Result<ExitCode> {
    let (_, store) = open_store(cli).await?;
    let current = store.handler_current().await?;
    let mut now: BTreeMap<(String, String), ServedVersion> = BTreeMap::new();
    for s in store.handler_served(None).await? {
        if s.result == "serving" {
            now.insert((s.name.clone(), s.host.clone()), s);
        }
    }
    if cli.json {
        let hosts: Vec<&ServedVersion> = now.values().collect();
        print_json(&serde_json::json!({ "current": current, "hosts": hosts }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table(&["name", "current version", "sha256"]);
    for c in &current {
        t.add_row(vec![
            c.name.clone(),
            c.version.to_string(),
            c.sha256[..16].to_string(),
        ]);
    }
    println!("{t}");
    let serving: Vec<ServedVersion> = now.into_values().collect();
    println!("{}", served_table(&serving));
    Ok(ExitCode::SUCCESS)
}

fn served_table(served: &[ServedVersion]) -> comfy_table::Table {
    let mut t = table(&["host", "handler", "version", "since", "result"]);
    for s in served {
        t.add_row(vec![
            s.host.clone(),
            s.name.clone(),
            s.version.to_string(),
            time(s.since_ms),
            match &s.error {
                Some(e) => format!("rejected: {e}"),
                None => s.result.clone(),
            },
        ]);
    }
    t
}
