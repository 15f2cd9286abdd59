//! Ordered sessions on PostgreSQL ([`crate::queue::sessions`] holds the rules and the SQL):
//! tending sessions in the caller's transaction, leasing only session heads, settling
//! handoffs and listing blocked sessions.

use sqlx::{PgConnection, Row};

use super::PostgresStore;
use super::statements::{TEND, lease};
use crate::queue::rows::{decode_headers, leased_in_order};
use crate::queue::sessions::session_commands;
use crate::queue::{InboxProbe, Lease, LeasedMessage, QueueError, now_ms};

session_commands!(PostgresStore, PgConnection, TEND);

impl PostgresStore {
    /// Lease session heads (see [`crate::queue::QueueStore::lease_in_sessions`]).
    pub(super) async fn lease_heads(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: Option<&InboxProbe>,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        let now = now_ms();
        let rows = match inbox {
            Some(probe) => {
                let sql = super::statements::lease_checking_inbox(&probe.table, true);
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(now + lease_ms)
                    .bind(now)
                    .bind(queue)
                    .bind(max as i64)
                    .bind(&probe.endpoint)
                    .fetch_all(&self.lease_pool)
                    .await?
            }
            None => {
                sqlx::query(lease(true))
                    .bind(now + lease_ms)
                    .bind(now)
                    .bind(queue)
                    .bind(max as i64)
                    .fetch_all(&self.lease_pool)
                    .await?
            }
        };
        self.upkeep.leased(rows.len());
        Ok(leased_in_order!(rows))
    }
}
