//! RabbitMQ faults: a lost processing connection, a silent network cut, a broker restart
//! mid-load, `wharf run` killed mid-load.

use super::*;

/// The broker's ids of the connections named `name`.
async fn connections_named(name: &str) -> Vec<String> {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .await
        .expect("rabbitmqctl runs");
    let wanted = format!("{{\"connection_name\",\"{name}\"}}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.contains(&wanted))
        .filter_map(|line| line.split('\t').next().map(str::to_string))
        .collect()
}

/// Publish one message (`n` = 1) to `export_order` on the shared broker and wait for its
/// single reply: the host processes again.
async fn publish_one_and_see_it_processed(host: &RunningHost, prefix: &str) {
    let body = Envelope::new(json!({"reply_to": "replies", "n": 1}).to_string(), None, 0);
    amqp_publish(
        &amqp_url(),
        &names(prefix, "export_order").exchange,
        "",
        body.to_json().as_bytes(),
    )
    .await;
    wait_for(T, "the reply", || async {
        (seen(host).await.get(&1) == Some(&1)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_processing_connection_turns_health_red_and_reconnects_while_idle() {
    let scope = Scope::new();
    let prefix = scope.prefix.clone();
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&config(&amqp_url(), &prefix, "")).await;
    let name = "wharf rmq export_order";
    let before = wait_for(T, "the processing connection", || async {
        let found = connections_named(name).await;
        (found.len() == 1 && readiness(&host, "rmq").await).then_some(found)
    })
    .await;
    // Watch the health check from now on: it must go red at least once.
    let went_red = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (health, went_red) = (host.health.clone(), went_red.clone());
        tokio::spawn(async move {
            loop {
                let (_, checks) = health.report().await;
                if !checks["external_queue_readiness_rmq"].healthy {
                    went_red.store(true, std::sync::atomic::Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let closed = tokio::process::Command::new("rabbitmqctl")
        .args(["close_connection", &before[0], "test: connection lost"])
        .status()
        .await
        .unwrap();
    assert!(closed.success());
    // Nothing is published: the idle queue reconnects by itself.
    wait_for(T, "a new processing connection", || async {
        let now = connections_named(name).await;
        (now.len() == 1 && now != before).then_some(())
    })
    .await;
    wait_for(T, "the health check to have gone red", || async {
        went_red
            .load(std::sync::atomic::Ordering::SeqCst)
            .then_some(())
    })
    .await;
    watcher.abort();
    wait_for(T, "the health check to be green again", || async {
        readiness(&host, "rmq").await.then_some(())
    })
    .await;
    publish_one_and_see_it_processed(&host, &prefix).await;
    host.shutdown().await;
}

/// A silent network cut (connections stay open, nothing gets through) is noticed by the AMQP
/// heartbeat: health turns red once the broker has been silent for twice the heartbeat (the
/// broker's own 60 s would take two minutes), and green again once traffic flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_network_cut_turns_health_red_through_the_heartbeat() {
    let scope = Scope::new();
    let prefix = scope.prefix.clone();
    let broker: lapin::uri::AMQPUri = amqp_url().parse().unwrap();
    let proxy = wharf_tests::proxy::TcpProxy::start(broker.authority.port).await;
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port());
    let config = config(&url, &prefix, "").replace(
        "type = \"rabbitmq\"\n",
        "type = \"rabbitmq\"\nheartbeat = \"1s\"\n",
    );
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&config).await;
    wait_for(T, "the provider to be ready", || async {
        readiness(&host, "rmq").await.then_some(())
    })
    .await;
    proxy.hold(true);
    wait_for(
        Duration::from_secs(20),
        "the health check to turn red",
        || async { (!readiness(&host, "rmq").await).then_some(()) },
    )
    .await;
    proxy.hold(false);
    wait_for(T, "the health check to be green again", || async {
        readiness(&host, "rmq").await.then_some(())
    })
    .await;
    publish_one_and_see_it_processed(&host, &prefix).await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_load_loses_nothing_and_the_inbox_skips_redeliveries() {
    let mut node = RabbitNode::start().await.expect("a private node");
    let scope = Scope::new();
    let prefix = scope.prefix.clone();
    let dir = TestDir::new();
    // No handler yet: everything is published before processing starts.
    let host = dir
        .start(&config(
            &node.amqp_url(),
            &prefix,
            "concurrency = 8\ninbox = { store = \"sql\" }",
        ))
        .await;
    wait_for(T, "the readiness consumer", || async {
        readiness(&host, "rmq").await.then_some(())
    })
    .await;
    const N: i64 = 2000;
    let envelopes: Vec<Envelope> = (0..N)
        .map(|n| {
            let payload = json!({"reply_to": "replies", "n": n, "sleep_ms": 10});
            Envelope::new(payload.to_string(), Some(format!("order-{n}")), 0)
        })
        .collect();
    let providers = wharf_host::external::Providers::open(
        &wharf_host::Config::load(&dir.path("wharf.toml")).unwrap(),
    )
    .await
    .unwrap();
    providers
        .get("rmq")
        .unwrap()
        .publish("export_order", &envelopes, Default::default())
        .await
        .unwrap();
    dir.deploy("flaky", "flaky");
    wait_for(T, "some progress", || async {
        (seen(&host).await.len() >= 100).then_some(())
    })
    .await;
    node.stop_app().await.unwrap();
    let done_at_stop = seen(&host).await.len();
    assert!(
        done_at_stop < N as usize,
        "restarted too late to prove anything"
    );
    wait_for(T, "the readiness check to turn unhealthy", || async {
        (!readiness(&host, "rmq").await).then_some(())
    })
    .await;
    node.start_app().await.unwrap();
    wait_for(T, "the readiness check to turn healthy again", || async {
        readiness(&host, "rmq").await.then_some(())
    })
    .await;
    let seen = wait_for(T, "every message", || async {
        let seen = seen(&host).await;
        (seen.len() == N as usize).then_some(seen)
    })
    .await;
    let twice: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        twice.is_empty(),
        "with the inbox, a redelivered message that already succeeded is skipped: {twice:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_wharf_run_mid_load_loses_nothing() {
    let scope = Scope::new();
    let prefix = scope.prefix.clone();
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\n[storage]\nurl = \"sqlite://wharf.db\"\npoll_interval = \"100ms\"\n{}",
        config(
            &amqp_url(),
            &prefix,
            "concurrency = 8\nlease = \"5s\"\ntimeout = \"2s\""
        )
    );
    std::fs::write(dir.path("wharf.toml"), &text).unwrap();
    // The topology exists before anything is published (a host declares it at start).
    let providers = wharf_host::external::Providers::open(
        &wharf_host::Config::load(&dir.path("wharf.toml")).unwrap(),
    )
    .await
    .unwrap();
    let provider = providers.get("rmq").unwrap().clone();
    provider
        .prepare(&["export_order".to_string()])
        .await
        .unwrap();
    const N: usize = 3000;
    let envelopes: Vec<Envelope> = (0..N)
        .map(|n| {
            Envelope::new(
                json!({"reply_to": "replies", "n": n, "sleep_ms": 1}).to_string(),
                None,
                0,
            )
        })
        .collect();
    provider
        .publish("export_order", &envelopes, Default::default())
        .await
        .unwrap();
    let store = dir.sqlite_store().await;
    let seen = || async {
        let all = store
            .list(&wharf_host::queue::MessageFilter {
                queue: Some("replies".into()),
                status: None,
                limit: 1_000_000,
                ..Default::default()
            })
            .await
            .unwrap_or_default();
        let mut counts = vec![0usize; N];
        for m in all {
            let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
            counts[v["seen"]["n"].as_u64().unwrap() as usize] += 1;
        }
        counts
    };
    let mut first = spawn_wharf(dir.dir.path());
    wait_for(T, "200 messages before the kill", || async {
        let done = seen().await.iter().filter(|c| **c > 0).count();
        (done >= 200).then_some(())
    })
    .await;
    first.kill(); // SIGKILL
    assert!(
        seen().await.contains(&0),
        "killed too late to prove anything"
    );
    let mut second = spawn_wharf(dir.dir.path());
    wait_for(
        Duration::from_secs(120),
        "every message after the restart",
        || async { seen().await.iter().all(|c| *c > 0).then_some(()) },
    )
    .await;
    second.terminate();
}
