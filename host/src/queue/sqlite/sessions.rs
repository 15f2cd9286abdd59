//! Ordered sessions on SQLite ([`crate::queue::sessions`] holds the rules and the SQL):
//! tending sessions in the caller's transaction, leasing only session heads, settling
//! handoffs and listing blocked sessions.

use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use super::statements::{TEND, lease};
use crate::queue::rows::{decode_headers, leased_in_order};
use crate::queue::sessions::session_commands;
use crate::queue::{InboxProbe, Lease, LeasedMessage, QueueError, now_ms};

session_commands!(SqliteStore, SqliteConnection, TEND);

impl SqliteStore {
    /// Lease session heads (see [`crate::queue::QueueStore::lease_in_sessions`]).
    pub(super) async fn lease_heads(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: Option<&InboxProbe>,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        let now = now_ms();
        // SQLite's leases do not check the inbox (the pipeline checks it).
        let _ = inbox;
        let rows = sqlx::query(lease(true))
            .bind(now + lease_ms)
            .bind(now)
            .bind(queue)
            .bind(max as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(leased_in_order!(rows))
    }
}
