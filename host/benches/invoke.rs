//! Per-message cost of a fresh instance plus one `handle` call of a no-op guest.

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
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::empty(dir.path().join("wharf.toml"));
    config.host.cache_dir = dir.path().join("cache");
    let registry = HandlerRegistry::new(Arc::new(config)).unwrap();
    let handlers = dir.path().join("handlers");
    std::fs::create_dir_all(&handlers).unwrap();
    std::fs::copy(&guest, handlers.join("noop.wasm")).unwrap();
    registry.load_file(&handlers.join("noop.wasm")).unwrap();
    let handler = registry.get("noop").unwrap();
    let enqueuer: Arc<dyn Enqueuer> = Arc::new(NoEnqueue);
    let message = Message {
        queue: "bench".into(),
        id: Some("order-1".into()),
        delivery_id: "0123456789abcdef".into(),
        payload: r#"{"order_id":"A-1","customer":"Ada","total_cents":1999}"#.into(),
        priority: 0,
        attempt: 1,
        max_attempts: 5,
        enqueued_at_ms: 0,
        headers: vec![],
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    c.bench_function("fresh instance + handle (no-op guest)", |b| {
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

criterion_group!(benches, bench);
criterion_main!(benches);
