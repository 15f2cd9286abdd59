//! The `wharf` binary: config errors name the key, `run` stops cleanly on SIGTERM, and the
//! CLI enqueues, lists, shows and manages messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn wharf() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wharf"))
}

/// A temporary host directory with a `handlers/` folder.
struct TestDir {
    dir: tempfile::TempDir,
}

impl TestDir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
        TestDir { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Deploy the built guest `crate_name` as handler `name`.
    fn deploy(&self, name: &str, crate_name: &str) {
        let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sample-handlers/target/wasm32-wasip2/release")
            .join(format!("{crate_name}.wasm"));
        assert!(
            guest.exists(),
            "{} is missing: run `cargo xtask guests`",
            guest.display()
        );
        std::fs::copy(guest, self.path(&format!("handlers/{name}.wasm"))).unwrap();
    }
}

fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run(dir: &TestDir, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(wharf())
        .current_dir(dir.dir.path())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn config_check_names_the_key_and_reason() {
    let dir = TestDir::new();
    let cases = [
        (
            "[queues.orders]\nhandler = \"h\"\nmax_attempt = 3\n",
            "`queues.orders.max_attempt`: unknown field `max_attempt`",
        ),
        (
            "[queues.orders]\nhandler = \"h\"\ntimeout = \"ten seconds\"\n",
            "`queues.orders.timeout`",
        ),
        (
            "[queues.orders]\nconcurrency = 2\n",
            "`queues.orders.concurrency`: the queue has no handler, so nothing runs there: set queues.orders.handler, or remove concurrency",
        ),
        (
            "[storage]\nurl = \"${WHARF_TEST_UNSET_VAR}\"\n",
            "`storage.url`: environment variable `WHARF_TEST_UNSET_VAR` is not set",
        ),
    ];
    for (text, expected) in cases {
        std::fs::write(dir.path("bad.toml"), text).unwrap();
        let (code, _, stderr) = run(&dir, &["config", "check", "bad.toml"]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("bad.toml"), "names the file: {stderr}");
        assert!(
            stderr.contains(expected),
            "expected `{expected}` in: {stderr}"
        );
        // `run` refuses to start on the same file, with the same message.
        let (code, _, stderr) = run(&dir, &["--config", "bad.toml", "run"]);
        assert_eq!(code, 2);
        assert!(stderr.contains(expected), "{stderr}");
    }
    std::fs::write(
        dir.path("good.toml"),
        "[queues.orders]\nhandler = \"order-export\"\n",
    )
    .unwrap();
    let (code, stdout, _) = run(&dir, &["config", "check", "good.toml"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("good.toml: ok (1 queues)"), "{stdout}");
    assert!(
        stdout.contains("order-export.wasm does not exist yet"),
        "{stdout}"
    );
}

#[test]
fn cli_enqueues_and_shows_messages_and_run_stops_on_sigterm() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!(
        "[host]\nadmin_listen = \"127.0.0.1:{port}\"\nmax_instances = 16\n[storage]\npoll_interval = \"20ms\"\n[queues.work]\nhandler = \"flaky\"\n"
    );
    std::fs::write(dir.path("wharf.toml"), config).unwrap();
    let (code, stdout, stderr) = run(
        &dir,
        &[
            "enqueue",
            "work",
            r#"{"permanent":"no such sku"}"#,
            "--id",
            "order-1",
            "--priority",
            "3",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("added: key 1 in queue work"), "{stdout}");
    let (code, stdout, _) = run(
        &dir,
        &[
            "enqueue",
            "work",
            r#"{"permanent":"still no sku"}"#,
            "--id",
            "order-1",
        ],
    );
    assert_eq!(code, 0);
    assert!(
        stdout.contains("updated existing message: key 1"),
        "{stdout}"
    );
    let (code, _, stderr) = run(&dir, &["enqueue", "nowhere", "{}"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("unknown queue `nowhere`"), "{stderr}");

    let mut child = Command::new(wharf())
        .current_dir(dir.dir.path())
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the message to fail", || {
        let (_, stdout, _) = run(&dir, &["messages", "show", "1", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout).ok()?;
        (v["status"] == "failed").then_some(v)
    });
    let (_, stdout, _) = run(&dir, &["messages", "list", "--status", "failed"]);
    assert!(
        stdout.contains("order-1") && stdout.contains("permanent error: still no sku"),
        "{stdout}"
    );
    let (code, stdout, stderr) = run(&dir, &["handlers", "list", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let handlers: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(handlers[0]["name"], "flaky");
    assert_eq!(handlers[0]["sha256"].as_str().unwrap().len(), 64);

    let health = http_get(port, "/readyz");
    assert!(
        health.contains("\"sql_storage\"") && health.contains("\"healthy\":true"),
        "{health}"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "wharf run did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(exit.success(), "exit {exit:?}: {log}");
    assert!(
        log.contains("shutdown requested") && log.contains("host stopped"),
        "{log}"
    );
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn cli_manages_messages_and_imports_json_lines() {
    let dir = TestDir::new();
    std::fs::write(
        dir.path("wharf.toml"),
        "[queues.work]\nhandler = \"flaky\"\nidempotent = true\n",
    )
    .unwrap();
    // A bad line stops the import before anything is enqueued, naming the line.
    std::fs::write(dir.path("bad.jsonl"), "{\"order_id\":\"a\"}\n{oops\n").unwrap();
    let (code, _, stderr) = run(&dir, &["enqueue", "work", "--file", "bad.jsonl"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("bad.jsonl:2: not valid JSON; nothing was enqueued"),
        "{stderr}"
    );
    let (_, stdout, _) = run(&dir, &["messages", "list", "--json"]);
    assert_eq!(stdout.trim(), "[]");
    // Ids taken from the payload; an identical line in an idempotent queue is discarded.
    let lines = "{\"order_id\":\"a\",\"n\":1}\n\n{\"order_id\":\"b\",\"n\":2}\n{\"n\":1, \"order_id\":\"a\"}\n{\"order_id\":\"a\",\"n\":3}\n";
    std::fs::write(dir.path("orders.jsonl"), lines).unwrap();
    let (code, stdout, stderr) = run(
        &dir,
        &[
            "enqueue",
            "work",
            "--file",
            "orders.jsonl",
            "--id-from",
            "/order_id",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        summary["added"].as_u64().unwrap()
            + summary["updated"].as_u64().unwrap()
            + summary["discarded"].as_u64().unwrap(),
        4
    );
    assert_eq!(summary["added"], 2);
    let (_, stdout, _) = run(&dir, &["messages", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2, "one message per id");
    let a = list
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "a")
        .unwrap();
    assert!(
        a["payload"].as_str().unwrap().contains("\"n\":3"),
        "the last line for `a` wins"
    );
    let key = a["key"].to_string();
    // Earlier versions of `a` are readable.
    let (code, stdout, _) = run(&dir, &["messages", "history", &key, "--json"]);
    assert_eq!(code, 0);
    let history: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(!history.as_array().unwrap().is_empty());
    // Hold it, list by the custom status, resubmit, delete.
    let (code, stdout, _) = run(&dir, &["messages", "move", &key, "on-hold"]);
    assert_eq!(code, 0, "{stdout}");
    let (_, stdout, _) = run(&dir, &["messages", "list", "--status", "on-hold", "--json"]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let (code, _, stderr) = run(&dir, &["messages", "move", &key, "processing"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("cannot be set by hand"), "{stderr}");
    let (code, stdout, _) = run(
        &dir,
        &[
            "messages", "retry", "--queue", "work", "--status", "on-hold",
        ],
    );
    assert_eq!(code, 0);
    assert!(
        stdout.contains("made ready again: 1 message(s)"),
        "{stdout}"
    );
    let (code, stdout, _) = run(&dir, &["messages", "delete", &key]);
    assert_eq!(code, 0);
    assert!(stdout.contains("deleted: 1"), "{stdout}");
    let (code, _, stderr) = run(&dir, &["messages", "delete", &key]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no message with key"), "{stderr}");
    // A single enqueue into the idempotent queue reports the discard.
    let (_, stdout, _) = run(
        &dir,
        &[
            "enqueue",
            "work",
            "{\"order_id\":\"b\",\"n\":2}",
            "--id",
            "b",
        ],
    );
    assert!(stdout.contains("discarded"), "{stdout}");
}
