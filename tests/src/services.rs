//! The test services: the PostgreSQL database (a private schema per test), Redis and
//! RabbitMQ URLs, unique names, and plain AMQP clients for what a direct producer does.

use std::time::Instant;

use crate::run_detached;

/// The PostgreSQL server the tests use (`DATABASE_URL`, default: the local `test` database).
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A PostgreSQL schema of its own for one test, dropped when the guard is dropped.
pub struct PgSchema {
    /// The schema name.
    pub name: String,
}

impl PgSchema {
    /// A new, uniquely named schema (created by the store on open).
    pub fn new() -> Self {
        PgSchema {
            name: format!("wharf_t_{:016x}", rand_u64()),
        }
    }
}

impl Default for PgSchema {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let name = self.name.clone();
        run_detached(async move {
            use sqlx::Connection;
            if let Ok(mut conn) = sqlx::PgConnection::connect(&database_url()).await {
                let drop = format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
                let _ = sqlx::query(sqlx::AssertSqlSafe(drop))
                    .execute(&mut conn)
                    .await;
            }
        });
    }
}

/// A loopback port free at the moment of asking, picked at random in 10000..20000: below
/// Linux's ephemeral range (32768..60999), so that neither an outgoing connection nor a
/// listener bound to port 0 (a proxy, another test's server) takes it before the caller's
/// server binds it. The port is reserved (see [`reserve`]) for the rest of the process, so
/// no later pick of this test or of another test running beside it hands it out again
/// before the server the caller starts binds it.
pub fn free_port() -> u16 {
    free_port_in(10000..20000, |_| true).expect("a free port in 10000..20000")
}

/// A port of `range` that `ok` accepts, that is free on 127.0.0.1 now and that no test
/// process has reserved, picked at random and reserved; `None` after 200 tries.
pub fn free_port_in(range: std::ops::Range<u16>, ok: impl Fn(u16) -> bool) -> Option<u16> {
    let span = u64::from(range.end - range.start);
    for _ in 0..200 {
        let port = range.start + (rand_u64() % span) as u16;
        if ok(port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() && reserve(port) {
            return Some(port);
        }
    }
    None
}

/// Reserve `port` for this process until it ends: an exclusive `flock` on a file named after
/// the port in a folder every test process shares. A port is free when bound for a moment,
/// but stays free only until the server meant for it binds it, which can be seconds later
/// (a host started after the brokers of its case); without the reservation another pick in
/// that time, in this process or another, could hand out the same port. The lock goes away
/// with the process, so a killed test leaves nothing reserved. `false` when another process
/// (or an earlier pick of this one) holds it.
fn reserve(port: u16) -> bool {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("wharf-test-ports");
    let file = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
    });
    // A lock is per open file: a second open of the same file in this process is refused too.
    match file {
        Ok(file) if file.try_lock().is_ok() => {
            HELD.lock().unwrap_or_else(|e| e.into_inner()).push(file);
            true
        }
        _ => false,
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one((std::process::id(), Instant::now()))
}

/// The Redis server the tests use (`REDIS_URL`, default the local one).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// A key prefix of its own for one test.
pub fn unique_prefix(what: &str) -> String {
    format!("wharf-test:{what}:{:016x}:", rand_u64())
}

/// The RabbitMQ broker the tests use (`AMQP_URL`, default the local one).
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

/// A plain lapin connection on the tokio runtime (tests produce and inspect with it).
pub async fn amqp_connect(url: &str) -> lapin::Connection {
    let properties = lapin::ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    lapin::Connection::connect(url, properties)
        .await
        .unwrap_or_else(|e| panic!("connecting to RabbitMQ at {url}: {e}"))
}

/// (messages, unacknowledged) of a RabbitMQ queue as `rabbitmqctl` reports them (on `node`,
/// or the local broker); (0, 0) for a queue that does not exist.
pub async fn rabbitmq_queue_counts(node: Option<&str>, queue: &str) -> (u64, u64) {
    let mut cmd = tokio::process::Command::new("rabbitmqctl");
    if let Some(node) = node {
        cmd.args(["-n", node]);
    }
    let out = cmd
        .args([
            "-q",
            "list_queues",
            "name",
            "messages",
            "messages_unacknowledged",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("rabbitmqctl runs");
    assert!(
        out.status.success(),
        "rabbitmqctl list_queues: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let name = fields.next()?;
            let messages = fields.next()?.trim().parse().ok()?;
            let unacked = fields.next()?.trim().parse().ok()?;
            (name == queue).then_some((messages, unacked))
        })
        .next()
        .unwrap_or((0, 0))
}

/// Publish `body` to `exchange` with `routing_key` (persistent, confirmed) with a plain
/// client, as a direct producer would.
pub async fn amqp_publish(url: &str, exchange: &str, routing_key: &str, body: &[u8]) {
    let persistent = lapin::BasicProperties::default().with_delivery_mode(2);
    amqp_publish_with(url, exchange, routing_key, body, persistent).await;
}

/// [`amqp_publish`] with the given message properties.
pub async fn amqp_publish_with(
    url: &str,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: lapin::BasicProperties,
) {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    let conn = amqp_connect(url).await;
    let channel = conn.create_channel().await.expect("a channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm mode");
    let confirm = channel
        .basic_publish(
            exchange,
            routing_key,
            BasicPublishOptions::default(),
            body,
            properties,
        )
        .await
        .expect("published")
        .await
        .expect("confirmed");
    assert!(confirm.is_ack(), "the broker took the message");
    let _ = conn.close(200, "published").await;
}

/// Delete RabbitMQ queues and exchanges (test clean-up; what is missing is skipped).
pub async fn amqp_delete(url: &str, queues: &[String], exchanges: &[String]) {
    let conn = amqp_connect(url).await;
    for queue in queues {
        if let Ok(channel) = conn.create_channel().await {
            let _ = channel.queue_delete(queue, Default::default()).await;
        }
    }
    for exchange in exchanges {
        if let Ok(channel) = conn.create_channel().await {
            let _ = channel.exchange_delete(exchange, Default::default()).await;
        }
    }
    let _ = conn.close(200, "cleaned up").await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_picked_port_is_not_handed_out_again() {
        let port = free_port();
        assert!(!reserve(port), "port {port} was reserved a second time");
        assert_eq!(free_port_in(port..port + 1, |_| true), None);
    }
}
