//! The Service Bus harness: a contract server of its own per test (the one permitted
//! stand-in: nothing here reaches Azure), with the topics of the cases' queues and their
//! processing and readiness subscriptions created up front (entity management is the
//! namespace owner's). The private variant sits behind a TCP proxy that "stops" it by
//! cutting its clients off while it keeps its messages. Locks last 4 s.

use wharf_tests::proxy::TcpProxy;
use wharf_tests::servicebus::{ContractServer, send_direct};

use crate::Harness;

/// The queues the cases use.
const QUEUES: [&str; 3] = ["export_order", "stuck", "outbound"];
const KEY_NAME: &str = "RootManageSharedAccessKey";
const KEY: &str = "Y29uZm9ybWFuY2Uta2V5";
const PREFIX: &str = "nexus.";

pub struct ServiceBusHarness {
    server: ContractServer,
    proxy: Option<TcpProxy>,
}

impl ServiceBusHarness {
    async fn new(private: bool) -> Self {
        let server = ContractServer::start(KEY_NAME, KEY).await;
        // Short locks, so that a host killed mid-handler hands its message over soon (and
        // the consumer renews the locks of handlers that run longer).
        server.set_lock_duration(std::time::Duration::from_secs(4));
        for queue in QUEUES {
            server.create_topic(&format!("{PREFIX}{queue}"), &["processing", "readiness"]);
        }
        let proxy = match private {
            true => Some(TcpProxy::start(server.port()).await),
            false => None,
        };
        ServiceBusHarness { server, proxy }
    }

    fn endpoint(&self) -> String {
        match &self.proxy {
            Some(proxy) => format!("http://127.0.0.1:{}", proxy.port()),
            None => self.server.endpoint(),
        }
    }

    fn topic(queue: &str) -> String {
        format!("{PREFIX}{queue}")
    }
}

impl Harness for ServiceBusHarness {
    async fn shared() -> Self {
        Self::new(false).await
    }

    async fn private() -> Self {
        Self::new(true).await
    }

    fn section(&self) -> String {
        format!(
            "type = \"servicebus\"\nconnection_string = \"Endpoint=sb://conformance.servicebus.windows.net/;SharedAccessKeyName={KEY_NAME};SharedAccessKey={KEY}\"\nendpoint_override = \"{}\"\n",
            self.endpoint()
        )
    }

    async fn produce_direct(&self, queue: &str, body: &[u8]) {
        let status = send_direct(
            &self.endpoint(),
            "conformance",
            (KEY_NAME, KEY),
            &Self::topic(queue),
            body,
            &[],
        )
        .await;
        assert_eq!(status, 201, "the contract server accepts the send");
    }

    async fn drop_notifications(&self, queue: &str) {
        self.server.purge(&Self::topic(queue), "readiness");
    }

    async fn unacknowledged_notifications(&self, queue: &str) -> u64 {
        self.server.counts(&Self::topic(queue), "readiness").0 as u64
    }

    async fn remaining(&self, queue: &str) -> u64 {
        self.server.counts(&Self::topic(queue), "processing").0 as u64
    }

    async fn in_flight(&self, queue: &str) -> u64 {
        self.server.counts(&Self::topic(queue), "processing").1 as u64
    }

    async fn stop(&mut self) {
        self.proxy.as_ref().expect("a private server").stop();
    }

    async fn start(&mut self) {
        self.proxy.as_ref().expect("a private server").start_again();
    }
}
