//! A private PostgreSQL server for tests that crash and restart the queue database: its own
//! data directory (`initdb`) and port, run as the `postgres` user (the server refuses root)
//! with the machine's PostgreSQL binaries. `crash` is an immediate shutdown — no checkpoint,
//! crash recovery on the next start — so only committed transactions survive, as after a
//! power cut of the database host.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::free_port;

/// A private PostgreSQL server, stopped when dropped.
pub struct PgNode {
    port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl PgNode {
    /// Create a database cluster and start it; returns once it accepts connections.
    pub fn start() -> PgNode {
        let bin = binaries();
        let dir = tempfile::Builder::new()
            .prefix("wharf-pg-")
            .tempdir()
            .expect("a temporary directory");
        run(Command::new("chown").arg("postgres:").arg(dir.path()));
        let node = PgNode {
            port: free_port(),
            dir,
            bin,
        };
        run(node
            .as_postgres("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(node.data()));
        node.start_again();
        node
    }

    /// Its URL (database `postgres`).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Immediate shutdown: every backend quits at once, nothing is checkpointed.
    pub fn crash(&self) {
        run(self
            .as_postgres("pg_ctl")
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(self.data()));
    }

    /// Start it (again, recovering from a crash); returns once it accepts connections.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        run(self
            .as_postgres("pg_ctl")
            .args(["start", "-w", "-t", "60", "-o", &options, "-l"])
            .arg(self.dir.path().join("log"))
            .arg("-D")
            .arg(self.data()));
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `program` of the PostgreSQL binaries, run as `postgres`.
    fn as_postgres(&self, program: &str) -> Command {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"])
            .arg(self.bin.join(program));
        cmd
    }
}

impl Drop for PgNode {
    fn drop(&mut self) {
        let _ = self
            .as_postgres("pg_ctl")
            .args(["stop", "-m", "immediate", "-D"])
            .arg(self.data())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The newest `/usr/lib/postgresql/N/bin`.
fn binaries() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is installed (/usr/lib/postgresql)")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().expect("a PostgreSQL with pg_ctl").1
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
