//! The Redis harnesses: a key prefix of its own on the shared server, or a private
//! `redis-server` (append-only file, so a restart keeps the data) for restarts; and a private
//! three-master Redis Cluster, where a direct producer runs the documented script with
//! `redis-cli -c` (following the slot's redirect like any cluster client).

use std::time::Duration;

use redis::aio::ConnectionLike;
use wharf_host::external::redis::{DIRECT_PRODUCER, Keys};
use wharf_tests::redis_nodes::{RedisCluster, RedisNode};
use wharf_tests::{redis_url, unique_prefix, wait_for};

use crate::Harness;

/// Which Redis a harness runs on.
enum Backing {
    Shared,
    Node(RedisNode),
    Cluster(RedisCluster),
}

/// A Redis provider on one server, or (`CLUSTER`) on a Redis Cluster of its own.
pub struct RedisHarness<const CLUSTER: bool = false> {
    url: String,
    prefix: String,
    backing: Backing,
}

/// A Redis provider on a private three-master Redis Cluster.
pub type RedisClusterHarness = RedisHarness<true>;

impl<const CLUSTER: bool> RedisHarness<CLUSTER> {
    async fn conn(&self) -> impl ConnectionLike + Send {
        wharf_host::redis_client::RedisTarget::parse(&self.url)
            .unwrap()
            .connect(Duration::from_secs(5))
            .await
            .unwrap()
    }

    fn on(backing: Backing) -> Self {
        let url = match &backing {
            Backing::Shared => redis_url(),
            Backing::Node(node) => node.url(),
            Backing::Cluster(cluster) => cluster.url(),
        };
        RedisHarness {
            url,
            prefix: unique_prefix("conformance"),
            backing,
        }
    }

    /// Wait until a client gets answers.
    async fn answering(self) -> Self {
        wait_for(Duration::from_secs(10), "Redis to answer", || async {
            let target = wharf_host::redis_client::RedisTarget::parse(&self.url).ok()?;
            let mut conn = target.connect(Duration::from_secs(1)).await.ok()?;
            let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
            pong.ok()
        })
        .await;
        self
    }
}

impl<const CLUSTER: bool> Harness for RedisHarness<CLUSTER> {
    async fn shared() -> Self {
        if CLUSTER {
            return Self::private().await;
        }
        RedisHarness::on(Backing::Shared)
    }

    async fn private() -> Self {
        let backing = if CLUSTER {
            Backing::Cluster(tokio::task::block_in_place(|| RedisCluster::start(3)))
        } else {
            Backing::Node(RedisNode::standalone())
        };
        RedisHarness::on(backing).answering().await
    }

    fn section(&self) -> String {
        format!(
            "type = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"\npromote_interval = \"100ms\"\n",
            self.url, self.prefix
        )
    }

    async fn produce_direct(&self, queue: &str, body: &[u8]) {
        let keys = Keys::new(&self.prefix, queue);
        if let Backing::Cluster(cluster) = &self.backing
            && !body.contains(&0)
        {
            // The documented script as a cluster client runs it: `EVAL` with both keys,
            // sent to any node and redirected to the one serving their slot.
            use std::os::unix::ffi::OsStrExt;
            let out = std::process::Command::new("redis-cli")
                .args(["-c", "-p", &cluster.nodes[0].port.to_string()])
                .args([
                    "EVAL",
                    DIRECT_PRODUCER,
                    "2",
                    &keys.ready,
                    &keys.readiness,
                    "0",
                ])
                .arg(std::ffi::OsStr::from_bytes(body))
                .arg(queue)
                .output()
                .expect("redis-cli runs");
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && said.trim() == "1",
                "redis-cli EVAL: {said}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        let done: i64 = redis::Script::new(DIRECT_PRODUCER)
            .key(&keys.ready)
            .key(&keys.readiness)
            .arg(0)
            .arg(body)
            .arg(queue)
            .invoke_async(&mut self.conn().await)
            .await
            .unwrap();
        assert_eq!(done, 1);
    }

    async fn drop_notifications(&self, queue: &str) {
        let keys = Keys::new(&self.prefix, queue);
        let _: () = redis::cmd("DEL")
            .arg(&keys.readiness)
            .query_async(&mut self.conn().await)
            .await
            .unwrap();
    }

    async fn unacknowledged_notifications(&self, queue: &str) -> u64 {
        let keys = Keys::new(&self.prefix, queue);
        // Unread records plus records read and not acknowledged (acknowledged ones are deleted).
        redis::cmd("XLEN")
            .arg(&keys.readiness)
            .query_async(&mut self.conn().await)
            .await
            .unwrap()
    }

    async fn remaining(&self, queue: &str) -> u64 {
        let keys = Keys::new(&self.prefix, queue);
        let (ready, delayed, leased): (u64, u64, u64) = redis::pipe()
            .zcard(&keys.ready)
            .zcard(&keys.delayed)
            .zcard(&keys.leases)
            .query_async(&mut self.conn().await)
            .await
            .unwrap();
        ready + delayed + leased
    }

    async fn in_flight(&self, queue: &str) -> u64 {
        let keys = Keys::new(&self.prefix, queue);
        redis::cmd("ZCOUNT")
            .arg(&keys.leases)
            .arg(wharf_host::queue::now_ms())
            .arg("+inf")
            .query_async(&mut self.conn().await)
            .await
            .unwrap()
    }

    async fn stop(&mut self) {
        match &mut self.backing {
            Backing::Node(node) => node.kill(),
            Backing::Cluster(cluster) => cluster.nodes.iter_mut().for_each(RedisNode::kill),
            Backing::Shared => panic!("the shared server is not stopped"),
        }
    }

    async fn start(&mut self) {
        match &mut self.backing {
            Backing::Node(node) => node.start(),
            Backing::Cluster(cluster) => {
                cluster.nodes.iter_mut().for_each(RedisNode::start);
                tokio::task::block_in_place(|| cluster.wait_healthy());
            }
            Backing::Shared => panic!("the shared server is not started"),
        }
    }
}
