//! The RabbitMQ harness: exchange and queue names of their own on the shared broker, or a
//! private node (its own port, name and data) for restarts. Counts that include
//! unacknowledged deliveries come from `rabbitmqctl`.

use lapin::options::QueuePurgeOptions;
use wharf_host::external::rabbitmq::{Names, RabbitSettings};
use wharf_tests::rabbit_node::RabbitNode;
use wharf_tests::{
    amqp_connect, amqp_delete, amqp_publish, amqp_url, rabbitmq_queue_counts, run_detached,
    unique_prefix,
};

use crate::Harness;

/// The queues the cases use (deleted from the shared broker afterwards).
const QUEUES: [&str; 2] = ["export_order", "stuck"];

pub struct RabbitHarness {
    url: String,
    prefix: String,
    node: Option<RabbitNode>,
}

impl RabbitHarness {
    fn names(&self, queue: &str) -> Names {
        RabbitSettings {
            exchange_prefix: self.prefix.clone(),
            queue_prefix: self.prefix.clone(),
            ..RabbitSettings::new(self.url.clone())
        }
        .names(queue)
    }

    async fn counts(&self, queue: &str) -> (u64, u64) {
        rabbitmq_queue_counts(self.node.as_ref().map(|n| n.node_name()), queue).await
    }
}

impl Harness for RabbitHarness {
    async fn shared() -> Self {
        RabbitHarness {
            url: amqp_url(),
            prefix: unique_prefix("conformance").replace(':', "."),
            node: None,
        }
    }

    async fn private() -> Self {
        let node = RabbitNode::start()
            .await
            .expect("a private RabbitMQ node starts");
        RabbitHarness {
            url: node.amqp_url(),
            prefix: "wharf-test.".to_string(),
            node: Some(node),
        }
    }

    fn section(&self) -> String {
        format!(
            "type = \"rabbitmq\"\nurl = \"{}\"\nexchange_prefix = \"{p}\"\nqueue_prefix = \"{p}\"\n",
            self.url,
            p = self.prefix
        )
    }

    async fn produce_direct(&self, queue: &str, body: &[u8]) {
        amqp_publish(&self.url, &self.names(queue).exchange, "", body).await;
    }

    async fn drop_notifications(&self, queue: &str) {
        let conn = amqp_connect(&self.url).await;
        let channel = conn.create_channel().await.unwrap();
        channel
            .queue_purge(&self.names(queue).readiness, QueuePurgeOptions::default())
            .await
            .unwrap();
        let _ = conn.close(200, "purged").await;
    }

    async fn unacknowledged_notifications(&self, queue: &str) -> u64 {
        self.counts(&self.names(queue).readiness).await.0
    }

    async fn remaining(&self, queue: &str) -> u64 {
        self.counts(&self.names(queue).processing).await.0
    }

    async fn in_flight(&self, queue: &str) -> u64 {
        self.counts(&self.names(queue).processing).await.1
    }

    async fn stop(&mut self) {
        self.node
            .as_ref()
            .expect("a private node")
            .stop_app()
            .await
            .unwrap();
    }

    async fn start(&mut self) {
        self.node
            .as_mut()
            .expect("a private node")
            .start_app()
            .await
            .unwrap();
    }
}

impl Drop for RabbitHarness {
    fn drop(&mut self) {
        if self.node.is_some() {
            return; // its data goes with the node
        }
        let url = self.url.clone();
        let names: Vec<Names> = QUEUES.iter().map(|q| self.names(q)).collect();
        let queues = names
            .iter()
            .flat_map(|n| [n.processing.clone(), n.readiness.clone()])
            .collect::<Vec<_>>();
        let exchanges = names.into_iter().map(|n| n.exchange).collect::<Vec<_>>();
        run_detached(async move { amqp_delete(&url, &queues, &exchanges).await });
    }
}
