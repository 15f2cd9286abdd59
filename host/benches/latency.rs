//! Enqueue → processed latency on PostgreSQL at a steady offered load (default 5k msg/s,
//! half the throughput target; `WHARF_BENCH_RATE` to change), no-op guest, 10 seconds.
//! Prints p50 / p99 / max from the stored enqueue and completion times.

use std::path::Path;
use std::time::{Duration, Instant};

use wharf_host::Config;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::{MessageFilter, NewMessage, Status};

// The allocator the `wharf` binary runs on, so the figures are what it does.
wharf_host::use_jemalloc!();

fn main() {
    // `cargo bench` passes `--bench`; a filter that does not name this bench skips it.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if !args.is_empty() && !args.iter().any(|a| "latency postgres".contains(a.as_str())) {
        return;
    }
    let rate: u64 = std::env::var("WHARF_BENCH_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(measure(rate, Duration::from_secs(10)));
}

async fn measure(rate: u64, duration: Duration) {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    std::fs::copy(&guest, dir.path().join("handlers/noop.wasm")).unwrap();
    let schema = format!("wharf_latency_{}", std::process::id());
    let text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\n[storage]\nurl = \"{url}\"\nschema = \"{schema}\"\nmax_connections = 16\n\
         [queues.bench]\nhandler = \"noop\"\nconcurrency = 64\nbatch = 64\n{}",
        if std::env::var("WHARF_BENCH_INBOX").is_ok() {
            "inbox = { store = \"sql\" }\n"
        } else {
            ""
        }
    );
    std::fs::write(dir.path().join("wharf.toml"), text).unwrap();
    let host = wharf_host::start(Config::load(&dir.path().join("wharf.toml")).unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let tick = Duration::from_millis(10);
    let per_tick = (rate / 100).max(1);
    let total = rate * duration.as_secs();
    let mut interval = tokio::time::interval(tick);
    let mut sent = 0;
    let started = Instant::now();
    let mut inflight = tokio::task::JoinSet::new();
    while sent < total {
        interval.tick().await;
        for _ in 0..per_tick {
            let router = host.router.clone();
            inflight.spawn(async move {
                let payload =
                    r#"{"order_id":"A-1","customer":"Ada","total_cents":1999}"#.to_string();
                router
                    .enqueue(
                        "bench",
                        NewMessage {
                            payload,
                            ..NewMessage::default()
                        },
                    )
                    .await
                    .unwrap();
            });
            sent += 1;
        }
        while inflight.try_join_next().is_some() {}
        if sent % rate == 0 && std::env::var("WHARF_BENCH_TRACE").is_ok() {
            let counts = host.store.counts("bench").await.unwrap();
            eprintln!(
                "{:?} sent {sent} inflight {} {counts:?}",
                started.elapsed(),
                inflight.len()
            );
        }
    }
    inflight.join_all().await;
    let offered = sent as f64 / started.elapsed().as_secs_f64();
    loop {
        let counts = host.store.counts("bench").await.unwrap();
        if counts
            .iter()
            .find(|(s, _)| *s == Status::Processed)
            .map_or(0, |(_, n)| *n)
            == total
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let filter = MessageFilter {
        queue: Some("bench".into()),
        status: Some(Status::Processed),
        limit: u32::MAX,
        ..Default::default()
    };
    let mut latencies: Vec<i64> = host
        .store
        .list(&filter)
        .await
        .unwrap()
        .iter()
        .map(|m| m.processed_at_ms.unwrap() - m.enqueued_at_ms)
        .collect();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "postgres enqueue→processed latency at {offered:.0} msg/s offered ({} messages): p50 {} ms, p99 {} ms, max {} ms",
        latencies.len(),
        pct(0.50),
        pct(0.99),
        latencies.last().unwrap()
    );
    host.shutdown().await;
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
}
