//! Handlers' key-value state (`wasi:keyvalue`) in the SQL store: the table `wharf_state`,
//! keyed by (bucket, key), with a revision that changes on every write. A call reads the
//! committed state through [`super::state_reads`] (coalesced); its staged changes ([`StateWrite`]) are committed with its
//! message's settlement: [`lock`] locks the rows a batch changes and finds the settlements
//! whose read-then-set lost a race (a state conflict), [`write`] writes what the applied
//! ones changed. Increments commit as increments on the locked value.

use std::collections::{BTreeMap, BTreeSet};

use crate::sql::{Conn, Dialect, Pool, Query, Sql};

use super::QueueError;

/// A staged change of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    /// Set the value.
    Set(Vec<u8>),
    /// Remove the key.
    Delete,
    /// Add to a counter (the value's decimal digits; absent counts as 0).
    Add(u64),
}

/// A change one handler call staged, committed with its message's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    /// The bucket.
    pub bucket: String,
    /// The key.
    pub key: String,
    /// What changes.
    pub change: StateChange,
    /// The committed revision the call read before a set or delete (0: it read the key
    /// absent): at commit, another revision is a state conflict. `None`: not checked.
    pub expect: Option<i64>,
}

/// A counter's value as stored: its decimal digits.
pub fn counter_bytes(value: u64) -> Vec<u8> {
    value.to_string().into_bytes()
}

/// A stored value read as a counter; `None` when it is not one.
pub fn counter_value(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// One key's committed value, as [`read`] returns it: the value and its revision.
pub type Committed = (Vec<u8>, i64);

/// (bucket, key).
pub(super) type Id = (String, String);

const KEYS: Sql =
    Sql::both("SELECT key FROM wharf_state WHERE bucket = $1 ORDER BY key LIMIT $2 OFFSET $3");

const ENTRIES: Sql = Sql::both(
    "SELECT key, value, revision FROM wharf_state WHERE bucket = $1 ORDER BY key LIMIT $2 OFFSET $3",
);

const BUCKETS: Sql =
    Sql::both("SELECT bucket, COUNT(*) AS n FROM wharf_state GROUP BY bucket ORDER BY bucket");

/// PostgreSQL: the rows of the keys in two arrays, locked in the arrays' order (the callers'
/// key order, the same in every process, so two transactions never wait for each other in a
/// circle). Each key is looked up in the primary key by itself: as one join, the statement's
/// generic plan hashes the keys and scans the whole table for every batch.
const LOCK_POSTGRES: &str = "SELECT s.bucket, s.key, s.value, s.revision \
     FROM UNNEST($1::text[], $2::text[]) AS k(bucket, key) CROSS JOIN LATERAL \
     (SELECT bucket, key, value, revision FROM wharf_state \
      WHERE bucket = k.bucket AND key = k.key FOR UPDATE) s";

/// What a key already present does when its new value is written over it.
macro_rules! REPLACE {
    () => {
        "DO UPDATE SET value = excluded.value, revision = excluded.revision, updated_at_ms = excluded.updated_at_ms"
    };
}

/// SQLite: rows written from a JSON list of `[bucket, key, offset, length, revision]` and one
/// blob of the values (`$2`), at `$3`, then what a key already present does.
macro_rules! upsert_sqlite {
    ($($on_conflict:tt)+) => {
        concat!(
            "INSERT INTO wharf_state (bucket, key, value, revision, updated_at_ms) ",
            "SELECT json_extract(r.value, '$[0]'), json_extract(r.value, '$[1]'), ",
            "CASE json_extract(r.value, '$[3]') WHEN 0 THEN x'' ",
            "ELSE substr($2, json_extract(r.value, '$[2]') + 1, json_extract(r.value, '$[3]')) END, ",
            "json_extract(r.value, '$[4]'), $3 FROM json_each($1) AS r WHERE true ",
            "ON CONFLICT (bucket, key) ",
            $($on_conflict)+
        )
    };
}

/// PostgreSQL: rows written from arrays (keys, values, revisions) in key order, at `$5`,
/// then what a key already present does.
macro_rules! upsert_postgres {
    ($($on_conflict:tt)+) => {
        concat!(
            "INSERT INTO wharf_state (bucket, key, value, revision, updated_at_ms) ",
            "SELECT b, k, v, r, $5 FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::int8[]) AS u(b, k, v, r) ",
            "ORDER BY b, k ON CONFLICT (bucket, key) ",
            $($on_conflict)+
        )
    };
}

/// The row of one key (`$1` bucket, `$2` key).
pub(super) const ROW_OF_KEY: Sql =
    Sql::both("SELECT value, revision FROM wharf_state WHERE bucket = $1 AND key = $2");

/// The rows of many keys, bound by [`bind_keys`]: SQLite joins a JSON list of pairs,
/// PostgreSQL two arrays. One text for any number of keys, so it stays prepared. PostgreSQL
/// looks each key up in the primary key by itself (`OFFSET 0` keeps the subquery apart): as
/// one join, the statement's generic plan hashes the keys and scans the whole table.
pub(super) const ROWS_OF_KEYS: Sql = Sql::each(
    "SELECT s.bucket, s.key, s.value, s.revision FROM json_each($1) AS k \
     JOIN wharf_state s ON s.bucket = json_extract(k.value, '$[0]') AND s.key = json_extract(k.value, '$[1]')",
    "SELECT s.bucket, s.key, s.value, s.revision FROM UNNEST($1::text[], $2::text[]) AS k(bucket, key) \
     CROSS JOIN LATERAL (SELECT bucket, key, value, revision FROM wharf_state \
     WHERE bucket = k.bucket AND key = k.key OFFSET 0) s",
);

/// `query` ([`ROWS_OF_KEYS`] or [`LOCK_POSTGRES`]) with the keys `ids` bound.
pub(super) fn bind_keys<'q, 'i>(
    query: Query<'q>,
    dialect: Dialect,
    ids: impl IntoIterator<Item = &'i Id>,
) -> Query<'q> {
    match dialect {
        Dialect::Sqlite => {
            let pairs: Vec<[&str; 2]> = ids
                .into_iter()
                .map(|(b, k)| [b.as_str(), k.as_str()])
                .collect();
            query.bind(serde_json::to_string(&pairs).expect("strings encode as JSON"))
        }
        Dialect::Postgres => {
            let (buckets, keys): (Vec<&str>, Vec<&str>) = ids
                .into_iter()
                .map(|(b, k)| (b.as_str(), k.as_str()))
                .unzip();
            query.bind_postgres(buckets).bind_postgres(keys)
        }
    }
}

/// On SQLite, the transaction's write lock, taken before the reads it decides on.
const TAKE_WRITE_LOCK: &str = "DELETE FROM wharf_state WHERE 0 = 1";

/// Keys per statement (five parameters a row at most).
const CHUNK: usize = 1000;

/// `limit` keys of `bucket` in key order, from position `offset`.
pub(crate) async fn keys(
    pool: &Pool,
    bucket: &str,
    offset: u64,
    limit: u32,
) -> Result<Vec<String>, QueueError> {
    Ok(pool
        .query(&KEYS)
        .bind(bucket)
        .bind(limit as i64)
        .bind(offset as i64)
        .fetch_column()
        .await?)
}

/// `limit` keys of `bucket` in key order, from position `offset`, with their committed
/// values and revisions (one statement).
pub(crate) async fn entries(
    pool: &Pool,
    bucket: &str,
    offset: u64,
    limit: u32,
) -> Result<Vec<(String, Committed)>, QueueError> {
    let rows = pool
        .query(&ENTRIES)
        .bind(bucket)
        .bind(limit as i64)
        .bind(offset as i64)
        .fetch_all()
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push((row.get("key")?, (row.get("value")?, row.get("revision")?)));
    }
    Ok(out)
}

/// Every bucket that holds a key, in name order, with its number of keys.
pub(crate) async fn buckets(pool: &Pool) -> Result<Vec<(String, u64)>, QueueError> {
    let rows = pool.query(&BUCKETS).fetch_all().await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push((row.get("bucket")?, row.get::<i64, _>("n")? as u64));
    }
    Ok(out)
}

/// The committed values of the keys a batch changes, read and locked.
#[derive(Debug, Default)]
pub(crate) struct Locked {
    base: BTreeMap<Id, Option<Committed>>,
}

/// A key's value after a change, from `before`; `None` when the change cannot apply (an
/// increment of a value that is not a counter, or past the largest).
fn apply(before: Option<&[u8]>, change: &StateChange) -> Option<Option<Vec<u8>>> {
    Some(match change {
        StateChange::Set(value) => Some(value.clone()),
        StateChange::Delete => None,
        StateChange::Add(delta) => {
            let base = match before {
                Some(bytes) => counter_value(bytes)?,
                None => 0,
            };
            Some(counter_bytes(base.checked_add(*delta)?))
        }
    })
}

/// `(b0, k0), (b1, k1), …` as `$N` placeholders from `$first`.
fn pairs(n: usize, first: usize) -> String {
    (0..n)
        .map(|i| format!("(${}, ${})", first + 2 * i, first + 2 * i + 1))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Read and lock (PostgreSQL: `FOR UPDATE`, in key order) every key `groups` change, then
/// go through the groups in order: a group with a set or delete whose read revision is no
/// longer the key's is a conflict (its first such key, `BUCKET/KEY`, is returned at its
/// position) and changes nothing; the others change the keys for the groups after them.
pub(crate) async fn lock(
    conn: &mut Conn<'_>,
    groups: &[&[StateWrite]],
) -> Result<(Vec<Option<String>>, Locked), QueueError> {
    let ids: BTreeSet<Id> = groups
        .iter()
        .flat_map(|g| g.iter().map(|w| (w.bucket.clone(), w.key.clone())))
        .collect();
    let ids: Vec<Id> = ids.into_iter().collect();
    if conn.dialect() == Dialect::Sqlite {
        // A deferred transaction that reads first cannot take the write lock later if another
        // connection wrote meanwhile: take it now (a write statement takes it, rows or not).
        conn.query(TAKE_WRITE_LOCK).execute().await?;
    }
    // One text for any number of keys: it stays prepared. PostgreSQL locks the rows in key
    // order; SQLite holds the write lock already, so reading is locking.
    let dialect = conn.dialect();
    let query = match dialect {
        Dialect::Postgres => conn.query(LOCK_POSTGRES),
        Dialect::Sqlite => conn.query(&ROWS_OF_KEYS),
    };
    let rows = bind_keys(query, dialect, &ids).fetch_all().await?;
    let mut locked = Locked::default();
    for row in rows {
        let id: Id = (row.get("bucket")?, row.get("key")?);
        locked
            .base
            .insert(id, Some((row.get("value")?, row.get("revision")?)));
    }
    for id in ids {
        locked.base.entry(id).or_insert(None);
    }
    // Walk the groups over a copy: (value, revision) after each applied group.
    let mut now: BTreeMap<&Id, (Option<Vec<u8>>, i64)> = locked
        .base
        .iter()
        .map(|(id, c)| (id, c.clone().map_or((None, 0), |(v, r)| (Some(v), r))))
        .collect();
    let mut conflicts = Vec::with_capacity(groups.len());
    for group in groups {
        let conflict = group.iter().find_map(|w| {
            let id = (w.bucket.clone(), w.key.clone());
            let (value, revision) = &now[&id];
            let stale = w.expect.is_some_and(|r| r != *revision);
            let fails = apply(value.as_deref(), &w.change).is_none();
            (stale || fails).then(|| format!("{}/{}", w.bucket, w.key))
        });
        if conflict.is_none() {
            for w in group.iter() {
                let id = (w.bucket.clone(), w.key.clone());
                let entry = now.get_mut(&id).expect("a locked key");
                let next = apply(entry.0.as_deref(), &w.change).expect("checked above");
                *entry = (next, new_revision());
            }
        }
        conflicts.push(conflict);
    }
    Ok((conflicts, locked))
}

/// A new revision: random, never 0 (which stands for an absent key), below 2^53 so that a
/// JSON reader keeping numbers as doubles (JavaScript) reads it exactly.
fn new_revision() -> i64 {
    (rand::random::<u64>() >> 11).max(1) as i64
}

/// Write what `groups` (the applied ones, in order, none a conflict per [`lock`]) change.
/// A key [`lock`] found absent that another transaction has written since is
/// [`QueueError::Conflict`]: the caller rolls back and tries the batch again, which then
/// finds and locks the row.
pub(crate) async fn write(
    conn: &mut Conn<'_>,
    groups: &[&[StateWrite]],
    locked: &Locked,
    now: i64,
) -> Result<(), QueueError> {
    let mut last: BTreeMap<&Id, Option<Vec<u8>>> = BTreeMap::new();
    for group in groups {
        for w in group.iter() {
            let id = locked
                .base
                .get_key_value(&(w.bucket.clone(), w.key.clone()))
                .map(|(id, _)| id)
                .expect("a locked key");
            let before = match last.get(id) {
                Some(value) => value.clone(),
                None => locked.base[id].as_ref().map(|(v, _)| v.clone()),
            };
            let next = apply(before.as_deref(), &w.change).ok_or_else(|| {
                QueueError::Conflict(format!("state of {}/{} changed", w.bucket, w.key))
            })?;
            last.insert(id, next);
        }
    }
    let (mut update, mut insert, mut delete) = (Vec::new(), Vec::new(), Vec::new());
    for (id, value) in &last {
        match (value, locked.base[*id].is_some()) {
            (Some(value), true) => update.push((*id, value)),
            (Some(value), false) => insert.push((*id, value)),
            (None, true) => delete.push(*id),
            (None, false) => {}
        }
    }
    upsert(conn, &update, true, now).await?;
    let inserted = upsert(conn, &insert, false, now).await?;
    if inserted != insert.len() as u64 {
        return Err(QueueError::Conflict(
            "a state key was written by another transaction meanwhile".into(),
        ));
    }
    for chunk in delete.chunks(CHUNK) {
        let text = format!(
            "DELETE FROM wharf_state WHERE (bucket, key) IN (VALUES {})",
            pairs(chunk.len(), 1)
        );
        let mut query = conn.query(text);
        for (bucket, key) in chunk {
            query = query.bind(bucket.as_str()).bind(key.as_str());
        }
        query.execute().await?;
    }
    Ok(())
}

/// Insert `rows`; with `replace`, over the existing ones, otherwise only where absent.
/// Returns how many rows were written.
async fn upsert(
    conn: &mut Conn<'_>,
    rows: &[(&Id, &Vec<u8>)],
    replace: bool,
    now: i64,
) -> Result<u64, QueueError> {
    // Four texts in all (dialect, replace or not): each stays prepared.
    let postgres = conn.dialect() == Dialect::Postgres;
    let text = match (conn.dialect(), replace) {
        (Dialect::Postgres, true) => upsert_postgres!(REPLACE!()),
        (Dialect::Postgres, false) => upsert_postgres!("DO NOTHING"),
        (Dialect::Sqlite, true) => upsert_sqlite!(REPLACE!()),
        (Dialect::Sqlite, false) => upsert_sqlite!("DO NOTHING"),
    };
    let mut written = 0;
    for chunk in by_size(rows) {
        let query = conn.query(text);
        let query = if postgres {
            let mut columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for ((bucket, key), value) in chunk {
                columns.0.push(bucket.as_str());
                columns.1.push(key.as_str());
                columns.2.push(value.as_slice());
                columns.3.push(new_revision());
            }
            query
                .bind_postgres(columns.0)
                .bind_postgres(columns.1)
                .bind_postgres(columns.2)
                .bind_postgres(columns.3)
        } else {
            // The values as one blob, each row `[bucket, key, offset, length, revision]`.
            let mut blob = Vec::new();
            let mut list = Vec::with_capacity(chunk.len());
            for ((bucket, key), value) in chunk {
                list.push(serde_json::json!([
                    bucket,
                    key,
                    blob.len(),
                    value.len(),
                    new_revision()
                ]));
                blob.extend_from_slice(value);
            }
            query
                .bind(serde_json::Value::Array(list).to_string())
                .bind(blob)
        };
        written += query.bind(now).execute().await?;
    }
    Ok(written)
}

/// `rows` in chunks of at most [`CHUNK`] rows and 64 MiB of values.
fn by_size<'r, 'a>(rows: &'r [(&'a Id, &'a Vec<u8>)]) -> Vec<&'r [(&'a Id, &'a Vec<u8>)]> {
    const MAX_BYTES: usize = 64 << 20;
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (_, value)) in rows.iter().enumerate() {
        if i > start && (i - start == CHUNK || bytes + value.len() > MAX_BYTES) {
            chunks.push(&rows[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += value.len();
    }
    if start < rows.len() {
        chunks.push(&rows[start..]);
    }
    chunks
}

/// Delete `bucket`/`key` (an operator's command); returns whether it existed.
pub(crate) async fn delete(pool: &Pool, bucket: &str, key: &str) -> Result<bool, QueueError> {
    const DELETE: Sql = Sql::both("DELETE FROM wharf_state WHERE bucket = $1 AND key = $2");
    Ok(pool.query(&DELETE).bind(bucket).bind(key).execute().await? > 0)
}
