//! Connections to Redis — one server or a Redis Cluster — shared by the Redis provider and
//! the Redis inbox store. A cluster is named by `redis+cluster://host:port,host:port,…`
//! (any reachable subset of its nodes: the rest is discovered, and the connection follows
//! slot moves and failovers); every other URL (`redis://`, `rediss://`, `unix://`) is one
//! server, reached through a reconnecting connection manager.
//!
//! On a cluster every command and every pipeline must touch keys of one slot: the callers
//! keep each queue's keys under one hash tag and never mix queues in one call.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value};

/// The scheme of a cluster URL.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// How long opening a connection to one node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long connecting to a cluster may take beyond one response timeout: reaching seed
/// nodes one after another and asking them for the slot map.
const CLUSTER_DISCOVERY: Duration = Duration::from_secs(10);

/// Where Redis is: one server, or the seed nodes of a cluster.
#[derive(Debug, Clone)]
pub enum RedisTarget {
    /// One server.
    Server(redis::Client),
    /// A cluster, by the `redis://` URLs of its seed nodes.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Parse `url`: `redis+cluster://[user:password@]host:port,host:port,…[/]` for a
    /// cluster, any URL the `redis` crate accepts for one server.
    pub fn parse(url: &str) -> Result<RedisTarget, RedisError> {
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            return redis::Client::open(url).map(RedisTarget::Server);
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (userinfo, hosts) = match rest.rsplit_once('@') {
            Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
            None => (String::new(), rest),
        };
        if hosts.contains(['/', '?', '#']) {
            return Err(invalid(
                "a cluster URL is `redis+cluster://host:port,host:port,…` without a path or options",
            ));
        }
        let mut nodes = Vec::new();
        for host in hosts.split(',').map(str::trim) {
            if host.is_empty() {
                return Err(invalid("a cluster URL lists an empty node"));
            }
            let node = format!("redis://{userinfo}{host}");
            node.as_str().into_connection_info()?;
            nodes.push(node);
        }
        Ok(RedisTarget::Cluster(nodes))
    }

    /// Whether this is a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
    }

    /// Open a connection whose commands give up after `response_timeout`. A server
    /// connection reconnects by itself; a cluster connection reconnects to each node and
    /// refreshes the slot map when the cluster changes.
    pub async fn connect(&self, response_timeout: Duration) -> Result<RedisConnection, RedisError> {
        match self {
            RedisTarget::Server(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(response_timeout))
                    .set_number_of_retries(2);
                ConnectionManager::new_with_config(client.clone(), config)
                    .await
                    .map(RedisConnection::Server)
            }
            RedisTarget::Cluster(nodes) => {
                let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(response_timeout)
                    // A failover takes a few seconds: retry through it, not for minutes.
                    .retries(6)
                    .max_retry_wait(1_000)
                    .build()?;
                // Each request of the slot discovery times out, but the discovery as a whole
                // has no deadline: bound it, so that a cluster that stalls there is an error
                // the caller retries, not a hang.
                let limit = CLUSTER_DISCOVERY + response_timeout;
                match tokio::time::timeout(limit, client.get_async_connection()).await {
                    Ok(connected) => connected.map(|c| RedisConnection::Cluster(Box::new(c))),
                    Err(_) => Err(RedisError::from((
                        ErrorKind::Io,
                        "no cluster node answered the slot discovery in time",
                        format!("{limit:?}"),
                    ))),
                }
            }
        }
    }
}

fn invalid(message: &'static str) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, message))
}

/// A connection to one server or to a cluster; cheap to clone (clones share the
/// underlying connections).
#[derive(Clone)]
pub enum RedisConnection {
    /// One server.
    Server(ConnectionManager),
    /// A cluster.
    Cluster(Box<ClusterConnection>),
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Server(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Server(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Server(c) => c.get_db(),
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_url_lists_its_seed_nodes() {
        let target =
            RedisTarget::parse("redis+cluster://u:p@127.0.0.1:7000, 127.0.0.1:7001/").unwrap();
        let RedisTarget::Cluster(nodes) = target else {
            panic!("a cluster")
        };
        assert_eq!(
            nodes,
            ["redis://u:p@127.0.0.1:7000", "redis://u:p@127.0.0.1:7001"]
        );
    }

    #[test]
    fn other_urls_are_one_server() {
        assert!(
            !RedisTarget::parse("redis://127.0.0.1:6379")
                .unwrap()
                .is_cluster()
        );
    }

    #[test]
    fn malformed_cluster_urls_are_refused() {
        for url in [
            "redis+cluster://",
            "redis+cluster://a:1,,b:2",
            "redis+cluster://a:1/0",
            "redis+cluster://a:1?protocol=3",
            "redis+cluster://a:notaport",
        ] {
            assert!(RedisTarget::parse(url).is_err(), "{url}");
        }
    }
}
