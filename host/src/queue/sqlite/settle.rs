//! The SQLite statements of a settlement ([`SettleStatements`]): completions together in one
//! statement, every other outcome one statement per message.

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::SqliteConnection;

use super::statements::{
    APPLY_NEXT, COMPLETE_MANY, COMPLETED_UNDER, DELETE_LEASED, FAIL, RECORD_HISTORY, RELEASE, RETRY,
};
use crate::queue::sessions::HAND_OFF;
use crate::queue::settle::SettleStatements;
use crate::queue::{InboxWrite, Lease, QueueError, Settlement, record_sqlite};

/// The statements of a settlement on one SQLite connection, in a transaction.
pub(super) struct SqliteSettle<'c> {
    pub conn: &'c mut SqliteConnection,
}

#[async_trait]
impl SettleStatements for SqliteSettle<'_> {
    async fn record_inbox(&mut self, write: &InboxWrite) -> Result<(), QueueError> {
        Ok(record_sqlite(&mut *self.conn, write).await?)
    }

    async fn complete_kept(
        &mut self,
        completes: &[&Settlement],
        now: i64,
    ) -> Result<HashSet<Lease>, QueueError> {
        let done: Vec<(i64, i64, Option<&str>)> = completes
            .iter()
            .map(|s| (s.lease.key, s.lease.token, s.outcome.as_deref()))
            .collect();
        let done = serde_json::to_string(&done).expect("leases serialize");
        let completed = sqlx::query_as::<_, (i64, i64)>(COMPLETE_MANY)
            .bind(now)
            .bind(done)
            .fetch_all(&mut *self.conn)
            .await?;
        Ok(completed
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
        sqlx::query(RECORD_HISTORY)
            .bind(now)
            .bind(status)
            .bind(error)
            .bind(lease.key)
            .bind(lease.token)
            .bind(only_in)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
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
