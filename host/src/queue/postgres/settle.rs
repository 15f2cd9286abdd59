//! The PostgreSQL statements of a settlement ([`SettleStatements`]); completions that keep
//! their message are one `UPDATE … FROM UNNEST` for the whole batch.

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::PgConnection;

use super::record_history;
use super::statements::{APPLY_NEXT, COMPLETE_MANY, DELETE_LEASED, FAIL, RELEASE, RETRY};
use crate::queue::sessions::HAND_OFF;
use crate::queue::settle::SettleStatements;
use crate::queue::{InboxWrite, Lease, QueueError, Settlement, record_postgres};

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
        let keys: Vec<i64> = completes.iter().map(|s| s.lease.key).collect();
        let tokens: Vec<i64> = completes.iter().map(|s| s.lease.token).collect();
        let outcomes: Vec<Option<&str>> = completes.iter().map(|s| s.outcome.as_deref()).collect();
        let done = sqlx::query_as::<_, (i64, i64)>(COMPLETE_MANY)
            .bind(now)
            .bind(&keys)
            .bind(&tokens)
            .bind(&outcomes)
            .fetch_all(&mut *self.conn)
            .await?;
        Ok(done
            .into_iter()
            .map(|(key, token)| Lease { key, token })
            .collect())
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
