//! Ordered sessions on PostgreSQL: 10,000 sessions × 10 messages drained by a no-op guest,
//! the same queue with `sessions = true` and without (every message still carries its
//! session key), rounds interleaved (`WHARF_BENCH_ROUNDS`, default 2). With the queue
//! defaults and tuned (`concurrency = 128`, `batch = 128`). The backlog is written straight
//! into the store before the host starts; the drain is timed between 1 % and 99 % processed.
//! `WHARF_BENCH_SESSIONS` (default 10,000) and `WHARF_BENCH_PER_SESSION` (default 10) size it.
//! The runs share one compiled-component cache, so the no-op guest compiles once.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;

use wharf_host::Config;
use wharf_host::queue::NewMessage;

use common::{PROCESSED, database_url, median};

// The allocator the `wharf` binary runs on, so the figures are what it does.
wharf_host::use_jemalloc!();

/// Sessions per run unless `WHARF_BENCH_SESSIONS` says otherwise. At 3,000 (30,000 messages,
/// drains of 1–3 s) the queue without sessions drained much faster than at 10,000 and the
/// ratio fell from 77 % to 45–60 %: too short a drain for a steady state, so 10,000 it is.
const SESSIONS: u64 = 10_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// One drain; returns msg/s.
async fn run_once(
    sessions_on: bool,
    tuned: bool,
    sessions: u64,
    per: u64,
    run: usize,
    cache: &Path,
) -> f64 {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let dir = tempfile::tempdir().unwrap();
    let schema = format!("wharf_sb_{}_{run}", std::process::id());
    let mut text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\ncache_dir = \"{}\"\n\
         [storage]\nurl = \"{}\"\nschema = \"{schema}\"\n\
         max_connections = 16\n[queues.bench]\nhandler = \"noop\"\nsessions = {sessions_on}\n",
        cache.display(),
        database_url()
    );
    if tuned {
        text += "concurrency = 128\nbatch = 128\n";
    }
    let path = dir.path().join("wharf.toml");
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path).unwrap();
    let store = wharf_host::queue::open(&config.storage.url, Some(&schema), 4)
        .await
        .unwrap();
    // Sessions interleaved, as independent producers write them.
    let all: Vec<NewMessage> = (0..per)
        .flat_map(|n| {
            (0..sessions).map(move |s| NewMessage {
                payload: format!("{{\"order\":{s},\"event\":{n}}}"),
                session: Some(format!("order-{s}")),
                ..NewMessage::default()
            })
        })
        .collect();
    for chunk in all.chunks(10_000) {
        store
            .enqueue_many("bench", chunk.to_vec(), false)
            .await
            .unwrap();
    }
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    std::fs::copy(&guest, dir.path().join("handlers/noop.wasm")).unwrap();
    let base = PROCESSED.load(Ordering::Relaxed);
    let host = wharf_host::start(config).await.unwrap();
    let label = format!("sessions {sessions_on}");
    let drain = common::time_drain(base, sessions * per, &label).await;
    host.shutdown().await;
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    let sql = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .unwrap();
    drain
}

fn main() {
    if common::filtered_out("sessions postgres") {
        return;
    }
    common::count_processed();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let sessions = env_or("WHARF_BENCH_SESSIONS", SESSIONS);
    let per = env_or("WHARF_BENCH_PER_SESSION", 10);
    // One compiled-component cache for every run: the guest compiles once.
    let cache = tempfile::tempdir().unwrap();
    let rows = [(false, false), (true, false), (false, true), (true, true)];
    let mut drains: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut run = 0;
    for round in 1..=common::rounds() {
        for (i, (on, tuned)) in rows.iter().enumerate() {
            run += 1;
            let drain = rt.block_on(run_once(*on, *tuned, sessions, per, run, cache.path()));
            println!("round {round}: sessions {on:<5} tuned {tuned:<5} drain {drain:>7.0} msg/s");
            drains[i].push(drain);
        }
    }
    println!(
        "\nPostgreSQL, {sessions} sessions × {per} messages, medians over {} rounds:",
        common::rounds()
    );
    println!("| queue settings | sessions off (msg/s) | sessions on (msg/s) | on / off |");
    println!("|---|---|---|---|");
    for (name, off, on) in [("defaults", 0, 1), ("concurrency 128, batch 128", 2, 3)] {
        let (off, on) = (median(drains[off].clone()), median(drains[on].clone()));
        println!(
            "| {name} | {off:.0} | {on:.0} | {:.0} % |",
            on / off * 100.0
        );
    }
}
