//! Hot deploy: replacing a handler under load loses nothing and the new version takes over;
//! a broken file is rejected while the old version serves; removing a file pauses its queue;
//! compiled components are cached across restarts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use wharf_host::Config;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_host::runtime::{DeployError, HandlerRegistry, LoadOutcome, Origin};
use wharf_tests::{Lang, TestDir, count, messages, msg, wait_for, wait_status};

const T: Duration = Duration::from_secs(30);
/// Long enough for a large component to compile while the tests load both cores.
const COMPILE_T: Duration = Duration::from_secs(180);

const CONFIG: &str = r#"
[queues.work]
handler = "versioned"
concurrency = 4

[queues.reports]
handler = "not-deployed"
"#;

/// Which version handled each `n`, from the reports queue.
async fn reports(host: &wharf_host::RunningHost) -> BTreeMap<u64, Vec<u64>> {
    let mut by_n: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for m in messages(host, "reports").await {
        let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        by_n.entry(v["n"].as_u64().unwrap())
            .or_default()
            .push(v["version"].as_u64().unwrap());
    }
    by_n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_a_handler_under_load_loses_nothing_and_switches_version() {
    replacing_under_load(Lang::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_a_javascript_handler_under_load() {
    replacing_under_load(Lang::Js).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_a_python_handler_under_load() {
    replacing_under_load(Lang::Python).await;
}

/// Version 1 serves a steady stream; version 2 replaces it midway: nothing is lost or run
/// twice, both versions served, and what comes after the swap runs on version 2.
async fn replacing_under_load(lang: Lang) {
    let dir = TestDir::new();
    dir.deploy_in("versioned", lang, "versioned-v1");
    let host = Arc::new(dir.start(CONFIG).await);
    // The producer runs until version 2 serves (compiling it takes from milliseconds to
    // seconds by language), then sends 100 more: it returns how many it sent.
    let swapped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let host = host.clone();
        let swapped = swapped.clone();
        tokio::spawn(async move {
            let mut after_swap = 0;
            let mut n: u64 = 0;
            while after_swap < 100 && n < 100_000 {
                host.router
                    .enqueue("work", msg(json!({"n": n, "reply_to": "reports"})))
                    .await
                    .unwrap();
                n += 1;
                if swapped.load(std::sync::atomic::Ordering::SeqCst) {
                    after_swap += 1;
                }
                if n.is_multiple_of(20) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            n
        })
    };
    // Swap while the producer is running.
    wait_for(T, "some messages handled by v1", || async {
        (count(&host, "work", Status::Processed).await >= 50).then_some(())
    })
    .await;
    let old_hash = host.registry.get("versioned").unwrap().hash.clone();
    dir.deploy_in("versioned", lang, "versioned-v2");
    // Compiling an 18 MB Python component on a loaded 2-core machine (debug host) takes
    // tens of seconds: this wait bounds only a failure.
    wait_for(COMPILE_T, "v2 to be serving", || async {
        (host.registry.get("versioned").unwrap().hash != old_hash).then_some(())
    })
    .await;
    swapped.store(true, std::sync::atomic::Ordering::SeqCst);
    let n_total = producer.await.unwrap();
    wait_for(T, "every message processed", || async {
        (count(&host, "work", Status::Processed).await == n_total).then_some(())
    })
    .await;
    let by_n = reports(&host).await;
    assert_eq!(by_n.len() as u64, n_total, "every message reported");
    assert!(
        by_n.values().all(|v| v.len() == 1),
        "no message handled twice"
    );
    let v1 = by_n.values().filter(|v| v[0] == 1).count();
    let v2 = by_n.values().filter(|v| v[0] == 2).count();
    assert!(v1 >= 50 && v2 >= 1, "both versions served: v1={v1} v2={v2}");
    // After the swap every newly enqueued message is handled by v2.
    let late = host
        .router
        .enqueue("work", msg(json!({"n": n_total, "reply_to": "reports"})))
        .await
        .unwrap();
    wait_status(&host, late.key, Status::Processed, T).await;
    assert_eq!(reports(&host).await[&n_total], vec![2]);
    Arc::try_unwrap(host)
        .ok()
        .expect("sole owner")
        .shutdown()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_file_is_rejected_while_the_old_version_serves() {
    let dir = TestDir::new();
    dir.deploy("versioned", "versioned-v1");
    let host = dir.start(CONFIG).await;
    let v1_hash = host.registry.get("versioned").unwrap().hash.clone();
    // Not WebAssembly at all, then a valid component that does not export `handle`.
    for (i, bad) in [&b"\0asm garbage"[..], &b"(component)"[..]]
        .into_iter()
        .enumerate()
    {
        dir.deploy_bytes("versioned", bad);
        // A handler deployed after the broken file: once it serves, the host has dealt with
        // the broken file (changes are applied in order, and a batch in path order: the
        // marker's name sorts after `versioned`).
        let marker = format!("z-marker-{i}");
        dir.deploy(&marker, "noop");
        wait_for(T, "the marker handler to be serving", || async {
            host.registry.get(&marker).map(|_| ())
        })
        .await;
        assert_eq!(
            host.registry.get("versioned").unwrap().hash,
            v1_hash,
            "v1 still serving"
        );
        let m = host
            .router
            .enqueue("work", msg(json!({"n": bad.len(), "reply_to": "reports"})))
            .await
            .unwrap();
        wait_status(&host, m.key, Status::Processed, T).await;
        assert_eq!(reports(&host).await[&(bad.len() as u64)], vec![1]);
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_files_are_rejected_with_the_reason() {
    let dir = TestDir::new();
    let config = Arc::new(Config::load(&dir.write_config(CONFIG)).unwrap());
    let registry = HandlerRegistry::new(config).unwrap();
    // Random bytes: not the binary format, nor text.
    dir.deploy_bytes("junk", &[0xff, 0xfe, 0x00, 0x13, 0x8c, 0x01]);
    let err = registry
        .load_file(&dir.handler_path("junk"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "junk.wasm: not a valid WebAssembly component: the file does not start with the WebAssembly header (`\\0asm`)"
        ),
        "{err}"
    );
    assert!(
        err.contains("(detail: input bytes aren't valid utf-8"),
        "the compiler's words come after: {err}"
    );
    dir.deploy_bytes("empty", b"(component)");
    let err = registry
        .load_file(&dir.handler_path("empty"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("empty.wasm: does not match the wharf:handler/handler world"),
        "{err}"
    );
    assert!(err.contains("handle"), "names the missing export: {err}");
    assert!(registry.get("junk").is_none() && registry.get("empty").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_file_is_rejected_once_not_again_on_every_read() {
    let dir = TestDir::new();
    let host = dir.start(CONFIG).await;
    let rejections = |host: &wharf_host::RunningHost| {
        host.registry
            .deploys
            .recent()
            .iter()
            .filter(|d| d.handler == "broken")
            .count()
    };
    dir.deploy_bytes("broken", b"not wasm");
    wait_for(T, "the broken file to be rejected", || async {
        (rejections(&host) > 0).then_some(())
    })
    .await;
    // Reading the file to deploy it is a watch event too: it must not start another round.
    // Another deployment after the rejection shows the watcher went on working meanwhile.
    dir.deploy("later", "noop");
    wait_for(T, "the next file to deploy", || async {
        host.registry.get("later").map(|_| ())
    })
    .await;
    assert_eq!(
        rejections(&host),
        1,
        "{:#?}",
        host.registry.deploys.recent()
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_handler_pauses_its_queue_without_losing_messages() {
    let dir = TestDir::new();
    dir.deploy("versioned", "versioned-v1");
    dir.deploy("noop", "noop");
    let host = dir
        .start(&format!("{CONFIG}\n[queues.live]\nhandler = \"noop\"\n"))
        .await;
    let first = host
        .router
        .enqueue("work", msg(json!({"n": 1, "reply_to": "reports"})))
        .await
        .unwrap();
    wait_status(&host, first.key, Status::Processed, T).await;
    std::fs::remove_file(dir.handler_path("versioned")).unwrap();
    wait_for(T, "the handler to be removed", || async {
        host.registry.get("versioned").is_none().then_some(())
    })
    .await;
    let parked = host
        .router
        .enqueue("work", msg(json!({"n": 2, "reply_to": "reports"})))
        .await
        .unwrap();
    // A message enqueued after it into a queue whose handler serves gets processed: the host
    // has been dispatching since `parked` arrived.
    let marker = host
        .router
        .enqueue("live", msg(json!({"n": 0})))
        .await
        .unwrap();
    wait_status(&host, marker.key, Status::Processed, T).await;
    let m = host.store.get(parked.key).await.unwrap().unwrap();
    assert_eq!(
        (m.status, m.attempts),
        (Status::Pending, 0),
        "waits, untouched, never failed"
    );
    dir.deploy("versioned", "versioned-v2");
    let m = wait_status(&host, parked.key, Status::Processed, T).await;
    assert_eq!(m.attempts, 1, "never attempted while its handler was gone");
    assert_eq!(reports(&host).await[&2], vec![2]);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_components_are_cached_across_restarts() {
    let dir = TestDir::new();
    dir.deploy("versioned", "versioned-v1");
    let config = Arc::new(Config::load(&dir.write_config(CONFIG)).unwrap());
    let path = dir.handler_path("versioned");
    let first = HandlerRegistry::new(config.clone())
        .unwrap()
        .load_file(&path)
        .unwrap();
    assert!(
        matches!(
            first,
            LoadOutcome::Deployed {
                origin: Origin::Compiled,
                ..
            }
        ),
        "{first:?}"
    );
    // A new registry (a restarted host) reads the cache instead of compiling.
    let registry = HandlerRegistry::new(config).unwrap();
    let second = registry.load_file(&path).unwrap();
    assert!(
        matches!(
            second,
            LoadOutcome::Deployed {
                origin: Origin::Cached,
                ..
            }
        ),
        "{second:?}"
    );
    // Loading the same content again changes nothing.
    assert!(matches!(
        registry.load_file(&path).unwrap(),
        LoadOutcome::Unchanged { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_files_under_several_names_share_one_compiled_component() {
    let dir = TestDir::new();
    dir.deploy("versioned", "versioned-v1");
    dir.deploy("copy", "versioned-v1");
    dir.deploy("other", "versioned-v2");
    let config = Arc::new(Config::load(&dir.write_config(CONFIG)).unwrap());
    let registry = HandlerRegistry::new(config).unwrap();
    let origin = |name: &str| match registry.load_file(&dir.handler_path(name)).unwrap() {
        LoadOutcome::Deployed { origin, .. } => origin,
        other => panic!("{other:?}"),
    };
    assert_eq!(origin("versioned"), Origin::Compiled);
    assert_eq!(
        origin("copy"),
        Origin::Shared,
        "the same bytes: not compiled again"
    );
    assert_eq!(
        origin("other"),
        Origin::Compiled,
        "other bytes are compiled"
    );
    let names: Vec<String> = registry.list().iter().map(|h| h.name.to_string()).collect();
    assert_eq!(names, ["copy", "other", "versioned"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_cap_below_the_initial_memory_is_rejected_at_deploy() {
    let dir = TestDir::new();
    dir.deploy("versioned", "versioned-v1");
    let text = format!("{CONFIG}\n[handlers.versioned]\nmemory = \"64KiB\"\n");
    let config = Arc::new(Config::load(&dir.write_config(&text)).unwrap());
    let registry = HandlerRegistry::new(config).unwrap();
    let error = registry
        .load_file(&dir.handler_path("versioned"))
        .unwrap_err();
    assert!(matches!(error, DeployError::Memory { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("memory cap 64.0 KiB is below the handler's initial memory")
            && text.contains("[handlers.versioned]"),
        "{text}"
    );
    assert!(registry.get("versioned").is_none(), "not deployed");
}

/// A handler no queue names is deployed, with a warning saying where to use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployed_handler_no_queue_uses_is_warned_about() {
    let logs = wharf_tests::capture_logs();
    let dir = TestDir::new();
    let host = dir.start(CONFIG).await;
    dir.deploy("versioned", "versioned_v1");
    dir.deploy("spare", "noop");
    wait_for(T, "both handlers to deploy", || async {
        (host.registry.get("versioned").is_some() && host.registry.get("spare").is_some())
            .then_some(())
    })
    .await;
    let text = logs.text();
    assert!(
        text.contains(
            "handler `spare` is deployed but no queue uses it: set handler = \"spare\" in a [queues.NAME] table of"
        ),
        "{text}"
    );
    assert!(
        !text.contains("handler `versioned` is deployed but no queue uses it"),
        "{text}"
    );
    host.shutdown().await;
}

/// `wharf handlers --help` says which subcommand needs the running host.
#[test]
fn handlers_help_says_which_subcommand_asks_the_running_host() {
    let dir = TestDir::new();
    let (ok, stdout, stderr) = dir.wharf(&["handlers", "--help"]);
    assert!(ok, "{stderr}");
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no `{name}` line: {stdout}"))
            .to_string()
    };
    assert!(line("list").contains("asks the running host"), "{stdout}");
    assert!(line("new").contains("needs no running host"), "{stdout}");
}

/// Handlers compile side by side: one that compiles in a fraction of a second serves before
/// one that takes seconds, at start and on a hot deploy, whatever their names' order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_handler_does_not_wait_behind_a_slow_compile() {
    let dir = TestDir::new();
    // Python compiles for seconds; the Rust no-op in a fraction of one. Sorted by name, the
    // slow one comes first.
    dir.deploy_in("a-slow", Lang::Python, "flaky");
    dir.deploy("b-quick", "noop");
    let host = dir.start(CONFIG).await;
    let order = |host: &wharf_host::RunningHost| -> Vec<String> {
        let mut events = host.registry.deploys.recent();
        events.reverse(); // oldest first
        events.into_iter().map(|e| e.handler).collect()
    };
    assert_eq!(order(&host), ["b-quick", "a-slow"], "at start");
    // A hot deploy of both at once: the same.
    dir.deploy_in("c-slow", Lang::Python, "trap");
    dir.deploy("d-quick", "trap");
    wait_for(COMPILE_T, "both new handlers' deploy events", || async {
        (order(&host).len() == 4).then_some(())
    })
    .await;
    assert_eq!(order(&host)[2..], ["d-quick", "c-slow"], "on a hot deploy");
    host.shutdown().await;
}
