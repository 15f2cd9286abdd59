//! What is particular to a Redis Cluster, end to end on a private three-master cluster: one
//! host serving queues whose slots live on different masters (a call may touch one slot
//! only, so each queue's readiness stream is read on a connection of its own). The
//! behaviour every provider shares runs on the cluster in the conformance suite
//! (`external_conformance`, `on_redis_cluster`), the inbox store contract in `inbox_store`,
//! and a master restarted mid-load in the fault matrix (`chaos`).

use std::time::Duration;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::external::redis::Keys;
use wharf_tests::redis_nodes::RedisCluster;
use wharf_tests::{TestDir, replies, unique_prefix, wait_for};

const T: Duration = Duration::from_secs(10);

/// Queue names under `prefix`, one per master of `cluster`.
fn one_queue_per_master(cluster: &RedisCluster, prefix: &str) -> Vec<String> {
    let mut by_master: Vec<Option<String>> = vec![None; cluster.nodes.len()];
    for n in 0.. {
        let name = format!("orders-{n}");
        let owner = cluster.owner_of(&Keys::new(prefix, &name).ready);
        by_master[owner].get_or_insert(name);
        if by_master.iter().all(Option::is_some) {
            return by_master.into_iter().flatten().collect();
        }
    }
    unreachable!()
}

/// Messages enqueued into every queue at once are all processed promptly, round after round:
/// the stream that answers first does not leave the others' notifications stranded (a read
/// cut short may take a record; the next read of this consumer's pending records hands it
/// out). Reconciliation and claiming are an hour away, so only the readiness bridge can
/// deliver these notifications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_on_every_master_are_served_by_one_host() {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3));
    let prefix = unique_prefix("cluster");
    let queues = one_queue_per_master(&cluster, &prefix);
    let mut config = format!(
        "[external]\nreconcile_interval = \"1h\"\n\n[providers.main]\ntype = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\nclaim_after = \"1h\"\n\n[queues.replies]\nhandler = \"not-deployed\"\n",
        cluster.url()
    );
    for queue in &queues {
        config.push_str(&format!(
            "\n[queues.{queue}]\nhandler = \"flaky\"\nstorage = \"external\"\nprovider = \"main\"\n"
        ));
    }
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&config).await;
    let mut expected = Vec::new();
    for round in 0..20 {
        for (i, queue) in queues.iter().enumerate() {
            let n = round * 10 + i as i64;
            host.router
                .enqueue(
                    queue,
                    wharf_tests::msg(json!({"reply_to": "replies", "n": n})),
                )
                .await
                .unwrap();
            expected.push(n);
        }
        expected.sort();
        wait_for(T, &format!("every reply of round {round}"), || async {
            (replies(&host).await == expected).then_some(())
        })
        .await;
    }
    host.shutdown().await;
}
