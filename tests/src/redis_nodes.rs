//! Private Redis servers for tests that stop and start them: one server ([`RedisNode`]) or
//! a Redis Cluster of several masters ([`RedisCluster`]), each node on free ports with an
//! append-only file synced on every write, so a restart keeps every acknowledged write. A
//! cluster can sit behind proxies the test controls: each node announces its proxy's port,
//! so cluster clients (and redirects) only ever reach the nodes through them.

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;
use crate::proxy::TcpProxy;
use wait_timeout::ChildExt as _;

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
        Self::new(false, None)
    }

    /// A server on a port picked free (a cluster node, with a bus port picked free too, when
    /// `cluster`), started; the ports are picked again when another server took them first.
    fn new(cluster: bool, announced: Option<u16>) -> RedisNode {
        let mut last = String::new();
        for _ in 0..5 {
            let mut node = RedisNode {
                port: free_port(),
                bus_port: cluster.then(free_port),
                announced,
                dir: tempfile::tempdir().unwrap(),
                child: None,
            };
            match node.try_start() {
                Ok(()) => return node,
                Err(why) => last = format!("on port {}: {why}", node.port),
            }
        }
        panic!("no redis-server of this test's own started in 5 tries; the last {last}");
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
        if let Err(why) = self.try_start() {
            panic!("redis-server on port {} did not start: {why}", self.port);
        }
    }

    /// Start it and wait until it answers on its port; an error when it exits first or when
    /// the server answering there is another one (whose port it then could not bind).
    fn try_start(&mut self) -> Result<(), String> {
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
        let child = cmd.spawn().expect("redis-server starts (is it installed?)");
        let pid = child.id();
        self.child = Some(child);
        let started = Instant::now();
        let answered = loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                break Err(format!("it exited ({status}): a port was taken"));
            }
            // The server that answers is ours only if it names our child's pid (a server
            // that lost the port to another one exits, but may answer briefly before).
            let info = run_bounded(
                Command::new("redis-cli").args(["-p", &self.port.to_string(), "INFO", "server"]),
                Duration::from_secs(5),
            );
            match info {
                Ok(out) if String::from_utf8_lossy(&out.stdout).contains("process_id:") => {
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    match text.contains(&format!("process_id:{pid}\r")) {
                        true => break Ok(()),
                        false => break Err("another server answers on its port".to_string()),
                    }
                }
                _ if started.elapsed() > Duration::from_secs(10) => {
                    break Err("it did not answer within 10 s".to_string());
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        if answered.is_err() {
            self.kill();
        }
        answered
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
        let out = run_bounded(
            Command::new("redis-cli")
                .args(["-c", "-p", &self.port.to_string()])
                .args(args),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("redis-cli {args:?} on port {}: {e}", self.port));
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
        Self::create(masters, Vec::new())
    }

    /// [`RedisCluster::start`], each node behind a proxy of its own that it announces as
    /// its address.
    pub async fn start_behind_proxies(masters: usize) -> RedisCluster {
        let mut proxies = Vec::new();
        for _ in 0..masters {
            // Pointed at its node once the node runs on ports of its own.
            proxies.push(TcpProxy::start(0).await);
        }
        tokio::task::block_in_place(|| Self::create(masters, proxies))
    }

    fn create(masters: usize, proxies: Vec<TcpProxy>) -> RedisCluster {
        let nodes: Vec<RedisNode> = (0..masters)
            .map(|i| {
                let proxy = proxies.get(i);
                let node = RedisNode::new(true, proxy.map(TcpProxy::port));
                if let Some(proxy) = proxy {
                    proxy.set_target(node.port);
                }
                node
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(RedisNode::addr).collect();
        // It waits for the nodes to agree with no deadline of its own.
        let out = run_bounded(
            Command::new("redis-cli")
                .args(["--cluster", "create"])
                .args(&addrs)
                .args(["--cluster-replicas", "0", "--cluster-yes"]),
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("redis-cli --cluster create {addrs:?}: {e}"));
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

/// Run `cmd` to its end with its output captured; an error (once it is killed) when it runs
/// longer than `limit`, with what it printed — `redis-cli` waits on a server that does not
/// answer, and `--cluster create` on nodes that do not agree, for ever.
fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("it did not start: {e}"))?;
    let stdout = collect(child.stdout.take().expect("piped stdout"));
    let stderr = collect(child.stderr.take().expect("piped stderr"));
    let status = child.wait_timeout(limit).map_err(|e| e.to_string())?;
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(format!(
            "it did not end within {limit:?}; it printed: {}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        )),
    }
}

/// Read `pipe` to its end on a thread of its own.
fn collect(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}
