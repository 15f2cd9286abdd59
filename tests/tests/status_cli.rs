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
    let path = dir.write_config(
        r#"
[admin]
token = "status-token"

[queues.work]
handler = "flaky"
max_attempts = 1
"#,
    );
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
    let report: Value = wait_for(T, "status to show the run with a rate", || async {
        let (ok, stdout, _) = status(&dir, true);
        let report: Value = serde_json::from_str(&stdout).ok().filter(|_| ok)?;
        let work = &report["queues"][0];
        (work["counts"] == json!({"processed": 3, "failed": 1})
            && work["rates"]["processed_per_s"].as_f64()? > 0.0)
            .then_some(report)
    })
    .await;
    assert_eq!(report["ready"]["status"], "healthy");
    assert_eq!(report["ready"]["checks"]["sql_storage"]["healthy"], true);
    assert_eq!(report["handlers"][0]["name"], "flaky");
    assert!(
        report["queues"][0]["rates"]["failed_per_s"]
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
    assert!(!table.contains("status-token"));
    host.kill();
}
