//! The API's and the CLI's view of schedules and hosts: the next and last tick, the host
//! that enqueued the last, and the hosts sharing the store.

use std::time::Duration;

use wharf_tests::{TestDir, wait_for};

use super::get;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_and_hosts_are_listed_with_the_host_that_ticked() {
    let dir = TestDir::new();
    let host = dir
        .start(
            "[queues.ticks]\n\n[schedules.pulse]\ncron = \"* * * * * *\"\nqueue = \"ticks\"\n\n\
             [schedules.yearly]\ncron = \"0 0 1 1 *\"\ntimezone = \"Europe/Berlin\"\nqueue = \"ticks\"\n",
        )
        .await;
    let listed = wait_for(Duration::from_secs(20), "a tick of `pulse`", || async {
        let listed = get(&host, "/api/v1/schedules").await;
        (listed.body[0]["enqueued"].as_i64() > Some(0)).then_some(listed)
    })
    .await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let pulse = &listed.body[0];
    assert_eq!(pulse["name"], "pulse");
    let id = pulse["last_host"]
        .as_str()
        .expect("the host that ticked")
        .to_string();
    let (last, next) = (
        pulse["last_tick_ms"].as_i64().unwrap(),
        pulse["next_tick_ms"].as_i64().unwrap(),
    );
    assert!(next > last && (next - last) % 1000 == 0, "{pulse}");
    let yearly = &listed.body[1];
    assert_eq!(yearly["name"], "yearly");
    assert_eq!(yearly["last_host"], serde_json::Value::Null, "{yearly}");
    assert_eq!(yearly["catch_up"], "latest");

    let hosts = get(&host, "/api/v1/hosts").await;
    assert_eq!(hosts.status, 200, "{}", hosts.body);
    assert_eq!(hosts.body[0]["id"], id.as_str());
    assert_eq!(hosts.body[0]["alive"], true);

    // The CLI reads the same store.
    let (ok, stdout, stderr) = dir.wharf(&["schedules", "list"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("pulse") && stdout.contains(&id), "{stdout}");
    let (ok, stdout, stderr) = dir.wharf(&["hosts"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains(&id) && stdout.contains("alive"), "{stdout}");
    host.shutdown().await;
    let (ok, stdout, _) = dir.wharf(&["hosts"]);
    assert!(ok && stdout.contains("stopped"), "{stdout}");
}
