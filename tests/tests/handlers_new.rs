//! `wharf handlers new NAME --lang rust|js|python` writes a project that builds with its one
//! command, and the component it builds handles a message in a host: logs, replies to the
//! `reply-to` header's queue, completes. Builds use the real toolchains (cargo with the
//! wasm32-wasip2 target, npm with the pinned jco, componentize-py in a venv).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{TestDir, messages, msg, wait_for, wait_status, wharf_binary};

const T: Duration = Duration::from_secs(60);

/// Run `command` (a shell line) in `dir`, failing with its output.
fn sh(dir: &Path, command: &str, env: &[(&str, &str)]) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .envs(env.iter().copied())
        .output()
        .expect("sh runs");
    assert!(
        out.status.success(),
        "`{command}` failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn a_new_project_builds_and_handles_a_message(lang: &str, component: &str) {
    let work = tempfile::tempdir().unwrap();
    let name = format!("greeter-{lang}");
    let out = Command::new(wharf_binary())
        .args(["handlers", "new", &name, "--lang", lang])
        .current_dir(work.path())
        .output()
        .expect("wharf runs");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    // The command it prints is the one that builds it.
    let build = said
        .lines()
        .find_map(|l| l.strip_prefix("build: "))
        .unwrap_or_else(|| panic!("no build line in {said}"));
    let project = work.path().join(&name);
    let build = build
        .split_once(" && ")
        .map_or(build, |(_, b)| b)
        .to_string();
    // Rust builds share one target folder between runs (incremental).
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/handlers-new");
    let shared = shared.to_string_lossy().to_string();
    let cargo_target = [("CARGO_TARGET_DIR", shared.as_str())];
    let env: &[(&str, &str)] = if lang == "rust" { &cargo_target } else { &[] };
    let run_build = {
        let project = project.clone();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move || {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            sh(&project, &build, &env)
        }
    };
    tokio::task::spawn_blocking(run_build).await.unwrap();
    let built = match lang {
        "rust" => Path::new(&shared).join(component),
        _ => project.join(component),
    };
    let dir = TestDir::new();
    dir.deploy_bytes(&name, &std::fs::read(&built).expect("the built component"));
    let host = dir
        .start(&format!(
            "[queues.greet]\nhandler = \"{name}\"\n\n[queues.replies]\nhandler = \"not-deployed\"\n"
        ))
        .await;
    let mut message = msg(json!({"name": "Ada"}));
    message.headers = vec![("reply-to".to_string(), "replies".to_string())];
    let done = host.router.enqueue("greet", message).await.unwrap();
    wait_status(&host, done.key, Status::Processed, T).await;
    let reply = wait_for(T, "the reply", || async {
        messages(&host, "replies").await.into_iter().next()
    })
    .await;
    let reply: serde_json::Value = serde_json::from_str(&reply.payload).unwrap();
    assert_eq!(reply["greeting"], "hello, Ada");
    // Bad data fails at once with the handler's words.
    let bad = host
        .router
        .enqueue("greet", msg(json!(["not", "an", "object"])))
        .await
        .unwrap();
    let failed = wait_status(&host, bad.key, Status::Failed, T).await;
    assert!(
        failed
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("permanent error: not the expected payload")),
        "{failed:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust() {
    a_new_project_builds_and_handles_a_message("rust", "wasm32-wasip2/release/greeter_rust.wasm")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js() {
    a_new_project_builds_and_handles_a_message("js", "greeter-js.wasm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python() {
    a_new_project_builds_and_handles_a_message("python", "greeter-python.wasm").await;
}
