//! Opening the SQLite store's database, serialised across processes, and its schema
//! migrations. Hosts and CLI commands that open a new database at the same moment would
//! otherwise trip over each other twice:
//! - switching a new file to WAL mode needs the file to itself; two connections that both
//!   read it first and then ask for that lock deadlock, and SQLite answers one of them
//!   `database is locked` at once instead of waiting (the busy timeout does not apply);
//! - sqlx takes no lock for SQLite migrations, so two processes would apply the same
//!   migration twice (`duplicate column name`, or a unique-constraint failure on the
//!   migrations table).
//!
//! So every open holds an exclusive lock on `<database>.lock`, beside the database file, from
//! before its first connection until its schema is current and its connections are open
//! ([`OpenTurn`]). The lock is an advisory `flock`, released when the process ends, so a
//! crash mid-open never leaves it held.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use sqlx::SqlitePool;

use super::super::QueueError;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// This process's turn to open a database: held from before the first connection until the
/// schema is current and the store's connections are open, then dropped.
pub(super) struct OpenTurn {
    _lock: Option<File>,
}

impl OpenTurn {
    /// Wait for the turn to open the database at `database` (its file name; `in_memory` for a
    /// private in-memory database, which no other process sees and needs no turn).
    pub(super) async fn take(database: &Path, in_memory: bool) -> Result<Self, QueueError> {
        let lock = match lock_path(database).filter(|_| !in_memory) {
            Some(path) => lock(path).await?,
            None => None,
        };
        Ok(OpenTurn { _lock: lock })
    }

    /// Bring the database up to date.
    pub(super) async fn migrate(&self, pool: &SqlitePool) -> Result<(), QueueError> {
        MIGRATOR.run(pool).await?;
        Ok(())
    }
}

/// The lock file of a file database; `None` for an in-memory one, which no other process sees.
fn lock_path(database: &Path) -> Option<PathBuf> {
    let name = database.as_os_str();
    if name.is_empty() || name == ":memory:" {
        return None;
    }
    let mut lock = name.to_owned();
    lock.push(".lock");
    Some(PathBuf::from(lock))
}

/// Wait for the exclusive lock on `path` (on a blocking thread: `flock` blocks). `None` when
/// the database's folder does not exist: opening the database then fails too, and SQLite's
/// own error says so better than one about the lock file.
async fn lock(path: PathBuf) -> Result<Option<File>, QueueError> {
    let shown = path.clone();
    tokio::task::spawn_blocking(move || {
        let file = match OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                tracing::info!(lock = %path.display(), "another process is opening the database: waiting for it");
                file.lock()?;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        Ok(Some(file))
    })
    .await
    .map_err(|join| std::io::Error::other(join.to_string()))
    .and_then(|locked| locked)
    .map_err(|source| QueueError::Lock {
        path: shown,
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::queue::SqlStore;

    /// An open waits for its turn before its first connection: while another open (here
    /// held by the test) has the turn, the database file is not even created, so no two
    /// processes ever switch a new file to WAL mode together (SQLite fails one of them with
    /// `database is locked` at once). Once the turn is free, the open completes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_connects_only_when_no_other_open_has_the_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        let held = OpenTurn::take(&path, false).await.unwrap();
        assert!(held._lock.is_some(), "the test holds the turn");
        let url = format!("sqlite://{}", path.display());
        let mut open = tokio::spawn(async move { SqlStore::open_sqlite(&url, 1).await });
        // What must not happen: the open connecting (and creating the file) without the turn.
        let waited = tokio::time::timeout(Duration::from_millis(500), &mut open).await;
        assert!(
            waited.is_err(),
            "the open completed while another held the turn"
        );
        assert!(!path.exists(), "the open connected before it had the turn");
        drop(held);
        let store = open
            .await
            .unwrap()
            .expect("the open completes once the turn is free");
        drop(store);
        assert!(path.exists());
    }

    #[test]
    fn file_databases_lock_a_sibling_file_and_memory_ones_none() {
        assert_eq!(
            lock_path(Path::new("/data/wharf.db")),
            Some(PathBuf::from("/data/wharf.db.lock"))
        );
        assert_eq!(lock_path(Path::new(":memory:")), None);
        assert_eq!(lock_path(Path::new("")), None);
    }
}
