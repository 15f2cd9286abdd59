//! Reading rows of the `messages` and `message_history` tables, and the lease that returns
//! them ([`fetch_lease`]), shared by the SQLite and PostgreSQL stores (their column names
//! and value types line up).

use super::QueueError;

pub(crate) fn encode_headers(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).unwrap_or_else(|_| "[]".into())
}

pub(crate) fn decode_headers(text: &str) -> Result<Vec<(String, String)>, QueueError> {
    serde_json::from_str(text).map_err(|e| QueueError::Corrupt {
        what: "headers",
        reason: e.to_string(),
    })
}

/// Read a full `messages` row (works for SQLite and PostgreSQL rows alike).
macro_rules! stored_from_row {
    ($row:expr) => {{
        let row = $row;
        let next = match row.try_get::<Option<String>, _>("next_payload")? {
            Some(payload) => Some(NextVersion {
                payload,
                priority: row.try_get::<Option<i32>, _>("next_priority")?.unwrap_or(0),
                process_at_ms: row
                    .try_get::<Option<i64>, _>("next_process_at_ms")?
                    .unwrap_or(0),
                status: row.try_get("next_status")?,
            }),
            None => None,
        };
        Ok::<_, QueueError>(StoredMessage {
            key: row.try_get("key")?,
            queue: row.try_get("queue")?,
            id: row.try_get("message_id")?,
            delivery_id: row.try_get("delivery_id")?,
            status: Status::parse(&row.try_get::<String, _>("status")?),
            payload: row.try_get("payload")?,
            headers: decode_headers(&row.try_get::<String, _>("headers")?)?,
            priority: row.try_get("priority")?,
            attempts: row.try_get::<i32, _>("attempts")? as u32,
            process_at_ms: row.try_get("process_at_ms")?,
            created_at_ms: row.try_get("created_at_ms")?,
            enqueued_at_ms: row.try_get("enqueued_at_ms")?,
            updated_at_ms: row.try_get("updated_at_ms")?,
            processed_at_ms: row.try_get("processed_at_ms")?,
            lease_expires_at_ms: row.try_get("lease_expires_at_ms")?,
            last_error: row.try_get("last_error")?,
            version: row.try_get("version")?,
            outcome: row.try_get("outcome")?,
            source_delivery_id: row.try_get("source_delivery_id")?,
            session: row.try_get("session_key")?,
            next,
        })
    }};
}

/// Read a `message_history` row (SQLite and PostgreSQL alike).
macro_rules! history_from_row {
    ($row:expr) => {{
        let row = $row;
        Ok::<_, QueueError>(HistoryEntry {
            queue: row.try_get("queue")?,
            id: row.try_get("message_id")?,
            message_key: row.try_get("message_key")?,
            version: row.try_get("version")?,
            delivery_id: row.try_get("delivery_id")?,
            payload: row.try_get("payload")?,
            headers: decode_headers(&row.try_get::<String, _>("headers")?)?,
            priority: row.try_get("priority")?,
            status: Status::parse(&row.try_get::<String, _>("status")?),
            attempts: row.try_get::<i32, _>("attempts")? as u32,
            last_error: row.try_get("last_error")?,
            enqueued_at_ms: row.try_get("enqueued_at_ms")?,
            processed_at_ms: row.try_get("processed_at_ms")?,
            recorded_at_ms: row.try_get("recorded_at_ms")?,
        })
    }};
}
/// Read the rows a lease statement returned, in lease order (priority, date, key):
/// `RETURNING` does not keep the order of the sub-select that chose them.
macro_rules! leased_in_order {
    ($rows:expr) => {{
        let mut leased = Vec::with_capacity($rows.len());
        for row in $rows.iter() {
            let order = (
                -row.try_get::<i32, _>("priority")?,
                row.try_get::<i64, _>("process_at_ms")?,
                row.try_get::<i64, _>("key")?,
            );
            leased.push((
                order,
                LeasedMessage {
                    lease: Lease {
                        key: row.try_get("key")?,
                        token: row.try_get("lease_token")?,
                    },
                    queue: row.try_get("queue")?,
                    id: row.try_get("message_id")?,
                    delivery_id: row.try_get("delivery_id")?,
                    payload: row.try_get("payload")?,
                    priority: row.try_get("priority")?,
                    attempt: row.try_get::<i32, _>("attempts")? as u32,
                    enqueued_at_ms: row.try_get("enqueued_at_ms")?,
                    headers: decode_headers(row.try_get("headers")?)?,
                    source_delivery_id: row.try_get("source_delivery_id")?,
                    inbox_processed: row
                        .try_get::<Option<bool>, _>("inbox_processed")
                        .ok()
                        .flatten(),
                    session: row.try_get("session_key")?,
                },
            ));
        }
        leased.sort_by_key(|(order, _)| *order);
        leased
            .into_iter()
            .map(|(_, m)| m)
            .collect::<Vec<LeasedMessage>>()
    }};
}

/// Lease up to `$max` messages of `$queue` for `$lease_ms` through `$pool`: session heads
/// when `$sessions`, any ready messages otherwise, each checked against the inbox table of
/// `$inbox` (an `Option<&InboxProbe>`) when given. `$lease` and `$checking` are the dialect's
/// statement builders (`lease(sessions)`, `lease_checking_inbox(table, sessions)`, binding
/// the lease's end, now, the queue, the limit and, for the check, the endpoint). Returns the
/// rows, read with [`leased_in_order`].
macro_rules! fetch_lease {
    ($pool:expr, $lease:path, $checking:path, $queue:expr, $max:expr, $lease_ms:expr, $inbox:expr, $sessions:expr) => {{
        let now = $crate::queue::now_ms();
        let inbox: Option<&$crate::queue::InboxProbe> = $inbox;
        let sql: std::borrow::Cow<'static, str> = match inbox {
            Some(probe) => $checking(&probe.table, $sessions).into(),
            None => $lease($sessions).into(),
        };
        let query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now + $lease_ms)
            .bind(now)
            .bind($queue)
            .bind($max as i64);
        match inbox {
            Some(probe) => query.bind(&probe.endpoint),
            None => query,
        }
        .fetch_all($pool)
        .await?
    }};
}

pub(crate) use {fetch_lease, history_from_row, leased_in_order, stored_from_row};
