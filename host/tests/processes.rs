//! Several `wharf run` processes against one PostgreSQL database share the queues safely:
//! each of them handles messages, and every message is handled exactly once.

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
    // Each process deploys its own build of the handler, whose reports name it: process a
    // runs `versioned-v1` (reports version 1), process b `versioned-v2` (version 2).
    for (name, build) in [("a", "versioned_v1"), ("b", "versioned_v2")] {
        let guest = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
            "../sample-handlers/target/wasm32-wasip2/release/{build}.wasm"
        ));
        assert!(
            guest.exists(),
            "{} is missing: run `cargo xtask guests`",
            guest.display()
        );
        let handlers = root.join(format!("handlers-{name}"));
        std::fs::create_dir_all(&handlers).unwrap();
        std::fs::copy(&guest, handlers.join("versioned.wasm")).unwrap();
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let schema = format!("wharf_p_{}_{nanos}", std::process::id());
    let mut admin_ports = Vec::new();
    for name in ["a", "b"] {
        let port = free_port();
        admin_ports.push(port);
        let config = format!(
            "[host]\nadmin_listen = \"127.0.0.1:{port}\"\nmax_instances = 32\nhandlers_dir = \"handlers-{name}\"\n\
             [storage]\nurl = \"{}\"\nschema = \"{schema}\"\npoll_interval = \"100ms\"\n\
             [queues.work]\nhandler = \"versioned\"\nconcurrency = 8\n\
             [queues.replies]\nhandler = \"not-deployed\"\n",
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
    // Both are up (a host serves its admin port once its handlers are loaded) before the
    // messages arrive, so neither gets them all by starting first.
    let started = Instant::now();
    for port in admin_ports {
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "wharf run did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
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
    let mut by_process = [0usize; 2];
    for reply in list(root, "replies", "pending") {
        let v: serde_json::Value =
            serde_json::from_str(reply["payload"].as_str().unwrap()).unwrap();
        seen[v["n"].as_u64().unwrap() as usize] += 1;
        by_process[v["version"].as_u64().unwrap() as usize - 1] += 1;
    }
    assert!(
        seen.iter().all(|c| *c == 1),
        "each message handled exactly once: {:?}",
        seen.iter().filter(|c| **c != 1).count()
    );
    let [by_a, by_b] = by_process;
    assert!(
        by_a > 0 && by_b > 0,
        "both processes handled messages: a {by_a}, b {by_b}"
    );
    let _ = Command::new("psql")
        .arg(database_url())
        .args(["-qc", &format!("DROP SCHEMA \"{schema}\" CASCADE")])
        .output();
}
