//! Periodic messages (`[schedules.NAME]`). Every host runs every schedule: it sleeps until
//! the next tick, then claims the ticks due by a conditional update of the schedule's row in
//! the transaction that writes their messages (into the SQL queue, or the outbox for a queue
//! whose pending messages live in a broker). The first host to claim a tick enqueues it; the
//! others find the row moved on, so each tick is enqueued exactly once.
//!
//! Ticks that came due while no host ran are caught up by the first host that starts while
//! no other host is alive ([`hosts`]), per the schedule's `catch_up`.

pub mod hosts;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::config::{CatchUp, ScheduleConfig};
use crate::enqueue::QueueRouter;
use crate::queue::{Claim, FollowUp, NewMessage, QueueStore};
use crate::runtime::{Enqueuer as _, Staged};
use crate::ticks::Ticks;

/// The header naming the schedule that enqueued a message.
pub const SCHEDULE_HEADER: &str = "wharf-schedule";

/// The header carrying the tick's time (RFC 3339, UTC, milliseconds).
pub const SCHEDULED_AT_HEADER: &str = "wharf-scheduled-at";

/// The header set (`true`) on a message of a tick missed while no host ran.
pub const CATCH_UP_HEADER: &str = "wharf-catch-up";

/// Ticks one claim enqueues at most when a host is late (the older ones are counted missed).
const MAX_DUE: usize = 1000;

/// How long a host waits after a failed claim (the store unreachable) before it tries again.
const RETRY: Duration = Duration::from_secs(1);

/// A schedule as the CLI and the API show it: its configuration and its row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScheduleView {
    /// The schedule's name.
    pub name: String,
    /// Its cron expression.
    pub cron: String,
    /// Its time zone.
    pub timezone: String,
    /// The queue its ticks go to.
    pub queue: String,
    /// What happens to ticks missed while no host ran.
    pub catch_up: CatchUp,
    /// The next tick (Unix ms); `None` when it never ticks again.
    pub next_tick_ms: Option<i64>,
    /// The last tick claimed; `None` before a host claimed one.
    pub last_tick_ms: Option<i64>,
    /// The host that claimed it.
    pub last_host: Option<String>,
    /// Ticks enqueued in all.
    pub enqueued: i64,
    /// Ticks missed in all.
    pub missed: i64,
}

/// Every configured schedule with its row (`rows`), at `now_ms`, by name.
pub fn views(
    schedules: &std::collections::BTreeMap<String, ScheduleConfig>,
    rows: &[crate::queue::ScheduleRow],
    now_ms: i64,
) -> Vec<ScheduleView> {
    schedules
        .iter()
        .map(|(name, s)| {
            let row = rows.iter().find(|r| &r.name == name);
            let from = row.map_or(now_ms, |r| r.last_tick_ms.max(now_ms));
            ScheduleView {
                name: name.clone(),
                cron: s.cron.clone(),
                timezone: s.timezone.clone(),
                queue: s.queue.clone(),
                catch_up: s.catch_up,
                next_tick_ms: s.ticks().next_after(from),
                last_tick_ms: row
                    .filter(|r| r.last_host.is_some())
                    .map(|r| r.last_tick_ms),
                last_host: row.and_then(|r| r.last_host.clone()),
                enqueued: row.map_or(0, |r| r.enqueued),
                missed: row.map_or(0, |r| r.missed),
            }
        })
        .collect()
}

/// What every schedule's loop shares.
#[derive(Clone)]
pub struct Schedules {
    /// The store holding the schedules' rows and the messages.
    pub store: Arc<dyn QueueStore>,
    /// Checks and stages each tick's message for its queue.
    pub router: Arc<QueueRouter>,
    /// This host's id.
    pub host: String,
    /// When this host started (Unix ms): ticks before it were missed when no host ran.
    pub started_at_ms: i64,
    /// Whether another host was alive when this one started (then it catches nothing up).
    pub others_alive: bool,
}

impl Schedules {
    /// Start one loop per schedule.
    pub fn start(
        self,
        schedules: &std::collections::BTreeMap<String, ScheduleConfig>,
        shutdown: &CancellationToken,
    ) -> Vec<JoinHandle<()>> {
        schedules
            .iter()
            .map(|(name, config)| {
                let this = self.clone();
                let (name, config) = (name.clone(), config.clone());
                let shutdown = shutdown.clone();
                tokio::spawn(async move { this.run(&name, &config, shutdown).await })
            })
            .collect()
    }

    async fn run(&self, name: &str, config: &ScheduleConfig, shutdown: CancellationToken) {
        let ticks = config.ticks();
        let mut caught_up = self.others_alive;
        // The schedule's last tick as this host last read or claimed it: while no other host
        // claims, a tick costs one transaction (its claim) and no read.
        let mut last_tick = None;
        loop {
            let step = async {
                if caught_up {
                    self.next(name, config, &ticks, &mut last_tick).await
                } else {
                    self.catch_up(name, config, &ticks).await.map(|()| None)
                }
            };
            let step = tokio::select! {
                step = step => step,
                () = shutdown.cancelled() => return,
            };
            let wait = match step {
                Ok(None) => {
                    caught_up = true;
                    continue;
                }
                Ok(Some(wait)) => wait,
                Err(e) => {
                    tracing::warn!(schedule = name, "schedule: {e:#}; trying again in 1 s");
                    RETRY
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Claim the ticks missed while no host ran, per `catch_up`.
    async fn catch_up(
        &self,
        name: &str,
        config: &ScheduleConfig,
        ticks: &Ticks,
    ) -> anyhow::Result<()> {
        let row = self.store.schedule_begin(name, self.started_at_ms).await?;
        let limit = match config.catch_up {
            CatchUp::None => 0,
            CatchUp::Latest => 1,
            CatchUp::All => config.catch_up_limit as usize,
        };
        let (due, all) = ticks.between(row.last_tick_ms, self.started_at_ms, limit.max(1));
        let Some(&last) = due.last() else {
            return Ok(());
        };
        let enqueue = &due[due.len() - limit.min(due.len())..];
        let claimed = self
            .claim(name, config, row.last_tick_ms, last, enqueue, all, true)
            .await?;
        if claimed {
            tracing::info!(
                schedule = name,
                missed = all,
                enqueued = enqueue.len(),
                "caught up the ticks missed while no host ran (catch_up = {:?})",
                config.catch_up
            );
        }
        Ok(())
    }

    /// Claim the ticks due now, if any; `Some(wait)` until the next one. `last_tick` is the
    /// schedule's last tick as this host knows it (`None`: read the row): a claim that finds
    /// the row moved on (another host claimed first) forgets it, so the next step reads it.
    async fn next(
        &self,
        name: &str,
        config: &ScheduleConfig,
        ticks: &Ticks,
        last_tick: &mut Option<i64>,
    ) -> anyhow::Result<Option<Duration>> {
        let known = match *last_tick {
            Some(known) => known,
            None => {
                self.store
                    .schedule_begin(name, now_ms())
                    .await?
                    .last_tick_ms
            }
        };
        *last_tick = Some(known);
        let Some(next) = ticks.next_after(known) else {
            // Never again (e.g. February 30th): wait for the shutdown.
            return Ok(Some(Duration::from_secs(3600)));
        };
        let now = now_ms();
        if next > now {
            return Ok(Some(Duration::from_millis((next - now) as u64)));
        }
        let (due, all) = ticks.between(known, now, MAX_DUE);
        let last = *due.last().expect("a tick is due");
        *last_tick = None;
        if self
            .claim(name, config, known, last, &due, all, false)
            .await?
        {
            *last_tick = Some(last);
        }
        Ok(Some(Duration::ZERO))
    }

    /// Claim the ticks up to `last` (after `expected_last`), writing a message for each of
    /// `enqueue`; the others of the `all` ticks are counted missed.
    #[allow(clippy::too_many_arguments)]
    async fn claim(
        &self,
        name: &str,
        config: &ScheduleConfig,
        expected_last: i64,
        last: i64,
        enqueue: &[i64],
        all: usize,
        catching_up: bool,
    ) -> anyhow::Result<bool> {
        let mut messages: Vec<FollowUp> = Vec::with_capacity(enqueue.len());
        for &tick in enqueue {
            messages.push(self.message(name, config, tick, catching_up)?);
        }
        let missed = all - enqueue.len();
        let claimed = self
            .store
            .schedule_claim(&Claim {
                schedule: name,
                expected_last_ms: expected_last,
                last_ms: last,
                host: &self.host,
                messages: &messages,
                missed: missed as i64,
            })
            .await?;
        if claimed {
            if !messages.is_empty() {
                self.router.ready(&config.queue);
            }
            crate::metrics::schedule_ticks(name, messages.len(), missed);
        }
        Ok(claimed)
    }

    /// The message of one tick, staged for its queue.
    fn message(
        &self,
        name: &str,
        config: &ScheduleConfig,
        tick: i64,
        catching_up: bool,
    ) -> anyhow::Result<FollowUp> {
        let at = DateTime::<Utc>::from_timestamp_millis(tick)
            .unwrap_or_default()
            .to_rfc3339_opts(SecondsFormat::Millis, true);
        let mut headers: Vec<(String, String)> = config
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        headers.push((SCHEDULE_HEADER.to_string(), name.to_string()));
        headers.push((SCHEDULED_AT_HEADER.to_string(), at.clone()));
        if catching_up {
            headers.push((CATCH_UP_HEADER.to_string(), "true".to_string()));
        }
        let mut message = NewMessage {
            id: Some(format!("{name}@{at}")),
            payload: config.payload_json(),
            priority: config.priority,
            headers,
            ..NewMessage::default()
        };
        self.router.trace_send(&config.queue, &mut message);
        match self.router.stage(&config.queue, message) {
            Ok(Staged::Store(follow_up)) => Ok(follow_up),
            Ok(Staged::Now(_)) => anyhow::bail!(
                "queue `{}` cannot take a scheduled message in the store's transaction",
                config.queue
            ),
            Err(e) => Err(anyhow::Error::new(e).context(format!(
                "schedule `{name}`: its message for queue `{}` was refused; fix [schedules.{name}]",
                config.queue
            ))),
        }
    }
}
