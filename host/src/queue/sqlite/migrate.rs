//! Schema migrations of the SQLite store, serialised across processes. sqlx takes no lock
//! for SQLite, so hosts and CLI commands that open a new database at the same moment would
//! apply the same migration twice (`duplicate column name`, or a unique-constraint failure on
//! the migrations table); an exclusive lock on `<database>.lock`, beside the database file,
//! makes them take turns. The lock is an advisory `flock`, released when the process ends, so
//! a crash mid-migration never leaves it held.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use sqlx::SqlitePool;

use super::super::QueueError;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Bring the database at `database` (its file name; `in_memory` for a private in-memory
/// database, which needs no lock) up to date, holding the migration lock.
pub(super) async fn migrate(
    pool: &SqlitePool,
    database: &Path,
    in_memory: bool,
) -> Result<(), QueueError> {
    let _lock = match lock_path(database).filter(|_| !in_memory) {
        Some(path) => Some(lock(path).await?),
        None => None,
    };
    MIGRATOR.run(pool).await?;
    Ok(())
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

/// Wait for the exclusive lock on `path` (on a blocking thread: `flock` blocks).
async fn lock(path: PathBuf) -> Result<File, QueueError> {
    let shown = path.clone();
    tokio::task::spawn_blocking(move || {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                tracing::info!(lock = %path.display(), "another process is migrating the database: waiting for it");
                file.lock()?;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        Ok(file)
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
    use super::*;

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
