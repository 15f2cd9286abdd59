//! The activation store: durable "this external queue has work" marks, one per queue, so a
//! burst of readiness notifications coalesces into one pending activation. The readiness
//! bridge requests activations (and acknowledges its notifications only afterwards); a
//! processor claims the activation and drains the queue. The default store is a table in
//! the `[storage]` database.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::SqlitePoolOptions;

use crate::queue::now_ms;
use crate::sql::{Pool, Sql};

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
pub struct SqlActivations(pub(crate) Pool);

impl SqlActivations {
    /// Connect to `url` (tables in `schema` when given). The table comes with the queue
    /// store's migrations.
    pub async fn open(url: &str, schema: Option<&str>) -> Result<Self, sqlx::Error> {
        if url.starts_with("sqlite:") {
            let options =
                crate::queue::sqlite_options(url)?.busy_timeout(std::time::Duration::from_secs(30));
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await?;
            Ok(SqlActivations(Pool::Sqlite(pool)))
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
            Ok(SqlActivations(Pool::Postgres(pool)))
        }
    }
}

/// Mark the queues of the JSON array `$1` as requested at `$2`.
static REQUEST: Sql = Sql::each(
    "INSERT INTO external_activations (queue, requested_at_ms)
     SELECT value, $2 FROM json_each($1) WHERE true ON CONFLICT (queue) DO NOTHING",
    "INSERT INTO external_activations (queue, requested_at_ms)
     SELECT value, $2 FROM jsonb_array_elements_text($1::jsonb) ON CONFLICT (queue) DO NOTHING",
);
const CLAIM: &str = "DELETE FROM external_activations WHERE queue = $1";
const IS_REQUESTED: &str = "SELECT 1 FROM external_activations WHERE queue = $1";

#[async_trait]
impl ActivationStore for SqlActivations {
    async fn request(&self, queues: &[String]) -> Result<(), sqlx::Error> {
        let list = serde_json::to_string(queues).expect("queue names serialize");
        let request = self.0.query(&REQUEST).bind(list);
        request.bind(now_ms()).execute().await?;
        Ok(())
    }

    async fn claim(&self, queue: &str) -> Result<bool, sqlx::Error> {
        let done = self.0.query(CLAIM).bind(queue).execute().await?;
        Ok(done > 0)
    }

    async fn is_requested(&self, queue: &str) -> Result<bool, sqlx::Error> {
        let found = self
            .0
            .query(IS_REQUESTED)
            .bind(queue)
            .fetch_optional()
            .await?;
        Ok(found.is_some())
    }
}
