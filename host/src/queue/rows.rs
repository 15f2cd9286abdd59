//! Reading rows of the `messages` and `message_history` tables (their column names and value
//! types line up in both dialects), and the order a lease returns them in.

use super::{HistoryEntry, Lease, LeasedMessage, NextVersion, QueueError, Status, StoredMessage};
use crate::sql::Row;

pub(crate) fn encode_headers(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).unwrap_or_else(|_| "[]".into())
}

pub(crate) fn decode_headers(text: &str) -> Result<Vec<(String, String)>, QueueError> {
    serde_json::from_str(text).map_err(|e| QueueError::Corrupt {
        what: "headers",
        reason: e.to_string(),
    })
}

/// Read a full `messages` row.
pub(crate) fn stored(row: &Row) -> Result<StoredMessage, QueueError> {
    let next = match row.get::<Option<String>, _>("next_payload")? {
        Some(payload) => Some(NextVersion {
            payload,
            priority: row.get::<Option<i32>, _>("next_priority")?.unwrap_or(0),
            process_at_ms: row
                .get::<Option<i64>, _>("next_process_at_ms")?
                .unwrap_or(0),
            status: row.get("next_status")?,
        }),
        None => None,
    };
    Ok(StoredMessage {
        key: row.get("key")?,
        queue: row.get("queue")?,
        id: row.get("message_id")?,
        delivery_id: row.get("delivery_id")?,
        status: Status::parse(row.get::<&str, _>("status")?),
        payload: row.get("payload")?,
        headers: decode_headers(row.get::<&str, _>("headers")?)?,
        priority: row.get("priority")?,
        attempts: row.get::<i32, _>("attempts")? as u32,
        process_at_ms: row.get("process_at_ms")?,
        created_at_ms: row.get("created_at_ms")?,
        enqueued_at_ms: row.get("enqueued_at_ms")?,
        updated_at_ms: row.get("updated_at_ms")?,
        processed_at_ms: row.get("processed_at_ms")?,
        lease_expires_at_ms: row.get("lease_expires_at_ms")?,
        last_error: row.get("last_error")?,
        version: row.get("version")?,
        outcome: row.get("outcome")?,
        source_delivery_id: row.get("source_delivery_id")?,
        session: row.get("session_key")?,
        next,
    })
}

/// Read a `message_history` row.
pub(crate) fn history(row: &Row) -> Result<HistoryEntry, QueueError> {
    Ok(HistoryEntry {
        queue: row.get("queue")?,
        id: row.get("message_id")?,
        message_key: row.get("message_key")?,
        version: row.get("version")?,
        delivery_id: row.get("delivery_id")?,
        payload: row.get("payload")?,
        headers: decode_headers(row.get::<&str, _>("headers")?)?,
        priority: row.get("priority")?,
        status: Status::parse(row.get::<&str, _>("status")?),
        attempts: row.get::<i32, _>("attempts")? as u32,
        last_error: row.get("last_error")?,
        enqueued_at_ms: row.get("enqueued_at_ms")?,
        processed_at_ms: row.get("processed_at_ms")?,
        recorded_at_ms: row.get("recorded_at_ms")?,
    })
}

/// Read the rows a lease statement returned, in lease order (priority, date, key):
/// `RETURNING` does not keep the order of the sub-select that chose them.
pub(crate) fn leased_in_order(rows: &[Row]) -> Result<Vec<LeasedMessage>, QueueError> {
    let mut leased = Vec::with_capacity(rows.len());
    for row in rows {
        let order = (
            -row.get::<i32, _>("priority")?,
            row.get::<i64, _>("process_at_ms")?,
            row.get::<i64, _>("key")?,
        );
        leased.push((
            order,
            LeasedMessage {
                lease: Lease {
                    key: row.get("key")?,
                    token: row.get("lease_token")?,
                },
                queue: row.get("queue")?,
                id: row.get("message_id")?,
                delivery_id: row.get("delivery_id")?,
                payload: row.get("payload")?,
                priority: row.get("priority")?,
                attempt: row.get::<i32, _>("attempts")? as u32,
                enqueued_at_ms: row.get("enqueued_at_ms")?,
                headers: decode_headers(row.get("headers")?)?,
                source_delivery_id: row.get("source_delivery_id")?,
                inbox_processed: row.get::<Option<bool>, _>("inbox_processed").ok().flatten(),
                session: row.get("session_key")?,
            },
        ));
    }
    leased.sort_by_key(|(order, _)| *order);
    Ok(leased.into_iter().map(|(_, m)| m).collect())
}
