//! Rate-limit budgets in the SQL store: one row per rate-limited queue holding its bucket's
//! `tat` ([`crate::rate_limit`]), so every host sharing the store takes from one budget. A
//! take reads the row, computes the grant, and writes the new value only if the row still
//! holds what it read (else it reads again): no lock is held between round trips, so a host
//! that pauses mid-take delays no other. On PostgreSQL the time is the database's, so hosts
//! whose clocks differ still share one rate.

use super::{QueueError, SqlStore};
use crate::rate_limit::{self, Limit, Taken};
use crate::sql::{Dialect, Sql};

/// The row, with the database's clock on PostgreSQL.
const READ: Sql = Sql::each(
    "SELECT tat_us FROM wharf_rate_limits WHERE queue = $1",
    "SELECT tat_us, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us \
     FROM wharf_rate_limits WHERE queue = $1",
);

/// An empty bucket: `$2` is the whole `tat` on SQLite, the tolerance on PostgreSQL (which
/// adds its clock).
const CREATE: Sql = Sql::each(
    "INSERT INTO wharf_rate_limits (queue, tat_us) VALUES ($1, $2) ON CONFLICT (queue) DO NOTHING",
    "INSERT INTO wharf_rate_limits (queue, tat_us) \
     VALUES ($1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + $2) \
     ON CONFLICT (queue) DO NOTHING",
);

/// The new `tat`, if the row still holds the one read. On PostgreSQL the write's commit does
/// not wait for its log to reach the disk (`synchronous_commit` off for that transaction
/// alone): a rate-limited queue commits this at every take, which would otherwise add a log
/// flush per take to every other queue's; and a budget update lost to a database crash is
/// harmless, as the bucket fills up to `burst` while the database recovers anyway.
const SET: Sql = Sql::each(
    "UPDATE wharf_rate_limits SET tat_us = $1 WHERE queue = $2 AND tat_us = $3",
    "UPDATE wharf_rate_limits SET tat_us = $1 WHERE queue = $2 AND tat_us = $3 \
     AND set_config('synchronous_commit', 'off', true) IS NOT NULL",
);

/// Reads and writes a take tries before it reports no budget (other hosts took it each
/// time); the caller looks again shortly.
const TRIES: usize = 8;

/// Unused budget back (its commit as [`SET`]'s).
const GIVE_BACK: Sql = Sql::each(
    "UPDATE wharf_rate_limits SET tat_us = tat_us - $1 WHERE queue = $2",
    "UPDATE wharf_rate_limits SET tat_us = tat_us - $1 WHERE queue = $2 \
     AND set_config('synchronous_commit', 'off', true) IS NOT NULL",
);

/// Take budget for up to `wanted` messages of `queue`.
pub(crate) async fn take(
    store: &SqlStore,
    queue: &str,
    limit: Limit,
    wanted: u32,
) -> Result<Taken, QueueError> {
    let dialect = store.pool.dialect();
    for _ in 0..TRIES {
        let Some(row) = store.pool.query(&READ).bind(queue).fetch_optional().await? else {
            let empty = match dialect {
                Dialect::Postgres => limit.empty_at(0),
                Dialect::Sqlite => limit.empty_at(crate::clock::now_us()),
            };
            store
                .pool
                .query(&CREATE)
                .bind(queue)
                .bind(empty)
                .execute()
                .await?;
            continue;
        };
        let tat: i64 = row.get("tat_us")?;
        let now = match dialect {
            Dialect::Postgres => row.get("now_us")?,
            Dialect::Sqlite => crate::clock::now_us(),
        };
        let taken = rate_limit::take(limit, tat, now, wanted);
        if taken.granted == 0 {
            return Ok(taken);
        }
        let set = store
            .pool
            .query(&SET)
            .bind(taken.tat_us)
            .bind(queue)
            .bind(tat)
            .execute()
            .await?;
        if set == 1 {
            return Ok(taken);
        }
    }
    Ok(Taken {
        tat_us: 0,
        granted: 0,
        wait_us: limit.interval_us.min(1_000),
    })
}

/// Return `unused` budget of `queue`.
pub(crate) async fn give_back(
    store: &SqlStore,
    queue: &str,
    limit: Limit,
    unused: u32,
) -> Result<(), QueueError> {
    store
        .pool
        .query(&GIVE_BACK)
        .bind(limit.budget_us(unused))
        .bind(queue)
        .execute()
        .await?;
    Ok(())
}
