//! What the hand-written benches (`harness = false`) share: skipping a bench that a
//! `cargo bench` filter does not name, the number of rounds, medians, and counting the
//! messages the host's pipeline processed.

#![allow(dead_code)] // each bench uses its own part

use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

/// Whether a `cargo bench` filter was given that names none of `words` (the bench is then
/// skipped). `cargo bench` itself passes `--bench`.
pub fn filtered_out(words: &str) -> bool {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    !args.is_empty() && !args.iter().any(|a| words.contains(a.as_str()))
}

/// Rounds to run (`WHARF_BENCH_ROUNDS`, default 2).
pub fn rounds() -> usize {
    std::env::var("WHARF_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2)
        .max(1)
}

/// The median of `rates`.
pub fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    let mid = rates.len() / 2;
    if rates.len() % 2 == 1 {
        rates[mid]
    } else {
        (rates[mid - 1] + rates[mid]) / 2.0
    }
}

/// Messages the host's pipeline has processed (the counted tracing event).
pub static PROCESSED: AtomicU64 = AtomicU64::new(0);

/// Counts every event that passes its filter.
struct CountProcessed;

impl<S: tracing::Subscriber> Layer<S> for CountProcessed {
    fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        PROCESSED.fetch_add(1, Ordering::Relaxed);
    }
}

/// The pipeline's "message processed" event: debug, in `dispatch::deliver`, with an
/// `attempt` and no `retry_at_ms` (that one is "handler asked to run again later").
fn is_processed_event(m: &tracing::Metadata<'_>) -> bool {
    m.is_event()
        && *m.level() == tracing::Level::DEBUG
        && m.target() == "wharf_host::dispatch::deliver"
        && m.fields().field("attempt").is_some()
        && m.fields().field("retry_at_ms").is_none()
}

/// Count processed messages in [`PROCESSED`] (every other callsite stays disabled).
pub fn count_processed() {
    let counting = tracing_subscriber::registry().with(
        CountProcessed.with_filter(
            tracing_subscriber::filter::filter_fn(is_processed_event)
                .with_max_level_hint(tracing::Level::DEBUG),
        ),
    );
    tracing::subscriber::set_global_default(counting).expect("no other subscriber");
}

/// Drain rate of a host that processes `messages` beyond the count `base` ([`PROCESSED`]
/// read before it started), timed between 1 % and 99 % processed; panics naming `label`
/// when it does not drain within five minutes.
pub async fn time_drain(base: u64, messages: u64, label: &str) -> f64 {
    use std::time::{Duration, Instant};
    let processed = || PROCESSED.load(Ordering::Relaxed) - base;
    let (low, high) = (messages / 100, messages * 99 / 100);
    // When the count first reached 1 % and 99 % (time, count then).
    let mut first: Option<(Instant, u64)> = None;
    let mut last: Option<(Instant, u64)> = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while processed() < messages {
        assert!(Instant::now() < deadline, "{label}: did not drain");
        let (n, now) = (processed(), Instant::now());
        if first.is_none() && n >= low {
            first = Some((now, n));
        }
        if last.is_none() && n >= high {
            last = Some((now, n));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ((t0, n0), (t1, n1)) = (first.unwrap(), last.unwrap());
    (n1 - n0) as f64 / (t1 - t0).as_secs_f64()
}

/// The PostgreSQL the benches use (`DATABASE_URL`, default the local `test` database).
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// The Redis the benches use (`REDIS_URL`, default on loopback).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// Delete every Redis key starting with `prefix` (what a bench run left).
pub async fn delete_redis_keys(prefix: &str) {
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}
