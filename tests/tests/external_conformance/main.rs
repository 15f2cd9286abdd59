//! The provider conformance suite: every provider-agnostic behaviour of external pending
//! storage, written once against a [`Harness`] and run against every provider on its real
//! broker (Redis on one server and on a three-master Redis Cluster, RabbitMQ, Kafka, and
//! Service Bus against its contract server). Cases that depend on a capability ask the
//! provider's [`Capabilities`] first.

mod cases;
mod kafka;
mod rabbitmq;
mod redis;
mod servicebus;

use std::sync::Arc;

use wharf_host::config::ProviderConfig;
use wharf_host::external::{Capabilities, Provider, registry};

/// One provider on its broker, in a namespace (key prefix, exchange and queue names) of its
/// own.
pub trait Harness: Send + Sync + Sized + 'static {
    /// A namespace on the shared broker.
    fn shared() -> impl Future<Output = Self> + Send;

    /// A broker of its own, which the test may stop and start.
    fn private() -> impl Future<Output = Self> + Send;

    /// The body of `[providers.main]` (with `type`).
    fn section(&self) -> String;

    /// Publish `body` to `queue` the way a direct producer does, with the documented
    /// topology and a plain client (not Wharf's code).
    fn produce_direct(&self, queue: &str, body: &[u8]) -> impl Future<Output = ()> + Send;

    /// Delete every readiness notification of `queue` (they were lost).
    fn drop_notifications(&self, queue: &str) -> impl Future<Output = ()> + Send;

    /// Readiness notifications of `queue` not acknowledged yet (delivered or not).
    fn unacknowledged_notifications(&self, queue: &str) -> impl Future<Output = u64> + Send;

    /// Messages of `queue` still in the broker: ready, scheduled or unsettled.
    fn remaining(&self, queue: &str) -> impl Future<Output = u64> + Send;

    /// Deliveries of `queue` a consumer holds unsettled right now (an expired lease does
    /// not count).
    fn in_flight(&self, queue: &str) -> impl Future<Output = u64> + Send;

    /// Stop the private broker.
    fn stop(&mut self) -> impl Future<Output = ()> + Send;

    /// Start the private broker again.
    fn start(&mut self) -> impl Future<Output = ()> + Send;
}

/// The provider of a harness, opened the way the host opens it.
pub async fn open<H: Harness>(h: &H) -> Arc<dyn Provider> {
    let section: ProviderConfig = toml::from_str(&h.section()).expect("the section parses");
    registry::find(&section.kind)
        .expect("a registered provider type")
        .open("main", &section.settings)
        .await
        .expect("the provider opens")
}

/// What the provider of a harness can do.
pub fn capabilities<H: Harness>(h: &H) -> Capabilities {
    let section: ProviderConfig = toml::from_str(&h.section()).expect("the section parses");
    registry::find(&section.kind)
        .expect("a registered provider type")
        .check(&section.settings)
        .expect("valid settings")
}

/// Generate the suite's tests for one harness.
macro_rules! conformance {
    ($module:ident, $harness:ty) => {
        mod $module {
            use crate::cases;
            conformance!(@cases $harness;
                a_direct_producer_is_processed,
                enqueued_messages_are_processed_once,
                failures_move_into_sql_with_their_attempts,
                a_malformed_body_ends_failed_in_sql,
                a_poison_message_ends_failed_after_max_attempts,
                readiness_is_acknowledged_only_after_a_durable_activation,
                dropped_notifications_are_reconciled,
                a_broker_restart_turns_health_red_then_green,
                shutdown_hands_unfinished_messages_back,
                the_inbox_skips_a_redelivered_message_id,
                a_moved_message_stands_in_for_its_message_id,
                a_future_enqueue_runs_when_due_and_once,
                queue_settings_the_provider_cannot_honour_are_config_errors,
                a_broker_down_at_start_up_does_not_stop_the_host,
                a_handle_the_provider_did_not_make_is_an_error,
                follow_ups_exist_only_for_the_attempt_that_succeeded,
                a_second_delivery_of_a_committed_success_commits_nothing,
                state_changes_from_a_broker_commit_with_the_outcome,
                follow_ups_for_a_broker_are_published_once_from_the_outbox,
                outbox_rows_wait_for_a_broker_that_is_down,
                two_hosts_relaying_one_outbox_publish_each_row_once,
            );
        }
    };
    (@cases $harness:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                cases::$case::<$harness>().await
            }
        )*
    };
}

conformance!(on_redis, crate::redis::RedisHarness);
conformance!(on_redis_cluster, crate::redis::RedisClusterHarness);
conformance!(on_rabbitmq, crate::rabbitmq::RabbitHarness);
conformance!(on_kafka, crate::kafka::KafkaHarness);
conformance!(on_servicebus, crate::servicebus::ServiceBusHarness);
