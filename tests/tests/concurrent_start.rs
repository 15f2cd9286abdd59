//! Many `wharf` processes started at once on a database that does not exist yet: every one
//! creates or migrates the schema without tripping over the others, on SQLite (a new file)
//! and on PostgreSQL (a new schema), and every message they enqueue is stored.

use wharf_tests::{PgSchema, TestDir, database_url};

const PROCESSES: usize = 10;

/// Fresh databases tried per store: a race shows up in some rounds, not all.
const ROUNDS: usize = 5;

/// Start `PROCESSES` `wharf enqueue` commands at the same moment and wait for them all:
/// each must succeed, and the queue must then hold one message from each.
async fn enqueue_all_at_once(dir: &TestDir) {
    let children: Vec<_> = (0..PROCESSES)
        .map(|n| {
            std::process::Command::new(wharf_tests::wharf_binary())
                .current_dir(dir.dir.path())
                .args(["--config", "wharf.toml", "enqueue", "work"])
                .arg(format!("{{\"n\":{n}}}"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("wharf enqueue starts")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("wharf enqueue ends");
        assert!(
            out.status.success(),
            "a concurrent `wharf enqueue` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (ok, stdout, stderr) = dir.wharf(&["--json", "messages", "list", "--queue", "work"]);
    assert!(ok, "{stderr}");
    let listed: serde_json::Value = serde_json::from_str(&stdout).expect("JSON list");
    assert_eq!(listed.as_array().map(Vec::len), Some(PROCESSES), "{stdout}");
}

const QUEUE: &str = "[queues.work]\nhandler = \"none\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_starting_together_on_a_new_sqlite_file_all_succeed() {
    for _ in 0..ROUNDS {
        let dir = TestDir::new();
        dir.write_config(QUEUE);
        assert!(!dir.path("wharf.db").exists());
        enqueue_all_at_once(&dir).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_starting_together_on_a_new_postgres_schema_all_succeed() {
    for _ in 0..ROUNDS {
        let dir = TestDir::new();
        let schema = PgSchema::new();
        dir.write_config_with_storage(
            &format!("url = \"{}\"\nschema = \"{}\"", database_url(), schema.name),
            QUEUE,
        );
        enqueue_all_at_once(&dir).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_opened_together_in_one_process_create_one_schema() {
    // In one process the opens are closer together, so the schema race shows more often.
    for _ in 0..4 * ROUNDS {
        let schema = PgSchema::new();
        let opens: Vec<_> = (0..PROCESSES)
            .map(|_| {
                let name = schema.name.clone();
                tokio::spawn(async move {
                    wharf_host::queue::SqlStore::open_postgres(&database_url(), Some(&name), 2)
                        .await
                        .map(|_| ())
                })
            })
            .collect();
        for open in opens {
            open.await
                .unwrap()
                .unwrap_or_else(|e| panic!("a concurrent open failed: {e}"));
        }
    }
}
