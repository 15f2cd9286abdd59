//! The host's durable delivery counts (for brokers that only flag redeliveries or tell
//! nothing), on both SQL stores: counted per queue and key, forgotten on settlement, and a
//! hand-back forgiven one count.

use wharf_host::external::{AttemptCounter, SqlActivations, SqlAttempts, attempt_key};
use wharf_tests::{PgSchema, database_url};

async fn scenario(counter: &SqlAttempts) {
    let a = attempt_key(Some("order-1"), b"{}");
    let b = attempt_key(None, b"body");
    assert_eq!(a, "id:order-1");
    assert!(b.starts_with("sha256:") && b.len() == 7 + 64, "{b}");
    let keys = [a.clone(), b.clone()];
    assert_eq!(counter.redelivered("q", &keys).await.unwrap(), vec![1, 1]);
    assert_eq!(counter.redelivered("q", &keys).await.unwrap(), vec![2, 2]);
    // Another queue counts apart.
    assert_eq!(
        counter.redelivered("other", &keys[..1]).await.unwrap(),
        vec![1]
    );
    counter.forgive("q", &keys[..1]).await.unwrap();
    assert_eq!(counter.redelivered("q", &keys).await.unwrap(), vec![2, 3]);
    counter.forget("q", &keys).await.unwrap();
    assert_eq!(counter.redelivered("q", &keys).await.unwrap(), vec![1, 1]);
    // A hand-back before any count: the next redelivery is not an attempt.
    let c = attempt_key(Some("order-2"), b"{}");
    counter
        .forgive("q", std::slice::from_ref(&c))
        .await
        .unwrap();
    assert_eq!(counter.redelivered("q", &[c]).await.unwrap(), vec![0]);
}

#[tokio::test]
async fn on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    wharf_host::queue::open(&url, None, 1).await.unwrap(); // migrations
    let activations = SqlActivations::open(&url, None).await.unwrap();
    scenario(&SqlAttempts::beside(&activations)).await;
}

#[tokio::test]
async fn on_postgres() {
    let schema = PgSchema::new();
    let url = database_url();
    wharf_host::queue::open(&url, Some(&schema.name), 1)
        .await
        .unwrap();
    let activations = SqlActivations::open(&url, Some(&schema.name))
        .await
        .unwrap();
    scenario(&SqlAttempts::beside(&activations)).await;
}
