//! WAL checkpoints for the SQLite store, off the writer's path.
//!
//! In WAL mode every commit appends the pages it changed to the log, and a checkpoint copies
//! them back into the database file and syncs both files. By default SQLite runs that
//! checkpoint inside the commit that pushes the log past 1,000 pages — on the one writer
//! connection, so every settlement behind it waits for two `fsync`s. Settlements that record
//! inbox entries change one page per entry (the keys are hashes, spread over the whole
//! table), so that happened every few hundred messages.
//!
//! Here a connection of its own checkpoints the log every [`INTERVAL`] (`PASSIVE`: it copies
//! what no reader still needs and never blocks the writer). The writer's own checkpoint stays
//! as a backstop at [`WRITER_BACKSTOP_PAGES`], for when this one falls behind. Durability is
//! unchanged: a commit is in the log before it returns either way.

use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};
use tokio::task::JoinHandle;

/// How often the log is checkpointed.
const INTERVAL: Duration = Duration::from_millis(100);

/// Log pages after which the writer checkpoints in its own commit (4 KiB pages: ~40 MiB).
pub(super) const WRITER_BACKSTOP_PAGES: u32 = 10_000;

/// The checkpointing task; stops when the store's last handle is dropped.
#[derive(Debug)]
pub(in crate::queue) struct Checkpointer(JoinHandle<()>);

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Checkpointer {
    /// Start checkpointing the database `options` opens, on a connection of its own.
    pub(super) async fn start(options: &SqliteConnectOptions) -> Result<Self, sqlx::Error> {
        let mut conn = options.clone().connect().await?;
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // A failed checkpoint leaves the log as it was; the writer's backstop or the
                // next tick copies it.
                if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                    .execute(&mut conn)
                    .await
                {
                    tracing::debug!(%error, "SQLite WAL checkpoint failed; retrying next tick");
                    if conn.ping().await.is_err() {
                        tracing::warn!(%error, "the SQLite checkpointing connection is lost; the writer checkpoints the log itself from now on (every {WRITER_BACKSTOP_PAGES} pages)");
                        return;
                    }
                }
            }
        });
        Ok(Checkpointer(task))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::queue::{NewMessage, QueueStore, SqlStore};

    #[tokio::test]
    async fn the_log_reaches_the_database_file_without_the_writer_checkpointing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queue.db");
        let store = SqlStore::open_sqlite(&format!("sqlite://{}", path.display()), 2)
            .await
            .unwrap();
        let backstop: i64 = store
            .pool
            .query("PRAGMA wal_autocheckpoint")
            .fetch_one()
            .await
            .unwrap()
            .get(0)
            .unwrap();
        assert_eq!(backstop, i64::from(WRITER_BACKSTOP_PAGES));

        let before = std::fs::metadata(&path).unwrap().len();
        let messages: Vec<NewMessage> = (0..5_000)
            .map(|n| NewMessage {
                id: Some(format!("order-{n}")),
                payload: format!("{{\"order\":{n},\"note\":\"{}\"}}", "x".repeat(200)),
                ..NewMessage::default()
            })
            .collect();
        store.enqueue_many("orders", messages, false).await.unwrap();
        // A few MiB of pages, far below the writer's backstop: only the checkpointer copies
        // them into the database file.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(&path).unwrap().len() < before + 1_000_000 {
            assert!(
                Instant::now() < deadline,
                "the log was not checkpointed into {}",
                path.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
