//! A `wharf run` process killed with SIGKILL in the middle of an external (Redis) queue loses
//! nothing: after a restart every message is processed — its leases expired and
//! reconciliation returned them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn wharf() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wharf"))
}

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(wharf())
        .current_dir(dir)
        .args(["--config", "wharf.toml"])
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

/// How many times each `n` was echoed to `replies`.
fn seen(dir: &Path, n: usize) -> Vec<usize> {
    let out = run(
        dir,
        &[
            "messages", "list", "--queue", "replies", "--limit", "100000", "--json",
        ],
    );
    let mut counts = vec![0usize; n];
    for reply in serde_json::from_str::<serde_json::Value>(&out)
        .unwrap()
        .as_array()
        .unwrap()
    {
        let v: serde_json::Value =
            serde_json::from_str(reply["payload"].as_str().unwrap()).unwrap();
        counts[v["seen"]["n"].as_u64().unwrap() as usize] += 1;
    }
    counts
}

fn spawn(dir: &Path) -> Child {
    Command::new(wharf())
        .current_dir(dir)
        .args(["--config", "wharf.toml", "run"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn sigkill_mid_load_loses_no_external_message() {
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
    let config = format!(
        "[host]\nadmin_listen = \"127.0.0.1:{}\"\nmax_instances = 16\n\
         [storage]\nurl = \"sqlite://wharf.db\"\npoll_interval = \"100ms\"\n\
         [external]\nreconcile_interval = \"200ms\"\n\
         [providers.main]\ntype = \"redis\"\nurl = \"{}\"\nkey_prefix = \"wharf-test:kill:{nanos}:\"\nclaim_after = \"1s\"\n\
         [queues.export_order]\nhandler = \"flaky\"\nstorage = \"external\"\nprovider = \"main\"\n\
         concurrency = 8\nlease = \"2s\"\ntimeout = \"1s\"\n\
         [queues.replies]\nhandler = \"not-deployed\"\n",
        free_port(),
        redis_url()
    );
    std::fs::write(root.join("wharf.toml"), config).unwrap();
    const N: usize = 3000;
    let lines: String = (0..N)
        .map(|n| format!("{{\"reply_to\":\"replies\",\"n\":{n}}}\n"))
        .collect();
    std::fs::write(root.join("work.jsonl"), lines).unwrap();
    run(root, &["enqueue", "export_order", "--file", "work.jsonl"]);

    let mut first = spawn(root);
    let started = Instant::now();
    loop {
        let done = seen(root, N).iter().filter(|c| **c > 0).count();
        if done >= 200 {
            assert!(done < N, "killed too late to prove anything");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no progress before the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();

    let mut second = spawn(root);
    let started = Instant::now();
    loop {
        let counts = seen(root, N);
        if counts.iter().all(|c| *c > 0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{} messages were never processed after the restart",
            counts.iter().filter(|c| **c == 0).count()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status();
    second.wait().unwrap();
}
