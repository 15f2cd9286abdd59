//! The `InboxStore` contract, run against every store: SQLite, PostgreSQL, Redis (one server
//! and a three-master Redis Cluster), memory.

use std::sync::Arc;
use std::time::Duration;

use wharf_host::inbox::{InboxKey, InboxStore, MemoryInbox, RedisInbox, SqlInbox};
use wharf_host::queue::now_ms;
use wharf_tests::redis_nodes::RedisCluster;
use wharf_tests::{PgSchema, database_url, redis_url, unique_prefix};

/// Long enough for every test; short enough that Redis forgets test keys soon.
const WEEK: i64 = 120_000;

struct Subject {
    store: Arc<dyn InboxStore>,
    _guard: Box<dyn std::any::Any + Send>,
}

async fn sqlite() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    Subject {
        store: Arc::new(
            SqlInbox::open_sqlite(&url, "wharf_inbox", true)
                .await
                .unwrap(),
        ),
        _guard: Box::new(dir),
    }
}

async fn postgres() -> Subject {
    let schema = PgSchema::new();
    // The queue store creates the schema; here the inbox is alone, so create it first.
    wharf_host::queue::SqlStore::open_postgres(&database_url(), Some(&schema.name), 1)
        .await
        .unwrap();
    let store = SqlInbox::open_postgres(&database_url(), Some(&schema.name), "wharf_inbox", true)
        .await
        .unwrap();
    Subject {
        store: Arc::new(store),
        _guard: Box::new(schema),
    }
}

async fn redis() -> Subject {
    let store = RedisInbox::open(&redis_url(), &unique_prefix("inbox"))
        .await
        .unwrap();
    Subject {
        store: Arc::new(store),
        _guard: Box::new(()),
    }
}

async fn redis_cluster() -> Subject {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3));
    let store = RedisInbox::open(&cluster.url(), &unique_prefix("inbox"))
        .await
        .unwrap();
    Subject {
        store: Arc::new(store),
        _guard: Box::new(cluster),
    }
}

async fn memory() -> Subject {
    Subject {
        store: Arc::new(MemoryInbox::default()),
        _guard: Box::new(()),
    }
}

fn key(endpoint: &str, id: &str) -> InboxKey {
    InboxKey::new(endpoint, id).unwrap()
}

macro_rules! for_store {
    ($store:ident: $($test:ident),* $(,)?) => {
        mod $store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let subject = super::$store().await;
                    super::$test(subject.store.clone()).await;
                }
            )*
        }
    };
}

macro_rules! conformance {
    ($($store:ident),*) => {
        $(
            for_store!($store:
                recorded_ids_are_processed,
                batches_are_checked_and_recorded_in_order,
                concurrent_records_are_idempotent,
                endpoints_are_isolated,
                ids_are_case_sensitive,
                trailing_whitespace_makes_ids_distinct,
                ids_of_512_characters_work,
                expired_records_are_not_processed,
            );
        )*
    };
}

conformance!(sqlite, postgres, redis, redis_cluster, memory);

/// Stores that keep expired rows until purged (Redis expires keys by itself).
macro_rules! purging {
    ($($store:ident),*) => {
        mod purge {
            $(
                mod $store {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn purge_removes_only_expired_rows_of_its_endpoint() {
                        let subject = super::super::$store().await;
                        super::super::purge_removes_only_expired_rows_of_its_endpoint(subject.store.clone()).await;
                    }
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn purge_is_bounded_per_pass() {
                        let subject = super::super::$store().await;
                        super::super::purge_is_bounded_per_pass(subject.store.clone()).await;
                    }
                }
            )*
        }
    };
}

purging!(sqlite, postgres, memory);

async fn recorded_ids_are_processed(store: Arc<dyn InboxStore>) {
    let k = key("billing", "msg-1");
    assert!(!store.is_processed(&k).await.unwrap());
    store.record(&k, WEEK).await.unwrap();
    assert!(store.is_processed(&k).await.unwrap());
    store.record(&k, WEEK).await.unwrap();
    assert!(
        store.is_processed(&k).await.unwrap(),
        "recording twice is fine"
    );
}

async fn batches_are_checked_and_recorded_in_order(store: Arc<dyn InboxStore>) {
    // 1,200 keys: more than one statement's worth where a store splits batches.
    let keys: Vec<InboxKey> = (0..1200)
        .map(|n| key("billing", &format!("b-{n}")))
        .collect();
    let even: Vec<InboxKey> = keys.iter().step_by(2).cloned().collect();
    store.record_many(&even, WEEK).await.unwrap();
    store.record_many(&even[..10], WEEK).await.unwrap();
    let seen = store.check_many(&keys).await.unwrap();
    assert_eq!(seen.len(), 1200);
    for (n, processed) in seen.iter().enumerate() {
        assert_eq!(*processed, n % 2 == 0, "key b-{n}");
    }
    assert!(store.check_many(&[]).await.unwrap().is_empty());
}

async fn concurrent_records_are_idempotent(store: Arc<dyn InboxStore>) {
    let k = key("billing", "race");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (store, k) = (store.clone(), k.clone());
        tasks.spawn(async move { store.record(&k, WEEK).await });
    }
    for result in tasks.join_all().await {
        result.expect("every concurrent first writer succeeds");
    }
    assert!(store.is_processed(&k).await.unwrap());
}

async fn endpoints_are_isolated(store: Arc<dyn InboxStore>) {
    store.record(&key("billing", "m-1"), WEEK).await.unwrap();
    assert!(!store.is_processed(&key("shipping", "m-1")).await.unwrap());
    assert!(store.is_processed(&key("billing", "m-1")).await.unwrap());
}

async fn ids_are_case_sensitive(store: Arc<dyn InboxStore>) {
    store
        .record(&key("billing", "Order-A"), WEEK)
        .await
        .unwrap();
    assert!(
        !store
            .is_processed(&key("billing", "order-a"))
            .await
            .unwrap()
    );
    assert!(
        !store
            .is_processed(&key("Billing", "Order-A"))
            .await
            .unwrap()
    );
}

async fn trailing_whitespace_makes_ids_distinct(store: Arc<dyn InboxStore>) {
    store.record(&key("billing", "m-1"), WEEK).await.unwrap();
    assert!(!store.is_processed(&key("billing", "m-1 ")).await.unwrap());
    assert!(!store.is_processed(&key("billing", "m-1\t")).await.unwrap());
}

async fn ids_of_512_characters_work(store: Arc<dyn InboxStore>) {
    let long = "é".repeat(512);
    let k = key("billing", &long);
    store.record(&k, WEEK).await.unwrap();
    assert!(store.is_processed(&k).await.unwrap());
    let mut other = long.clone();
    other.pop();
    other.push('e');
    assert!(!store.is_processed(&key("billing", &other)).await.unwrap());
}

async fn expired_records_are_not_processed(store: Arc<dyn InboxStore>) {
    // Checked against the clock rather than after a fixed sleep: on a loaded machine the
    // first check may already fall after the retention, and then only expiry is asserted.
    const RETENTION_MS: i64 = 1_000;
    let k = key("billing", "short-lived");
    let before = now_ms();
    store.record(&k, RETENTION_MS).await.unwrap();
    let processed = store.is_processed(&k).await.unwrap();
    if now_ms() < before + RETENTION_MS {
        assert!(processed, "a record counts within its retention");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.is_processed(&k).await.unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "after its retention a record no longer counts"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        now_ms() >= before + RETENTION_MS,
        "a record stopped counting before its retention ended"
    );
}

async fn purge_removes_only_expired_rows_of_its_endpoint(store: Arc<dyn InboxStore>) {
    store.record(&key("billing", "old"), WEEK).await.unwrap();
    store.record(&key("shipping", "old"), WEEK).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let cutoff = now_ms();
    tokio::time::sleep(Duration::from_millis(30)).await;
    store.record(&key("billing", "new"), WEEK).await.unwrap();
    assert_eq!(
        store.purge_expired("billing", cutoff, 1000).await.unwrap(),
        1
    );
    assert!(!store.is_processed(&key("billing", "old")).await.unwrap());
    assert!(
        store.is_processed(&key("billing", "new")).await.unwrap(),
        "newer than the cutoff: kept"
    );
    assert!(
        store.is_processed(&key("shipping", "old")).await.unwrap(),
        "another endpoint's record: kept"
    );
}

async fn purge_is_bounded_per_pass(store: Arc<dyn InboxStore>) {
    for n in 0..25 {
        store
            .record(&key("billing", &format!("m-{n}")), WEEK)
            .await
            .unwrap();
    }
    let cutoff = now_ms() + 1;
    assert_eq!(
        store.purge_expired("billing", cutoff, 10).await.unwrap(),
        10
    );
    assert_eq!(
        store.purge_expired("billing", cutoff, 10).await.unwrap(),
        10
    );
    assert_eq!(store.purge_expired("billing", cutoff, 10).await.unwrap(), 5);
    assert_eq!(store.purge_expired("billing", cutoff, 10).await.unwrap(), 0);
}

/// On PostgreSQL the lease statement checks the inbox itself; its SQL hash must be the same
/// bytes as `InboxKey::new`, for plain, non-ASCII and trailing-space endpoints.
#[tokio::test]
async fn postgres_lease_checks_the_same_keys_the_store_records() {
    let (queue, inbox, _schema) = postgres_queue_and_inbox().await;
    lease_checks_the_same_keys_the_store_records(&queue, &inbox).await;
}

/// On SQLite too (with the `wharf_inbox_key` function on the writer), for plain leases and for
/// the session-head lease of a queue with sessions.
#[tokio::test]
async fn sqlite_lease_checks_the_same_keys_the_store_records() {
    use wharf_host::queue::{Disposition, InboxProbe, NewMessage, QueueStore, Settlement};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("queue.db").display());
    let queue = wharf_host::queue::SqlStore::open_sqlite(&url, 2)
        .await
        .unwrap();
    let inbox = SqlInbox::open_sqlite(&url, "wharf_inbox", true)
        .await
        .unwrap();
    lease_checks_the_same_keys_the_store_records(&queue, &inbox).await;

    // A session head, checked by the lease of a queue with sessions.
    let probe = InboxProbe {
        table: "wharf_inbox".into(),
        endpoint: "billing".to_string(),
    };
    for n in 0..2 {
        queue
            .enqueue(
                "s",
                NewMessage {
                    payload: format!("{{\"n\":{n}}}"),
                    session: Some("order-1".into()),
                    ..NewMessage::default()
                },
                false,
            )
            .await
            .unwrap();
    }
    let head = queue
        .lease_in_sessions("s", 10, 60_000, None)
        .await
        .unwrap();
    assert_eq!(head.len(), 1, "one head per session");
    assert_eq!(head[0].inbox_processed, None, "no inbox asked for");
    inbox
        .record(
            &InboxKey::new("billing", &head[0].delivery_id).unwrap(),
            WEEK,
        )
        .await
        .unwrap();
    queue
        .settle(&[Settlement::new(head[0].lease, Disposition::Release)])
        .await
        .unwrap();
    let again = queue
        .lease_in_sessions("s", 10, 60_000, Some(&probe))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].delivery_id, head[0].delivery_id);
    assert_eq!(again[0].inbox_processed, Some(true));
}

async fn lease_checks_the_same_keys_the_store_records(
    queue: &dyn wharf_host::queue::QueueStore,
    inbox: &dyn InboxStore,
) {
    use wharf_host::queue::{InboxProbe, NewMessage};
    for n in 0..4 {
        queue
            .enqueue(
                "q",
                NewMessage {
                    payload: format!("{{\"n\":{n}}}"),
                    ..NewMessage::default()
                },
                false,
            )
            .await
            .unwrap();
    }
    // Lease everything once to learn the delivery ids, then put them back.
    let first = queue.lease("q", 10, 60_000).await.unwrap();
    assert_eq!(first.len(), 4);
    assert!(first.iter().all(|m| m.inbox_processed.is_none()));
    let endpoint = "endpoint é ";
    let recorded: Vec<String> = first[..2].iter().map(|m| m.delivery_id.clone()).collect();
    for id in &recorded {
        inbox
            .record(&InboxKey::new(endpoint, id).unwrap(), WEEK)
            .await
            .unwrap();
    }
    let releases: Vec<_> = first
        .iter()
        .map(|m| {
            wharf_host::queue::Settlement::new(m.lease, wharf_host::queue::Disposition::Release)
        })
        .collect();
    queue.settle(&releases).await.unwrap();

    assert!(queue.leases_check_inbox());
    let probe = InboxProbe {
        table: "wharf_inbox".into(),
        endpoint: endpoint.to_string(),
    };
    let again = queue
        .lease_checking_inbox("q", 10, 60_000, &probe)
        .await
        .unwrap();
    assert_eq!(again.len(), 4);
    for m in &again {
        let expected = recorded.contains(&m.delivery_id);
        assert_eq!(m.inbox_processed, Some(expected), "{}", m.delivery_id);
    }
    // Another endpoint sees none of them.
    let other = InboxProbe {
        table: "wharf_inbox".into(),
        endpoint: "endpoint é".to_string(),
    };
    queue
        .settle(
            &again
                .iter()
                .map(|m| {
                    wharf_host::queue::Settlement::new(
                        m.lease,
                        wharf_host::queue::Disposition::Release,
                    )
                })
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    let third = queue
        .lease_checking_inbox("q", 10, 60_000, &other)
        .await
        .unwrap();
    assert!(third.iter().all(|m| m.inbox_processed == Some(false)));
}

/// A settlement batch writes its inbox records with its completions, on every SQL store, also
/// for a message re-enqueued while it was leased (its newer version takes over) and for one
/// that lost its lease: a record follows the handler's success.
async fn completions_record_their_inbox_entries(
    queue: &dyn wharf_host::queue::QueueStore,
    inbox: &dyn InboxStore,
) {
    use wharf_host::queue::{
        Disposition, InboxRow, InboxWrite, NewMessage, SettleResult, Settlement, Status,
    };
    let message = |id: &str, payload: &str| NewMessage {
        id: Some(id.to_string()),
        payload: payload.to_string(),
        ..NewMessage::default()
    };
    for id in ["lost", "plain", "renewed"] {
        queue
            .enqueue("q", message(id, "{\"v\":1}"), false)
            .await
            .unwrap();
    }
    // "lost" is leased, its lease expires and another processor leases it again.
    let lost = queue.lease("q", 1, 0).await.unwrap().remove(0);
    assert_eq!(lost.id.as_deref(), Some("lost"));
    assert_eq!(queue.expire_leases("q", 5, true).await.unwrap(), 1);
    let mut leased = queue.lease("q", 10, 60_000).await.unwrap();
    assert_eq!(leased.len(), 3);
    leased.retain(|m| m.id.as_deref() != Some("lost"));
    leased.push(lost);
    queue
        .enqueue("q", message("renewed", "{\"v\":2}"), false)
        .await
        .unwrap();

    let endpoint = "completions";
    let settlements: Vec<Settlement> = leased
        .iter()
        .map(|m| {
            let key = key(endpoint, &m.delivery_id);
            Settlement {
                inbox: Some(InboxWrite {
                    table: "wharf_inbox".into(),
                    rows: vec![InboxRow {
                        hash: key.hash,
                        endpoint: key.endpoint,
                        message_id: key.message_id,
                    }],
                    retention_ms: WEEK,
                }),
                ..Settlement::new(m.lease, Disposition::Complete)
            }
        })
        .collect();
    let results = queue.settle(&settlements).await.unwrap();
    for (m, result) in leased.iter().zip(&results) {
        let expected = match m.id.as_deref() {
            Some("lost") => SettleResult::LeaseLost,
            _ => SettleResult::Applied,
        };
        assert_eq!(*result, expected, "{:?}", m.id);
        assert!(
            inbox
                .is_processed(&key(endpoint, &m.delivery_id))
                .await
                .unwrap(),
            "inbox record of {:?}",
            m.id
        );
    }
    let plain = leased
        .iter()
        .find(|m| m.id.as_deref() == Some("plain"))
        .unwrap();
    let stored = queue.get(plain.lease.key).await.unwrap().unwrap();
    assert_eq!(stored.status, Status::Processed);
    let renewed = leased
        .iter()
        .find(|m| m.id.as_deref() == Some("renewed"))
        .unwrap();
    let stored = queue.get(renewed.lease.key).await.unwrap().unwrap();
    assert_eq!(stored.status, Status::Pending);
    assert_eq!(stored.payload, "{\"v\":2}");
    let history = queue.history("q", "renewed").await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].status, Status::Processed);
    assert_eq!(history[0].payload, "{\"v\":1}");
}

#[tokio::test]
async fn sqlite_completions_record_their_inbox_entries() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("queue.db").display());
    let queue = wharf_host::queue::SqlStore::open_sqlite(&url, 2)
        .await
        .unwrap();
    let inbox = SqlInbox::open_sqlite(&url, "wharf_inbox", true)
        .await
        .unwrap();
    completions_record_their_inbox_entries(&queue, &inbox).await;
}

#[tokio::test]
async fn postgres_completions_record_their_inbox_entries() {
    let (queue, inbox, _schema) = postgres_queue_and_inbox().await;
    completions_record_their_inbox_entries(&queue, &inbox).await;
}

/// A PostgreSQL queue store with the inbox table in its schema (dropped with the guard).
async fn postgres_queue_and_inbox() -> (wharf_host::queue::SqlStore, SqlInbox, PgSchema) {
    let schema = PgSchema::new();
    let queue = wharf_host::queue::SqlStore::open_postgres(&database_url(), Some(&schema.name), 2)
        .await
        .unwrap();
    let inbox = SqlInbox::open_postgres(&database_url(), Some(&schema.name), "wharf_inbox", true)
        .await
        .unwrap();
    (queue, inbox, schema)
}

/// The index names and whether each is unique, of SQLite table `table`.
async fn sqlite_indexes(pool: &sqlx::SqlitePool, table: &str) -> Vec<(String, bool)> {
    let mut indexes: Vec<(String, bool)> =
        sqlx::query_as("SELECT name, \"unique\" FROM pragma_index_list(?1)")
            .bind(table)
            .fetch_all(pool)
            .await
            .unwrap();
    indexes.sort();
    indexes
}

/// A new SQLite inbox table keeps its rows in insertion order with the key unique in an index
/// of its own; a table made with the earlier layout (keyed by the hash, `WITHOUT ROWID`) keeps
/// working as it is and gets no second index on the key.
#[tokio::test]
async fn sqlite_inbox_tables_of_either_layout_work() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE older (id_hash BLOB PRIMARY KEY, endpoint TEXT NOT NULL,
             message_id TEXT NOT NULL, created_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL)
         WITHOUT ROWID",
    )
    .execute(&pool)
    .await
    .unwrap();
    let newer = SqlInbox::open_sqlite(&url, "newer", true).await.unwrap();
    let older = SqlInbox::open_sqlite(&url, "older", true).await.unwrap();

    for store in [&newer, &older] {
        let (a, b, c) = (
            key("billing", "A"),
            key("billing", "B"),
            key("billing", "C"),
        );
        store
            .record_many(&[a.clone(), b.clone()], WEEK)
            .await
            .unwrap();
        // Recording a key again is a no-op, not a constraint error.
        store
            .record_many(&[b.clone(), a.clone()], WEEK)
            .await
            .unwrap();
        assert_eq!(
            store
                .check_many(&[c.clone(), a.clone(), b.clone()])
                .await
                .unwrap(),
            vec![false, true, true]
        );
        store.record(&c, -1).await.unwrap();
        assert!(!store.is_processed(&c).await.unwrap(), "expired on record");
        assert_eq!(
            store
                .purge_expired("billing", now_ms() + 1, 10)
                .await
                .unwrap(),
            3
        );
        assert_eq!(store.check_many(&[a, b]).await.unwrap(), vec![false, false]);
    }

    assert_eq!(
        sqlite_indexes(&pool, "newer").await,
        vec![
            ("newer_created".to_string(), false),
            ("newer_hash".to_string(), true)
        ]
    );
    let older_indexes = sqlite_indexes(&pool, "older").await;
    assert!(
        older_indexes.iter().all(|(name, _)| name != "older_hash"),
        "{older_indexes:?}"
    );
    // Each key is stored once in the new layout, in insertion order.
    newer
        .record_many(&[key("billing", "Z"), key("billing", "Y")], WEEK)
        .await
        .unwrap();
    let ids: Vec<String> = sqlx::query_scalar("SELECT message_id FROM newer ORDER BY rowid")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(ids, ["Z", "Y"]);
}

/// A SQLite write with keys of several endpoints, interleaved and with ids that JSON must
/// escape: every row holds the hash of its own (endpoint, MessageId), next to them.
#[tokio::test]
async fn sqlite_records_each_hash_next_to_its_own_endpoint_and_id() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    let store = SqlInbox::open_sqlite(&format!("sqlite://{}", path.display()), "wharf_inbox", true)
        .await
        .unwrap();
    let ids = ["m-1", "quote \" and \\ back", "ünïcode ✓", "", "m-1 "];
    let mut recorded: Vec<(String, String)> = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        for endpoint in ["billing", "shipping"] {
            recorded.push((endpoint.to_string(), format!("{id}{n}")));
        }
    }
    let keys: Vec<InboxKey> = recorded.iter().map(|(e, id)| key(e, id)).collect();
    store.record_many(&keys, WEEK).await.unwrap();

    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let mut rows: Vec<(Vec<u8>, String, String)> =
        sqlx::query_as("SELECT id_hash, endpoint, message_id FROM wharf_inbox")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    for (hash, endpoint, id) in &rows {
        assert_eq!(
            hash[..],
            wharf_host::queue::inbox_hash(endpoint.as_bytes(), id.as_bytes())[..],
            "the row of ({endpoint:?}, {id:?}) holds another key's hash"
        );
    }
    let mut stored: Vec<(String, String)> = rows.drain(..).map(|(_, e, id)| (e, id)).collect();
    stored.sort();
    recorded.sort();
    assert_eq!(stored, recorded);
}
