//! Private Redis servers for tests that stop and start them: one server ([`RedisNode`]) or
//! a Redis Cluster of several masters ([`RedisCluster`]), each node on free ports with an
//! append-only file synced on every write, so a restart keeps every acknowledged write. A
//! cluster can sit behind proxies the test controls: each node announces its proxy's port,
//! so cluster clients (and redirects) only ever reach the nodes through them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;
use crate::proxy::TcpProxy;

/// One `redis-server` of its own.
pub struct RedisNode {
    /// Its client port.
    pub port: u16,
    /// Its cluster bus port, when it is a cluster node.
    bus_port: Option<u16>,
    /// The client port it announces to the cluster (its proxy's), when not its own.
    announced: Option<u16>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisNode {
    /// A standalone server, started.
    pub fn standalone() -> RedisNode {
        Self::new(free_port(), None, None)
    }

    fn new(port: u16, bus_port: Option<u16>, announced: Option<u16>) -> RedisNode {
        let mut node = RedisNode {
            port,
            bus_port,
            announced,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        node.start();
        node
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its `host:port`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Start it (again, with its data), and wait until it accepts connections.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "the node runs already");
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
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
            .stdout(Stdio::null());
        if let Some(bus) = self.bus_port {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus.to_string(),
            ])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", "2000"]);
            if let Some(announced) = self.announced {
                cmd.args(["--cluster-announce-ip", "127.0.0.1"])
                    .args(["--cluster-announce-port", &announced.to_string()])
                    .args(["--cluster-announce-bus-port", &bus.to_string()]);
            }
        }
        self.child = Some(cmd.spawn().expect("redis-server starts (is it installed?)"));
        let addr: std::net::SocketAddr = self.addr().parse().unwrap();
        let started = Instant::now();
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server on {addr} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether it runs.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// `redis-cli -p PORT ARGS…` (with `-c`, following cluster redirects): its stdout, or a
    /// panic with its stderr.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-c", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of private master nodes on loopback (no replicas), its slots spread
/// evenly by `redis-cli --cluster create`.
pub struct RedisCluster {
    /// The nodes, in creation order.
    pub nodes: Vec<RedisNode>,
    /// The proxy in front of each node (same order), when behind proxies.
    pub proxies: Vec<TcpProxy>,
}

impl RedisCluster {
    /// Start `masters` nodes (at least 3) and join them into one cluster; returns once every
    /// node reports the cluster healthy.
    pub fn start(masters: usize) -> RedisCluster {
        let ports = (0..masters).map(|_| free_port()).collect();
        Self::create(ports, Vec::new())
    }

    /// [`RedisCluster::start`], each node behind a proxy of its own that it announces as
    /// its address.
    pub async fn start_behind_proxies(masters: usize) -> RedisCluster {
        let ports: Vec<u16> = (0..masters).map(|_| free_port()).collect();
        let mut proxies = Vec::new();
        for port in &ports {
            proxies.push(TcpProxy::start(*port).await);
        }
        tokio::task::block_in_place(|| Self::create(ports, proxies))
    }

    fn create(ports: Vec<u16>, proxies: Vec<TcpProxy>) -> RedisCluster {
        let nodes: Vec<RedisNode> = ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let announced = proxies.get(i).map(TcpProxy::port);
                RedisNode::new(*port, Some(free_port()), announced)
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(RedisNode::addr).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes, proxies };
        cluster.wait_healthy();
        cluster
    }

    /// The `redis+cluster://` URL listing every node (its proxy, when behind proxies).
    pub fn url(&self) -> String {
        let ports: Vec<u16> = match self.proxies.is_empty() {
            true => self.nodes.iter().map(|n| n.port).collect(),
            false => self.proxies.iter().map(TcpProxy::port).collect(),
        };
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", addrs.join(","))
    }

    /// Wait until every running node reports `cluster_state:ok` and agrees on the slots.
    pub fn wait_healthy(&self) {
        let started = Instant::now();
        loop {
            let healthy = self.nodes.iter().filter(|n| n.running()).all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
            if healthy {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the Redis Cluster did not become healthy"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The index of the node serving `key`'s slot.
    pub fn owner_of(&self, key: &str) -> usize {
        let any = self
            .nodes
            .iter()
            .find(|n| n.running())
            .expect("a running node");
        let slot: u16 = any
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .unwrap();
        let table = any.cli(&["CLUSTER", "NODES"]);
        for line in table.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(addr) = fields.get(1) else { continue };
            let port: u16 = addr
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .expect("a node address");
            let serves = fields.iter().skip(8).any(|range| {
                let mut ends = range.split('-').map(|s| s.parse::<u16>());
                match (ends.next(), ends.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                    (Some(Ok(a)), None) => a == slot,
                    _ => false,
                }
            });
            if serves {
                let by_node = self.nodes.iter().position(|n| n.port == port);
                let by_proxy = self.proxies.iter().position(|p| p.port() == port);
                return by_node.or(by_proxy).expect("a node of this cluster");
            }
        }
        panic!("no node serves slot {slot} of {key}");
    }
}
