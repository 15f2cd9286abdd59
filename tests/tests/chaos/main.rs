//! The fault matrix: for each backend and fault, N messages through a counting guest (the
//! `flaky` fixture echoing each message's `n` into the SQL queue `replies` — a follow-up,
//! committed with the outcome of the run that sent it — or, in the `into_broker` rows, into
//! `replies` on a broker through the outbox, echoed once more from there into the SQL queue
//! `echoes`; in the `state` rows the `kv-state` fixture also increments a shared and a per-customer key-value counter
//! per message), while a `wharf run` process is crashed, stopped, or cut off from its store.
//! Each case reports lost messages (must be 0), duplicate follow-ups (must be 0 from a SQL
//! queue, and from a broker with the SQL inbox or with MessageIds), the time processing took
//! to resume once the fault ended, and whether `/readyz` went red during the fault and green
//! again.
//!
//! The `kills` rows strike five times: the follow-up column (every source, into SQL and into a
//! broker, with and without the inbox), and messages from Kafka and RabbitMQ changing
//! key-value state with the SQL inbox (the broker half of the state crash test in
//! `state_crash.rs`, with its message count).
//!
//! `cargo xtask test` runs the short form (few messages, 3 s cuts, 2,000 messages for the
//! state `kills` rows) without the `chaos_only` rows; `cargo xtask chaos` runs the long form
//! (`WHARF_CHAOS_MESSAGES`, `WHARF_CHAOS_CUT_SECS`, `WHARF_STATE_CRASH_MESSAGES`) and writes
//! every row to `WHARF_CHAOS_OUT` for the table in docs/guarantees.md.

mod backend;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use backend::{Backend, Setup, Shape};
use wharf_tests::{TestDir, WharfProcess, poll_until, spawn_wharf, wait_for};

/// What is done to the host or its connection to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL of the host mid-load; a new host starts at once.
    Kill,
    /// [`KILLS`] SIGKILLs of the host spread over the middle third of the load (each new
    /// host processing before it is killed).
    Kills,
    /// SIGTERM mid-load (graceful stop); a new host starts once it exited.
    Terminate,
    /// Every connection to the store closed at once (the host reconnects).
    CloseConnections,
    /// No traffic to the store for a while; connections stay open.
    CutNetwork,
    /// The store crashed (PostgreSQL: immediate shutdown; a broker: SIGKILL; on a cluster,
    /// the node serving the queue) and started again on its data after a while.
    RestartStore,
    /// The broker gone for a while — connections cut, new ones refused — and back with its
    /// data (for brokers that keep their data in memory and cannot be restarted).
    BrokerDown,
}

/// SIGKILLs in a [`Fault::Kills`] case.
const KILLS: u64 = 5;
const _: () = assert!(KILLS == 5, "the fault's name says five");

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL of the host",
            Fault::Kills => "5 SIGKILLs of the host",
            Fault::Terminate => "SIGTERM during load",
            Fault::CloseConnections => "store connections killed",
            Fault::CutNetwork => "network to the store cut",
            Fault::RestartStore => "store crashed and restarted",
            Fault::BrokerDown => "broker down (connections refused)",
        }
    }
}

/// The fault column of a row: the fault, and the message count when it is not the table's.
fn fault_name(fault: Fault, shape: Shape) -> String {
    match case_messages(fault, shape) {
        n if n == messages() => fault.name().to_string(),
        n => format!("{}, {n} messages", fault.name()),
    }
}

/// How many messages a case runs: [`crash_messages`] for repeated kills with key-value
/// state (the broker half of the state crash test), else [`messages`].
fn case_messages(fault: Fault, shape: Shape) -> u64 {
    match (fault, shape.state) {
        (Fault::Kills, true) => crash_messages(),
        _ => messages(),
    }
}

fn messages() -> u64 {
    std::env::var("WHARF_CHAOS_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Messages of a [`Fault::Kills`] case with key-value state: `WHARF_STATE_CRASH_MESSAGES` (2,000 by default; the
/// crash test of handler state reads it too).
fn crash_messages() -> u64 {
    std::env::var("WHARF_STATE_CRASH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn cut_for() -> Duration {
    Duration::from_secs(
        std::env::var("WHARF_CHAOS_CUT_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3),
    )
}

/// How long a case may take to finish after its fault, at least.
const SETTLE: Duration = Duration::from_secs(60);

/// How long a case of `total` messages may take for a step: [`SETTLE`], and 3 ms per
/// message beyond that (8 at a time, 10 ms each, with room to spare) for long forms.
fn settle_for(total: u64) -> Duration {
    SETTLE + Duration::from_millis(3 * total)
}

/// What `/readyz` of the host at `admin` answers: its body when 200, else the status and body or the error.
async fn readyz(admin: &str) -> Result<String, String> {
    let url = format!("http://{admin}/readyz");
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(1)))
            .build()
            .into();
        match agent.get(&url).call() {
            Ok(mut r) => {
                let status = r.status().as_u16();
                let body = r.body_mut().read_to_string().unwrap_or_default();
                if status == 200 {
                    Ok(body)
                } else {
                    Err(format!("{status}: {body}"))
                }
            }
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()))
}

/// Whether `/readyz` of the host at `admin` answers 200.
async fn ready(admin: &str) -> bool {
    readyz(admin).await.is_ok()
}

/// Wait until `/readyz` answers 200; on timeout, panic with its last answer and the end of
/// the host's log, so a host that never became ready says why.
async fn wait_ready(setup: &Setup, dir: &TestDir, timeout: Duration, what: &str) {
    let last = std::cell::RefCell::new(String::new());
    let answered = poll_until(timeout, || async {
        readyz(&setup.admin)
            .await
            .map_err(|e| *last.borrow_mut() = e)
            .ok()
    })
    .await;
    if answered.is_none() {
        panic!(
            "timed out after {timeout:?} waiting for {what}; /readyz: {}\nhost log (last 40 lines):\n{}",
            last.borrow(),
            host_log_tail(dir)
        );
    }
}

/// The last 40 lines of the host's log in `dir`.
fn host_log_tail(dir: &TestDir) -> String {
    let log = std::fs::read_to_string(dir.path("wharf.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// The replies so far: how many runs each `n` had.
async fn runs(setup: &Setup) -> BTreeMap<i64, u64> {
    let mut out = BTreeMap::new();
    for n in setup.replies().await {
        *out.entry(n).or_insert(0) += 1;
    }
    out
}

/// Run one case and report its row; panics when a message is lost or health stays red, or
/// when a follow-up exists twice where it must exist once (from a SQL queue; from a broker
/// with the SQL inbox or with MessageIds).
async fn case(backend: Backend, fault: Fault, shape: Shape) {
    wharf_tests::init_logging();
    let total = case_messages(fault, shape);
    let settle = settle_for(total);
    let dir = TestDir::new();
    dir.deploy("work", if shape.state { "kv_state" } else { "flaky" });
    let mut setup = Setup::new(backend, &dir, shape).await;
    let mut host = spawn_wharf(dir.dir.path());
    wait_ready(
        &setup,
        &dir,
        Duration::from_secs(60),
        "the host to become ready",
    )
    .await;
    setup.enqueue(&dir, total);

    // The fault strikes a third of the way through.
    wait_for(settle, "a third of the messages to run", || async {
        (runs(&setup).await.len() as u64 >= total / 3).then_some(())
    })
    .await;
    let mut went_red = false;
    match fault {
        Fault::Kill => {
            host.kill();
            host = spawn_wharf(dir.dir.path());
        }
        Fault::Kills => {
            for k in 1..=KILLS {
                host.kill();
                host = spawn_wharf(dir.dir.path());
                if k == KILLS {
                    break;
                }
                // The next kill once the new host has run its share of the middle third.
                let at = total / 3 + k * total / (3 * KILLS);
                wait_for(settle, "the restarted host to process", || async {
                    (runs(&setup).await.len() as u64 >= at).then_some(())
                })
                .await;
            }
        }
        Fault::Terminate => {
            tokio::task::block_in_place(|| host.terminate());
            host = spawn_wharf(dir.dir.path());
        }
        Fault::CloseConnections => setup.close_connections(),
        Fault::CutNetwork | Fault::BrokerDown => {
            let cut = fault == Fault::CutNetwork;
            setup.cut_off(cut, true);
            let until = Instant::now() + cut_for();
            while Instant::now() < until {
                went_red |= !ready(&setup.admin).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            setup.cut_off(cut, false);
        }
        Fault::RestartStore => {
            let admin = setup.admin.clone();
            setup
                .restart_store(cut_for(), async || {
                    went_red |= !ready(&admin).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                })
                .await;
        }
    }
    let healed = Instant::now();
    let before: u64 = runs(&setup).await.values().sum();
    wait_for(settle, "processing to resume after the fault", || async {
        let seen = runs(&setup).await;
        (seen.values().sum::<u64>() > before || seen.len() as u64 == total).then_some(())
    })
    .await;
    let recovered = healed.elapsed();
    let done = poll_until(settle, || async {
        let seen = runs(&setup).await;
        (seen.len() as u64 == total && setup.settled(total).await).then_some(seen)
    })
    .await;
    let Some(done) = done else {
        let ran = runs(&setup).await.len();
        let settled = setup.settled(total).await;
        panic!(
            "timed out after {settle:?} waiting for every message to run and settle: \
             {ran} of {total} ran, settled: {settled}\nhost log (last 40 lines):\n{}",
            host_log_tail(&dir)
        );
    };
    wait_ready(&setup, &dir, settle, "/readyz to be green again").await;
    drop::<WharfProcess>(host);

    let lost = (0..total as i64).filter(|n| !done.contains_key(n)).count();
    let duplicates: u64 = done.values().map(|runs| runs - 1).sum();
    report(
        backend, fault, shape, total, lost, duplicates, recovered, went_red,
    );
    assert_eq!(lost, 0, "messages lost");
    if matches!(backend, Backend::Sqlite | Backend::Postgres) {
        // A reply is the handler's follow-up, written with its message's settlement: a run
        // whose settlement did not commit left none.
        assert_eq!(
            duplicates, 0,
            "follow-ups from a SQL queue exist exactly once"
        );
    }
    if shape.inbox {
        // From a broker, the follow-ups commit with the inbox record before the
        // acknowledgement: a redelivery of a committed success is skipped.
        assert_eq!(
            duplicates, 0,
            "follow-ups with the SQL inbox exist exactly once"
        );
    }
    if shape.state {
        // Key-value changes commit with the outcome (and the inbox record or commit mark).
        assert_eq!(
            setup.counter("total").await,
            total,
            "the state counter counts each message once"
        );
        for c in 0..backend::CUSTOMERS {
            let expected = (0..total).filter(|n| n % backend::CUSTOMERS == c).count() as u64;
            let key = format!("customer-{c}");
            assert_eq!(setup.counter(&key).await, expected, "the counter {key}");
        }
    }
    if shape.ids {
        // Without the inbox, the commit mark of a delivery's MessageId: a redelivery of a
        // committed success runs again and commits nothing.
        assert_eq!(
            duplicates, 0,
            "follow-ups of messages with MessageIds exist exactly once"
        );
    }
}

/// Print the row, and append it to `WHARF_CHAOS_OUT` when set.
#[allow(clippy::too_many_arguments)]
fn report(
    backend: Backend,
    fault: Fault,
    shape: Shape,
    total: u64,
    lost: usize,
    duplicates: u64,
    recovered: Duration,
    went_red: bool,
) {
    let row = serde_json::json!({
        "backend": row_name(backend, shape),
        "fault": fault_name(fault, shape),
        "messages": total,
        "lost": lost,
        "duplicates": duplicates,
        "recovered_ms": recovered.as_millis() as u64,
        "health": if matches!(fault, Fault::CutNetwork | Fault::RestartStore | Fault::BrokerDown) {
            if went_red { "red, then green" } else { "stayed green" }
        } else {
            "green at the end"
        },
    });
    println!("chaos row: {row}");
    if let Ok(path) = std::env::var("WHARF_CHAOS_OUT") {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("the chaos output file");
        writeln!(file, "{row}").expect("writing a chaos row");
    }
}

/// The backend column of a row: the backend and what of [`Shape`] the case has.
fn row_name(backend: Backend, shape: Shape) -> String {
    let mut name = backend.name().to_string();
    if shape.inbox {
        name.push_str(", SQL inbox");
    } else if shape.ids {
        name.push_str(", MessageIds");
    }
    if shape.state {
        name.push_str(", key-value state");
    }
    if shape.into_broker {
        name.push_str(match backend {
            Backend::Sqlite | Backend::Postgres => " → Redis",
            _ => " → same broker",
        });
    }
    name
}

/// Whether this is `cargo xtask chaos` (the long form), which sets `WHARF_CHAOS_OUT`: the
/// `chaos_only` rows run only there.
fn long_form() -> bool {
    std::env::var_os("WHARF_CHAOS_OUT").is_some()
}

macro_rules! matrix {
    ($($name:ident: $backend:expr, $fault:expr $(, $option:ident)*;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                #[allow(unused_mut)]
                let mut shape = Shape::default();
                $(shape.$option = true;)*
                if shape.chaos_only && !long_form() {
                    println!("a row of `cargo xtask chaos` only");
                    return;
                }
                case($backend, $fault, shape).await;
            }
        )*
    };
}

matrix! {
    sqlite_kill: Backend::Sqlite, Fault::Kill;
    sqlite_terminate: Backend::Sqlite, Fault::Terminate;
    postgres_kill: Backend::Postgres, Fault::Kill;
    postgres_terminate: Backend::Postgres, Fault::Terminate;
    postgres_connections_killed: Backend::Postgres, Fault::CloseConnections;
    postgres_network_cut: Backend::Postgres, Fault::CutNetwork;
    postgres_restarted: Backend::Postgres, Fault::RestartStore;
    redis_kill: Backend::Redis, Fault::Kill;
    redis_terminate: Backend::Redis, Fault::Terminate;
    redis_connections_killed: Backend::Redis, Fault::CloseConnections;
    redis_network_cut: Backend::Redis, Fault::CutNetwork;
    redis_store_restarted: Backend::Redis, Fault::RestartStore;
    redis_cluster_kill: Backend::RedisCluster, Fault::Kill;
    redis_cluster_terminate: Backend::RedisCluster, Fault::Terminate;
    redis_cluster_connections_killed: Backend::RedisCluster, Fault::CloseConnections;
    redis_cluster_network_cut: Backend::RedisCluster, Fault::CutNetwork;
    redis_cluster_node_restarted: Backend::RedisCluster, Fault::RestartStore;
    rabbitmq_kill: Backend::RabbitMq, Fault::Kill;
    rabbitmq_terminate: Backend::RabbitMq, Fault::Terminate;
    rabbitmq_connections_killed: Backend::RabbitMq, Fault::CloseConnections;
    rabbitmq_network_cut: Backend::RabbitMq, Fault::CutNetwork;
    rabbitmq_broker_restarted: Backend::RabbitMq, Fault::RestartStore;
    kafka_kill: Backend::Kafka, Fault::Kill;
    kafka_terminate: Backend::Kafka, Fault::Terminate;
    kafka_connections_killed: Backend::Kafka, Fault::CloseConnections;
    kafka_network_cut: Backend::Kafka, Fault::CutNetwork;
    kafka_broker_down: Backend::Kafka, Fault::BrokerDown;
    servicebus_kill: Backend::ServiceBus, Fault::Kill;
    servicebus_terminate: Backend::ServiceBus, Fault::Terminate;
    servicebus_connections_killed: Backend::ServiceBus, Fault::CloseConnections;
    servicebus_network_cut: Backend::ServiceBus, Fault::CutNetwork;
    servicebus_broker_down: Backend::ServiceBus, Fault::BrokerDown;
    redis_kill_inbox: Backend::Redis, Fault::Kill, inbox;
    rabbitmq_kill_inbox: Backend::RabbitMq, Fault::Kill, inbox;
    rabbitmq_broker_restarted_inbox: Backend::RabbitMq, Fault::RestartStore, inbox;
    kafka_kill_inbox: Backend::Kafka, Fault::Kill, inbox;
    kafka_broker_down_inbox: Backend::Kafka, Fault::BrokerDown, inbox;
    servicebus_kill_inbox: Backend::ServiceBus, Fault::Kill, inbox;
    rabbitmq_kill_ids: Backend::RabbitMq, Fault::Kill, ids;
    kafka_kill_ids: Backend::Kafka, Fault::Kill, ids;
    sqlite_kill_into_broker: Backend::Sqlite, Fault::Kill, into_broker;
    postgres_kill_into_broker: Backend::Postgres, Fault::Kill, into_broker;
    redis_kill_inbox_into_broker: Backend::Redis, Fault::Kill, inbox, into_broker;
    rabbitmq_kill_inbox_into_broker: Backend::RabbitMq, Fault::Kill, inbox, into_broker;
    kafka_kill_inbox_into_broker: Backend::Kafka, Fault::Kill, inbox, into_broker;
    servicebus_kill_inbox_into_broker: Backend::ServiceBus, Fault::Kill, inbox, into_broker;
    redis_kill_into_broker: Backend::Redis, Fault::Kill, into_broker;
    sqlite_kill_state: Backend::Sqlite, Fault::Kill, state;
    postgres_kill_state: Backend::Postgres, Fault::Kill, state;
    kafka_kill_inbox_state: Backend::Kafka, Fault::Kill, inbox, state;
    rabbitmq_kill_inbox_state: Backend::RabbitMq, Fault::Kill, inbox, state;
    rabbitmq_kill_ids_state: Backend::RabbitMq, Fault::Kill, ids, state;
    kafka_kills_inbox_state: Backend::Kafka, Fault::Kills, inbox, state;
    rabbitmq_kills_inbox_state: Backend::RabbitMq, Fault::Kills, inbox, state;
    // The follow-up column: five kills, into a SQL target and into a broker target, from
    // each source — with the SQL inbox from a broker (exactly once), and without it
    // (duplicates counted). `cargo xtask test` runs the SQL sources and Kafka with the inbox.
    sqlite_kills: Backend::Sqlite, Fault::Kills;
    postgres_kills: Backend::Postgres, Fault::Kills;
    kafka_kills_inbox: Backend::Kafka, Fault::Kills, inbox;
    redis_kills_inbox: Backend::Redis, Fault::Kills, inbox, chaos_only;
    rabbitmq_kills_inbox: Backend::RabbitMq, Fault::Kills, inbox, chaos_only;
    servicebus_kills_inbox: Backend::ServiceBus, Fault::Kills, inbox, chaos_only;
    redis_kills: Backend::Redis, Fault::Kills, chaos_only;
    rabbitmq_kills: Backend::RabbitMq, Fault::Kills, chaos_only;
    kafka_kills: Backend::Kafka, Fault::Kills, chaos_only;
    servicebus_kills: Backend::ServiceBus, Fault::Kills, chaos_only;
    sqlite_kills_into_broker: Backend::Sqlite, Fault::Kills, into_broker, chaos_only;
    postgres_kills_into_broker: Backend::Postgres, Fault::Kills, into_broker, chaos_only;
    redis_kills_inbox_into_broker: Backend::Redis, Fault::Kills, inbox, into_broker, chaos_only;
    rabbitmq_kills_inbox_into_broker: Backend::RabbitMq, Fault::Kills, inbox, into_broker, chaos_only;
    kafka_kills_inbox_into_broker: Backend::Kafka, Fault::Kills, inbox, into_broker, chaos_only;
    servicebus_kills_inbox_into_broker: Backend::ServiceBus, Fault::Kills, inbox, into_broker, chaos_only;
}
