//! End-to-end throughput on SQLite: 20k messages enqueued, then processed by a no-op guest
//! through the whole host (lease batches, fresh instance per message, batched settlement).

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use wharf_host::Config;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::{NewMessage, Status};

const MESSAGES: u64 = 20_000;

async fn run_once() -> Duration {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    let config_path = dir.path().join("wharf.toml");
    std::fs::write(
        &config_path,
        "[host]\nadmin_listen = \"127.0.0.1:0\"\n[storage]\nurl = \"sqlite://bench.db\"\n\
         [queues.bench]\nhandler = \"noop\"\nconcurrency = 64\nbatch = 64\n",
    )
    .unwrap();
    let host = wharf_host::start(Config::load(&config_path).unwrap())
        .await
        .unwrap();
    // Fill the queue while no handler is deployed, then deploy and time the drain.
    let mut producers = tokio::task::JoinSet::new();
    for p in 0..8u64 {
        let router = host.router.clone();
        producers.spawn(async move {
            for n in (p..MESSAGES).step_by(8) {
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
        if done == MESSAGES {
            break;
        }
    }
    let elapsed = started.elapsed();
    host.shutdown().await;
    elapsed
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("sqlite end-to-end");
    group.throughput(Throughput::Elements(MESSAGES));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(40));
    group.bench_function("no-op guest, 20k messages", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += rt.block_on(run_once());
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
