//! Test harness for Wharf's integration tests: a temporary host directory with a config
//! file, handler fixtures deployed from the real guest builds, and polling helpers.

pub mod kafka;
pub mod pg_node;
pub mod proxy;
pub mod rabbit_node;
pub mod redis_nodes;
mod services;

pub use services::*;
pub use wharf_servicebus_contract as servicebus;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use wharf_host::queue::{MessageFilter, NewMessage, Status, StoredMessage};
use wharf_host::{Config, RunningHost};

/// The folder the guest components are built into (`cargo xtask guests`).
pub fn guests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-handlers/target/wasm32-wasip2/release")
}

/// An external-storage envelope body for `payload` with MessageId `id` (priority 0), as a
/// producer would publish it.
pub fn envelope_body(payload: serde_json::Value, id: Option<&str>) -> Vec<u8> {
    wharf_host::external::Envelope::new(payload.to_string(), id.map(str::to_string), 0)
        .to_json()
        .into_bytes()
}

/// A language handlers are written in (fixtures of the same name behave the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// `sample-handlers/fixtures/NAME` (Rust).
    Rust,
    /// `sample-handlers/js/fixtures/NAME.js` (QuickJS through jco).
    Js,
    /// `sample-handlers/python/fixtures/NAME/app.py` (componentize-py).
    Python,
    /// `sample-handlers/js/spidermonkey/NAME.js` (SpiderMonkey through componentize-js, with
    /// `fetch`), and the `order-export` sample built on SpiderMonkey.
    JsSpiderMonkey,
}

impl Lang {
    /// The built component of fixture `name` in this language.
    pub fn guest(self, name: &str) -> PathBuf {
        let dir = match self {
            Lang::Rust => return guest(name),
            Lang::Js => "js",
            Lang::Python => "python",
            Lang::JsSpiderMonkey => "js-spidermonkey",
        };
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sample-handlers/target")
            .join(dir)
            .join(format!("{name}.wasm"));
        assert!(
            path.exists(),
            "{} is missing: build the guests first (`cargo xtask guests` needs Node and Python for these)",
            path.display()
        );
        path
    }
}

/// The built component of a sample or fixture crate (`flaky`, `order_export`, …).
pub fn guest(crate_name: &str) -> PathBuf {
    let path = guests_dir().join(format!("{}.wasm", crate_name.replace('-', "_")));
    assert!(
        path.exists(),
        "{} is missing: build the guests first (`cargo xtask test` does, or `cargo xtask guests`)",
        path.display()
    );
    path
}

/// Route the host's logs to the test output (once per process; `RUST_LOG` to adjust).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,wharf::guest=warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// The host's log lines, captured for assertions (see [`capture_logs`]).
#[derive(Clone, Default)]
pub struct CapturedLogs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Capture the process's logs at `info` (one test per process, as under nextest).
pub fn capture_logs() -> CapturedLogs {
    let logs = CapturedLogs::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .try_init()
        .expect("capture_logs needs the test to own its process: run it under cargo nextest");
    logs
}

/// A host directory: `wharf.toml`, `handlers/`, the SQLite database, the cache.
pub struct TestDir {
    /// The temporary directory (removed on drop).
    pub dir: tempfile::TempDir,
}

impl TestDir {
    /// A new empty host directory with a `handlers/` folder.
    pub fn new() -> Self {
        init_logging();
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::create_dir_all(dir.path().join("handlers")).expect("handlers folder");
        TestDir { dir }
    }

    /// Path of a file inside the directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Where handler `name` is deployed.
    pub fn handler_path(&self, name: &str) -> PathBuf {
        self.path(&format!("handlers/{name}.wasm"))
    }

    /// Deploy the built guest `crate_name` as handler `name`, atomically (copy + rename).
    pub fn deploy(&self, name: &str, crate_name: &str) {
        self.deploy_bytes(
            name,
            &std::fs::read(guest(crate_name)).expect("reading guest"),
        );
    }

    /// Deploy fixture `fixture` written in `lang` as handler `name`, atomically.
    pub fn deploy_in(&self, name: &str, lang: Lang, fixture: &str) {
        self.deploy_bytes(
            name,
            &std::fs::read(lang.guest(fixture)).expect("reading guest"),
        );
    }

    /// The SQLite queue store of this directory's `wharf.db`, opened on its own (as a CLI
    /// or a second process would).
    pub async fn sqlite_store(&self) -> std::sync::Arc<dyn wharf_host::queue::QueueStore> {
        wharf_host::queue::open(
            &format!("sqlite://{}", self.path("wharf.db").display()),
            None,
            1,
        )
        .await
        .expect("opening the test database")
    }

    /// Run the `wharf` binary here with `--config wharf.toml` and `args`: (success, stdout,
    /// stderr).
    pub fn wharf(&self, args: &[&str]) -> (bool, String, String) {
        let out = std::process::Command::new(wharf_binary())
            .current_dir(self.dir.path())
            .args(["--config", "wharf.toml"])
            .args(args)
            .output()
            .expect("running wharf");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Deploy raw bytes as handler `name`, atomically.
    pub fn deploy_bytes(&self, name: &str, bytes: &[u8]) {
        let tmp = self.path(&format!("handlers/.{name}.tmp"));
        std::fs::write(&tmp, bytes).expect("writing handler");
        std::fs::rename(&tmp, self.handler_path(name)).expect("renaming handler into place");
    }

    /// Write `wharf.toml`: test-friendly `[host]`/`[storage]` settings (SQLite; counts and
    /// gauges sampled every 500 ms) followed by
    /// `queues` (TOML text with `[queues.NAME]` tables).
    pub fn write_config(&self, queues: &str) -> PathBuf {
        self.write_config_with_storage(
            "url = \"sqlite://wharf.db\"\npoll_interval = \"20ms\"",
            queues,
        )
    }

    /// Like [`TestDir::write_config`], with the given `[storage]` body.
    pub fn write_config_with_storage(&self, storage: &str, queues: &str) -> PathBuf {
        let text = format!(
            "[host]\nadmin_listen = \"127.0.0.1:0\"\nmax_instances = 64\ndeploy_debounce = \"50ms\"\nshutdown_grace = \"5s\"\nmetrics_interval = \"500ms\"\n\n[storage]\n{storage}\n\n{queues}"
        );
        let path = self.path("wharf.toml");
        std::fs::write(&path, text).expect("writing config");
        path
    }

    /// Write the config and start a host on it.
    pub async fn start(&self, queues: &str) -> RunningHost {
        let path = self.write_config(queues);
        let config = Config::load(&path).unwrap_or_else(|e| panic!("test config is invalid: {e}"));
        wharf_host::start(config).await.expect("host starts")
    }

    /// Start a host on PostgreSQL, in `schema`, polling only every `poll` (so that prompt
    /// processing shows notifications at work).
    pub async fn start_postgres(&self, schema: &PgSchema, poll: &str, queues: &str) -> RunningHost {
        let storage = format!(
            "url = \"{}\"\nschema = \"{}\"\npoll_interval = \"{poll}\"",
            database_url(),
            schema.name
        );
        let path = self.write_config_with_storage(&storage, queues);
        let config = Config::load(&path).unwrap_or_else(|e| panic!("test config is invalid: {e}"));
        wharf_host::start(config)
            .await
            .expect("host starts on PostgreSQL")
    }

    /// Write `wharf.toml` for host `id` on PostgreSQL in `schema` (polling every 50 ms, a 2 s
    /// shutdown grace), followed by `rest` (queues, schedules): one of several hosts sharing
    /// the store, in this process ([`TestDir::start_host`]) or as a `wharf run`.
    pub fn write_host_config(&self, schema: &PgSchema, id: &str, rest: &str) -> PathBuf {
        let text = format!(
            "[host]\nid = \"{id}\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"2s\"\n\n\
             [storage]\nurl = \"{url}\"\nschema = \"{schema}\"\npoll_interval = \"50ms\"\n\n{rest}",
            url = database_url(),
            schema = schema.name
        );
        let path = self.path("wharf.toml");
        std::fs::write(&path, text).expect("writing config");
        path
    }

    /// Start host `id` here on PostgreSQL in `schema` with `rest` ([`TestDir::write_host_config`]).
    pub async fn start_host(&self, schema: &PgSchema, id: &str, rest: &str) -> RunningHost {
        let path = self.write_host_config(schema, id, rest);
        let config = Config::load(&path).unwrap_or_else(|e| panic!("test config is invalid: {e}"));
        wharf_host::start(config).await.expect("host starts")
    }
}

impl Default for TestDir {
    fn default() -> Self {
        Self::new()
    }
}

/// A message with this JSON payload and no identity.
pub fn msg(payload: serde_json::Value) -> NewMessage {
    NewMessage {
        payload: payload.to_string(),
        ..NewMessage::default()
    }
}

/// Where a test host keeps its queues: the directory's SQLite, or a fresh schema of the
/// shared PostgreSQL.
#[derive(Debug, Clone, Copy)]
pub enum Db {
    /// `wharf.db` in the test directory.
    Sqlite,
    /// A schema of its own on the shared PostgreSQL.
    Postgres,
}

impl TestDir {
    /// Write the config with `queues` and start a host on `db` (the schema, for PostgreSQL,
    /// lives as long as the returned value).
    pub async fn start_on(&self, db: Db, queues: &str) -> (Option<PgSchema>, RunningHost) {
        match db {
            Db::Sqlite => (None, self.start(queues).await),
            Db::Postgres => {
                let schema = PgSchema::new();
                let host = self.start_postgres(&schema, "50ms", queues).await;
                (Some(schema), host)
            }
        }
    }
}

/// Poll `check` every 20 ms until it returns `Some`, or panic after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll_until(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// How long a check of [`poll_until`] may run past the wait's timeout (a slow call near the
/// end of a wait still counts).
pub const CHECK_GRACE: Duration = Duration::from_secs(10);

/// Poll `check` every 20 ms until it returns `Some`; `None` once `timeout` passed (for a
/// caller that says more about the timeout than [`wait_for`] does). A check that does not
/// end counts as timed out [`CHECK_GRACE`] after `timeout`, so a call that hangs fails the
/// test with what it waited for instead of holding it for ever.
pub async fn poll_until<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        let limit = timeout.saturating_sub(started.elapsed()) + CHECK_GRACE;
        match tokio::time::timeout(limit, check()).await {
            Ok(Some(value)) => return Some(value),
            Ok(None) => {}
            Err(_) => return None,
        }
        if started.elapsed() >= timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// All messages of a queue (oldest first).
pub async fn messages(host: &RunningHost, queue: &str) -> Vec<StoredMessage> {
    let filter = MessageFilter {
        queue: Some(queue.to_string()),
        status: None,
        limit: 1_000_000,
        ..Default::default()
    };
    let mut all = host.store.list(&filter).await.expect("listing messages");
    all.reverse();
    all
}

/// Number of messages of `queue` in `status`.
pub async fn count(host: &RunningHost, queue: &str, status: Status) -> u64 {
    host.store
        .counts(queue)
        .await
        .expect("counting messages")
        .into_iter()
        .find(|(s, _)| *s == status)
        .map(|(_, n)| n)
        .unwrap_or(0)
}

/// Wait until the message with `key` is in `status`; returns it.
pub async fn wait_status(
    host: &RunningHost,
    key: i64,
    status: Status,
    timeout: Duration,
) -> StoredMessage {
    wait_for(
        timeout,
        &format!("message {key} to be {status}"),
        || async {
            host.store
                .get(key)
                .await
                .expect("reading message")
                .filter(|m| m.status == status)
        },
    )
    .await
}

/// Run `work` to completion on a runtime of its own, in a thread of its own: for `Drop`
/// implementations, which run inside a test's runtime.
pub fn run_detached<F: std::future::Future<Output = ()> + Send + 'static>(work: F) {
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(work);
        }
    })
    .join();
}

/// The `wharf` binary next to the running test binary. `cargo xtask test` (the whole
/// workspace) builds it with the tests; `cargo nextest run -p wharf-tests` alone does not
/// rebuild it, so run `cargo build -p wharf-host --bin wharf` first then.
pub fn wharf_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .join("wharf");
    assert!(
        path.exists(),
        "{} is missing: `cargo build -p wharf-host --bin wharf` (cargo xtask test builds it)",
        path.display()
    );
    path
}

/// `wharf run` with `dir/wharf.toml`, its log appended to `dir/wharf.log`.
pub fn spawn_wharf(dir: &Path) -> WharfProcess {
    spawn_wharf_with(dir, &[])
}

/// [`spawn_wharf`] with global options before `run` (e.g. `--log-format json`).
pub fn spawn_wharf_with(dir: &Path, options: &[&str]) -> WharfProcess {
    spawn_wharf_in(dir, options, &[])
}

/// [`spawn_wharf`] with environment variables set for the process.
pub fn spawn_wharf_with_env(dir: &Path, vars: &[(&str, &str)]) -> WharfProcess {
    spawn_wharf_in(dir, &[], vars)
}

fn spawn_wharf_in(dir: &Path, options: &[&str], vars: &[(&str, &str)]) -> WharfProcess {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("wharf.log"))
        .expect("the log file");
    let child = std::process::Command::new(wharf_binary())
        .current_dir(dir)
        .args(["--config", "wharf.toml"])
        .args(options)
        .envs(vars.iter().copied())
        .arg("run")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("wharf run starts");
    WharfProcess(child)
}

/// A running `wharf run`, killed when dropped (a failing test leaves no process behind).
pub struct WharfProcess(std::process::Child);

impl WharfProcess {
    /// Its process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL it (a crash) and reap it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// SIGTERM it (a graceful stop) and wait until it exited.
    pub fn terminate(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

impl Drop for WharfProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            self.kill();
        }
    }
}

/// Scrape the host's `/metrics` into `series → value` (`name{labels}` exactly as rendered).
pub async fn scrape(host: &RunningHost) -> std::collections::BTreeMap<String, f64> {
    let url = format!("http://{}/metrics", host.admin_addr);
    let text = tokio::task::spawn_blocking(move || {
        ureq::get(&url)
            .call()
            .expect("GET /metrics")
            .into_body()
            .read_to_string()
            .expect("metrics text")
    })
    .await
    .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Queue `queue` as `GET /api/v1/queues` of the host shows it (a host without an admin
/// token).
pub async fn queue_info(host: &RunningHost, queue: &str) -> serde_json::Value {
    let url = format!("http://{}/api/v1/queues", host.admin_addr);
    let queues: serde_json::Value = tokio::task::spawn_blocking(move || {
        let text = ureq::get(&url)
            .call()
            .expect("GET /api/v1/queues")
            .into_body()
            .read_to_string()
            .expect("the queues");
        serde_json::from_str(&text).expect("JSON")
    })
    .await
    .unwrap();
    queues
        .as_array()
        .expect("a list of queues")
        .iter()
        .find(|q| q["name"] == queue)
        .unwrap_or_else(|| panic!("no queue {queue} in {queues}"))
        .clone()
}

/// The replies in `replies`, as the attempts that sent them (the echo's `attempt`), by the
/// `n` they echo.
pub async fn replies_by_n(host: &RunningHost) -> std::collections::BTreeMap<i64, Vec<i64>> {
    let mut by_n: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
    for m in messages(host, "replies").await {
        let v: serde_json::Value = serde_json::from_str(&m.payload).expect("a JSON reply");
        let n = v["seen"]["n"].as_i64().expect("the echoed n");
        let attempt = v["attempt"].as_i64().expect("the echoed attempt");
        by_n.entry(n).or_default().push(attempt);
    }
    by_n
}

/// The `n` values the `flaky` guest echoed to the `replies` queue, sorted.
pub async fn replies(host: &RunningHost) -> Vec<i64> {
    let mut out: Vec<i64> = messages(host, "replies")
        .await
        .iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_str(&m.payload).expect("a JSON reply");
            v["seen"]["n"].as_i64().expect("the echoed n")
        })
        .collect();
    out.sort();
    out
}
