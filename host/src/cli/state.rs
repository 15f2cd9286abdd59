//! `wharf state get|list|delete`: handlers' key-value state (`wasi:keyvalue`), on the store
//! directly (no running host needed).

use std::process::ExitCode;

use anyhow::bail;
use clap::Subcommand;

use super::Cli;
use super::format::{print_json, table};
use super::open_store;

/// `wharf state …`.
#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// The value of one key (as text; `--json` for the bytes as a string and the revision).
    Get {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
    /// The keys of a bucket with their values, in key order.
    List {
        /// The bucket.
        bucket: String,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Skip this many first.
        #[arg(long, default_value_t = 0)]
        offset: u64,
    },
    /// Delete one key (now, outside any message's outcome).
    Delete {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
}

/// One key as the CLI shows it.
#[derive(Debug, serde::Serialize)]
struct Entry {
    bucket: String,
    key: String,
    value: String,
    revision: i64,
}

/// `wharf state …`.
pub async fn run(cli: &Cli, cmd: &StateCommand) -> anyhow::Result<ExitCode> {
    let (_, store) = open_store(cli).await?;
    match cmd {
        StateCommand::Get { bucket, key } => {
            let Some((value, revision)) = store.state_read(bucket, key).await? else {
                bail!(
                    "no key `{key}` in bucket `{bucket}` (`wharf state list {bucket}` lists its keys)"
                );
            };
            let value = String::from_utf8_lossy(&value).into_owned();
            if cli.json {
                let (bucket, key) = (bucket.clone(), key.clone());
                print_json(&Entry {
                    bucket,
                    key,
                    value,
                    revision,
                })?;
            } else {
                println!("{value}");
            }
        }
        StateCommand::List {
            bucket,
            limit,
            offset,
        } => {
            let entries: Vec<Entry> = store
                .state_entries(bucket, *offset, *limit)
                .await?
                .into_iter()
                .map(|(key, (value, revision))| Entry {
                    bucket: bucket.clone(),
                    key,
                    value: String::from_utf8_lossy(&value).into_owned(),
                    revision,
                })
                .collect();
            if cli.json {
                print_json(&entries)?;
            } else if entries.is_empty() {
                println!("no keys in bucket `{bucket}`");
            } else {
                let mut t = table(&["key", "value"]);
                for e in &entries {
                    t.add_row(vec![e.key.clone(), super::format::clip(&e.value, 80)]);
                }
                println!("{t}");
            }
        }
        StateCommand::Delete { bucket, key } => {
            if !store.state_delete(bucket, key).await? {
                bail!("no key `{key}` in bucket `{bucket}`: nothing deleted");
            }
            println!("deleted {bucket}/{key}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
