//! The backends of the fault matrix: where the queue under test keeps its messages, the proxy
//! the host reaches it through, and how a case reads the replies and sees the queue settled.

use std::sync::Arc;

use redis::AsyncCommands;
use wharf_host::external::rabbitmq::{Names, RabbitSettings};
use wharf_host::external::redis::Keys;
use wharf_host::queue::{MessageFilter, QueueStore, Status};
use wharf_tests::proxy::TcpProxy;
use wharf_tests::redis_nodes::{RedisCluster, RedisNode};
use wharf_tests::{
    PgSchema, TestDir, amqp_delete, amqp_url, database_url, free_port, rabbitmq_queue_counts,
    run_detached, unique_prefix,
};

/// Where the queue under test lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Redis,
    RedisCluster,
    RabbitMq,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
            Backend::Redis => "Redis",
            Backend::RedisCluster => "Redis Cluster",
            Backend::RabbitMq => "RabbitMQ",
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
    redis: Option<RedisUnderTest>,
    rabbit: Option<Names>,
    _schema: Option<PgSchema>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(names) = self.rabbit.take() {
            run_detached(async move {
                let queues = [names.processing, names.readiness];
                amqp_delete(&amqp_url(), &queues, &[names.exchange]).await
            });
        }
    }
}

/// The private Redis of a Redis case, and the keys of `work` in it.
struct RedisUnderTest {
    prefix: String,
    keys: Keys,
    url: String,
    node: Option<RedisNode>,
    cluster: Option<RedisCluster>,
}

impl RedisUnderTest {
    fn provider(&self, url: &str) -> String {
        let prefix = &self.prefix;
        format!(
            "[providers.main]\ntype = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\npromote_interval = \"100ms\"\n"
        )
    }
}

/// The queue under test: short leases so a crashed host's messages return quickly, retries
/// enough for every fault, and a pace (8 at a time, 10 ms each) that keeps the load running
/// while the fault strikes.
const WORK: &str = "[queues.work]\nhandler = \"work\"\nconcurrency = 8\nlease = \"3s\"\ntimeout = \"2s\"\nbackoff = \"100ms\"\nmax_backoff = \"1s\"\nmax_attempts = 1000\n";

const REPLIES: &str = "[queues.replies]\nhandler = \"none\"\n";

/// The `work` queue's keys for an external provider (and the provider's table), with
/// reconciliation often enough to pick work up soon after a fault.
fn external_queue(provider: &str) -> String {
    format!(
        "storage = \"external\"\nprovider = \"main\"\n\n{provider}\n[external]\nreconcile_interval = \"1s\"\n"
    )
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|tail| tail.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

impl Setup {
    /// Write the case's `wharf.toml` for `backend` into `dir`.
    pub async fn new(backend: Backend, dir: &TestDir) -> Setup {
        let admin = format!("127.0.0.1:{}", free_port());
        let sqlite = "url = \"sqlite://wharf.db\"".to_string();
        let mut rabbit = None;
        let (storage, external, proxy, schema, redis) = match backend {
            Backend::Sqlite => (sqlite, String::new(), None, None, None),
            Backend::Postgres => {
                let proxy = TcpProxy::start(port_of(&database_url())).await;
                let schema = PgSchema::new();
                let url = format!("postgres://postgres@127.0.0.1:{}/test", proxy.port());
                let storage = format!("url = \"{url}\"\nschema = \"{}\"", schema.name);
                (storage, String::new(), Some(proxy), Some(schema), None)
            }
            Backend::Redis => {
                let node = RedisNode::standalone();
                let proxy = TcpProxy::start(node.port).await;
                let prefix = unique_prefix("chaos");
                let redis = RedisUnderTest {
                    keys: Keys::new(&prefix, "work"),
                    prefix,
                    url: node.url(),
                    node: Some(node),
                    cluster: None,
                };
                let provider = redis.provider(&format!("redis://127.0.0.1:{}", proxy.port()));
                let external = external_queue(&provider);
                (sqlite, external, Some(proxy), None, Some(redis))
            }
            Backend::RedisCluster => {
                let cluster = tokio::task::block_in_place(|| RedisCluster::start(3));
                let prefix = unique_prefix("chaos");
                let redis = RedisUnderTest {
                    keys: Keys::new(&prefix, "work"),
                    prefix,
                    url: cluster.url(),
                    node: None,
                    cluster: Some(cluster),
                };
                let external = external_queue(&redis.provider(&redis.url));
                (sqlite, external, None, None, Some(redis))
            }
            Backend::RabbitMq => {
                let proxy = TcpProxy::start(port_of(&amqp_url())).await;
                let prefix = unique_prefix("chaos").replace(':', ".");
                let provider = format!(
                    "[providers.main]\ntype = \"rabbitmq\"\nurl = \"amqp://guest:guest@127.0.0.1:{}/%2f\"\nexchange_prefix = \"{prefix}\"\nqueue_prefix = \"{prefix}\"\n",
                    proxy.port()
                );
                rabbit = Some(
                    RabbitSettings {
                        exchange_prefix: prefix.clone(),
                        queue_prefix: prefix,
                        ..RabbitSettings::new(amqp_url())
                    }
                    .names("work"),
                );
                (sqlite, external_queue(&provider), Some(proxy), None, None)
            }
        };
        let text = format!(
            "[host]\nadmin_listen = \"{admin}\"\nmax_instances = 64\ndeploy_debounce = \"50ms\"\nshutdown_grace = \"5s\"\n\n[storage]\n{storage}\n\n{WORK}{external}\n{REPLIES}"
        );
        std::fs::write(dir.path("wharf.toml"), text).unwrap();
        let store = match &schema {
            Some(schema) => wharf_host::queue::open(&database_url(), Some(&schema.name), 2)
                .await
                .expect("the case's PostgreSQL schema"),
            None => dir.sqlite_store().await,
        };
        Setup {
            admin,
            store,
            proxy,
            redis,
            rabbit,
            _schema: schema,
        }
    }

    /// The proxy in front of the store (SQL backends other than SQLite, and brokers).
    pub fn proxy(&self) -> &TcpProxy {
        self.proxy.as_ref().expect("this backend has no proxy")
    }

    /// Enqueue messages `0..total` into `work` with the CLI.
    pub fn enqueue(&self, dir: &TestDir, total: u64) {
        let lines: String = (0..total)
            .map(|n| format!("{{\"n\":{n},\"reply_to\":\"replies\",\"sleep_ms\":10}}\n"))
            .collect();
        std::fs::write(dir.path("work.jsonl"), lines).unwrap();
        let (ok, _, stderr) = dir.wharf(&["enqueue", "work", "--file", "work.jsonl"]);
        assert!(ok, "enqueueing the load failed: {stderr}");
    }

    /// Every `n` a run echoed so far (one entry per run).
    pub async fn replies(&self) -> Vec<i64> {
        let mut out = Vec::new();
        let mut before = None;
        loop {
            let page = self
                .store
                .list(&MessageFilter {
                    queue: Some("replies".into()),
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
                v["seen"]["n"].as_i64().expect("the echoed n")
            }));
        }
    }

    /// Whether nothing of `work` is left pending, leased or failed.
    pub async fn settled(&self, total: u64) -> bool {
        let counts = self.store.counts("work").await.expect("counting `work`");
        let count = |status: Status| {
            counts
                .iter()
                .find(|(s, _)| *s == status)
                .map_or(0, |(_, n)| *n)
        };
        if let Some(names) = &self.rabbit {
            let left = rabbitmq_queue_counts(None, &names.processing).await;
            return counts.iter().all(|(_, n)| *n == 0) && left == (0, 0);
        }
        let sql_settled = match self.redis {
            None => count(Status::Processed) == total,
            Some(_) => counts.iter().all(|(_, n)| *n == 0),
        };
        let Some(redis) = &self.redis else {
            return sql_settled;
        };
        let Ok(mut conn) = wharf_host::redis_client::RedisTarget::parse(&redis.url)
            .unwrap()
            .connect(std::time::Duration::from_secs(5))
            .await
        else {
            return false;
        };
        let ready: redis::RedisResult<u64> = conn.zcard(&redis.keys.ready).await;
        let leased: redis::RedisResult<u64> = conn.zcard(&redis.keys.leases).await;
        sql_settled && ready == Ok(0) && leased == Ok(0)
    }

    /// Stop the store (SIGKILL; for a cluster, the node serving `work`'s slot) for `down`,
    /// calling `during` meanwhile, then start it again on its data.
    pub async fn restart_store(
        &mut self,
        down: std::time::Duration,
        mut during: impl AsyncFnMut(),
    ) {
        let redis = self
            .redis
            .as_mut()
            .expect("a backend that can be restarted");
        let node = match (&mut redis.node, &mut redis.cluster) {
            (Some(node), _) => node,
            (None, Some(cluster)) => {
                let owner = cluster.owner_of(&redis.keys.ready);
                &mut cluster.nodes[owner]
            }
            (None, None) => unreachable!("a Redis case has a node or a cluster"),
        };
        node.kill();
        let until = std::time::Instant::now() + down;
        while std::time::Instant::now() < until {
            during().await;
        }
        node.start();
        if let Some(cluster) = &redis.cluster {
            tokio::task::block_in_place(|| cluster.wait_healthy());
        }
    }
}
