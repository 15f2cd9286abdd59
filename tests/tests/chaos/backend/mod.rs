//! The backends of the fault matrix: where the queue under test keeps its messages, the proxy
//! the host reaches it through, and how a case reads the replies and sees the queue settled.
//! The SQL backends are here (PostgreSQL on a private server the case may crash and
//! restart); the brokers (each on a private instance of the case's own) are in [`brokers`].

mod brokers;

use std::sync::Arc;
use std::time::Duration;

use brokers::Broker;
use wharf_host::queue::{MessageFilter, QueueStore, Status};
use wharf_tests::pg_node::PgNode;
use wharf_tests::proxy::TcpProxy;
use wharf_tests::{TestDir, free_port};

/// Where the queue under test lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Redis,
    RedisCluster,
    RabbitMq,
    Kafka,
    ServiceBus,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
            Backend::Redis => "Redis",
            Backend::RedisCluster => "Redis Cluster",
            Backend::RabbitMq => "RabbitMQ",
            Backend::Kafka => "Kafka (tansu)",
            Backend::ServiceBus => "Service Bus (contract server)",
        }
    }
}

/// One case's backend, configured in its directory.
pub struct Setup {
    /// The host's admin address (`/readyz`).
    pub admin: String,
    /// The SQL store of the `replies` queue (and of `work` on a SQL backend), reached
    /// directly, not through the proxy.
    store: Arc<dyn QueueStore>,
    proxy: Option<TcpProxy>,
    broker: Option<Broker>,
    postgres: Option<PgNode>,
    /// How the case's messages and follow-ups go.
    shape: Shape,
}

/// How a case's messages and follow-ups go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    /// `work` has the consumer inbox in the SQL store (and its messages ids).
    pub inbox: bool,
    /// `work`'s messages have MessageIds (always with the inbox).
    pub ids: bool,
    /// The follow-ups go into `replies` on a broker (the backend's own; a Redis on the shared
    /// server for a SQL backend) through the outbox; a handler there, with the SQL inbox,
    /// echoes each into the SQL queue `echoes`, where the case counts them: two hops, each
    /// exactly once when the relay's repeats keep their MessageId.
    pub into_broker: bool,
    /// The handler (the `kv-state` fixture) also increments the key-value counter
    /// `counters/total` and one of [`CUSTOMERS`] per-customer counters per message, committed
    /// with the outcome: they must end equal to the message counts.
    pub state: bool,
    /// The case runs only in `cargo xtask chaos` (the long form).
    pub chaos_only: bool,
}

impl Shape {
    /// Whether every follow-up must exist exactly once: from a SQL queue (settled under its
    /// lease), or from a broker with the SQL inbox or MessageIds (commit marks).
    pub fn with_ids(self) -> bool {
        self.inbox || self.ids
    }
}

/// The queue under test: short leases so a crashed host's messages return quickly, retries
/// enough for every fault, and a pace (8 at a time, 10 ms each) that keeps the load running
/// while the fault strikes.
const WORK: &str = "[queues.work]\nhandler = \"work\"\nconcurrency = 8\nlease = \"3s\"\ntimeout = \"2s\"\nbackoff = \"100ms\"\nmax_backoff = \"1s\"\nmax_attempts = 1000\n";

const REPLIES: &str = "[queues.replies]\nhandler = \"none\"\n";

/// In the `state` cases, message `n` also increments `counters/customer-{n % CUSTOMERS}`.
pub const CUSTOMERS: u64 = 7;

/// `replies` on the broker of `provider`, echoing into `echoes`.
fn replies_on(provider: &str) -> String {
    format!(
        "[queues.replies]\nhandler = \"work\"\nstorage = \"external\"\nprovider = \"{provider}\"\nconcurrency = 8\nlease = \"3s\"\ntimeout = \"2s\"\nbackoff = \"100ms\"\nmax_attempts = 1000\ninbox = {{ store = \"sql\" }}\n\n[queues.echoes]\nhandler = \"none\"\n"
    )
}

impl Setup {
    /// Write the case's `wharf.toml` for `backend` and `shape` into `dir`.
    pub async fn new(backend: Backend, dir: &TestDir, shape: Shape) -> Setup {
        let admin = format!("127.0.0.1:{}", free_port());
        let mut storage = "url = \"sqlite://wharf.db\"".to_string();
        let (mut proxy, mut postgres, mut broker, mut external) = (None, None, None, String::new());
        match backend {
            Backend::Sqlite => {}
            Backend::Postgres => {
                let node = tokio::task::block_in_place(PgNode::start);
                let through = TcpProxy::start(node.port()).await;
                let url = format!("postgres://postgres@127.0.0.1:{}/postgres", through.port());
                storage = format!("url = \"{url}\"");
                (proxy, postgres) = (Some(through), Some(node));
            }
            _ => {
                let (b, provider, through) = Broker::start(backend).await;
                // Reconciliation often enough to pick work up soon after a fault.
                external = format!(
                    "storage = \"external\"\nprovider = \"main\"\n\n[providers.main]\n{provider}\n[external]\nreconcile_interval = \"1s\"\n"
                );
                (broker, proxy) = (Some(b), through);
            }
        }
        let with_inbox = if shape.inbox {
            "inbox = { store = \"sql\" }\n"
        } else {
            ""
        };
        let replies = match (shape.into_broker, &broker) {
            (false, _) => REPLIES.to_string(),
            (true, Some(_)) => replies_on("main"),
            (true, None) => format!(
                "{}\n[providers.target]\ntype = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nkey_prefix = \"{}\"\n",
                replies_on("target"),
                wharf_tests::unique_prefix("chaos-target")
            ),
        };
        let grants = match shape.state {
            true => "[handlers.work]\nkeyvalue = [\"counters\"]\n\n",
            false => "",
        };
        let text = format!(
            "[host]\nadmin_listen = \"{admin}\"\nmax_instances = 64\ndeploy_debounce = \"50ms\"\nshutdown_grace = \"5s\"\n\n[storage]\n{storage}\n\n{grants}{WORK}{with_inbox}{external}\n{replies}"
        );
        std::fs::write(dir.path("wharf.toml"), text).unwrap();
        let store = match &postgres {
            Some(node) => wharf_host::queue::open(&node.url(), None, 2)
                .await
                .expect("the case's PostgreSQL"),
            None => dir.sqlite_store().await,
        };
        Setup {
            admin,
            store,
            proxy,
            broker,
            postgres,
            shape,
        }
    }

    /// The proxies in front of the store (every backend but SQLite).
    fn proxies(&self) -> Vec<&TcpProxy> {
        let own = self.broker.iter().flat_map(Broker::own_proxies);
        let proxies: Vec<&TcpProxy> = self.proxy.iter().chain(own).collect();
        assert!(!proxies.is_empty(), "this backend has no proxy");
        proxies
    }

    /// Close every connection of the host to the store at once.
    pub fn close_connections(&self) {
        self.proxies().into_iter().for_each(TcpProxy::close_all);
    }

    /// Cut the store off (`on`), or let the host reach it again: with `silently`, traffic is
    /// held and connections stay open (a network cut); otherwise connections are cut and new
    /// ones refused (the store is gone).
    pub fn cut_off(&self, silently: bool, on: bool) {
        for proxy in self.proxies() {
            match (silently, on) {
                (true, held) => proxy.hold(held),
                (false, true) => proxy.stop(),
                (false, false) => proxy.start_again(),
            }
        }
    }

    /// Enqueue messages `0..total` into `work` with the CLI.
    pub fn enqueue(&self, dir: &TestDir, total: u64) {
        let lines: String = (0..total)
            .map(|n| {
                let next = match (self.shape.into_broker, self.shape.state) {
                    (true, _) => ",\"next_reply_to\":\"echoes\"".to_string(),
                    (false, true) => {
                        format!(",\"incr\":[\"total\",\"customer-{}\"]", n % CUSTOMERS)
                    }
                    (false, false) => String::new(),
                };
                format!("{{\"n\":{n},\"id\":\"m-{n}\",\"reply_to\":\"replies\"{next},\"sleep_ms\":10}}\n")
            })
            .collect();
        std::fs::write(dir.path("work.jsonl"), lines).unwrap();
        let mut args = vec!["enqueue", "work", "--file", "work.jsonl"];
        if self.shape.with_ids() {
            // The inbox and the commit marks know a message by its MessageId.
            args.extend(["--id-from", "/id"]);
        }
        let (ok, _, stderr) = dir.wharf(&args);
        assert!(ok, "enqueueing the load failed: {stderr}");
    }

    /// Every `n` a run echoed so far (one entry per run; through the broker, per echo of an
    /// echo).
    pub async fn replies(&self) -> Vec<i64> {
        let (queue, path) = match self.shape.into_broker {
            false => ("replies", "/seen/n"),
            true => ("echoes", "/seen/seen/n"),
        };
        let mut out = Vec::new();
        let mut before = None;
        loop {
            let page = self
                .store
                .list(&MessageFilter {
                    queue: Some(queue.into()),
                    limit: 1000,
                    before_key: before,
                    ..Default::default()
                })
                .await
                .expect("listing the replies");
            let Some(last) = page.last() else {
                return out;
            };
            before = Some(last.key);
            out.extend(page.iter().map(|m| {
                let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
                v.pointer(path)
                    .and_then(|n| n.as_i64())
                    .expect("the echoed n")
            }));
        }
    }

    /// The key-value counter `counters/KEY` (absent: 0).
    pub async fn counter(&self, key: &str) -> u64 {
        let read = self.store.state_read("counters", key).await;
        read.expect("reading the counter")
            .map_or(0, |(v, _)| String::from_utf8(v).unwrap().parse().unwrap())
    }

    /// Whether nothing of `work` is left pending, leased or failed.
    pub async fn settled(&self, total: u64) -> bool {
        let counts = self.store.counts("work").await.expect("counting `work`");
        match &self.broker {
            // Messages that needed inspection would be in SQL; the rest must be gone from
            // the broker.
            Some(broker) => counts.iter().all(|(_, n)| *n == 0) && broker.drained().await,
            None => counts
                .iter()
                .find(|(s, _)| *s == Status::Processed)
                .is_some_and(|(_, n)| *n == total),
        }
    }

    /// Crash the store — an immediate shutdown of PostgreSQL, a SIGKILL of a broker (for a
    /// cluster, of the node serving `work`'s slot) — call `during` for `down`, then start it
    /// again on its data.
    pub async fn restart_store(&mut self, down: Duration, mut during: impl AsyncFnMut()) {
        let Some(node) = &self.postgres else {
            let broker = self.broker.as_mut().expect("a store that can be restarted");
            return broker.restart(down, during).await;
        };
        tokio::task::block_in_place(|| node.crash());
        let until = std::time::Instant::now() + down;
        while std::time::Instant::now() < until {
            during().await;
        }
        tokio::task::block_in_place(|| node.start_again());
    }
}
