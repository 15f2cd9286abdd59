//! Prometheus metrics, served by the admin server on `/metrics`: what happened to messages,
//! how long handlers and instantiation took, enqueue→settled latency, deploys, inbox work,
//! and gauges (queue depth by status, external depth, health) sampled by a background task,
//! never computed per scrape; recent rates per queue ([`rates`]) for the API, and the last
//! hour of rates and depth per queue ([`history`]) for the dashboard's charts. Labels are
//! bounded: queue, provider, endpoint and health-check names from the configuration, handler
//! names from the handlers directory, and fixed outcome/status words — never message ids.
//! docs/operations.md lists every metric.

pub mod counts;
mod handles;
pub mod history;
mod rates;

pub use history::Point;
pub use rates::{Rates, Totals, rates, totals};

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::external::{Lag, Provider};
use crate::health::HealthRegistry;
use crate::queue::QueueStore;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Histogram buckets, in seconds, for handler calls and instantiation (10 µs – 60 s).
const CALL_BUCKETS: [f64; 17] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 1.0, 5.0, 60.0,
];

/// Histogram buckets, in seconds, for enqueue→settled latency (1 ms – 1 day).
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0, 3600.0,
    86400.0,
];

/// Install the process-wide recorder (once; later calls reuse it).
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            // A gauge no longer set (a custom status that emptied) leaves after 10 minutes.
            .idle_timeout(
                metrics_util::MetricKindMask::GAUGE,
                Some(Duration::from_secs(600)),
            )
            .set_buckets_for_metric(Matcher::Suffix("_call_seconds".into()), &CALL_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("wharf_instantiate_seconds".into()),
                    &CALL_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("wharf_instance_wait_seconds".into()),
                    &CALL_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("wharf_settle_latency_seconds".into()),
                    &LATENCY_BUCKETS,
                )
            })
            .expect("bucket lists are not empty")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (an embedding application): then ours
        // only renders what it sees, which is nothing; the application's recorder wins.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// The current metrics in the Prometheus text format.
pub fn render() -> String {
    install().render()
}

/// What happened to a message after one delivery (`wharf_messages_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageOutcome {
    /// The handler succeeded (completed or handed off): settled as processed.
    Processed,
    /// The attempt failed (or asked to run later) and the message will run again.
    Retried,
    /// Failed for good: permanent error or no attempts left.
    Failed,
    /// Handed back unprocessed (shutdown, handler removed).
    Released,
    /// Skipped by the consumer inbox: already processed on this endpoint.
    Duplicate,
}

impl MessageOutcome {
    /// Every outcome, in declaration order (`outcome as usize` indexes it).
    const ALL: [MessageOutcome; 5] = [
        MessageOutcome::Processed,
        MessageOutcome::Retried,
        MessageOutcome::Failed,
        MessageOutcome::Released,
        MessageOutcome::Duplicate,
    ];

    fn label(self) -> &'static str {
        match self {
            MessageOutcome::Processed => "processed",
            MessageOutcome::Retried => "retried",
            MessageOutcome::Failed => "failed",
            MessageOutcome::Released => "released",
            MessageOutcome::Duplicate => "duplicate",
        }
    }
}

/// Count one delivery's outcome on `queue`.
pub fn message(queue: &str, outcome: MessageOutcome) {
    match outcome {
        MessageOutcome::Processed => rates::bump(queue, false),
        MessageOutcome::Failed => rates::bump(queue, true),
        _ => {}
    }
    handles::queue(queue).outcome(outcome).increment(1);
}

/// How long one `handle` call took on `queue` (instantiation included).
pub fn handler_call(queue: &str, took: Duration) {
    handles::queue(queue).call.record(took.as_secs_f64());
}

/// How long creating a fresh instance of `handler` took.
pub fn instantiated(handler: &str, took: Duration) {
    handles::instantiate(handler).record(took.as_secs_f64());
}

/// A call of `handler` found every pooled instance in use and waited `waited` (until one came
/// back, or until it gave up and handed its message back uncounted).
pub fn instance_waited(handler: &str, waited: Duration) {
    metrics::counter!("wharf_instance_waits_total", "handler" => handler.to_string()).increment(1);
    metrics::histogram!("wharf_instance_wait_seconds", "handler" => handler.to_string())
        .record(waited.as_secs_f64());
}

/// From enqueue to the final settlement (processed or failed) of a message on `queue`.
pub fn settled(queue: &str, enqueued_at_ms: u64) {
    if enqueued_at_ms == 0 {
        return; // not known (a message from a direct producer without a timestamp)
    }
    let ms = (crate::queue::now_ms() - enqueued_at_ms as i64).max(0);
    handles::queue(queue).settle.record(ms as f64 / 1000.0);
}

/// A message of an external queue moved into the SQL queue with `status`.
pub fn moved_into_sql(queue: &str, provider: &str, status: &str) {
    metrics::counter!(
        "wharf_moved_into_sql_total",
        "queue" => queue.to_string(),
        "provider" => provider.to_string(),
        "status" => status.to_string()
    )
    .increment(1);
}

/// The expired-lease sweep of `queue` handled `count` messages (back to pending, or failed).
pub fn leases_expired(queue: &str, count: u64) {
    metrics::counter!("wharf_lease_expiries_total", "queue" => queue.to_string()).increment(count);
}

/// A handler file was deployed, rejected or removed.
pub fn deploy(handler: &str, result: &'static str) {
    metrics::counter!(
        "wharf_deploys_total",
        "handler" => handler.to_string(),
        "result" => result
    )
    .increment(1);
}

/// Deliveries of `endpoint` looked up in the consumer inbox.
pub fn inbox_checked(endpoint: &str, count: usize) {
    handles::inbox(endpoint).checks.increment(count as u64);
}

/// Follow-ups published from the outbox into external queue `queue`.
pub fn outbox_published(queue: &str, count: usize) {
    metrics::counter!("wharf_outbox_published_total", "queue" => queue.to_string())
        .increment(count as u64);
}

/// A message of `queue` whose key-value changes met a state conflict at commit (it runs
/// again, or past the bound its attempt fails).
pub fn state_conflict(queue: &str) {
    metrics::counter!("wharf_state_conflicts_total", "queue" => queue.to_string()).increment(1);
}

/// Finished spans not exported: `reason` is `queue-full` (the collector is slower than the
/// host, or down, and [telemetry] max_queued_spans were waiting) or `export-failed`.
pub fn spans_dropped(reason: &'static str, count: usize) {
    metrics::counter!("wharf_trace_spans_dropped_total", "reason" => reason)
        .increment(count as u64);
}

/// Ticks of schedule `schedule` this host claimed: `enqueued` got a message, `missed` were
/// skipped (no host ran at the time, and the catch-up left them out).
pub fn schedule_ticks(schedule: &str, enqueued: usize, missed: usize) {
    if enqueued > 0 {
        metrics::counter!("wharf_schedule_ticks_enqueued_total", "schedule" => schedule.to_string())
            .increment(enqueued as u64);
    }
    if missed > 0 {
        metrics::counter!("wharf_schedule_ticks_missed_total", "schedule" => schedule.to_string())
            .increment(missed as u64);
    }
}

/// A pipeline of rate-limited `queue` found no budget and waits for it.
pub fn rate_limited(queue: &str) {
    metrics::counter!("wharf_rate_limit_waits_total", "queue" => queue.to_string()).increment(1);
}

/// Finished spans the collector accepted.
pub fn spans_exported(count: usize) {
    metrics::counter!("wharf_trace_spans_exported_total").increment(count as u64);
}

/// Inbox entries recorded for `endpoint` after successful handler calls.
pub fn inbox_recorded(endpoint: &str, count: usize) {
    handles::inbox(endpoint).records.increment(count as u64);
}

/// Count a redelivery skipped by the consumer inbox; `storage` is where the queue's pending
/// messages live (`sql`, `redis`, `rabbitmq`, `kafka`, `servicebus`), not the inbox store.
pub fn duplicate_detected(endpoint: &str, queue: &str, storage: &'static str) {
    metrics::counter!(
        "wharf_inbox_duplicates_total",
        "endpoint" => endpoint.to_string(),
        "queue" => queue.to_string(),
        "storage" => storage
    )
    .increment(1);
}

/// An external queue's provider: its name and the opened provider.
pub type NamedProvider = (String, Arc<dyn Provider>);

/// What the gauge sampler looks at.
pub struct Sampled {
    /// The SQL queue store.
    pub store: Arc<dyn QueueStore>,
    /// Every configured queue, with its provider when it is external.
    pub queues: Vec<(String, Option<NamedProvider>)>,
    /// The health checks.
    pub health: Arc<HealthRegistry>,
}

/// Refresh the gauges every `interval` until `shutdown`: `wharf_queue_messages` (SQL counts
/// by status), `wharf_external_messages` (where the provider can tell) and
/// `wharf_health_ready`, and append each queue's point to its [`history`]. One count per
/// queue per interval, whatever the scrape rate.
pub async fn run_sampler(sampled: Sampled, interval: Duration, shutdown: CancellationToken) {
    let mut seen = HashMap::new();
    loop {
        // Histograms keep their samples until upkeep folds them in, scraped or not.
        install().run_upkeep();
        let started = tokio::time::Instant::now();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sample(&sampled, &mut seen) => {}
        }
        // The next pass: after `interval`, or sooner when the API wants fresh counts (but
        // never sooner than `counts::MIN_GAP` after this one began).
        let asked = async {
            counts::wanted().await;
            tokio::time::sleep_until(started + counts::MIN_GAP).await;
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
            _ = asked => {}
        }
    }
}

/// The longest one count, depth or health question of a sampling pass may take.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The statuses every queue reports, even at zero.
const STATUSES: [&str; 6] = [
    "pending",
    "processing",
    "processed",
    "failed",
    "sleeping",
    "awaiting-release",
];

/// One sampling pass; `seen` keeps the statuses each queue has reported, so a custom status
/// that empties drops to zero instead of keeping its last value.
async fn sample(sampled: &Sampled, seen: &mut HashMap<String, BTreeSet<String>>) {
    rates::snapshot();
    for (queue, external) in &sampled.queues {
        let at_ms = crate::queue::now_ms();
        let totals = rates::totals(queue);
        let mut depth = None;
        match tokio::time::timeout(SAMPLE_TIMEOUT, sampled.store.counts(queue)).await {
            Err(_) => tracing::debug!(%queue, "sampling the queue's counts timed out"),
            Ok(Err(e)) => tracing::debug!(%queue, "sampling the queue's counts failed: {e}"),
            Ok(Ok(counts)) => {
                depth = Some(history::depth(&counts));
                counts::record(queue, counts.clone());
                let statuses = seen.entry(queue.clone()).or_default();
                statuses.extend(STATUSES.iter().map(|s| s.to_string()));
                statuses.extend(counts.iter().map(|(s, _)| s.as_str().to_string()));
                for status in statuses.iter() {
                    let n = counts
                        .iter()
                        .find(|(s, _)| s.as_str() == status)
                        .map_or(0, |(_, n)| *n);
                    metrics::gauge!(
                        "wharf_queue_messages",
                        "queue" => queue.clone(),
                        "status" => status.clone()
                    )
                    .set(n as f64);
                }
                // A custom status that emptied was set to zero once; then its series may
                // expire (idle gauges are dropped after a while).
                statuses.retain(|s| {
                    STATUSES.contains(&s.as_str()) || counts.iter().any(|(c, _)| c.as_str() == s)
                });
            }
        }
        let mut lag = None;
        if let Some((name, provider)) = external {
            lag = external_lag(queue, name, provider.as_ref()).await;
        }
        let broker_oldest = lag.and_then(|l| l.oldest_ms);
        let oldest_ready = oldest_ready(sampled, queue, broker_oldest, at_ms).await;
        counts::record_waiting(queue, oldest_ready, lag.map(|l| l.messages));
        if let Some((name, provider)) = external {
            // An external queue's depth is what its provider holds plus what moved into SQL;
            // unknown when the provider cannot tell.
            let held = match provider.capabilities().depth {
                true => external_depth(queue, name, provider.as_ref()).await,
                false => None,
            };
            depth = depth.zip(held).map(|(sql, held)| sql + held);
        }
        history::record(queue, at_ms, totals, depth);
    }
    outbox(sampled).await;
    let Ok((_, checks)) = tokio::time::timeout(SAMPLE_TIMEOUT, sampled.health.report()).await
    else {
        tracing::debug!("sampling the health checks timed out");
        return;
    };
    for (check, report) in checks {
        metrics::gauge!("wharf_health_ready", "check" => check).set(if report.healthy {
            1.0
        } else {
            0.0
        });
    }
}

/// Sample the outbox's backlog per external queue into `wharf_outbox_rows` and
/// `wharf_outbox_oldest_seconds` (zero when empty).
async fn outbox(sampled: &Sampled) {
    if sampled
        .queues
        .iter()
        .all(|(_, external)| external.is_none())
    {
        return;
    }
    let backlog = match tokio::time::timeout(SAMPLE_TIMEOUT, sampled.store.outbox_backlog()).await {
        Ok(Ok(backlog)) => backlog,
        _ => {
            tracing::debug!("sampling the outbox failed");
            return;
        }
    };
    let now = crate::queue::now_ms();
    for (queue, _) in sampled.queues.iter().filter(|(_, e)| e.is_some()) {
        let waiting = backlog.iter().find(|b| &b.queue == queue);
        let (rows, age) = waiting.map_or((0, 0.0), |b| {
            (b.rows, (now - b.oldest_ms).max(0) as f64 / 1000.0)
        });
        metrics::gauge!("wharf_outbox_rows", "queue" => queue.clone()).set(rows as f64);
        metrics::gauge!("wharf_outbox_oldest_seconds", "queue" => queue.clone()).set(age);
    }
}

/// Sample how long the oldest ready message of the queue has waited into
/// `wharf_queue_oldest_ready_seconds` (0 when none is ready): the SQL queue's, or the
/// broker's (`broker`: when the oldest message its processing group has not committed was
/// written) when that is older; its ready time.
async fn oldest_ready(
    sampled: &Sampled,
    queue: &str,
    broker: Option<i64>,
    now: i64,
) -> Option<i64> {
    let sql = match tokio::time::timeout(SAMPLE_TIMEOUT, sampled.store.oldest_ready(queue)).await {
        Ok(Ok(oldest)) => oldest,
        _ => {
            tracing::debug!(%queue, "sampling the oldest ready message failed");
            return None;
        }
    };
    let oldest = match (sql, broker) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let age = oldest.map_or(0.0, |at| (now - at).max(0) as f64 / 1000.0);
    metrics::gauge!("wharf_queue_oldest_ready_seconds", "queue" => queue.to_string()).set(age);
    oldest
}

/// Sample a Kafka queue's processing-group lag into `wharf_external_lag_messages` (a provider
/// that has no lag: nothing).
async fn external_lag(queue: &str, name: &str, provider: &dyn Provider) -> Option<Lag> {
    match tokio::time::timeout(SAMPLE_TIMEOUT, provider.lag(queue)).await {
        Ok(Ok(Some(lag))) => {
            metrics::gauge!("wharf_external_lag_messages", "queue" => queue.to_string(), "provider" => name.to_string())
                .set(lag.messages as f64);
            Some(lag)
        }
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            tracing::debug!(%queue, provider = %name, "sampling the lag failed: {e}");
            None
        }
        Err(_) => {
            tracing::debug!(%queue, provider = %name, "sampling the lag timed out");
            None
        }
    }
}

/// Sample an external queue's depth into `wharf_external_messages`; its total, unless the
/// provider did not answer.
async fn external_depth(queue: &str, name: &str, provider: &dyn Provider) -> Option<u64> {
    match tokio::time::timeout(SAMPLE_TIMEOUT, provider.depth(queue)).await {
        Err(_) => {
            tracing::debug!(%queue, provider = %name, "sampling the external depth timed out");
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(%queue, provider = %name, "sampling the external depth failed: {e}");
            None
        }
        Ok(Ok(depth)) => {
            for (state, n) in [
                ("ready", depth.ready),
                ("delayed", depth.delayed),
                ("in_flight", depth.in_flight),
            ] {
                metrics::gauge!(
                    "wharf_external_messages",
                    "queue" => queue.to_string(),
                    "provider" => name.to_string(),
                    "state" => state
                )
                .set(n as f64);
            }
            Some(depth.ready + depth.delayed + depth.in_flight)
        }
    }
}
