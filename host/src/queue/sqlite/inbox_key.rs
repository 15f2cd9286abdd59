//! The SQL function `wharf_inbox_key(endpoint, message_id)` on the store's writer connection:
//! the consumer inbox's 32-byte key ([`inbox_hash`]), so the lease statement can look every
//! delivery up in an inbox table of the same database, as PostgreSQL's does with `sha256`
//! (SQLite has no hash function of its own).
//!
//! Checked in the lease, the lookup runs on the writer, whose page cache holds the index pages
//! its own inbox records just changed; a separate check on a reader connection waited its
//! turn between the lease and the guests, and started from a page cache that SQLite empties
//! whenever another connection has committed.

use std::ffi::{CStr, c_int, c_void};

use libsqlite3_sys as ffi;
use sqlx::SqliteConnection;

use crate::queue::inbox_hash;

/// The function's name, as SQL calls it.
const FUNCTION: &CStr = c"wharf_inbox_key";

/// [`FUNCTION`] as statement text.
pub(super) fn name() -> &'static str {
    FUNCTION.to_str().expect("the function's name is ASCII")
}

/// Make `wharf_inbox_key` callable on `conn`.
pub(super) async fn register(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is the open connection, locked for us while `handle` lives. The name is
    // NUL-terminated and static; the function keeps no user data, so nothing is destroyed.
    let rc = unsafe {
        ffi::sqlite3_create_function_v2(
            db,
            FUNCTION.as_ptr(),
            2,
            ffi::SQLITE_UTF8 | ffi::SQLITE_DETERMINISTIC | ffi::SQLITE_INNOCUOUS,
            std::ptr::null_mut(),
            Some(inbox_key),
            None,
            None,
            None,
        )
    };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "could not define the SQLite function {} (result code {rc})",
            name()
        )))
    }
}

/// The bytes of a text argument, or `None` for SQL NULL.
///
/// # Safety
/// `value` is an argument of the running call.
unsafe fn text<'a>(value: *mut ffi::sqlite3_value) -> Option<&'a [u8]> {
    // SAFETY: per the caller; `sqlite3_value_text` first (it converts), then its byte length,
    // as SQLite's documentation prescribes. The bytes live until the call returns.
    unsafe {
        let bytes = ffi::sqlite3_value_text(value);
        if bytes.is_null() {
            return None;
        }
        let len = ffi::sqlite3_value_bytes(value);
        Some(std::slice::from_raw_parts(bytes, len.max(0) as usize))
    }
}

/// `wharf_inbox_key(endpoint, message_id)`: the 32-byte key as a BLOB, NULL if either is NULL.
unsafe extern "C" fn inbox_key(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: SQLite calls with `argc` (2, as registered) valid arguments in `argv` and a
    // live context; the result blob is copied (`SQLITE_TRANSIENT`) before `key` is dropped.
    unsafe {
        if argc != 2 {
            ffi::sqlite3_result_error_code(ctx, ffi::SQLITE_MISUSE);
            return;
        }
        match (text(*argv), text(*argv.add(1))) {
            (Some(endpoint), Some(message_id)) => {
                let key = inbox_hash(endpoint, message_id);
                ffi::sqlite3_result_blob(
                    ctx,
                    key.as_ptr().cast::<c_void>(),
                    key.len() as c_int,
                    ffi::SQLITE_TRANSIENT(),
                );
            }
            _ => ffi::sqlite3_result_null(ctx),
        }
    }
}

#[cfg(test)]
mod tests {
    use sqlx::ConnectOptions;

    use super::*;

    #[tokio::test]
    async fn the_sql_function_gives_the_inbox_keys_bytes() {
        let mut conn = super::super::sqlite_options("sqlite::memory:")
            .unwrap()
            .connect()
            .await
            .unwrap();
        register(&mut conn).await.unwrap();
        for (endpoint, id) in [("billing", "A1"), ("endpoint é ", "id "), ("ab", "c")] {
            let key: Vec<u8> = sqlx::query_scalar("SELECT wharf_inbox_key(?1, ?2)")
                .bind(endpoint)
                .bind(id)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            assert_eq!(key, inbox_hash(endpoint.as_bytes(), id.as_bytes()));
        }
        let none: Option<Vec<u8>> = sqlx::query_scalar("SELECT wharf_inbox_key('e', NULL)")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(none, None);
    }
}
