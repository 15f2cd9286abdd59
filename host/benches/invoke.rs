//! Per-message cost of a fresh instance plus one `handle` call: the no-op Rust guest, and
//! the `order-export` sample (parse the order, log it, enqueue a follow-up) in Rust,
//! JavaScript on QuickJS (jco) and on SpiderMonkey (componentize-js), and Python
//! (componentize-py).
//!
//! Each row: 1 s of warm-up, then 30 samples over 2 s (criterion's defaults are 3 s, 100
//! samples over 5 s; the Python row needs ≥ 5050 calls at 100 samples, about 9–12 s here).
//! The compiled components are cached in the target directory (`CARGO_TARGET_TMPDIR`), keyed
//! by the guest's content and the engine's settings, so the guests compile only when they
//! change: a cached component is served from its cache file exactly as a freshly compiled
//! one is (the host writes it and maps the file back), so the rows do not depend on which.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use wharf_host::Config;
use wharf_host::enqueue::{EnqueueError, Enqueuer};
use wharf_host::queue::{EnqueueStatus, Enqueued, NewMessage};
use wharf_host::runtime::{HandlerRegistry, Message, Outcome, invoke};

// The allocator the `wharf` binary runs on, so the figures are what it does.
wharf_host::use_jemalloc!();

/// Accepts every follow-up without storing it: the rows measure the guest, not a store.
struct Accept;

#[async_trait]
impl Enqueuer for Accept {
    async fn enqueue(&self, _: &str, _: NewMessage) -> Result<Enqueued, EnqueueError> {
        Ok(Enqueued {
            key: 1,
            status: EnqueueStatus::Added,
        })
    }
}

fn bench(c: &mut Criterion) {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-handlers/target");
    let guests = [
        ("no-op guest", built.join("wasm32-wasip2/release/noop.wasm")),
        (
            "order-export, Rust",
            built.join("wasm32-wasip2/release/order_export.wasm"),
        ),
        (
            "order-export, JavaScript (QuickJS)",
            built.join("js/order-export.wasm"),
        ),
        (
            "order-export, JavaScript (SpiderMonkey)",
            built.join("js-spidermonkey/order-export.wasm"),
        ),
        (
            "order-export, Python",
            built.join("python/order-export.wasm"),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::empty(dir.path().join("wharf.toml"));
    // Kept between runs: compiling the JavaScript and Python guests cold takes seconds (8 s
    // on a fast day here, more on a slow one), which none of the rows measures.
    config.host.cache_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wharf-bench-invoke-cache");
    let registry = HandlerRegistry::new(Arc::new(config)).unwrap();
    let handlers = dir.path().join("handlers");
    std::fs::create_dir_all(&handlers).unwrap();
    let enqueuer: Arc<dyn Enqueuer> = Arc::new(Accept);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (i, (label, guest)) in guests.iter().enumerate() {
        assert!(
            guest.exists(),
            "build the guests first: cargo xtask guests ({})",
            guest.display()
        );
        let file = handlers.join(format!("guest{i}.wasm"));
        std::fs::copy(guest, &file).unwrap();
        registry.load_file(&file).unwrap();
        let handler = registry.get(&format!("guest{i}")).unwrap();
        let message = Message {
            queue: "bench".into(),
            id: Some("order-1".into()),
            delivery_id: "0123456789abcdef".into(),
            payload: r#"{"order_id":"o-1","customer":"Ada","total_cents":1250}"#.into(),
            priority: 0,
            attempt: 1,
            max_attempts: 5,
            enqueued_at_ms: 0,
            headers: vec![],
        };
        c.bench_function(&format!("fresh instance + handle ({label})"), |b| {
            b.to_async(&rt).iter(|| async {
                let out = invoke(
                    &handler,
                    message.clone(),
                    Duration::from_secs(10),
                    enqueuer.clone(),
                )
                .await;
                assert!(matches!(out, Ok(Ok(Outcome::Completed))), "{out:?}");
            })
        });
    }
}

/// Sized so the five rows take about 3.5 s each (warm-up, samples, analysis) instead of
/// 8–15 s: 30 samples still give a stable mean for calls of 10 µs to 2 ms. criterion's
/// `--warm-up-time`, `--measurement-time` and `--sample-size` flags still override these.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
