//! `wharf status` against a running `wharf run` protected by an admin token: readiness with
//! its checks, queues with counts and recent rates, handlers — as a table and as JSON.

use std::time::Duration;

use serde_json::{Value, json};
use wharf_tests::{TestDir, free_port, msg, wait_for};

const T: Duration = Duration::from_secs(30);

fn status(dir: &TestDir, json: bool) -> (bool, String, String) {
    if json {
        dir.wharf(&["--json", "status"])
    } else {
        dir.wharf(&["status"])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_readiness_queues_rates_and_handlers() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let port = free_port();
    let path = dir.write_config(&format!(
        r#"
[admin]
token = "status-token"

[providers.main]
type = "redis"
url = "{url}"
key_prefix = "{prefix}"

[queues.work]
handler = "flaky"
max_attempts = 1

[queues.ext]
handler = "flaky"
storage = "external"
provider = "main"
"#,
        url = wharf_tests::redis_url(),
        prefix = wharf_tests::unique_prefix("status")
    ));
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    std::fs::write(&path, text).unwrap();

    // Nothing runs yet: the error names the address.
    let (ok, _, stderr) = status(&dir, false);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("no Wharf host answers at http://127.0.0.1:{port}")),
        "{stderr}"
    );

    let mut host = wharf_tests::spawn_wharf(dir.dir.path());
    let store = dir.sqlite_store().await;
    let mut keys = Vec::new();
    for n in 0..3 {
        keys.push(
            store
                .enqueue("work", msg(json!({"n": n})), false)
                .await
                .unwrap()
                .key,
        );
    }
    keys.push(
        store
            .enqueue("work", msg(json!({"permanent": "bad"})), false)
            .await
            .unwrap()
            .key,
    );
    // Two messages through the external queue: the broker keeps no record of them.
    for n in [7, 8] {
        let (ok, _, stderr) = dir.wharf(&["enqueue", "ext", &json!({"n": n}).to_string()]);
        assert!(ok, "{stderr}");
    }
    let report: Value = wait_for(T, "status to show the run with a rate", || async {
        let (ok, stdout, _) = status(&dir, true);
        let report: Value = serde_json::from_str(&stdout).ok().filter(|_| ok)?;
        let work = &report["queues"][1];
        (work["counts"] == json!({"processed": 3, "failed": 1})
            && work["rates"]["processed_per_s"].as_f64()? > 0.0
            && report["queues"][0]["since_start"]["processed"] == 2)
            .then_some(report)
    })
    .await;
    assert_eq!(report["queues"][0]["name"], "ext");
    assert_eq!(
        report["queues"][1]["since_start"],
        json!({"processed": 3, "failed": 1})
    );
    assert_eq!(report["ready"]["status"], "healthy");
    assert_eq!(report["ready"]["checks"]["sql_storage"]["healthy"], true);
    assert_eq!(report["handlers"][0]["name"], "flaky");
    assert!(
        report["queues"][1]["rates"]["failed_per_s"]
            .as_f64()
            .unwrap()
            > 0.0
    );

    let (ok, table, stderr) = status(&dir, false);
    assert!(ok, "{stderr}");
    assert!(table.contains("host: healthy"), "{table}");
    assert!(table.contains("sql_storage: ok"), "{table}");
    let row = table
        .lines()
        .find(|l| l.contains("work") && l.contains("flaky"))
        .unwrap_or_else(|| panic!("no queue row in\n{table}"));
    let cells: Vec<&str> = row
        .split_whitespace()
        .filter(|c| *c != "│" && *c != "|")
        .collect();
    assert!(cells.contains(&"3") && cells.contains(&"1"), "{row}");
    // The external queue's processed count is this host's, and says so.
    let ext = table
        .lines()
        .find(|l| l.contains("external (main)"))
        .unwrap_or_else(|| panic!("no external row in\n{table}"));
    assert!(ext.contains("2*"), "{ext}");
    assert!(
        table.contains("* external queue: processed by this host since it started"),
        "{table}"
    );
    assert!(!table.contains("status-token"));
    host.kill();
}
