//! Handlers from the shared store (`[host] handlers_source = "store"`), on PostgreSQL: three
//! hosts serve a `wharf handlers deploy` within seconds under load, each message processed
//! once by the version the deploy log says its host served when the call started; a broken
//! component is refused before any host sees it; a rollback reaches every host; a host
//! started later serves the stored version without any file on its disk; a host whose own
//! configuration rejects the current version keeps the previous one and says so in the log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use wharf_host::queue::{QueueStore, ServedVersion, Status};
use wharf_host::{Config, RunningHost};
use wharf_tests::{Lang, PgSchema, TestDir, database_url, guest, messages, msg, wait_for};

/// `wharf.toml` of host `id` following the store in `schema`; `handler` is extra text of
/// `[handlers.versioned]`.
fn write_config(dir: &TestDir, schema: &PgSchema, id: &str, handler: &str) {
    let text = format!(
        "[host]\nid = \"{id}\"\nhandlers_source = \"store\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"2s\"\n\n\
         [storage]\nurl = \"{url}\"\nschema = \"{schema}\"\npoll_interval = \"50ms\"\n\n\
         [queues.work]\nhandler = \"versioned\"\ninbox = {{ store = \"sql\" }}\n\n[queues.reports]\n\n\
         [handlers.versioned]\nenv = {{ REPORT_HOST = \"{id}\" }}\n{handler}\n",
        url = database_url(),
        schema = schema.name
    );
    std::fs::write(dir.path("wharf.toml"), text).expect("writing config");
}

async fn start(dir: &TestDir) -> RunningHost {
    let config = Config::load(&dir.path("wharf.toml")).expect("a valid test config");
    wharf_host::start(config).await.expect("host starts")
}

/// `wharf handlers deploy FILE --name versioned` in `dir`: (success, stdout + stderr).
fn deploy(dir: &TestDir, file: &std::path::Path) -> (bool, String) {
    let file = file.display().to_string();
    let (ok, out, err) = dir.wharf(&["handlers", "deploy", &file, "--name", "versioned"]);
    (ok, format!("{out}{err}"))
}

/// Messages of `work` processed so far.
async fn processed(store: &Arc<dyn QueueStore>) -> u64 {
    store
        .counts("work")
        .await
        .unwrap()
        .into_iter()
        .find(|(s, _)| *s == Status::Processed)
        .map_or(0, |(_, n)| n)
}

fn serving_version(host: &RunningHost) -> Option<i64> {
    host.registry.get("versioned").and_then(|h| h.version)
}

/// Wait until every host serves `version`; returns how long it took.
async fn all_serve(hosts: &[RunningHost], version: i64) -> Duration {
    let started = Instant::now();
    wait_for(
        Duration::from_secs(30),
        &format!("every host serving version {version}"),
        || async {
            hosts
                .iter()
                .all(|h| serving_version(h) == Some(version))
                .then_some(())
        },
    )
    .await;
    started.elapsed()
}

/// How long after a swap a call may still start on the version before (dispatched before it).
const SWAP_SLACK_MS: i64 = 500;

/// A report of the versioned fixture.
struct Report {
    n: u64,
    version: i64,
    host: String,
    ran_at_ms: i64,
}

async fn reports(host: &RunningHost) -> Vec<Report> {
    messages(host, "reports")
        .await
        .iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_str(&m.payload).expect("a JSON report");
            Report {
                n: v["n"].as_u64().expect("n"),
                version: v["version"].as_i64().expect("version"),
                host: v["host"]
                    .as_str()
                    .expect("the host granted REPORT_HOST")
                    .into(),
                ran_at_ms: v["ran_at_ms"].as_i64().expect("ran_at_ms"),
            }
        })
        .collect()
}

/// The version the deploy log says `host` served at `at_ms` (the last it started serving
/// at or before then).
fn served_at(log: &[ServedVersion], host: &str, at_ms: i64) -> Option<i64> {
    log.iter()
        .filter(|s| s.host == host && s.result == "serving" && s.since_ms <= at_ms)
        .max_by_key(|s| s.since_ms)
        .map(|s| s.version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deploy_reaches_every_host_under_load_and_a_rollback_too() {
    let schema = PgSchema::new();
    let dirs = [TestDir::new(), TestDir::new(), TestDir::new()];
    for (i, dir) in dirs.iter().enumerate() {
        write_config(dir, &schema, &format!("host-{i}"), "");
    }
    let (ok, out) = deploy(&dirs[0], &guest("versioned-v1"));
    assert!(ok, "deploying v1: {out}");
    assert!(out.contains("version 1"), "{out}");
    let mut hosts = Vec::new();
    for dir in &dirs {
        hosts.push(start(dir).await);
    }
    all_serve(&hosts, 1).await;
    for dir in &dirs {
        assert_eq!(
            std::fs::read_dir(dir.path("handlers")).unwrap().count(),
            0,
            "in store mode nothing is read from or written to the handlers directory"
        );
    }
    let store: Arc<dyn QueueStore> = hosts[0].store.clone();

    // Load from another task until told to stop: 100 messages at a time, the next once all
    // but the last hundred are processed (a steady backlog, whatever the machine's speed).
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (store, sent, stop) = (store.clone(), sent.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::SeqCst) {
                let start = sent.fetch_add(100, Ordering::SeqCst);
                let batch: Vec<_> = (start..start + 100)
                    .map(|n| msg(json!({"n": n, "reply_to": "reports"})))
                    .collect();
                store
                    .enqueue_many("work", batch, false)
                    .await
                    .expect("enqueue");
                wait_for(
                    Duration::from_secs(30),
                    "the backlog worked down",
                    || async { (processed(&store).await + 100 >= start + 100).then_some(()) },
                )
                .await;
            }
        }
    });
    wait_for(Duration::from_secs(30), "1,000 messages sent", || async {
        (sent.load(Ordering::SeqCst) >= 1000).then_some(())
    })
    .await;

    let (ok, out) = deploy(&dirs[1], &guest("versioned-v2"));
    assert!(ok, "deploying v2: {out}");
    let took = all_serve(&hosts, 2).await;
    assert!(
        took < Duration::from_secs(5),
        "v2 reached every host after {took:?}"
    );

    // A broken component is refused by the CLI's check: nothing stored, nothing served.
    let broken = dirs[2].path("broken.wasm");
    std::fs::write(&broken, b"\0asm\x0d\0\x01\0 truncated").unwrap();
    let (ok, out) = deploy(&dirs[2], &broken);
    assert!(!ok, "a broken component must be refused: {out}");
    assert!(out.contains("nothing was stored"), "{out}");
    let versions = store.handler_versions("versioned").await.unwrap();
    assert_eq!(versions.len(), 2, "only v1 and v2 are stored: {versions:?}");

    let sent_before_rollback = sent.load(Ordering::SeqCst);
    wait_for(
        Duration::from_secs(30),
        "500 more messages sent",
        || async { (sent.load(Ordering::SeqCst) >= sent_before_rollback + 500).then_some(()) },
    )
    .await;
    let (ok, out, err) = dirs[0].wharf(&["handlers", "rollback", "versioned"]);
    assert!(ok, "rollback: {out}{err}");
    assert!(out.contains("version 1"), "{out}");
    let took = all_serve(&hosts, 1).await;
    assert!(
        took < Duration::from_secs(5),
        "the rollback reached every host after {took:?}"
    );
    let sent_after_rollback = sent.load(Ordering::SeqCst);
    wait_for(
        Duration::from_secs(30),
        "500 more messages sent",
        || async { (sent.load(Ordering::SeqCst) >= sent_after_rollback + 500).then_some(()) },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    producer.await.unwrap();
    let total = sent.load(Ordering::SeqCst);

    let all = wait_for(
        Duration::from_secs(60),
        "every message reported",
        || async {
            let r = reports(&hosts[0]).await;
            (r.len() as u64 >= total).then_some(r)
        },
    )
    .await;
    for host in hosts {
        host.shutdown().await;
    }

    // Exactly once: one report per message.
    let mut by_n: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &all {
        *by_n.entry(r.n).or_default() += 1;
    }
    assert_eq!(by_n.len() as u64, total, "every message reported");
    assert!(by_n.values().all(|&c| c == 1), "a message reported twice");

    // Each by the version its host served when the call started: never a version before
    // the host started serving it; the version before only for calls dispatched just before
    // the swap (a batch spawned on it starts within moments).
    let log = store.handler_served(Some("versioned")).await.unwrap();
    let mut versions_by_host: BTreeMap<&str, BTreeMap<i64, usize>> = BTreeMap::new();
    for r in &all {
        *versions_by_host
            .entry(r.host.as_str())
            .or_default()
            .entry(r.version)
            .or_default() += 1;
        let now = served_at(&log, &r.host, r.ran_at_ms + 1);
        let just_before = served_at(&log, &r.host, r.ran_at_ms - SWAP_SLACK_MS);
        assert!(
            now == Some(r.version) || just_before == Some(r.version),
            "message {} ran at {} on {} by version {}, but the deploy log says {now:?} then: {log:?}",
            r.n,
            r.ran_at_ms,
            r.host,
            r.version,
        );
        let started = log
            .iter()
            .filter(|s| s.host == r.host && s.version == r.version)
            .map(|s| s.since_ms)
            .min()
            .unwrap();
        assert!(
            r.ran_at_ms + 1 >= started,
            "message {} ran on {} by version {} before the host served it",
            r.n,
            r.host,
            r.version
        );
    }
    for i in 0..3 {
        let host = format!("host-{i}");
        let served = &versions_by_host[host.as_str()];
        assert!(
            served.get(&1).is_some() && served.get(&2).is_some(),
            "{host} ran both versions: {served:?}"
        );
        let entries: Vec<i64> = log
            .iter()
            .filter(|s| s.host == host)
            .map(|s| s.version)
            .collect();
        assert_eq!(entries, [1, 2, 1], "{host}'s deploy log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_started_after_a_deploy_serves_the_stored_version() {
    let schema = PgSchema::new();
    let dir = TestDir::new();
    write_config(&dir, &schema, "late", "");
    assert!(deploy(&dir, &guest("versioned-v1")).0);
    let (ok, out) = deploy(&dir, &guest("versioned-v2"));
    assert!(ok, "{out}");
    assert!(out.contains("version 2 (was version 1)"), "{out}");
    let (ok, out) = deploy(&dir, &guest("versioned-v2"));
    assert!(ok && out.contains("already current"), "{out}");

    let host = start(&dir).await;
    wait_for(Duration::from_secs(20), "the stored v2 serving", || async {
        (serving_version(&host) == Some(2)).then_some(())
    })
    .await;
    assert!(!dir.handler_path("versioned").exists());
    host.store
        .enqueue("work", msg(json!({"n": 7, "reply_to": "reports"})), false)
        .await
        .unwrap();
    let got = wait_for(Duration::from_secs(20), "the report", || async {
        let r = reports(&host).await;
        (!r.is_empty()).then_some(r)
    })
    .await;
    assert_eq!((got[0].n, got[0].version), (7, 2));
    let (ok, out, _) = dir.wharf(&["handlers", "history", "versioned"]);
    assert!(
        ok && out.contains("late") && out.contains("serving"),
        "{out}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_rejects_the_current_version_keeps_the_previous_one_and_says_so() {
    let schema = PgSchema::new();
    let (cli, strict) = (TestDir::new(), TestDir::new());
    write_config(&cli, &schema, "cli", "");
    // This host caps the handler's memory between the Rust v1's initial memory (1.1 MiB) and
    // the JavaScript v2's (1.4 MiB): it can serve v1, not v2.
    write_config(&strict, &schema, "strict", "memory = \"1200KiB\"");
    assert!(deploy(&cli, &guest("versioned-v1")).0);
    let host = start(&strict).await;
    wait_for(Duration::from_secs(20), "v1 serving", || async {
        (serving_version(&host) == Some(1)).then_some(())
    })
    .await;
    let (ok, out) = deploy(&cli, &Lang::Js.guest("versioned-v2"));
    assert!(ok, "the CLI's configuration accepts v2: {out}");
    let log = wait_for(
        Duration::from_secs(20),
        "the rejection in the log",
        || async {
            let log = host.store.handler_served(Some("versioned")).await.unwrap();
            log.iter()
                .any(|s| s.host == "strict" && s.version == 2)
                .then_some(log)
        },
    )
    .await;
    let entry = log
        .iter()
        .find(|s| s.host == "strict" && s.version == 2)
        .unwrap();
    assert_eq!(entry.result, "rejected");
    let error = entry.error.as_deref().unwrap_or_default();
    assert!(error.contains("memory cap"), "{error}");
    assert_eq!(serving_version(&host), Some(1), "v1 keeps serving");
    host.shutdown().await;
}
