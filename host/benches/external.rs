//! End-to-end throughput through Redis external pending storage: 100k envelopes enqueued in
//! batches while no handler is deployed, then drained by a no-op guest (batched leases and
//! settlements; the happy path never touches SQL).

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use wharf_host::Config;
use wharf_host::external::redis::{RedisProvider, RedisSettings};
use wharf_host::external::{Envelope, Provider, PublishOptions};

const MESSAGES: u64 = 100_000;

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

async fn run_once(run: u64) -> Duration {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    let prefix = format!("wharf-bench:{}:{run}:", std::process::id());
    let text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\n[storage]\nurl = \"sqlite://bench.db\"\n\
         [providers.main]\ntype = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n\
         [queues.bench]\nhandler = \"noop\"\nstorage = \"external\"\nprovider = \"main\"\n\
         concurrency = 256\nbatch = 256\n",
        redis_url()
    );
    let config_path = dir.path().join("wharf.toml");
    std::fs::write(&config_path, text).unwrap();
    let host = wharf_host::start(Config::load(&config_path).unwrap())
        .await
        .unwrap();
    let storage = RedisProvider::open(RedisSettings {
        key_prefix: prefix.clone(),
        ..RedisSettings::new(redis_url())
    })
    .await
    .unwrap();
    for chunk in 0..(MESSAGES / 1000) {
        let envelopes: Vec<Envelope> = (0..1000)
            .map(|i| {
                let n = chunk * 1000 + i;
                Envelope::new(
                    format!(r#"{{"order_id":"{n}","customer":"Ada","total_cents":1999}}"#),
                    None,
                    0,
                )
            })
            .collect();
        storage
            .publish("bench", &envelopes, PublishOptions::default())
            .await
            .unwrap();
    }
    let started = Instant::now();
    std::fs::copy(&guest, dir.path().join("handlers/noop.wasm")).unwrap();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let depth = storage.depth("bench").await.unwrap();
        if depth.ready == 0 && depth.in_flight == 0 {
            break;
        }
    }
    let elapsed = started.elapsed();
    host.shutdown().await;
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
    elapsed
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut run = 0;
    let mut group = c.benchmark_group("end-to-end");
    group.throughput(Throughput::Elements(MESSAGES));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(30));
    group.bench_function("redis external, no-op guest, 100k messages", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                run += 1;
                total += rt.block_on(run_once(run));
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
