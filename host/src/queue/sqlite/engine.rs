//! Process-wide settings of the embedded SQLite library, applied once, before its first
//! connection opens.
//!
//! By default SQLite keeps allocation statistics (`sqlite3_status`) and updates them under
//! one process-wide mutex on every allocation. The store's writer, its readers, the inbox's
//! connections and the checkpointer each run on a thread of their own, so that bookkeeping
//! made them queue on one lock for every allocation: in a profile of a drain with the inbox,
//! about a fifth of the times the writer's thread went to sleep, it was waiting on that lock.
//! Nothing here reads those statistics, so they are turned off.

use std::ffi::c_int;
use std::str::FromStr;
use std::sync::Once;

use sqlx::sqlite::SqliteConnectOptions;

/// The connect options of a `sqlite:` URL, with the process-wide settings applied first:
/// every SQLite connection of the host starts from these.
pub(crate) fn options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    configure();
    SqliteConnectOptions::from_str(url)
}

/// Apply the settings; only the first call does anything. It must run before the first
/// connection opens: once SQLite is initialized, the settings can no longer change (the call
/// then leaves everything as it was).
fn configure() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sqlite3_config` may be called before `sqlite3_initialize` (which the first
        // open runs); `SQLITE_CONFIG_MEMSTATUS` takes one `int`. After initialization it
        // returns `SQLITE_MISUSE` and changes nothing.
        let rc = unsafe {
            libsqlite3_sys::sqlite3_config(libsqlite3_sys::SQLITE_CONFIG_MEMSTATUS, 0 as c_int)
        };
        if rc != libsqlite3_sys::SQLITE_OK {
            tracing::debug!(
                rc,
                "SQLite was initialized already; its allocation statistics stay on"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use libsqlite3_sys::{SQLITE_OK, SQLITE_STATUS_MEMORY_USED, sqlite3_status64};

    use super::super::store_with_orders;
    use crate::queue::QueueStore;

    /// Holds in a process of its own (as `cargo nextest` runs each test): a test that opened
    /// SQLite another way first in the same process would leave the statistics on.
    #[tokio::test]
    async fn the_store_keeps_sqlite_from_counting_allocations() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_orders(dir.path(), 100).await;
        assert_eq!(store.lease("orders", 100, 30_000).await.unwrap().len(), 100);

        let (mut current, mut highest) = (0i64, 0i64);
        // SAFETY: two valid out-pointers; the counter is only read.
        let rc =
            unsafe { sqlite3_status64(SQLITE_STATUS_MEMORY_USED, &mut current, &mut highest, 0) };
        assert_eq!(rc, SQLITE_OK);
        assert_eq!(
            (current, highest),
            (0, 0),
            "SQLite counted its allocations (under its process-wide lock)"
        );
    }
}
