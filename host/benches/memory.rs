//! Resident memory of an idle `wharf run` with ten JavaScript and Python handlers deployed
//! (ten different files: five Python, three JavaScript on QuickJS, two on SpiderMonkey),
//! measured twice: a cold start that compiles every handler, and a restart that reads them
//! from the compiled-component cache. Also the same file deployed under ten names (one
//! shared compiled component). Prints VmRSS of the host process; goal ≤ 300 MB.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HANDLERS: [(&str, &str); 10] = [
    ("python", "order-export"),
    ("python", "flaky"),
    ("python", "trap"),
    ("python", "versioned-v1"),
    ("python", "versioned-v2"),
    ("js", "order-export"),
    ("js", "flaky"),
    ("js", "versioned-v1"),
    ("js-spidermonkey", "order-export"),
    ("js-spidermonkey", "fetch"),
];

fn built(lang: &str, name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target")
        .join(lang)
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "build the guests first: cargo xtask guests ({})",
        path.display()
    );
    path
}

fn config(names: &[String]) -> String {
    let mut text = String::from("[host]\nadmin_listen = \"127.0.0.1:0\"\n\n");
    for name in names {
        text.push_str(&format!(
            "[handlers.{name}]\nallowed_outbound_hosts = [\"http://127.0.0.1:9\"]\n\n[queues.{name}]\nhandler = \"{name}\"\n\n"
        ));
    }
    text
}

/// Start `wharf run` in `dir` and wait until `count` handlers are deployed.
fn start(dir: &Path, count: usize) -> (Child, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .current_dir(dir)
        .args(["--config", "wharf.toml", "run"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wharf run starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut deployed = 0;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.contains("rejected handler file") {
            panic!("{line}");
        }
        if line.contains("handler deployed") {
            deployed += 1;
            if deployed == count {
                break;
            }
        }
    }
    assert_eq!(
        deployed, count,
        "the host stopped before deploying every handler"
    );
    // Keep reading the log so the host never writes to a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, started.elapsed())
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib / 1024.0
}

/// Deploy `files` (name, path), start the host, report RSS once it has settled.
fn measure(label: &str, dir: &Path, files: &[(String, PathBuf)]) {
    let handlers = dir.join("handlers");
    std::fs::create_dir_all(&handlers).unwrap();
    for (name, path) in files {
        std::fs::copy(path, handlers.join(format!("{name}.wasm"))).unwrap();
    }
    let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    std::fs::write(dir.join("wharf.toml"), config(&names)).unwrap();
    let (mut child, took) = start(dir, files.len());
    // Idle: no messages; let the start-up work settle before reading.
    std::thread::sleep(Duration::from_secs(2));
    let rss = rss_mib(child.id());
    println!(
        "{label:<58} RSS {rss:>7.1} MiB   (deployed in {:.1} s)",
        took.as_secs_f64()
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` and test discovery: nothing to list.
    }
    let ten: Vec<(String, PathBuf)> = HANDLERS
        .iter()
        .map(|(lang, name)| (format!("{lang}-{name}"), built(lang, name)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    measure(
        "10 JS/Python handlers, idle, cold start (compiled now)",
        dir.path(),
        &ten,
    );
    measure(
        "10 JS/Python handlers, idle, restart (compiled cache)",
        dir.path(),
        &ten,
    );
    let same = tempfile::tempdir().unwrap();
    let python = built("python", "order-export");
    let shared: Vec<(String, PathBuf)> = (0..10)
        .map(|i| (format!("copy{i}"), python.clone()))
        .collect();
    measure(
        "one Python handler under 10 names, idle (shared component)",
        same.path(),
        &shared,
    );
}
