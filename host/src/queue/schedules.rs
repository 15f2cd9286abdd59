//! Schedules and hosts in the SQL store. A schedule's row holds its last tick; a host claims
//! the next ticks by a conditional update of that row (`last_tick_ms` still what it read) in
//! the transaction that writes their messages, so each tick is enqueued once whatever the
//! number of hosts. The hosts' rows say which hosts share the store and which are alive.

use serde::Serialize;

use super::follow_ups::{self, FollowUp};
use super::{QueueError, SqlStore};
use crate::sql::{Pool, Sql};

/// A schedule's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduleRow {
    /// The schedule's name.
    pub name: String,
    /// Its last tick claimed (Unix ms): enqueued or skipped; when the schedule was first
    /// seen, the moment it was.
    pub last_tick_ms: i64,
    /// The host that claimed it.
    pub last_host: Option<String>,
    /// When that host claimed it.
    pub last_enqueued_at_ms: Option<i64>,
    /// Ticks enqueued in all.
    pub enqueued: i64,
    /// Ticks missed in all (no host ran, and the catch-up skipped them).
    pub missed: i64,
}

/// Ticks a host claims at once.
#[derive(Debug)]
pub struct Claim<'a> {
    /// The schedule.
    pub schedule: &'a str,
    /// The last tick the host read: the claim holds only if it is still the last.
    pub expected_last_ms: i64,
    /// The newest tick claimed.
    pub last_ms: i64,
    /// The claiming host.
    pub host: &'a str,
    /// The ticks' messages.
    pub messages: &'a [FollowUp],
    /// Ticks claimed without a message (skipped by the catch-up).
    pub missed: i64,
}

/// A host's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostRow {
    /// Its id.
    pub id: String,
    /// When it last started.
    pub started_at_ms: i64,
    /// Its last heartbeat.
    pub seen_at_ms: i64,
    /// When it stopped, if it stopped cleanly (and has not started again).
    pub stopped_at_ms: Option<i64>,
}

const BEGIN: Sql = Sql::both(
    "INSERT INTO wharf_schedules (name, last_tick_ms) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
);

const COLUMNS: &str =
    "name, last_tick_ms, last_host, last_enqueued_at_ms, enqueued, missed FROM wharf_schedules";

const CLAIM: Sql = Sql::both(
    "UPDATE wharf_schedules SET last_tick_ms = $1, last_host = $2, last_enqueued_at_ms = $3, \
     enqueued = enqueued + $4, missed = missed + $5 WHERE name = $6 AND last_tick_ms = $7",
);

const BEAT: Sql = Sql::both(
    "INSERT INTO wharf_hosts (id, started_at_ms, seen_at_ms, stopped_at_ms) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (id) DO UPDATE SET started_at_ms = excluded.started_at_ms, \
     seen_at_ms = excluded.seen_at_ms, stopped_at_ms = excluded.stopped_at_ms",
);

const HOSTS: Sql =
    Sql::both("SELECT id, started_at_ms, seen_at_ms, stopped_at_ms FROM wharf_hosts ORDER BY id");

fn schedule_row(r: &crate::sql::Row) -> Result<ScheduleRow, sqlx::Error> {
    Ok(ScheduleRow {
        name: r.get("name")?,
        last_tick_ms: r.get("last_tick_ms")?,
        last_host: r.get("last_host")?,
        last_enqueued_at_ms: r.get("last_enqueued_at_ms")?,
        enqueued: r.get("enqueued")?,
        missed: r.get("missed")?,
    })
}

/// The row of `schedule`, made (its last tick `now`) when it has none.
pub(crate) async fn begin(
    pool: &Pool,
    schedule: &str,
    now: i64,
) -> Result<ScheduleRow, QueueError> {
    pool.query(&BEGIN)
        .bind(schedule)
        .bind(now)
        .execute()
        .await?;
    let row = pool
        .query(format!("SELECT {COLUMNS} WHERE name = $1"))
        .bind(schedule)
        .fetch_one()
        .await?;
    Ok(schedule_row(&row)?)
}

/// Every schedule's row, by name.
pub(crate) async fn list(pool: &Pool) -> Result<Vec<ScheduleRow>, QueueError> {
    let rows = pool
        .query(format!("SELECT {COLUMNS} ORDER BY name"))
        .fetch_all()
        .await?;
    Ok(rows.iter().map(schedule_row).collect::<Result<_, _>>()?)
}

/// Claim ticks and write their messages, in one transaction; `false` when another host
/// claimed first (nothing written).
pub(crate) async fn claim(
    store: &SqlStore,
    claim: &Claim<'_>,
    now: i64,
) -> Result<bool, QueueError> {
    let mut tx = store.pool.begin().await?;
    let claimed = tx
        .conn()
        .query(&CLAIM)
        .bind(claim.last_ms)
        .bind(claim.host)
        .bind(now)
        .bind(claim.messages.len() as i64)
        .bind(claim.missed)
        .bind(claim.schedule)
        .bind(claim.expected_last_ms)
        .execute()
        .await?;
    if claimed == 0 {
        return Ok(false);
    }
    let written = follow_ups::write(&mut tx.conn(), claim.messages, now).await?;
    tx.commit().await?;
    store.committed(&written).await;
    Ok(true)
}

/// Record that host `id` (started at `started_at_ms`) is alive at `now`, or stopped then.
pub(crate) async fn beat(
    pool: &Pool,
    id: &str,
    started_at_ms: i64,
    now: i64,
    stopped: bool,
) -> Result<(), QueueError> {
    pool.query(&BEAT)
        .bind(id)
        .bind(started_at_ms)
        .bind(now)
        .bind(stopped.then_some(now))
        .execute()
        .await?;
    Ok(())
}

/// Every host that ever used this store, by id.
pub(crate) async fn hosts(pool: &Pool) -> Result<Vec<HostRow>, QueueError> {
    let rows = pool.query(&HOSTS).fetch_all().await?;
    rows.iter()
        .map(|r| {
            Ok(HostRow {
                id: r.get("id")?,
                started_at_ms: r.get("started_at_ms")?,
                seen_at_ms: r.get("seen_at_ms")?,
                stopped_at_ms: r.get("stopped_at_ms")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(QueueError::from)
}
