//! The Kafka harness: topics and groups of their own on the shared broker, or a private
//! broker for restarts (in memory: a restart loses topics and offsets, so `start` creates
//! the topics again, as a broker that kept its definitions would have them). What is still
//! in the broker is the lag of the processing group; what a consumer holds is the fetched
//! but uncommitted part while the group has members.

use wharf_host::external::kafka::KafkaSettings;
use wharf_tests::kafka::{
    KafkaNode, TEST_PROPERTIES, kafka_brokers, kafka_committed, kafka_lag, kafka_members,
    kafka_produce, kafka_skip_to_end,
};
use wharf_tests::unique_prefix;

use crate::{Harness, open};

pub struct KafkaHarness {
    brokers: String,
    prefix: String,
    node: Option<KafkaNode>,
}

impl KafkaHarness {
    fn settings(&self) -> KafkaSettings {
        let mut s = KafkaSettings::new(self.brokers.clone());
        s.topic_prefix = self.prefix.clone();
        s.processing_group = format!("{}processing", self.prefix);
        s.readiness_group = format!("{}readiness", self.prefix);
        s
    }

    async fn blocking<T: Send + 'static>(&self, work: impl FnOnce(String, KafkaSettings) -> T + Send + 'static) -> T {
        let (brokers, settings) = (self.brokers.clone(), self.settings());
        tokio::task::spawn_blocking(move || work(brokers, settings))
            .await
            .unwrap()
    }
}

impl Harness for KafkaHarness {
    async fn shared() -> Self {
        KafkaHarness {
            brokers: kafka_brokers(),
            prefix: unique_prefix("conformance").replace(':', "."),
            node: None,
        }
    }

    async fn private() -> Self {
        let node = KafkaNode::start().await;
        KafkaHarness {
            brokers: node.brokers(),
            prefix: "wharf-test.".to_string(),
            node: Some(node),
        }
    }

    fn section(&self) -> String {
        let s = self.settings();
        format!(
            "type = \"kafka\"\nbrokers = \"{}\"\ntopic_prefix = \"{}\"\nprocessing_group = \"{}\"\nreadiness_group = \"{}\"\npartitions = 2\n[providers.main.properties]\n{TEST_PROPERTIES}",
            self.brokers, s.topic_prefix, s.processing_group, s.readiness_group
        )
    }

    async fn produce_direct(&self, queue: &str, body: &[u8]) {
        kafka_produce(&self.brokers, &self.settings().topic(queue), None, body).await;
    }

    async fn drop_notifications(&self, queue: &str) {
        let queue = queue.to_string();
        self.blocking(move |b, s| kafka_skip_to_end(&b, &s.readiness_group, &s.topic(&queue)))
            .await;
    }

    async fn unacknowledged_notifications(&self, queue: &str) -> u64 {
        let queue = queue.to_string();
        self.blocking(move |b, s| kafka_lag(&b, &s.readiness_group, &s.topic(&queue)))
            .await
    }

    async fn remaining(&self, queue: &str) -> u64 {
        let queue = queue.to_string();
        self.blocking(move |b, s| kafka_lag(&b, &s.processing_group, &s.topic(&queue)))
            .await
    }

    async fn in_flight(&self, queue: &str) -> u64 {
        let queue = queue.to_string();
        self.blocking(move |b, s| {
            if kafka_members(&b, &s.processing_group) == 0 {
                return 0;
            }
            let topic = s.topic(&queue);
            let committed = kafka_committed(&b, &s.processing_group, &topic);
            kafka_committed(&b, &s.delivered_group(), &topic)
                .into_iter()
                .map(|(p, mark)| (mark - committed.get(&p).copied().unwrap_or(0)).max(0) as u64)
                .sum()
        })
        .await
    }

    async fn stop(&mut self) {
        self.node.as_mut().expect("a private broker").stop();
    }

    async fn start(&mut self) {
        self.node.as_mut().expect("a private broker").start_again().await;
        let queues = ["export_order".to_string(), "stuck".to_string()];
        open(self).await.prepare(&queues).await.unwrap();
    }
}
