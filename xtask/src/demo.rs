//! `cargo xtask demo`: builds the guests and the host, runs the host on SQLite with a sample
//! config, enqueues orders, shows them processed, hot-deploys version 2 of the handler while
//! running, shows it taking over, then stops the host (unless `--keep-running`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::tools::{self, root};

const CONFIG: &str = r#"# Demo configuration written by `cargo xtask demo`.
[host]
handlers_dir = "handlers"
admin_listen = "127.0.0.1:9464"

[storage]
url = "sqlite://wharf.db"

[queues.orders]
handler = "order-export"
concurrency = 4
max_attempts = 3
timeout = "5s"

[queues.notifications]
handler = "notifier"
"#;

struct Demo {
    wharf: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl Demo {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.wharf);
        cmd.current_dir(&self.dir).args(args);
        cmd
    }

    fn output(&self, args: &[&str]) -> Result<String> {
        let out = self
            .cmd(args)
            .output()
            .with_context(|| format!("running wharf {args:?}"))?;
        if !out.status.success() {
            bail!(
                "wharf {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn show(&self, title: &str, args: &[&str]) -> Result<()> {
        println!("\n=== {title}\n$ wharf {}", args.join(" "));
        print!("{}", self.output(args)?);
        Ok(())
    }

    fn json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.output(&all).ok()?).ok()
    }

    fn processed(&self, queue: &str) -> usize {
        self.json(&[
            "messages",
            "list",
            "--queue",
            queue,
            "--status",
            "processed",
            "--limit",
            "1000",
        ])
        .and_then(|v| v.as_array().map(Vec::len))
        .unwrap_or(0)
    }

    fn handler_hash(&self) -> Option<String> {
        let list = self.json(&["handlers", "list"])?;
        list.as_array()?
            .iter()
            .find(|h| h["name"] == "order-export")
            .and_then(|h| h["sha256"].as_str().map(str::to_string))
    }

    fn enqueue_orders(&self, from: u32, to: u32) -> Result<()> {
        for n in from..=to {
            let order = format!(
                r#"{{"order_id":"A-{n}","customer":"customer {n}","total_cents":{}}}"#,
                1000 + n * 250
            );
            let id = format!("order-{n}");
            println!("$ wharf enqueue orders '{order}' --id {id}");
            print!(
                "{}",
                self.output(&["enqueue", "orders", &order, "--id", &id])?
            );
        }
        Ok(())
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > Duration::from_secs(60) {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn deploy(from: &Path, dir: &Path, name: &str) -> Result<()> {
    let tmp = dir.join(format!("handlers/.{name}.tmp"));
    std::fs::copy(from, &tmp).with_context(|| format!("copying {}", from.display()))?;
    std::fs::rename(&tmp, dir.join(format!("handlers/{name}.wasm")))?;
    Ok(())
}

fn stop(child: &mut Child) -> Result<()> {
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let status = child.wait()?;
    println!("\nwharf run exited ({status})");
    Ok(())
}

/// Run the demo.
pub fn run(keep_running: bool) -> Result<()> {
    tools::build_guests()?;
    tools::run(tools::cargo(&[
        "build",
        "--package",
        "wharf-host",
        "--bin",
        "wharf",
    ]))?;
    let dir = root().join("demo");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).context("clearing the previous demo folder")?;
    }
    std::fs::create_dir_all(dir.join("handlers"))?;
    std::fs::write(dir.join("wharf.toml"), CONFIG)?;
    deploy(&tools::guest("order_export"), &dir, "order-export")?;
    deploy(&tools::guest("noop"), &dir, "notifier")?;
    let demo = Demo {
        wharf: root().join("target/debug/wharf"),
        dir: dir.clone(),
    };

    demo.show("The configuration is valid", &["config", "check"])?;
    println!("\n=== Starting the host (its log follows on stderr)");
    let mut child = demo
        .cmd(&["run"])
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .spawn()
        .context("starting wharf run")?;
    let result = (|| -> Result<()> {
        wait_until("the admin API", || demo.handler_hash().is_some())?;
        demo.show("Deployed handlers", &["handlers", "list"])?;

        println!("\n=== Enqueueing five orders");
        demo.enqueue_orders(1, 5)?;
        wait_until("five processed orders", || demo.processed("orders") == 5)?;
        demo.show("Processed by order-export v1", &["messages", "list"])?;

        let v1 = demo.handler_hash();
        println!("\n=== Hot-deploying order-export v2 (copy to a temp name, then rename)");
        deploy(&tools::guest("order_export_v2"), &dir, "order-export")?;
        wait_until("v2 to be serving", || {
            demo.handler_hash().is_some_and(|h| Some(h) != v1)
        })?;
        demo.show("Deployed handlers after the swap", &["handlers", "list"])?;

        println!("\n=== Enqueueing five more orders");
        demo.enqueue_orders(6, 10)?;
        wait_until("ten processed orders", || demo.processed("orders") == 10)?;
        wait_until("ten notifications", || {
            demo.processed("notifications") == 10
        })?;
        demo.show(
            "Notifications: the last five (ids notify-…) were sent by v2",
            &["messages", "list", "--queue", "notifications"],
        )?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = stop(&mut child);
        return Err(e);
    }
    if keep_running {
        println!(
            "\nThe host keeps running (admin API on http://127.0.0.1:9464/readyz). In another shell:"
        );
        println!(
            "  cd demo && ../target/debug/wharf enqueue orders '{{\"order_id\":\"A-99\",\"customer\":\"you\",\"total_cents\":100}}'"
        );
        println!("Press Ctrl-C to stop it.");
        child.wait()?;
        return Ok(());
    }
    stop(&mut child)?;
    println!("Demo finished: the files are in {}", dir.display());
    Ok(())
}
