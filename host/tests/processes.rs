//! Several `wharf run` processes against one PostgreSQL database share the queues safely:
//! every message is handled exactly once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn wharf() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wharf"))
}

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(dir: &Path, config: &str, args: &[&str]) -> String {
    let out = Command::new(wharf())
        .current_dir(dir)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "wharf {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn list(dir: &Path, queue: &str, status: &str) -> Vec<serde_json::Value> {
    let out = run(
        dir,
        "a.toml",
        &[
            "messages", "list", "--queue", queue, "--status", status, "--limit", "100000", "--json",
        ],
    );
    serde_json::from_str::<serde_json::Value>(&out)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("wharf run did not stop after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_wharf_run_processes_share_a_postgres_queue() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("handlers")).unwrap();
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/flaky.wasm");
    assert!(
        guest.exists(),
        "{} is missing: run `cargo xtask guests`",
        guest.display()
    );
    std::fs::copy(&guest, root.join("handlers/flaky.wasm")).unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let schema = format!("wharf_p_{}_{nanos}", std::process::id());
    for name in ["a", "b"] {
        let config = format!(
            "[host]\nadmin_listen = \"127.0.0.1:{}\"\nmax_instances = 32\n\
             [storage]\nurl = \"{}\"\nschema = \"{schema}\"\npoll_interval = \"100ms\"\n\
             [queues.work]\nhandler = \"flaky\"\nconcurrency = 8\n\
             [queues.replies]\nhandler = \"not-deployed\"\n",
            free_port(),
            database_url()
        );
        std::fs::write(root.join(format!("{name}.toml")), config).unwrap();
    }
    let spawn = |config: &str| {
        Command::new(wharf())
            .current_dir(root)
            .args(["--config", config, "run"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // Create the schema before both processes race to migrate it.
    run(root, "a.toml", &["messages", "list"]);
    let (a, b) = (spawn("a.toml"), spawn("b.toml"));
    const N: usize = 600;
    let lines: String = (0..N)
        .map(|n| format!("{{\"reply_to\":\"replies\",\"n\":{n}}}\n"))
        .collect();
    std::fs::write(root.join("work.jsonl"), lines).unwrap();
    run(root, "a.toml", &["enqueue", "work", "--file", "work.jsonl"]);
    let started = Instant::now();
    while list(root, "work", "processed").len() < N {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not every message was processed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    stop(a);
    stop(b);
    let mut seen = vec![0usize; N];
    for reply in list(root, "replies", "pending") {
        let v: serde_json::Value =
            serde_json::from_str(reply["payload"].as_str().unwrap()).unwrap();
        seen[v["seen"]["n"].as_u64().unwrap() as usize] += 1;
    }
    assert!(
        seen.iter().all(|c| *c == 1),
        "each message handled exactly once: {:?}",
        seen.iter().filter(|c| **c != 1).count()
    );
    let _ = Command::new("psql")
        .arg(database_url())
        .args(["-qc", &format!("DROP SCHEMA \"{schema}\" CASCADE")])
        .output();
}
