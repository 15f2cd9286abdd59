//! The consumer inbox's records written by the settlement transaction itself, so a successful
//! delivery is recorded exactly when its settlement commits. The queue owns these writes; the
//! inbox supplies its keys as plain rows ([`InboxWrite`]), so the queue needs nothing else of
//! the inbox.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, PgConnection, SqliteConnection};

use crate::sql::Conn;

use super::{Settlement, now_ms};

/// The inbox key's hash of (`endpoint`, `message_id`): SHA-256 over each part's byte length
/// (8 bytes, big-endian) followed by its bytes, so ("ab", "c") and ("a", "bc") differ. The
/// same bytes as PostgreSQL's lease statement computes in SQL and SQLite's `wharf_inbox_key`.
pub fn inbox_hash(endpoint: &[u8], message_id: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in [endpoint, message_id] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// One inbox record: the key's hash, with the endpoint and MessageId it was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRow {
    /// SHA-256 of the length-delimited (endpoint, MessageId) encoding.
    pub hash: [u8; 32],
    /// The endpoint.
    pub endpoint: String,
    /// The MessageId.
    pub message_id: String,
}

/// Inbox records to write into a table of the queue database.
#[derive(Debug, Clone)]
pub struct InboxWrite {
    /// The inbox table.
    pub table: Arc<str>,
    /// The records, in order.
    pub rows: Vec<InboxRow>,
    /// How long they are kept.
    pub retention_ms: i64,
}

/// The inbox records of a settlement batch, merged into one write per (table, retention).
pub(crate) fn inbox_writes(settlements: &[Settlement]) -> Vec<InboxWrite> {
    merged(settlements.iter().filter_map(|s| s.inbox.as_ref()))
}

/// `writes` merged into one write per (table, retention).
pub(crate) fn merged<'w>(all: impl IntoIterator<Item = &'w InboxWrite>) -> Vec<InboxWrite> {
    let mut writes: Vec<InboxWrite> = Vec::new();
    for write in all {
        match writes
            .iter_mut()
            .find(|w| w.table == write.table && w.retention_ms == write.retention_ms)
        {
            Some(merged) => merged.rows.extend(write.rows.iter().cloned()),
            None => writes.push(write.clone()),
        }
    }
    writes
}

/// Write `write`'s records on `conn` (in the caller's transaction, if any); a key recorded
/// already stays as it is.
pub async fn record(conn: &mut Conn<'_>, write: &InboxWrite) -> Result<(), sqlx::Error> {
    match conn {
        Conn::Postgres(conn) => record_postgres(conn, write).await,
        Conn::Sqlite(conn) => record_sqlite(conn, write).await,
    }
}

/// Write `write`'s records on an open PostgreSQL connection (e.g. inside the transaction that
/// settles the message). Recording an existing key is a no-op. Keys are inserted in hash
/// order, so concurrent writes of the same keys never wait on each other in a cycle.
async fn record_postgres(conn: &mut PgConnection, write: &InboxWrite) -> Result<(), sqlx::Error> {
    let now = now_ms();
    let hashes: Vec<&[u8]> = write.rows.iter().map(|k| &k.hash[..]).collect();
    let endpoints: Vec<&str> = write.rows.iter().map(|k| k.endpoint.as_str()).collect();
    let ids: Vec<&str> = write.rows.iter().map(|k| k.message_id.as_str()).collect();
    sqlx::query(AssertSqlSafe(insert_postgres(
        &write.table,
        [1, 2, 3, 4, 5],
    )))
    .bind(&hashes)
    .bind(&endpoints)
    .bind(&ids)
    .bind(now)
    .bind(now + write.retention_ms)
    .execute(conn)
    .await?;
    Ok(())
}

/// The PostgreSQL `INSERT` of inbox records into `table`, its values bound at the numbered
/// parameters `[hashes, endpoints, message ids, created at, expires at]` (the three first
/// arrays). Keys go in hash order, so concurrent writes of the same keys never wait on each
/// other in a cycle; a key already recorded is skipped.
pub(super) fn insert_postgres(table: &str, [h, e, m, created, expires]: [u8; 5]) -> String {
    format!(
        "INSERT INTO {table} (id_hash, endpoint, message_id, created_at_ms, expires_at_ms)
         SELECT h, e, m, ${created}, ${expires} FROM UNNEST(${h}::bytea[], ${e}::text[], ${m}::text[]) AS r(h, e, m)
         ORDER BY h
         ON CONFLICT (id_hash) DO NOTHING"
    )
}

/// Write `write`'s records on an open SQLite connection (e.g. inside the transaction that
/// settles the message). Recording an existing key is a no-op. One statement per endpoint
/// (a settlement batch usually has one): the hashes travel as one blob of 32-byte keys and
/// the MessageIds as a flat JSON array, so the statement text is the same for any number of
/// rows and stays prepared, and SQLite parses each id once (an array of `[hash, endpoint,
/// id]` arrays made it parse every row again to pick its fields).
async fn record_sqlite(conn: &mut SqliteConnection, write: &InboxWrite) -> Result<(), sqlx::Error> {
    let now = now_ms();
    let sql = format!(
        "INSERT INTO {} (id_hash, endpoint, message_id, created_at_ms, expires_at_ms)
         SELECT substr(?1, ids.key * 32 + 1, 32), ?2, ids.value, ?4, ?5 FROM json_each(?3) AS ids WHERE true
         ON CONFLICT (id_hash) DO NOTHING",
        write.table
    );
    let mut endpoints: Vec<&str> = Vec::new();
    for row in &write.rows {
        if !endpoints.contains(&row.endpoint.as_str()) {
            endpoints.push(&row.endpoint);
        }
    }
    for endpoint in endpoints {
        let rows = || write.rows.iter().filter(|row| row.endpoint == endpoint);
        let hashes: Vec<u8> = rows().flat_map(|row| row.hash).collect();
        let ids: Vec<&str> = rows().map(|row| row.message_id.as_str()).collect();
        // `WHERE true` tells SQLite's parser the `ON CONFLICT` belongs to the upsert.
        sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(hashes)
            .bind(endpoint)
            .bind(serde_json::to_string(&ids).expect("MessageIds serialize"))
            .bind(now)
            .bind(now + write.retention_ms)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}
