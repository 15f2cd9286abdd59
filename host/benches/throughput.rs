//! End-to-end throughput: messages enqueued, then processed by a no-op guest through the
//! whole host (lease batches, fresh instance per message, batched settlement), on SQLite
//! (20k messages) and PostgreSQL (100k messages, without and with the consumer inbox).

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use wharf_host::Config;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::{NewMessage, Status};

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// The `[storage]` body for a run: SQLite in `dir`, or a fresh PostgreSQL schema.
fn storage(postgres: bool, run: u64) -> String {
    if postgres {
        format!(
            "url = \"{}\"\nschema = \"wharf_bench_{}_{run}\"\nmax_connections = 16",
            database_url(),
            std::process::id()
        )
    } else {
        "url = \"sqlite://bench.db\"".to_string()
    }
}

async fn drop_schema(postgres: bool, run: u64) {
    if postgres {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
        let sql = format!(
            "DROP SCHEMA IF EXISTS wharf_bench_{}_{run} CASCADE",
            std::process::id()
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
    }
}

async fn run_once(postgres: bool, inbox: bool, messages: u64, run: u64) -> Duration {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    let config_path = dir.path().join("wharf.toml");
    let text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\n[storage]\n{}\n[queues.bench]\nhandler = \"noop\"\nconcurrency = 64\nbatch = 64\n{}",
        storage(postgres, run),
        if inbox {
            "inbox = { store = \"sql\" }\n"
        } else {
            ""
        }
    );
    std::fs::write(&config_path, text).unwrap();
    let host = wharf_host::start(Config::load(&config_path).unwrap())
        .await
        .unwrap();
    // Fill the queue while no handler is deployed, then deploy and time the drain.
    let mut producers = tokio::task::JoinSet::new();
    for p in 0..16u64 {
        let router = host.router.clone();
        producers.spawn(async move {
            for n in (p..messages).step_by(16) {
                let payload =
                    format!(r#"{{"order_id":"{n}","customer":"Ada","total_cents":1999}}"#);
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
            }
        });
    }
    producers.join_all().await;
    let started = Instant::now();
    std::fs::copy(&guest, dir.path().join("handlers/noop.wasm")).unwrap();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let counts = host.store.counts("bench").await.unwrap();
        let done = counts
            .iter()
            .find(|(s, _)| *s == Status::Processed)
            .map_or(0, |(_, n)| *n);
        if done == messages {
            break;
        }
    }
    let elapsed = started.elapsed();
    host.shutdown().await;
    drop_schema(postgres, run).await;
    elapsed
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut run = 0;
    for (name, postgres, inbox, messages, time) in [
        (
            "sqlite, no-op guest, 20k messages",
            false,
            false,
            20_000u64,
            40,
        ),
        (
            "postgres, no-op guest, 100k messages",
            true,
            false,
            100_000u64,
            60,
        ),
        (
            "postgres + sql inbox, no-op guest, 100k messages",
            true,
            true,
            100_000u64,
            60,
        ),
    ] {
        let mut group = c.benchmark_group("end-to-end");
        group.throughput(Throughput::Elements(messages));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(time));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    run += 1;
                    total += rt.block_on(run_once(postgres, inbox, messages, run));
                }
                total
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
