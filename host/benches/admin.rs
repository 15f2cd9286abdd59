//! The cost of operating a busy host: with 1M messages stored (95 % processed, 5 % failed),
//! how long `/metrics` and the dashboard's requests take (each must answer within 200 ms), and
//! how much a scraper that loads them every second slows the drain of 25k new messages (by at
//! most 5 %: the median of the paired scraped/quiet ratios). SQLite and PostgreSQL; each round
//! is two pairs in both orders (quiet, scraped, scraped, quiet); `WHARF_BENCH_ROUNDS` rounds
//! (default 2). The drain is timed on a warm host: the handler is deployed and compiled, and a
//! first drain of 5k messages has run, before the clock starts.
//!
//! `cargo bench --bench admin` (or `-- admin sqlite` / `-- admin postgres`).

#![allow(missing_docs)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wharf_host::{Config, RunningHost};

use common::database_url;

// The allocator the `wharf` binary runs on, so the figures are what it does.
wharf_host::use_jemalloc!();

const STORED: u64 = 1_000_000;
/// Messages per timed drain. Sized so each drain lasts about 1.5–2.5 s (12–17k msg/s) and the
/// bench about 1:20 min, most of it storing the 1M rows; at 50k it took about 1:50 min. The
/// scraper's first load is at the start of each drain, its next ones a second apart, so a
/// scraped drain still carries two or three loads of every request.
const DRAIN: u64 = 25_000;
/// Messages of the untimed first drain that warms the host (deploy, compile, first leases).
const WARM_DRAIN: u64 = 5_000;
const SCRAPE_EVERY: Duration = Duration::from_secs(1);

fn main() {
    if common::filtered_out("admin dashboard metrics sqlite postgres") {
        return;
    }
    common::count_processed();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |store: &str| {
        !args.iter().any(|a| a == "sqlite" || a == "postgres") || args.iter().any(|a| a == store)
    };
    println!("admin under load: {STORED} messages stored, drain of {DRAIN} (no-op guest)");
    for (store, postgres) in [("sqlite", false), ("postgres", true)] {
        if wants(store) {
            rt.block_on(measure(store, postgres));
        }
    }
}

fn schema() -> String {
    format!("wharf_bench_admin_{}", std::process::id())
}

async fn start(dir: &Path, postgres: bool) -> RunningHost {
    let storage = if postgres {
        format!(
            "url = \"{}\"\nschema = \"{}\"\nmax_connections = 16",
            database_url(),
            schema()
        )
    } else {
        "url = \"sqlite://bench.db\"".to_string()
    };
    std::fs::create_dir_all(dir.join("handlers")).unwrap();
    let config = dir.join("wharf.toml");
    std::fs::write(
        &config,
        format!(
            "[host]\nadmin_listen = \"127.0.0.1:0\"\n[storage]\n{storage}\n[queues.bench]\nhandler = \"noop\"\n"
        ),
    )
    .unwrap();
    wharf_host::start(Config::load(&config).unwrap())
        .await
        .unwrap()
}

/// Insert `rows` messages of queue `bench` in one statement: `pending`, or when `history` the
/// stored backlog (every 20th failed with an error, the rest processed).
async fn insert(dir: &Path, postgres: bool, rows: u64, history: bool) {
    let now = wharf_host::queue::now_ms();
    let (status, error, processed) = if history {
        (
            "CASE WHEN i % 20 = 0 THEN 'failed' ELSE 'processed' END",
            "CASE WHEN i % 20 = 0 THEN 'permanent: order has no lines' END",
            "CASE WHEN i % 20 = 0 THEN NULL ELSE {now} END",
        )
    } else {
        ("'pending'", "NULL", "NULL")
    };
    let processed = processed.replace("{now}", &now.to_string());
    let select = format!(
        "SELECT 'bench', 'd' || i || '-{now}', '{{\"order_id\":\"' || i || '\",\"total_cents\":1999}}', 'h', {status}, \
         {attempts}, {now}, {now}, {now}, {now}, {processed}, {error}",
        attempts = if history { 1 } else { 0 },
    );
    let columns = "(queue, delivery_id, payload, payload_hash, status, attempts, process_at_ms, \
                   created_at_ms, enqueued_at_ms, updated_at_ms, processed_at_ms, last_error)";
    if postgres {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
        let sql = format!(
            "INSERT INTO {}.messages {columns} {} FROM generate_series(1, {rows}) AS i",
            schema(),
            select
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ANALYZE {}.messages",
            schema()
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        if !history {
            sqlx::query("NOTIFY wharf_ready")
                .execute(&mut conn)
                .await
                .unwrap();
        }
    } else {
        use sqlx::Connection;
        let url = format!("sqlite://{}", dir.join("bench.db").display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let sql = format!(
            "INSERT INTO messages {columns} WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}) {select} FROM n"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
    }
}

/// Request `path` from the admin server: how long the whole answer took.
async fn timed_get(client: &reqwest::Client, base: &str, path: &str) -> Duration {
    let started = Instant::now();
    let response = client.get(format!("{base}{path}")).send().await.unwrap();
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    response.bytes().await.unwrap();
    started.elapsed()
}

/// The requests a scrape and one dashboard refresh make.
fn paths(failed_key: i64) -> Vec<(&'static str, String)> {
    vec![
        ("GET /metrics", "/metrics".to_string()),
        ("GET / (dashboard page)", "/".to_string()),
        (
            "GET /api/v1/queues (overview)",
            "/api/v1/queues".to_string(),
        ),
        (
            "GET /api/v1/messages (50 failed)",
            "/api/v1/messages?queue=bench&status=failed&limit=50".to_string(),
        ),
        (
            "GET /api/v1/messages/{key}",
            format!("/api/v1/messages/{failed_key}"),
        ),
        ("GET /readyz", "/readyz".to_string()),
    ]
}

/// Time the drain of `messages` new pending messages, with a scraper running when `scraped`.
async fn drain(
    dir: &Path,
    postgres: bool,
    host: &RunningHost,
    scraped: bool,
    failed_key: i64,
    messages: u64,
) -> f64 {
    let stop = Arc::new(tokio::sync::Notify::new());
    let scraper = scraped.then(|| {
        let base = format!("http://{}", host.admin_addr);
        let stop = stop.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut ticks = tokio::time::interval(SCRAPE_EVERY);
            loop {
                tokio::select! {
                    _ = stop.notified() => break,
                    _ = ticks.tick() => {
                        for (_, path) in paths(failed_key) {
                            timed_get(&client, &base, &path).await;
                        }
                    }
                }
            }
        })
    });
    let target = common::PROCESSED.load(Ordering::Relaxed) + messages;
    let started = Instant::now();
    insert(dir, postgres, messages, false).await;
    while common::PROCESSED.load(Ordering::Relaxed) < target {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    stop.notify_one();
    if let Some(scraper) = scraper {
        scraper.await.unwrap();
    }
    rate
}

async fn measure(store: &str, postgres: bool) {
    let dir = tempfile::tempdir().unwrap();
    let host = start(dir.path(), postgres).await;
    let filling = Instant::now();
    insert(dir.path(), postgres, STORED, true).await;
    println!(
        "{store}: stored {STORED} messages in {:.1} s",
        filling.elapsed().as_secs_f64()
    );
    // Warm the host: deploy and compile the handler, run a first drain.
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    std::fs::copy(&guest, dir.path().join("handlers/noop.wasm")).unwrap();
    while host.registry.get("noop").is_none() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failed_key = 20;
    drain(dir.path(), postgres, &host, false, failed_key, WARM_DRAIN).await;

    // Each admin answer, idle host, 1M stored: median and worst of 20.
    let client = reqwest::Client::new();
    let base = format!("http://{}", host.admin_addr);
    for (name, path) in paths(failed_key) {
        let mut times = Vec::new();
        for _ in 0..20 {
            times.push(timed_get(&client, &base, &path).await.as_secs_f64() * 1000.0);
        }
        let worst = times.iter().cloned().fold(0.0, f64::max);
        println!(
            "{store}: {name:<34} median {:>7.2} ms, worst {:>7.2} ms {}",
            common::median(times),
            worst,
            if worst <= 200.0 {
                "(≤ 200 ms)"
            } else {
                "(OVER 200 ms)"
            }
        );
    }

    // Drain with and without a scraper, interleaved. The drain slows as the table grows, so
    // each quiet drain is paired with a scraped one next to it and the paired ratios (not the
    // medians of each column) tell the cost. A round runs two pairs in both orders (quiet,
    // scraped, scraped, quiet), so the position in the run counts against neither side.
    let (mut quiet, mut scraped) = (Vec::new(), Vec::new());
    for _ in 0..common::rounds() {
        quiet.push(drain(dir.path(), postgres, &host, false, failed_key, DRAIN).await);
        scraped.push(drain(dir.path(), postgres, &host, true, failed_key, DRAIN).await);
        scraped.push(drain(dir.path(), postgres, &host, true, failed_key, DRAIN).await);
        quiet.push(drain(dir.path(), postgres, &host, false, failed_key, DRAIN).await);
    }
    let ratios: Vec<f64> = quiet
        .iter()
        .zip(&scraped)
        .map(|(q, s)| (s / q - 1.0) * 100.0)
        .collect();
    let change = common::median(ratios.clone());
    println!(
        "{store}: drain quiet {quiet:.0?} msg/s, scraped every {SCRAPE_EVERY:?} {scraped:.0?} msg/s; \
         paired change {ratios:.1?} %, median {change:+.1} % {}",
        if change >= -5.0 {
            "(within 5 %)"
        } else {
            "(SLOWER than 5 %)"
        }
    );
    host.shutdown().await;
    if postgres {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            schema()
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
}
