//! The Redis harness: a key prefix of its own on the shared server, or a private
//! `redis-server` (append-only file, so a restart keeps the data) for restarts.

use std::time::Duration;

use wharf_host::external::redis::{DIRECT_PRODUCER, Keys};
use wharf_tests::{redis_url, unique_prefix, wait_for};

use crate::Harness;

pub struct RedisHarness {
    url: String,
    prefix: String,
    server: Option<PrivateRedis>,
}

impl RedisHarness {
    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Harness for RedisHarness {
    async fn shared() -> Self {
        RedisHarness {
            url: redis_url(),
            prefix: unique_prefix("conformance"),
            server: None,
        }
    }

    async fn private() -> Self {
        let server = PrivateRedis::start();
        let url = server.url();
        let h = RedisHarness {
            url,
            prefix: unique_prefix("conformance"),
            server: Some(server),
        };
        wait_for(
            Duration::from_secs(10),
            "the private Redis to answer",
            || async {
                let client = redis::Client::open(h.url.as_str()).ok()?;
                client.get_multiplexed_async_connection().await.ok()
            },
        )
        .await;
        h
    }

    fn section(&self) -> String {
        format!(
            "type = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"\npromote_interval = \"100ms\"\n",
            self.url, self.prefix
        )
    }

    async fn produce_direct(&self, queue: &str, body: &[u8]) {
        let keys = Keys::new(&self.prefix, queue);
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
        self.server.as_mut().expect("a private server").kill();
    }

    async fn start(&mut self) {
        self.server.as_mut().expect("a private server").spawn();
    }
}

/// A `redis-server` of its own on a free port, with an append-only file.
struct PrivateRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
}

impl PrivateRedis {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = PrivateRedis {
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        server.spawn();
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let addr: std::net::SocketAddr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
