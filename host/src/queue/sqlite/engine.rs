//! Process-wide settings of the embedded SQLite library, applied once, before its first
//! connection opens.
//!
//! By default SQLite keeps allocation statistics (`sqlite3_status`) and updates them under
//! one process-wide mutex on every allocation. The store's writer, its readers, the inbox's
//! connections and the checkpointer each run on a thread of their own, so that bookkeeping
//! made them queue on one lock for every allocation: in a profile of a drain with the inbox,
//! about a fifth of the times the writer's thread went to sleep, it was waiting on that lock.
//! Nothing here reads those statistics, so they are turned off.
//!
//! SQLite also allocates through the C library's `malloc` by default, apart from the rest of
//! the host (jemalloc, see [`crate::allocator`]). In a profile of a SQLite drain, glibc's
//! `malloc`, `_int_malloc`, `malloc_consolidate` and `free` took about a tenth of the writer
//! thread's time; SQLite's allocations go to jemalloc instead ([`JEMALLOC`]).

use std::ffi::{c_int, c_void};
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
        // SAFETY: as above; `SQLITE_CONFIG_MALLOC` takes a pointer to the methods, which
        // SQLite copies. Before initialization nothing has been allocated yet, so no block
        // allocated by another allocator ever reaches these functions.
        let rc = unsafe {
            libsqlite3_sys::sqlite3_config(
                libsqlite3_sys::SQLITE_CONFIG_MALLOC,
                &JEMALLOC as *const libsqlite3_sys::sqlite3_mem_methods,
            )
        };
        if rc != libsqlite3_sys::SQLITE_OK {
            tracing::debug!(
                rc,
                "SQLite was initialized already; it keeps the C library's allocator"
            );
        }
    });
}

/// SQLite's memory methods on jemalloc. SQLite asks for sizes as `int`s, never negative or
/// zero (it handles those itself), and relies on the blocks being 8-byte aligned, which
/// jemalloc's are.
const JEMALLOC: libsqlite3_sys::sqlite3_mem_methods = libsqlite3_sys::sqlite3_mem_methods {
    xMalloc: Some(sqlite_malloc),
    xFree: Some(sqlite_free),
    xRealloc: Some(sqlite_realloc),
    xSize: Some(sqlite_size),
    xRoundup: Some(sqlite_roundup),
    xInit: Some(sqlite_init),
    xShutdown: Some(sqlite_shutdown),
    pAppData: std::ptr::null_mut(),
};

unsafe extern "C" fn sqlite_malloc(size: c_int) -> *mut c_void {
    // SAFETY: jemalloc's `malloc`, called as C's.
    unsafe { tikv_jemalloc_sys::malloc(size.max(1) as usize) }
}

unsafe extern "C" fn sqlite_free(block: *mut c_void) {
    // SAFETY: `block` came from `sqlite_malloc` or `sqlite_realloc` (or is null).
    unsafe { tikv_jemalloc_sys::free(block) }
}

unsafe extern "C" fn sqlite_realloc(block: *mut c_void, size: c_int) -> *mut c_void {
    // SAFETY: as for `sqlite_free`; on failure the block is left as it was, as SQLite expects.
    unsafe { tikv_jemalloc_sys::realloc(block, size.max(1) as usize) }
}

unsafe extern "C" fn sqlite_size(block: *mut c_void) -> c_int {
    if block.is_null() {
        return 0;
    }
    // SAFETY: `block` is a live block of jemalloc's.
    let size = unsafe { tikv_jemalloc_sys::malloc_usable_size(block) };
    c_int::try_from(size).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn sqlite_roundup(size: c_int) -> c_int {
    // SAFETY: `nallocx` only computes; a size of 0 is the one it must not be given.
    let rounded = unsafe { tikv_jemalloc_sys::nallocx(size.max(1) as usize, 0) };
    c_int::try_from(rounded).unwrap_or(size)
}

unsafe extern "C" fn sqlite_init(_: *mut c_void) -> c_int {
    libsqlite3_sys::SQLITE_OK
}

unsafe extern "C" fn sqlite_shutdown(_: *mut c_void) {}

#[cfg(test)]
mod tests {
    use libsqlite3_sys::{
        SQLITE_OK, SQLITE_STATUS_MEMORY_USED, sqlite3_free, sqlite3_malloc, sqlite3_msize,
        sqlite3_status64,
    };

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

    /// Holds in a process of its own, as the test above. A block of 1,000 bytes is one of
    /// jemalloc's 1,024-byte size class; the C library's allocator (or SQLite's own size
    /// prefix) would report 1,000.
    #[tokio::test]
    async fn sqlite_allocates_through_jemalloc() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_orders(dir.path(), 10).await;
        assert_eq!(store.lease("orders", 10, 30_000).await.unwrap().len(), 10);
        // SAFETY: a block from SQLite's allocator, measured and given back to it.
        let size = unsafe {
            let block = sqlite3_malloc(1000);
            assert!(!block.is_null());
            let size = sqlite3_msize(block);
            sqlite3_free(block);
            size
        };
        assert_eq!(size, 1024, "SQLite does not allocate through jemalloc");
    }
}
