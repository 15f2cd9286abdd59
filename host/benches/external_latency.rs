//! Enqueue → settled latency through Redis external storage at a steady offered load
//! (default 15k msg/s, half the throughput target; `WHARF_BENCH_RATE` to change), no-op
//! guest, 10 seconds. Every 10 ms one probe message with its own MessageId joins the load,
//! timed from when its enqueue returns; a single poller checks (one pipelined round trip per
//! millisecond) when each probe's id leaves the queue's id index, which the settlement does.
//! Prints p50 / p99 / max.

mod common;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wharf_host::Config;
use wharf_host::enqueue::Enqueuer;
use wharf_host::external::redis::Keys;
use wharf_host::queue::NewMessage;

// The allocator the `wharf` binary runs on, so the figures are what it does.
wharf_host::use_jemalloc!();

fn main() {
    if common::filtered_out("latency redis external") {
        return;
    }
    let rate: u64 = std::env::var("WHARF_BENCH_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(15_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(measure(rate, Duration::from_secs(10)));
}

async fn measure(rate: u64, duration: Duration) {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    std::fs::copy(&guest, dir.path().join("handlers/noop.wasm")).unwrap();
    let prefix = format!("wharf-bench-latency:{}:", std::process::id());
    let text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\n[storage]\nurl = \"sqlite://bench.db\"\n\
         [providers.main]\ntype = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n\
         [queues.bench]\nhandler = \"noop\"\nstorage = \"external\"\nprovider = \"main\"\n\
         concurrency = 256\nbatch = 256\n",
        common::redis_url()
    );
    let config_path = dir.path().join("wharf.toml");
    std::fs::write(&config_path, text).unwrap();
    let host = wharf_host::start(Config::load(&config_path).unwrap())
        .await
        .unwrap();
    let ids_key = Keys::new(&prefix, "bench").ids;
    let outstanding: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();

    // The poller: one pipelined HEXISTS per outstanding probe, every millisecond.
    let stop = tokio_util::sync::CancellationToken::new();
    let poller = {
        let (outstanding, latencies, stop) = (outstanding.clone(), latencies.clone(), stop.clone());
        let mut conn = redis::Client::open(common::redis_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let ids: Vec<String> = outstanding.lock().unwrap().keys().cloned().collect();
                if ids.is_empty() {
                    continue;
                }
                let mut pipe = redis::pipe();
                for id in &ids {
                    pipe.hexists(&ids_key, id);
                }
                let present: Vec<bool> = pipe.query_async(&mut conn).await.unwrap();
                let now = Instant::now();
                let mut map = outstanding.lock().unwrap();
                for (id, present) in ids.iter().zip(present) {
                    if !present && let Some(sent) = map.remove(id) {
                        latencies.lock().unwrap().push(now - sent);
                    }
                }
            }
        })
    };

    // The load: `rate` messages a second in 1 ms ticks, with a probe every 10 ms.
    let started = Instant::now();
    let per_tick = (rate / 1000).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut n: u64 = 0;
    let mut probes = 0u64;
    let mut enqueues = tokio::task::JoinSet::new();
    while started.elapsed() < duration {
        tick.tick().await;
        for _ in 0..per_tick {
            n += 1;
            let router = host.router.clone();
            let id = if n.is_multiple_of((rate / 100).max(1)) {
                probes += 1;
                Some(format!("probe-{probes}"))
            } else {
                None
            };
            let outstanding = outstanding.clone();
            enqueues.spawn(async move {
                router
                    .enqueue(
                        "bench",
                        NewMessage {
                            id: id.clone(),
                            payload: format!(r#"{{"order_id":"{n}"}}"#),
                            ..NewMessage::default()
                        },
                    )
                    .await
                    .unwrap();
                // A probe's clock starts once its enqueue returned: before, its id may not
                // be in the index yet, which the poller would take for settled.
                if let Some(id) = id {
                    outstanding.lock().unwrap().insert(id, Instant::now());
                }
            });
        }
        while enqueues.try_join_next().is_some() {}
    }
    enqueues.join_all().await;
    let wait = Instant::now();
    while !outstanding.lock().unwrap().is_empty() && wait.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    let _ = poller.await;
    host.shutdown().await;
    let mut all = latencies.lock().unwrap().clone();
    all.sort();
    let pick = |q: f64| all[((all.len() as f64 - 1.0) * q) as usize];
    println!(
        "latency redis external: {} msg/s offered for {:?}, {} probes ({} lost): p50 {:?}, p99 {:?}, max {:?}",
        rate,
        duration,
        all.len(),
        outstanding.lock().unwrap().len(),
        pick(0.5),
        pick(0.99),
        all.last().unwrap()
    );
    common::delete_redis_keys(&prefix).await;
}
