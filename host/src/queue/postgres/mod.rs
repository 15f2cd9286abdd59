//! What only PostgreSQL does for the SQL queue ([`SqlStore`]), for production and for several
//! hosts sharing queues: leases take ready rows with `FOR UPDATE SKIP LOCKED` in batches,
//! completions are applied in one statement per batch, and enqueues `NOTIFY wharf_ready`
//! (throttled, see [`super::notify`]), so processors in every process wake on enqueue
//! instead of polling.

mod enqueue;
mod listen;
mod settle;
pub(super) mod statements;
mod upkeep;

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

pub(super) use self::enqueue::{insert_new, lock_ids};
pub(super) use self::listen::listen_on;
pub(super) use self::settle::complete;
pub(super) use self::upkeep::Upkeep;
pub use self::upkeep::VACUUM_AFTER_LEASES;
use sqlx::PgPool;

use super::QueueError;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The connections of a PostgreSQL store.
pub(super) struct Connected {
    /// Reads and writes.
    pub pool: PgPool,
    /// Leases, with `synchronous_commit = off`.
    pub leases: PgPool,
    /// Reserved for settlements.
    pub settlements: PgPool,
}

/// Connect to the PostgreSQL database at `url`, using tables in `schema` (created if missing;
/// `None`: the connection's default search path), and migrate.
pub(super) async fn connect(
    url: &str,
    schema: Option<&str>,
    max_connections: u32,
) -> Result<Connected, QueueError> {
    let mut options = PgConnectOptions::from_str(url)?;
    options = options.application_name(&match schema {
        Some(schema) => format!("wharf:{schema}"),
        None => "wharf".to_string(),
    });
    if let Some(schema) = schema {
        let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
        let bootstrap = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        crate::schema_lock::create_serialized(
            &bootstrap,
            &[format!("CREATE SCHEMA IF NOT EXISTS {quoted}")],
        )
        .await?;
        bootstrap.close().await;
        options = options.options([("search_path", quoted.as_str())]);
    }
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options.clone())
        .await?;
    MIGRATOR.run(&pool).await?;
    let small = |n: u32| {
        PgPoolOptions::new()
            .max_connections(n)
            .acquire_timeout(Duration::from_secs(10))
    };
    let settle_pool = small(2).connect_with(options.clone()).await?;
    let lease_pool = small(2)
        .connect_with(options.options([("synchronous_commit", "off")]))
        .await?;
    Ok(Connected {
        pool,
        leases: lease_pool,
        settlements: settle_pool,
    })
}
