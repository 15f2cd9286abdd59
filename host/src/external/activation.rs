//! The activation store: durable "this external queue has work" marks, one per queue, so a
//! burst of readiness notifications coalesces into one pending activation. The readiness
//! bridge requests activations (and acknowledges its notifications only afterwards); a
//! processor claims the activation and drains the queue. The default store is a table in
//! the `[storage]` database.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};

use crate::queue::now_ms;

/// Durable activations of external queues.
#[async_trait]
pub trait ActivationStore: Send + Sync + 'static {
    /// Mark `queues` as having work; durable when this returns. Idempotent.
    async fn request(&self, queues: &[String]) -> Result<(), sqlx::Error>;
    /// Take the activation of `queue`; true when there was one.
    async fn claim(&self, queue: &str) -> Result<bool, sqlx::Error>;
    /// Whether `queue` has an unclaimed activation.
    async fn is_requested(&self, queue: &str) -> Result<bool, sqlx::Error>;
}

/// The `external_activations` table of the `[storage]` database.
pub enum SqlActivations {
    /// SQLite.
    Sqlite(SqlitePool),
    /// PostgreSQL.
    Postgres(PgPool),
}

impl SqlActivations {
    /// Connect to `url` (tables in `schema` when given). The table comes with the queue
    /// store's migrations.
    pub async fn open(url: &str, schema: Option<&str>) -> Result<Self, sqlx::Error> {
        if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .busy_timeout(std::time::Duration::from_secs(30));
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await?;
            Ok(SqlActivations::Sqlite(pool))
        } else {
            let mut options =
                PgConnectOptions::from_str(url)?.application_name("wharf-activations");
            if let Some(schema) = schema {
                options = options.options([(
                    "search_path",
                    format!("\"{}\"", schema.replace('"', "\"\"")),
                )]);
            }
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await?;
            Ok(SqlActivations::Postgres(pool))
        }
    }
}

#[async_trait]
impl ActivationStore for SqlActivations {
    async fn request(&self, queues: &[String]) -> Result<(), sqlx::Error> {
        let now = now_ms();
        match self {
            SqlActivations::Sqlite(pool) => {
                let mut tx = pool.begin().await?;
                for queue in queues {
                    sqlx::query(
                        "INSERT INTO external_activations (queue, requested_at_ms) VALUES (?1, ?2)
                         ON CONFLICT (queue) DO NOTHING",
                    )
                    .bind(queue)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
            }
            SqlActivations::Postgres(pool) => {
                sqlx::query(
                    "INSERT INTO external_activations (queue, requested_at_ms)
                     SELECT q, $2 FROM UNNEST($1::text[]) AS q ON CONFLICT (queue) DO NOTHING",
                )
                .bind(queues)
                .bind(now)
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    async fn claim(&self, queue: &str) -> Result<bool, sqlx::Error> {
        let done = match self {
            SqlActivations::Sqlite(pool) => {
                sqlx::query("DELETE FROM external_activations WHERE queue = ?1")
                    .bind(queue)
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
            SqlActivations::Postgres(pool) => {
                sqlx::query("DELETE FROM external_activations WHERE queue = $1")
                    .bind(queue)
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
        };
        Ok(done > 0)
    }

    async fn is_requested(&self, queue: &str) -> Result<bool, sqlx::Error> {
        let found = match self {
            SqlActivations::Sqlite(pool) => {
                sqlx::query("SELECT 1 FROM external_activations WHERE queue = ?1")
                    .bind(queue)
                    .fetch_optional(pool)
                    .await?
                    .is_some()
            }
            SqlActivations::Postgres(pool) => {
                sqlx::query("SELECT 1 FROM external_activations WHERE queue = $1")
                    .bind(queue)
                    .fetch_optional(pool)
                    .await?
                    .is_some()
            }
        };
        Ok(found)
    }
}
