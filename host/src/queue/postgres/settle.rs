//! Settlements on PostgreSQL: the statements of a settlement ([`SettleStatements`]), where
//! completions that keep their message are one `UPDATE … FROM UNNEST` for the whole batch,
//! and the common batch — only such completions, with their inbox records — as one statement
//! outside a transaction ([`settle_batch`]).

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use super::record_history;
use super::statements::{
    APPLY_NEXT, COMPLETE_MANY, COMPLETED_UNDER, DELETE_LEASED, FAIL, RELEASE, RETRY,
    complete_recording_inbox,
};
use crate::queue::sessions::HAND_OFF;
use crate::queue::settle::{SettleStatements, plain_completions, settle};
use crate::queue::{InboxWrite, Lease, QueueError, SettleResult, Settlement, record_postgres};

/// Apply `settlements` on `pool`; results in input order. A batch of plain completions
/// ([`plain_completions`]) is one statement, so one round trip where `BEGIN`, the inbox
/// records, the update and `COMMIT` took four: the settlement task waits for each batch, so
/// every round trip saved is throughput. Its messages that it did not complete (re-enqueued
/// while leased, or leased no more) are then settled as any batch is, their inbox records
/// already written (a record follows the handler's success, not the lease).
pub(super) async fn settle_batch(
    pool: &PgPool,
    settlements: &[Settlement],
    now: i64,
) -> Result<Vec<SettleResult>, QueueError> {
    let Some(inbox) = plain_completions(settlements) else {
        return in_transaction(pool, settlements, now).await;
    };
    let completes: Vec<&Settlement> = settlements.iter().collect();
    let done = complete(&mut *pool.acquire().await?, &completes, inbox.as_ref(), now).await?;
    let rest: Vec<Settlement> = settlements
        .iter()
        .filter(|s| !done.contains(&s.lease))
        .map(|s| Settlement {
            inbox: None,
            ..s.clone()
        })
        .collect();
    let mut rest = if rest.is_empty() {
        Vec::new()
    } else {
        in_transaction(pool, &rest, now).await?
    }
    .into_iter();
    Ok(settlements
        .iter()
        .map(|s| match done.contains(&s.lease) {
            true => SettleResult::Applied,
            false => rest.next().unwrap_or(SettleResult::LeaseLost),
        })
        .collect())
}

async fn in_transaction(
    pool: &PgPool,
    settlements: &[Settlement],
    now: i64,
) -> Result<Vec<SettleResult>, QueueError> {
    let mut tx = pool.begin().await?;
    let results = settle(&mut PgSettle { conn: &mut tx }, settlements, now).await?;
    tx.commit().await?;
    Ok(results)
}

/// Complete `completes` (kept, with their outcome) and write `inbox` in one statement;
/// returns the leases done.
async fn complete(
    conn: &mut PgConnection,
    completes: &[&Settlement],
    inbox: Option<&InboxWrite>,
    now: i64,
) -> Result<HashSet<Lease>, QueueError> {
    let keys: Vec<i64> = completes.iter().map(|s| s.lease.key).collect();
    let tokens: Vec<i64> = completes.iter().map(|s| s.lease.token).collect();
    let outcomes: Vec<Option<&str>> = completes.iter().map(|s| s.outcome.as_deref()).collect();
    let sql = match inbox {
        Some(write) => complete_recording_inbox(&write.table),
        None => COMPLETE_MANY.to_string(),
    };
    let mut query = sqlx::query_as::<_, (i64, i64)>(AssertSqlSafe(sql))
        .bind(now)
        .bind(&keys)
        .bind(&tokens)
        .bind(&outcomes);
    if let Some(write) = inbox {
        let hashes: Vec<&[u8]> = write.rows.iter().map(|k| &k.hash[..]).collect();
        let endpoints: Vec<&str> = write.rows.iter().map(|k| k.endpoint.as_str()).collect();
        let ids: Vec<&str> = write.rows.iter().map(|k| k.message_id.as_str()).collect();
        query = query
            .bind(now + write.retention_ms)
            .bind(hashes)
            .bind(endpoints)
            .bind(ids);
    }
    let done = query.fetch_all(conn).await?;
    Ok(done
        .into_iter()
        .map(|(key, token)| Lease { key, token })
        .collect())
}

/// The statements of a settlement on one PostgreSQL connection, in a transaction.
pub(super) struct PgSettle<'c> {
    pub conn: &'c mut PgConnection,
}

#[async_trait]
impl SettleStatements for PgSettle<'_> {
    async fn record_inbox(&mut self, write: &InboxWrite) -> Result<(), QueueError> {
        Ok(record_postgres(&mut *self.conn, write).await?)
    }

    async fn complete_kept(
        &mut self,
        completes: &[&Settlement],
        now: i64,
    ) -> Result<HashSet<Lease>, QueueError> {
        complete(&mut *self.conn, completes, None, now).await
    }

    async fn record_history(
        &mut self,
        lease: Lease,
        status: &str,
        error: Option<&str>,
        only_in: &str,
        now: i64,
    ) -> Result<(), QueueError> {
        record_history(
            &mut *self.conn,
            now,
            Some(status),
            error,
            lease.key,
            Some(lease.token),
            Some(only_in),
        )
        .await
    }

    async fn delete_leased(&mut self, lease: Lease) -> Result<bool, QueueError> {
        let done = sqlx::query(DELETE_LEASED)
            .bind(lease.key)
            .bind(lease.token)
            .execute(&mut *self.conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn retry(
        &mut self,
        lease: Lease,
        at_ms: i64,
        error: Option<&str>,
        now: i64,
    ) -> Result<bool, QueueError> {
        let done = sqlx::query(RETRY)
            .bind(now)
            .bind(at_ms)
            .bind(error)
            .bind(lease.key)
            .bind(lease.token)
            .execute(&mut *self.conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn fail(&mut self, lease: Lease, error: &str, now: i64) -> Result<bool, QueueError> {
        let done = sqlx::query(FAIL)
            .bind(now)
            .bind(error)
            .bind(lease.key)
            .bind(lease.token)
            .execute(&mut *self.conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&mut self, lease: Lease, now: i64) -> Result<bool, QueueError> {
        let done = sqlx::query(RELEASE)
            .bind(now)
            .bind(lease.key)
            .bind(lease.token)
            .execute(&mut *self.conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn apply_next(&mut self, lease: Lease, now: i64) -> Result<bool, QueueError> {
        let done = sqlx::query(APPLY_NEXT)
            .bind(now)
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(lease.key)
            .bind(lease.token)
            .bind(None::<String>)
            .execute(&mut *self.conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn completed_under(&mut self, lease: Lease) -> Result<bool, QueueError> {
        let found = sqlx::query(COMPLETED_UNDER)
            .bind(lease.key)
            .bind(lease.token)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(found.is_some())
    }

    async fn hand_off(&mut self, lease: Lease, now: i64) -> Result<bool, QueueError> {
        let done = sqlx::query(HAND_OFF)
            .bind(now)
            .bind(lease.key)
            .bind(lease.token)
            .execute(&mut *self.conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn tend_sessions(
        &mut self,
        queue: &str,
        sessions: &str,
        now: i64,
    ) -> Result<(), QueueError> {
        super::sessions::tend(&mut *self.conn, queue, Some(sessions), now).await
    }
}
