//! The API's side of handlers' key-value state, and `wharf state`: a bucket's keys, one key,
//! deleting one; the CLI reads the same store.

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{TestDir, msg, wait_status};

use super::{T, call, get};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_listed_read_and_deleted() {
    let dir = TestDir::new();
    dir.deploy("kv", "kv_state");
    let host = dir
        .start("[handlers.kv]\nkeyvalue = [\"counters\"]\n\n[queues.work]\nhandler = \"kv\"\n")
        .await;
    let key = host
        .router
        .enqueue("work", msg(json!({"incr": ["b", "b"], "set": {"a": "x"}})))
        .await
        .unwrap()
        .key;
    wait_status(&host, key, Status::Processed, T).await;

    let listed = get(&host, "/api/v1/state/counters").await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let keys: Vec<(&str, &str)> = listed
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    assert_eq!(keys, vec![("a", "x"), ("b", "2")]);
    let one = get(&host, "/api/v1/state/counters/b").await;
    assert_eq!((one.status, one.body["value"].clone()), (200, json!("2")));
    let missing = get(&host, "/api/v1/state/counters/nope").await;
    assert_eq!(missing.status, 404, "{}", missing.body);
    assert!(missing.body["error"].as_str().unwrap().contains("`nope`"));
    let bad = get(&host, "/api/v1/state/counters?limit=0").await;
    assert_eq!(bad.status, 400);

    // The CLI, on the store directly.
    let (ok, stdout, stderr) = dir.wharf(&["state", "get", "counters", "b"]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.trim(), "2");
    let (ok, stdout, _) = dir.wharf(&["state", "list", "counters"]);
    assert!(
        ok && stdout.contains('a') && stdout.contains('x'),
        "{stdout}"
    );

    let deleted = call(&host, "DELETE", "/api/v1/state/counters/a", None, None).await;
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    let again = call(&host, "DELETE", "/api/v1/state/counters/a", None, None).await;
    assert_eq!(again.status, 404);
    let (ok, _, stderr) = dir.wharf(&["state", "delete", "counters", "b"]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = dir.wharf(&["state", "get", "counters", "b"]);
    assert!(
        !ok && stderr.contains("no key `b` in bucket `counters`"),
        "{stderr}"
    );
    host.shutdown().await;
}
