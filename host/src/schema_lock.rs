//! Creating PostgreSQL schemas and tables when several hosts start at the same moment (the
//! queue's schema, the inbox table): one advisory lock serialises it.

use sqlx::PgPool;

/// Run `statements` (`CREATE … IF NOT EXISTS`) in one transaction under a database-wide
/// advisory lock: PostgreSQL's `IF NOT EXISTS` does not hold when two hosts starting at the
/// same moment create the same schema or table (one fails on a unique catalog index).
pub async fn create_serialized(pool: &PgPool, statements: &[String]) -> Result<(), sqlx::Error> {
    /// An arbitrary key shared by every Wharf host.
    const DDL_LOCK: i64 = 0x5748_4152_4644_444c; // "WHARFDDL"
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(DDL_LOCK)
        .execute(&mut *tx)
        .await?;
    for statement in statements {
        sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}
