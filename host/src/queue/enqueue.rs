//! Enqueueing, once for every SQL dialect: a batch of messages is applied inside one
//! transaction with the identity rules of [`super::plan`]. Only the multi-row insert and the
//! locks on ids differ between dialects (`postgres/`, `sqlite/`); the order of the steps
//! lives here.
//!
//! A batch is cut into rounds in which no id repeats. Each round is one multi-row insert
//! that skips ids already stored; a message whose id was taken is then applied to the stored
//! message one by one (discard, defer behind the lease, or replace). So the same id twice in
//! one batch is applied in batch order, exactly as two single enqueues would be.

use std::collections::HashMap;

use super::prepared::Prepared;
use super::sessions::{self, by_queue};
use super::statements::{DEFER, RECORD_HISTORY, REPLACE, SELECT_EXISTING};
use super::{EnqueueStatus, Enqueued, Existing, Plan, QueueError, Status, plan};
use super::{postgres, sqlite};
use crate::sql::Conn;

/// Messages per multi-row insert and per transaction (SQLite binds 15 values a row, within
/// its limit of 32,766).
pub(crate) const ROUND_ROWS: usize = 1000;

/// Most payload bytes per transaction: a batch of large messages is cut earlier, so no
/// statement carries hundreds of megabytes.
pub(crate) const TRANSACTION_BYTES: usize = 16 << 20;

/// Most messages with an id per transaction: PostgreSQL takes one advisory lock per id, and
/// its lock table is shared by every connection (64 per connection by default).
pub(crate) const TRANSACTION_IDS: usize = 250;

/// How many of the first `items` one enqueue transaction takes: at most [`ROUND_ROWS`]
/// messages, [`TRANSACTION_IDS`] of them with an id and, unless the first alone is larger,
/// [`TRANSACTION_BYTES`] of payload. At least one of a non-empty slice.
pub(crate) fn transaction_len<T>(
    items: &[T],
    payload_len: impl Fn(&T) -> usize,
    has_id: impl Fn(&T) -> bool,
) -> usize {
    let (mut bytes, mut ids) = (0, 0);
    for (n, item) in items.iter().enumerate() {
        bytes += payload_len(item);
        ids += usize::from(has_id(item));
        if n > 0 && (n == ROUND_ROWS || bytes > TRANSACTION_BYTES || ids > TRANSACTION_IDS) {
            return n;
        }
    }
    items.len()
}

/// `messages` cut into transactions (see [`transaction_len`]).
pub(crate) fn transactions(mut messages: &[Prepared]) -> Vec<&[Prepared]> {
    let mut cuts = Vec::new();
    while !messages.is_empty() {
        let n = transaction_len(
            messages,
            |m| m.message.payload.len(),
            |m| m.message.id.is_some(),
        );
        let (first, rest) = messages.split_at(n);
        cuts.push(first);
        messages = rest;
    }
    cuts
}

/// `items` cut in order into runs of at most `max_items` items and `max_bytes` (by `size`);
/// an item larger than `max_bytes` is a run of its own.
pub(crate) fn cut<T>(
    items: &[T],
    max_items: usize,
    max_bytes: usize,
    size: impl Fn(&T) -> usize,
) -> Vec<&[T]> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (n, item) in items.iter().enumerate() {
        let item_size = size(item);
        if n > start && (n - start == max_items || bytes + item_size > max_bytes) {
            runs.push(&items[start..n]);
            (start, bytes) = (n, 0);
        }
        bytes += item_size;
    }
    if start < items.len() {
        runs.push(&items[start..]);
    }
    runs
}

/// What a batch did.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// One result per message, in batch order.
    pub results: Vec<Enqueued>,
    /// Whether some message is now ready to lease (processors elsewhere should wake).
    pub ready: bool,
}

/// Apply `messages` to `queue` in order on `conn` (in the caller's transaction when they
/// hold ids).
pub(crate) async fn apply(
    conn: &mut Conn<'_>,
    queue: &str,
    messages: &[Prepared],
    idempotent: bool,
    now: i64,
) -> Result<Applied, QueueError> {
    let mut applied = Applied {
        results: Vec::with_capacity(messages.len()),
        ready: false,
    };
    let ids: Vec<&str> = messages
        .iter()
        .filter_map(|m| m.message.id.as_deref())
        .collect();
    if let (false, Conn::Postgres(pg)) = (ids.is_empty(), &mut *conn) {
        postgres::lock_ids(pg, queue, ids).await?;
    }
    let mut start = 0;
    while start < messages.len() {
        let end = round_end(messages, start);
        let round: Vec<&Prepared> = messages[start..end].iter().collect();
        let keys = insert_new(conn, queue, &round, now).await?;
        for (message, key) in round.into_iter().zip(keys) {
            let (done, ready) = match key {
                Some(key) => (
                    Enqueued {
                        key,
                        status: EnqueueStatus::Added,
                    },
                    message.status == Status::Pending,
                ),
                None => apply_to_stored(conn, queue, message, idempotent, now).await?,
            };
            applied.ready |= ready;
            applied.results.push(done);
        }
        start = end;
    }
    let sessions = messages
        .iter()
        .filter_map(|m| Some((queue, m.message.session.as_deref()?)));
    for (queue, sessions) in by_queue(sessions) {
        sessions::park(conn, queue, &sessions, now).await?;
    }
    Ok(applied)
}

/// The end of the round starting at `start`: at most [`ROUND_ROWS`] messages, no id twice.
fn round_end(messages: &[Prepared], start: usize) -> usize {
    let mut seen: HashMap<&str, ()> = HashMap::new();
    let mut end = start;
    while end < messages.len() && end - start < ROUND_ROWS {
        if let Some(id) = messages[end].message.id.as_deref()
            && seen.insert(id, ()).is_some()
        {
            break;
        }
        end += 1;
    }
    end
}

/// Apply `message`, whose id is taken, to the stored message. A stored message removed in
/// between (retention) makes it a new insert again.
async fn apply_to_stored(
    conn: &mut Conn<'_>,
    queue: &str,
    message: &Prepared,
    idempotent: bool,
    now: i64,
) -> Result<(Enqueued, bool), QueueError> {
    let id = message.message.id.as_deref().unwrap_or_default();
    for _ in 0..3 {
        let Some((key, existing)) = existing(conn, queue, id).await? else {
            if let Some(Some(key)) = insert_new(conn, queue, &[message], now).await?.pop() {
                let added = Enqueued {
                    key,
                    status: EnqueueStatus::Added,
                };
                return Ok((added, message.status == Status::Pending));
            }
            continue;
        };
        let (status, ready) = match plan(&existing, &message.hash, idempotent) {
            Plan::Discard => (EnqueueStatus::Discarded, false),
            Plan::Defer => {
                defer(conn, key, message, now).await?;
                (EnqueueStatus::Updated, false)
            }
            Plan::Replace => {
                replace(conn, key, message, now).await?;
                (EnqueueStatus::Updated, message.status == Status::Pending)
            }
        };
        return Ok((Enqueued { key, status }, ready));
    }
    Err(QueueError::Conflict(format!(
        "message `{id}` in queue `{queue}` kept changing; try again"
    )))
}

/// Insert every message of `round` (no two share an id) whose id is not stored yet in
/// `queue`, in one statement; returns each one's new key by position, `None` where the id
/// was taken.
async fn insert_new(
    conn: &mut Conn<'_>,
    queue: &str,
    round: &[&Prepared],
    now: i64,
) -> Result<Vec<Option<i64>>, QueueError> {
    let returned = match conn {
        Conn::Postgres(pg) => postgres::insert_new(pg, queue, round, now).await?,
        Conn::Sqlite(lite) => sqlite::insert_new(lite, queue, round, now).await?,
    };
    Ok(keys_by_position(round, returned))
}

/// The stored message with `id` in `queue`, locked until the transaction ends.
async fn existing(
    conn: &mut Conn<'_>,
    queue: &str,
    id: &str,
) -> Result<Option<(i64, Existing)>, QueueError> {
    let found = conn.query(&SELECT_EXISTING).bind(queue).bind(id);
    let Some(row) = found.fetch_optional().await? else {
        return Ok(None);
    };
    let existing = Existing {
        status: Status::parse(row.get::<&str, _>("status")?),
        payload_hash: row.get("payload_hash")?,
        next_payload_hash: row.get("next_payload_hash")?,
    };
    Ok(Some((row.get("key")?, existing)))
}

/// Keep the leased version of message `key` and store `m` for after its release.
async fn defer(conn: &mut Conn<'_>, key: i64, m: &Prepared, now: i64) -> Result<(), QueueError> {
    conn.query(&DEFER)
        .bind(m.delivery_id.as_str())
        .bind(m.message.payload.as_str())
        .bind(m.hash.as_str())
        .bind(m.headers.as_str())
        .bind(m.message.priority)
        .bind(m.at)
        .bind(m.custom_status())
        .bind(now)
        .bind(key)
        .bind(m.message.attempts as i32)
        .bind(m.message.last_error.as_deref())
        .bind(m.message.source_delivery_id.as_deref())
        .execute()
        .await?;
    Ok(())
}

/// Record the live version of message `key` in history and overwrite it with `m`.
async fn replace(conn: &mut Conn<'_>, key: i64, m: &Prepared, now: i64) -> Result<(), QueueError> {
    conn.query(&RECORD_HISTORY)
        .bind(now)
        .bind(None::<String>)
        .bind(None::<String>)
        .bind(key)
        .bind(None::<i64>)
        .bind(None::<String>)
        .execute()
        .await?;
    conn.query(&REPLACE)
        .bind(m.delivery_id.as_str())
        .bind(m.message.payload.as_str())
        .bind(m.hash.as_str())
        .bind(m.headers.as_str())
        .bind(m.message.priority)
        .bind(m.status.as_str())
        .bind(m.at)
        .bind(now)
        .bind(key)
        .bind(m.message.last_error.as_deref())
        .bind(m.message.source_delivery_id.as_deref())
        .bind(m.message.attempts as i32)
        .bind(m.message.session.as_deref())
        .execute()
        .await?;
    Ok(())
}

/// Map the `(key, delivery_id)` pairs an insert returned back to the positions of `round`.
fn keys_by_position(round: &[&Prepared], returned: Vec<(i64, String)>) -> Vec<Option<i64>> {
    let mut by_delivery: HashMap<String, i64> = returned
        .into_iter()
        .map(|(key, delivery)| (delivery, key))
        .collect();
    round
        .iter()
        .map(|m| by_delivery.remove(&m.delivery_id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::NewMessage;

    fn prepared(id: Option<&str>) -> Prepared {
        Prepared::new(
            NewMessage {
                id: id.map(Into::into),
                payload: "{}".into(),
                ..NewMessage::default()
            },
            1,
        )
    }

    #[test]
    fn rounds_end_before_a_repeated_id() {
        let batch = vec![
            prepared(Some("a")),
            prepared(None),
            prepared(Some("b")),
            prepared(None),
            prepared(Some("a")),
            prepared(Some("b")),
        ];
        assert_eq!(round_end(&batch, 0), 4);
        assert_eq!(round_end(&batch, 4), 6);
        let many: Vec<Prepared> = (0..ROUND_ROWS + 5).map(|_| prepared(None)).collect();
        assert_eq!(round_end(&many, 0), ROUND_ROWS);
        assert_eq!(round_end(&many, ROUND_ROWS), ROUND_ROWS + 5);
    }

    #[test]
    fn transactions_are_bounded_by_rows_and_bytes() {
        let small: Vec<Prepared> = (0..2500).map(|_| prepared(None)).collect();
        let sizes: Vec<usize> = transactions(&small).iter().map(|t| t.len()).collect();
        assert_eq!(sizes, vec![1000, 1000, 500]);
        let ids: Vec<Prepared> = (0..600).map(|n| prepared(Some(&n.to_string()))).collect();
        let sizes: Vec<usize> = transactions(&ids).iter().map(|t| t.len()).collect();
        assert_eq!(sizes, vec![250, 250, 100], "ids are bounded on their own");
        let big = |mib: usize| {
            Prepared::new(
                NewMessage {
                    payload: format!("\"{}\"", "x".repeat((mib << 20) - 2)),
                    ..NewMessage::default()
                },
                1,
            )
        };
        let large = vec![big(6), big(6), big(6), big(20), big(1)];
        let sizes: Vec<usize> = transactions(&large).iter().map(|t| t.len()).collect();
        assert_eq!(
            sizes,
            vec![2, 1, 1, 1],
            "16 MiB each, a larger message alone"
        );
        assert!(transactions(&[]).is_empty());
    }

    #[test]
    fn returned_keys_find_their_messages() {
        let batch = [prepared(Some("a")), prepared(Some("b")), prepared(None)];
        let round: Vec<&Prepared> = batch.iter().collect();
        let returned = vec![
            (9, batch[2].delivery_id.clone()),
            (7, batch[0].delivery_id.clone()),
        ];
        assert_eq!(
            keys_by_position(&round, returned),
            vec![Some(7), None, Some(9)]
        );
    }
}
