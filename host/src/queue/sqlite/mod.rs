//! What only SQLite does for the SQL queue ([`SqlStore`]) on embedded SQLite (WAL mode), the
//! default store: how it is opened (one writer connection, readers beside it, a turn for
//! processes opening one file), checkpoints off the writer's path, the inbox-key function its
//! lease calls, and its multi-row insert. SQLite serialises writers, so every transaction
//! starts with a write and holds the lock it decides under; identity is still enforced by the
//! unique index on (queue, message_id).

mod checkpoint;
mod engine;
mod enqueue;
mod inbox_key;
mod open_turn;
mod settle;
pub(super) mod statements;

use std::sync::Arc;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

pub(in crate::queue) use self::checkpoint::Checkpointer;
pub(crate) use self::engine::options as sqlite_options;
pub(super) use self::enqueue::insert_new;
use self::open_turn::OpenTurn;
pub(super) use self::settle::complete;
use super::QueueError;

/// The connections of a SQLite store.
pub(super) struct Connected {
    /// The one writer connection.
    pub writer: SqlitePool,
    /// Reader connections beside it (the writer itself for an in-memory database).
    pub readers: SqlitePool,
    /// Checkpoints the log off the writer's path (none for an in-memory database).
    pub checkpointer: Option<Arc<Checkpointer>>,
}

/// Open (creating if missing) the SQLite database at a `sqlite://PATH` URL and migrate it.
pub(super) async fn connect(url: &str, max_connections: u32) -> Result<Connected, QueueError> {
    let options = sqlite_options(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        // A statement's rollback journal inside a transaction stays in memory instead
        // of a temporary file written for every multi-statement settlement.
        .pragma("temp_store", "memory")
        .busy_timeout(Duration::from_secs(30));
    let writer = options.clone().pragma(
        "wal_autocheckpoint",
        checkpoint::WRITER_BACKSTOP_PAGES.to_string(),
    );
    let in_memory = url.contains(":memory:") || url.contains("mode=memory");
    // Until the schema is current and every connection is open, other processes opening
    // this database wait.
    let turn = OpenTurn::take(options.get_filename(), in_memory).await?;
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        // The writer's leases check the inbox with `wharf_inbox_key`.
        .after_connect(|conn, _| Box::pin(inbox_key::register(conn)))
        .connect_with(writer)
        .await?;
    turn.migrate(&pool).await?;
    let (readers, checkpointer) = if in_memory {
        (pool.clone(), None) // another connection would open another database
    } else {
        let readers = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .connect_with(options.clone())
            .await?;
        (
            readers,
            Some(Arc::new(Checkpointer::start(&options).await?)),
        )
    };
    drop(turn);
    Ok(Connected {
        writer: pool,
        readers,
        checkpointer,
    })
}

/// A store in a fresh database file of `dir` holding `count` messages in queue `orders`.
#[cfg(test)]
pub(super) async fn store_with_orders(dir: &std::path::Path, count: u32) -> crate::queue::SqlStore {
    use super::{NewMessage, QueueStore, SqlStore};
    let url = format!("sqlite://{}", dir.join("queue.db").display());
    let store = SqlStore::open_sqlite(&url, 2).await.unwrap();
    let messages = (0..count)
        .map(|n| NewMessage {
            payload: format!("{{\"n\":{n}}}"),
            ..NewMessage::default()
        })
        .collect();
    store.enqueue_many("orders", messages, false).await.unwrap();
    store
}
