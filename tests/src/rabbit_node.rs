//! A private, throw-away RabbitMQ node for tests that restart the broker mid-load.
//!
//! The machine's shared broker (127.0.0.1:5672) must never be restarted by a test, so a test
//! that needs "the broker went away" starts its own node: own AMQP port, own Erlang
//! distribution port, own node name and own data/log directories in a temporary directory.
//! Several nodes (in one process or in parallel test processes) do not conflict.
//!
//! Needs: the Debian `rabbitmq-server` package (`rabbitmq-server`, `rabbitmqctl` on PATH, a
//! `rabbitmq` system user), `su`, `chown`, `kill`; crates `anyhow`, `tempfile`,
//! `tokio` (features `process`, `net`, `time`, `io-util`).
//!
//! ```ignore
//! let mut node = RabbitNode::start().await?;          // ~3-4 s on 2 cores
//! let conn = lapin::Connection::connect(&node.amqp_url(), props).await?;
//! node.stop_app().await?;                             // clients see the socket reset
//! node.start_app().await?;                            // durable queues/messages are still there
//! node.kill().await?; node.start_node().await?;       // hard crash: no close frame, RST/EOF
//! ```
//!
//! Restart flavours (pick by what the test wants to exercise):
//! - `stop_app()` / `start_app()`: the Erlang VM stays up, the `rabbit` application stops
//!   (listener closed: connects are refused; open connections are reset, lapin reports
//!   `IO error: Connection reset by peer`) and starts again. Fastest "broker restarted".
//! - `stop()` / `start_node()`: the whole node (VM) stops gracefully and a new VM boots on the
//!   same data directory, ports and name.
//! - `kill()` / `start_node()`: SIGKILL of the VM (a crash: no close frame, the socket just
//!   dies), then a new VM boots on the same data directory.
//!
//! Measured on 2 cores (RabbitMQ 3.10.8): start() 2.8-4.1 s alone, 6.6-8.3 s for 3 in parallel;
//! stop_app 0.3-0.7 s + start_app 0.75-1.15 s (restart_app 2.1-2.6 s with 3 nodes busy);
//! stop 1.5 s + start_node 2.6-4.9 s; kill <0.1 s + start_node 2.7-3.8 s; Drop 1.6 s.
//! Durable classic and quorum queues kept their messages across all three restart flavours.
//!
//! Facts behind it (RabbitMQ 3.10 Debian package, as root):
//! - `/usr/sbin/rabbitmq-server` is a wrapper that `su`s to the `rabbitmq` user (in a new
//!   session: killing our child's process group does not reach the VM), so the
//!   directories must belong to `rabbitmq`; the Erlang cookie used by the node and by
//!   `rabbitmqctl` is then the same (`/var/lib/rabbitmq/.erlang.cookie`).
//! - `/etc/rabbitmq/rabbitmq.conf` pins 5672, so our own `RABBITMQ_CONFIG_FILE` is given;
//!   `RABBITMQ_NODENAME` in the environment wins over `NODENAME` in rabbitmq-env.conf.
//! - epmd: one `epmd -daemon` (port 4369) is shared by all nodes; the first Erlang node to start
//!   launches it if it is not running and it outlives the node; node names are unique here, so
//!   nodes don't clash on it.
//! - `rabbitmqctl` itself is an Erlang node that listens on a port in 35672..=35682 (the same
//!   range for every node), so at most 11 `rabbitmqctl` may run at once on the machine; the dist
//!   port chosen here avoids that range.

use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a node may take to boot (or the app to start) before we give up.
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A private RabbitMQ node; stopped, killed and its directory removed on drop.
pub struct RabbitNode {
    node: String,
    amqp_port: u16,
    dist_port: u16,
    dir: tempfile::TempDir,
    /// The `rabbitmq-server` wrapper (root), leader of its own process group. The VM runs as
    /// `rabbitmq` in another session (made by `su`): its pid is in `rabbit.pid`.
    child: Option<Child>,
}

impl RabbitNode {
    /// Starts a fresh node and waits until it answers AMQP.
    pub async fn start() -> Result<Self> {
        let mut last_err = None;
        // A port picked free can be taken by someone else before the node binds it: retry.
        for _ in 0..3 {
            let dir = tempfile::Builder::new()
                .prefix("wharf-rabbit-")
                .tempdir()
                .context("creating the node directory")?;
            let amqp_port = free_port(|_| true)?;
            let dist_port = free_port(|p| p != amqp_port)?;
            let node = format!(
                "wharftest-{}-{}-{amqp_port}@localhost",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            let mut this = RabbitNode {
                node,
                amqp_port,
                dist_port,
                dir,
                child: None,
            };
            this.prepare_dir()?;
            match this.start_node().await {
                Ok(()) => return Ok(this),
                Err(e) => last_err = Some(e), // `this` is dropped: cleaned up
            }
        }
        Err(last_err.expect("at least one attempt"))
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f` (guest may log in from anywhere: loopback_users = none).
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    /// The AMQP port it listens on.
    pub fn amqp_port(&self) -> u16 {
        self.amqp_port
    }

    /// The Erlang node name, for `rabbitmqctl -n`.
    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// The node's log directory (worth printing when a test fails).
    pub fn log_dir(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    /// Stops the `rabbit` application (VM stays up): open connections are reset and the AMQP
    /// port refuses connections when this returns.
    pub async fn stop_app(&self) -> Result<()> {
        self.ctl(&["stop_app"]).await
    }

    /// Starts the `rabbit` application again and waits until it answers AMQP.
    pub async fn start_app(&mut self) -> Result<()> {
        self.ctl(&["start_app"]).await?;
        self.wait_ready().await
    }

    /// `stop_app` then `start_app`.
    pub async fn restart_app(&mut self) -> Result<()> {
        self.stop_app().await?;
        self.start_app().await
    }

    /// Stops the whole node gracefully (`rabbitmqctl stop`) and waits for the VM to exit.
    pub async fn stop(&mut self) -> Result<()> {
        self.ctl(&["stop"]).await?;
        self.reap(Duration::from_secs(30)).await
    }

    /// Kills the VM (SIGKILL: a crash, clients see the socket die without a close frame).
    pub async fn kill(&mut self) -> Result<()> {
        self.kill_now();
        self.reap(Duration::from_secs(10)).await
    }

    /// Boots the node (again) on its directory, name and ports; waits until it answers AMQP.
    pub async fn start_node(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("node {} is already running", self.node);
        }
        let d = self.dir.path();
        let child = Command::new("rabbitmq-server")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_PID_FILE", self.pid_file())
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(d.join("stdout.log"))?)
            .stderr(std::fs::File::create(d.join("stderr.log"))?)
            // Own group for the wrapper and `su`; note that `su` starts the server script (and the
            // VM) in a new session, so the VM itself is reached through RABBITMQ_PID_FILE.
            .process_group(0)
            .spawn()
            .context("spawning rabbitmq-server (is the rabbitmq-server package installed?)")?;
        self.child = Some(child);
        self.wait_ready().await
    }

    fn prepare_dir(&self) -> Result<()> {
        let d = self.dir.path();
        std::fs::create_dir_all(d.join("mnesia"))?;
        std::fs::create_dir_all(d.join("log"))?;
        std::fs::write(d.join("enabled_plugins"), "[].\n")?;
        std::fs::write(
            d.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.1 = 127.0.0.1:{}\nloopback_users = none\n\
                 log.console = false\nlog.file.level = info\n",
                self.amqp_port
            ),
        )?;
        if is_root() {
            // rabbitmq-server drops to the rabbitmq user: it must own (and be able to reach) the
            // directory; tempfile makes it 0700 root.
            let status = Command::new("chown")
                .args(["-R", "rabbitmq:rabbitmq"])
                .arg(d)
                .status()
                .context("chown")?;
            if !status.success() {
                bail!("chown -R rabbitmq:rabbitmq {} failed", d.display());
            }
        }
        Ok(())
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.path().join("rabbit.pid")
    }

    async fn ctl(&self, args: &[&str]) -> Result<()> {
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new("rabbitmqctl")
                .arg("-n")
                .arg(&self.node)
                .args(args)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .with_context(|| format!("rabbitmqctl {args:?} timed out"))?
        .context("running rabbitmqctl")?;
        if !out.status.success() {
            bail!(
                "rabbitmqctl -n {} {args:?}: {}\n{}{}",
                self.node,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Polls until the AMQP port answers a protocol header with connection.start.
    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            if amqp_answers(self.amqp_port).await {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "rabbitmq node {} exited ({status}) before answering on {}\n{}",
                    self.node,
                    self.amqp_port,
                    self.log_tail()
                );
            }
            if started.elapsed() > BOOT_TIMEOUT {
                bail!(
                    "rabbitmq node {} did not answer AMQP on {} within {BOOT_TIMEOUT:?}\n{}",
                    self.node,
                    self.amqp_port,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (bounded) for the wrapper process to exit, killing the group past the deadline.
    async fn reap(&mut self, within: Duration) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        let started = Instant::now();
        while child.try_wait()?.is_none() {
            if started.elapsed() > within {
                self.kill_now();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.pid_file());
        Ok(())
    }

    /// SIGKILL to the VM (by its pid file) and to the whole process group of the wrapper.
    fn kill_now(&self) {
        if let Ok(pid) = std::fs::read_to_string(self.pid_file()) {
            let pid = pid.trim();
            if !pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit()) {
                let _ = quiet(Command::new("kill").args(["-KILL", pid])).status();
            }
        }
        if let Some(child) = self.child.as_ref() {
            let group = format!("-{}", child.id());
            let _ = quiet(Command::new("kill").args(["-KILL", "--", &group])).status();
        }
    }

    fn log_tail(&self) -> String {
        let mut out = String::new();
        for f in [
            self.dir.path().join("stderr.log"),
            self.dir.path().join("stdout.log"),
        ]
        .into_iter()
        .chain(logs_in(&self.log_dir()))
        {
            if let Ok(text) = std::fs::read_to_string(&f) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(20)..];
                out.push_str(&format!("--- {}\n{}\n", f.display(), tail.join("\n")));
            }
        }
        out
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Graceful stop first (bounded), then make sure nothing survives.
            if let Ok(mut ctl) = quiet(
                Command::new("rabbitmqctl")
                    .arg("-n")
                    .arg(&self.node)
                    .arg("stop"),
            )
            .spawn()
            {
                let deadline = Instant::now() + Duration::from_secs(30);
                while matches!(ctl.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = ctl.kill();
                let _ = ctl.wait();
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            self.child = Some(child);
            self.kill_now();
            if let Some(mut child) = self.child.take() {
                let _ = child.wait();
            }
        }
        // `dir` (TempDir) is removed after this: root may delete the rabbitmq-owned files.
    }
}

/// True when 127.0.0.1:`port` answers the AMQP 0-9-1 protocol header with a method frame on
/// channel 0 (connection.start), i.e. the broker accepts connections.
async fn amqp_answers(port: u16) -> bool {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
        s.write_all(b"AMQP\x00\x00\x09\x01").await?;
        let mut header = [0u8; 3];
        s.read_exact(&mut header).await?;
        std::io::Result::Ok(header == [1, 0, 0])
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Ok(true))
    )
}

/// A port that is free on 127.0.0.1 now, picked at random in 20000..32000: below Linux's
/// ephemeral range (32768..60999), so that no outgoing connection grabs it while the node is
/// stopped, apart from the range of the other test servers' ports
/// ([`crate::services::free_port`]) and from the shared broker's ports (25672 here;
/// `rabbitmqctl`'s 35672..=35682 lie above the range).
fn free_port(ok: impl Fn(u16) -> bool) -> Result<u16> {
    crate::services::free_port_in(20000..32000, |p| p != 25672 && ok(p))
        .context("no free port found in 20000..32000")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn quiet(cmd: &mut Command) -> &mut Command {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
}

fn logs_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default()
}
