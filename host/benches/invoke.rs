//! Per-message cost of a fresh instance plus one `handle` call: the no-op Rust guest, and
//! the `flaky` fixture (with an empty payload it parses the JSON and completes) in Rust,
//! JavaScript (jco, QuickJS) and Python (componentize-py).

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use wharf_host::Config;
use wharf_host::enqueue::{EnqueueError, Enqueuer};
use wharf_host::queue::{Enqueued, NewMessage};
use wharf_host::runtime::{HandlerRegistry, Message, invoke};

struct NoEnqueue;

#[async_trait]
impl Enqueuer for NoEnqueue {
    async fn enqueue(&self, queue: &str, _: NewMessage) -> Result<Enqueued, EnqueueError> {
        Err(EnqueueError::UnknownQueue {
            queue: queue.into(),
            known: String::new(),
        })
    }
}

fn bench(c: &mut Criterion) {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-handlers/target");
    let guests = [
        ("no-op guest", built.join("wasm32-wasip2/release/noop.wasm")),
        (
            "flaky, Rust",
            built.join("wasm32-wasip2/release/flaky.wasm"),
        ),
        ("flaky, JavaScript (QuickJS)", built.join("js/flaky.wasm")),
        ("flaky, Python", built.join("python/flaky.wasm")),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::empty(dir.path().join("wharf.toml"));
    config.host.cache_dir = dir.path().join("cache");
    let registry = HandlerRegistry::new(Arc::new(config)).unwrap();
    let handlers = dir.path().join("handlers");
    std::fs::create_dir_all(&handlers).unwrap();
    let enqueuer: Arc<dyn Enqueuer> = Arc::new(NoEnqueue);
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
            payload: "{}".into(),
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
                assert!(matches!(out, Ok(Ok(_))), "{out:?}");
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
