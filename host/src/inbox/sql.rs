//! The inbox in the SQL database of `[storage]` (SQLite or PostgreSQL): a table keyed by the
//! 32-byte identity hash, with the raw endpoint and MessageId for diagnostics and an index on
//! (endpoint, creation time) for bounded per-endpoint purges. The schema bootstrap is
//! idempotent; with `auto_create_table = false` a missing table is a start-up error.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteJournalMode, SqlitePoolOptions};

use super::{InboxError, InboxKey, InboxStore};
use crate::clock::now_ms;
use crate::queue::{InboxRow, InboxWrite, record};
use crate::sql::{Dialect, Pool};

fn missing_table(table: &str) -> InboxError {
    InboxError::Setup(format!(
        "the inbox table `{table}` does not exist and inbox.sql.auto_create_table = false: create it, or set auto_create_table = true"
    ))
}

/// The SQLite inbox table `table`: rows kept in insertion order (the rowid, which follows
/// the creation time, as the spec's clustered index on the creation timestamp), the key's
/// hash unique in an index of its own, and (endpoint, creation time) indexed for purges.
///
/// Measured against a table keyed by the hash itself (`WITHOUT ROWID`), where every record
/// put its whole ~100-byte row on a random leaf page: about a fifth less time per record.
/// A table made with that older layout keeps working unchanged (the statements only need
/// `id_hash` to be unique).
fn sqlite_layout(table: &str) -> [String; 3] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {table} (id_hash BLOB NOT NULL, endpoint TEXT NOT NULL,
                 message_id TEXT NOT NULL, created_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL)"
        ),
        format!("CREATE UNIQUE INDEX IF NOT EXISTS {table}_hash ON {table} (id_hash)"),
        format!("CREATE INDEX IF NOT EXISTS {table}_created ON {table} (endpoint, created_at_ms)"),
    ]
}

/// The inbox table in the SQL database of `[storage]`.
pub struct SqlInbox {
    pool: Pool,
    table: Arc<str>,
    check: Arc<str>,
    check_many: Arc<str>,
    purge: Arc<str>,
}

impl SqlInbox {
    /// Open the SQLite database at `url` and bootstrap (or require) `table`.
    pub async fn open_sqlite(
        url: &str,
        table: &str,
        auto_create: bool,
    ) -> Result<Self, InboxError> {
        let options = crate::queue::sqlite_options(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        if auto_create {
            // One transaction: no connection may load the schema between the table and its
            // key index. SQLite prepares a statement against the schema it last loaded, and
            // an upsert prepared on a table without the index fails ("ON CONFLICT clause does
            // not match") instead of loading the schema again.
            let [create, unique_hash, by_endpoint] = sqlite_layout(table);
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            sqlx::query(AssertSqlSafe(create)).execute(&mut *tx).await?;
            // A table of the older layout has its key as its primary key already.
            let keyed_by_hash: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pragma_index_list(?1) WHERE origin = 'pk')",
            )
            .bind(table)
            .fetch_one(&mut *tx)
            .await?;
            if !keyed_by_hash {
                sqlx::query(AssertSqlSafe(unique_hash))
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(AssertSqlSafe(by_endpoint))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        } else if sqlx::query(AssertSqlSafe(format!("SELECT 1 FROM {table} LIMIT 0")))
            .execute(&pool)
            .await
            .is_err()
        {
            return Err(missing_table(table));
        }
        Ok(SqlInbox::new(Pool::Sqlite(pool), table))
    }

    /// Connect to the PostgreSQL database at `url` (tables in `schema` when given) and bootstrap (or require) `table`.
    pub async fn open_postgres(
        url: &str,
        schema: Option<&str>,
        table: &str,
        auto_create: bool,
    ) -> Result<Self, InboxError> {
        // Records commit without waiting for their own WAL flush: they are visible at once,
        // and the settlement that follows (same database, synchronous commit) flushes the WAL
        // up to and including them, so a record is never lost while its message counts as
        // settled. This halves the flushes per message.
        // The table starts empty and grows fast: a generic plan made while it was empty
        // (a sequential scan) would stay cached and slow every check down as it grows.
        let mut settings = vec![
            ("synchronous_commit", "off".to_string()),
            ("plan_cache_mode", "force_custom_plan".to_string()),
        ];
        if let Some(schema) = schema {
            settings.push((
                "search_path",
                format!("\"{}\"", schema.replace('"', "\"\"")),
            ));
        }
        let options = PgConnectOptions::from_str(url)?
            .application_name("wharf-inbox")
            .options(settings);
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        if auto_create {
            crate::schema_lock::create_serialized(
                &pool,
                &[
                    format!(
                        "CREATE TABLE IF NOT EXISTS {table} (id_hash BYTEA PRIMARY KEY, endpoint TEXT NOT NULL,
                             message_id TEXT NOT NULL, created_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL)"
                    ),
                    format!(
                        "CREATE INDEX IF NOT EXISTS {table}_created ON {table} (endpoint, created_at_ms)"
                    ),
                ],
            )
            .await?;
        } else if sqlx::query(AssertSqlSafe(format!("SELECT 1 FROM {table} LIMIT 0")))
            .execute(&pool)
            .await
            .is_err()
        {
            return Err(missing_table(table));
        }
        Ok(SqlInbox::new(Pool::Postgres(pool), table))
    }

    fn new(pool: Pool, table: &str) -> Self {
        let check_many = match pool.dialect() {
            // The keys travel as one JSON array of hex: one statement text for any batch,
            // kept prepared.
            Dialect::Sqlite => format!(
                "SELECT id_hash FROM {table} WHERE expires_at_ms > $2
                     AND id_hash IN (SELECT unhex(value) FROM json_each($1))"
            ),
            Dialect::Postgres => format!(
                "SELECT id_hash FROM {table} WHERE id_hash = ANY($1) AND expires_at_ms > $2"
            ),
        };
        SqlInbox {
            pool,
            table: Arc::from(table),
            check: format!("SELECT 1 FROM {table} WHERE id_hash = $1 AND expires_at_ms > $2").into(),
            check_many: check_many.into(),
            purge: format!(
                "DELETE FROM {table} WHERE id_hash IN
                     (SELECT id_hash FROM {table} WHERE endpoint = $1 AND created_at_ms < $2 LIMIT $3)"
            )
            .into(),
        }
    }
}

#[async_trait]
impl InboxStore for SqlInbox {
    async fn check_many(&self, keys: &[InboxKey]) -> Result<Vec<bool>, InboxError> {
        let query = self.pool.query(self.check_many.clone());
        let query = match self.pool.dialect() {
            Dialect::Sqlite => {
                let hashes: Vec<String> = keys.iter().map(|k| hex::encode(k.hash)).collect();
                query.bind(serde_json::to_string(&hashes).expect("hashes serialize"))
            }
            Dialect::Postgres => {
                query.bind_postgres(keys.iter().map(|k| &k.hash[..]).collect::<Vec<&[u8]>>())
            }
        };
        let found: Vec<Vec<u8>> = query.bind(now_ms()).fetch_column().await?;
        let found: std::collections::HashSet<Vec<u8>> = found.into_iter().collect();
        Ok(keys.iter().map(|k| found.contains(&k.hash[..])).collect())
    }

    async fn is_processed(&self, key: &InboxKey) -> Result<bool, InboxError> {
        let found = self
            .pool
            .query(self.check.clone())
            .bind(&key.hash[..])
            .bind(now_ms())
            .fetch_optional()
            .await?;
        Ok(found.is_some())
    }

    async fn record(&self, key: &InboxKey, retention_ms: i64) -> Result<(), InboxError> {
        self.record_many(std::slice::from_ref(key), retention_ms)
            .await
    }

    async fn record_many(&self, keys: &[InboxKey], retention_ms: i64) -> Result<(), InboxError> {
        let write = InboxWrite {
            table: self.table.clone(),
            rows: keys.iter().map(InboxRow::from).collect(),
            retention_ms,
        };
        let mut conn = self.pool.acquire().await?;
        record(&mut conn.conn(), &write).await?;
        Ok(())
    }

    fn queue_database_table(&self) -> Option<Arc<str>> {
        Some(self.table.clone())
    }

    async fn purge_expired(
        &self,
        endpoint: &str,
        cutoff_ms: i64,
        batch: u32,
    ) -> Result<u64, InboxError> {
        let done = self
            .pool
            .query(self.purge.clone())
            .bind(endpoint)
            .bind(cutoff_ms)
            .bind(batch as i64)
            .execute()
            .await?;
        Ok(done)
    }
}
