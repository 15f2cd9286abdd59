//! The Kafka harness: topics and groups of their own on the shared broker, or a private
//! broker behind a proxy that "stops" it by cutting its clients off (the test broker keeps
//! nothing across a real restart, a real broker would). What is still
//! in the broker is the lag of the processing group; what a consumer holds is the fetched
//! but uncommitted part while the group has members.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use wharf_host::external::kafka::KafkaSettings;
use wharf_tests::kafka::{KafkaNode, KafkaReader, TEST_PROPERTIES, kafka_brokers, kafka_produce};
use wharf_tests::unique_prefix;

use crate::Harness;

pub struct KafkaHarness {
    brokers: String,
    prefix: String,
    node: Option<KafkaNode>,
    reader: Arc<KafkaReader>,
    /// Members `in_flight` reported as holding messages.
    reported: Arc<Mutex<HashSet<String>>>,
}

impl KafkaHarness {
    fn settings(&self) -> KafkaSettings {
        let mut s = KafkaSettings::new(self.brokers.clone());
        s.topic_prefix = self.prefix.clone();
        s.processing_group = format!("{}processing", self.prefix);
        s.readiness_group = format!("{}readiness", self.prefix);
        s
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&KafkaReader, KafkaSettings) -> T + Send + 'static,
    ) -> T {
        let (reader, settings) = (self.reader.clone(), self.settings());
        tokio::task::spawn_blocking(move || work(&reader, settings))
            .await
            .unwrap()
    }
}

impl Harness for KafkaHarness {
    async fn shared() -> Self {
        KafkaHarness {
            reader: Arc::new(KafkaReader::new(&kafka_brokers())),
            brokers: kafka_brokers(),
            prefix: unique_prefix("conformance").replace(':', "."),
            node: None,
            reported: Arc::default(),
        }
    }

    async fn private() -> Self {
        let node = KafkaNode::start().await;
        KafkaHarness {
            reader: Arc::new(KafkaReader::new(&node.brokers())),
            brokers: node.brokers(),
            prefix: "wharf-test.".to_string(),
            node: Some(node),
            reported: Arc::default(),
        }
    }

    fn section(&self) -> String {
        let s = self.settings();
        format!(
            "type = \"kafka\"\nbrokers = \"{}\"\ntopic_prefix = \"{}\"\nprocessing_group = \"{}\"\nreadiness_group = \"{}\"\npartitions = 2\n{TEST_PROPERTIES}\n",
            self.brokers, s.topic_prefix, s.processing_group, s.readiness_group
        )
    }

    async fn produce_direct(&self, queue: &str, body: &[u8]) {
        kafka_produce(&self.brokers, &self.settings().topic(queue), None, body).await;
    }

    async fn drop_notifications(&self, queue: &str) {
        let queue = queue.to_string();
        self.blocking(move |r, s| r.skip_to_end(&s.readiness_group, &s.topic(&queue)))
            .await;
    }

    async fn unacknowledged_notifications(&self, queue: &str) -> u64 {
        let queue = queue.to_string();
        self.blocking(move |r, s| r.lag(&s.readiness_group, &s.topic(&queue)))
            .await
    }

    async fn remaining(&self, queue: &str) -> u64 {
        let queue = queue.to_string();
        self.blocking(move |r, s| r.lag(&s.processing_group, &s.topic(&queue)))
            .await
    }

    /// Fetched and uncommitted messages while a member holds the partitions — counted once
    /// per member: the test broker lists a killed member until the next one joins, so a
    /// member already reported (and then killed or closed) holds nothing any more.
    async fn in_flight(&self, queue: &str) -> u64 {
        let queue = queue.to_string();
        let reported = self.reported.clone();
        self.blocking(move |r, s| {
            let members = r.members(&s.processing_group);
            let mut reported = reported.lock().unwrap();
            if members.iter().all(|m| reported.contains(m)) {
                return 0;
            }
            let topic = s.topic(&queue);
            let committed = r.committed(&s.processing_group, &topic);
            let held = r
                .committed(&s.delivered_group(), &topic)
                .into_iter()
                .map(|(p, mark)| (mark - committed.get(&p).copied().unwrap_or(0)).max(0) as u64)
                .sum();
            if held > 0 {
                reported.extend(members);
            }
            held
        })
        .await
    }

    async fn stop(&mut self) {
        self.node.as_mut().expect("a private broker").stop();
    }

    async fn start(&mut self) {
        self.node
            .as_mut()
            .expect("a private broker")
            .start_again()
            .await;
    }
}
