//! The `QueueStore` contract, written once and run unchanged against every store: SQLite
//! (a fresh file per test) and PostgreSQL (a fresh schema per test), so tests run in parallel.

mod awaiting_release;
mod batches;
mod counters;
mod identity;
mod leases;
mod management;
mod retention;
mod sessions;
mod state_reads;

use std::sync::Arc;

use wharf_host::queue::{
    Disposition, Lease, NewMessage, QueueStore, SettleResult, Settlement, SqlStore, Status,
};
use wharf_tests::{PgSchema, database_url};

/// A store for one test, with whatever keeps its database alive.
pub(crate) struct Subject {
    pub(crate) store: Arc<dyn QueueStore>,
    _guard: Box<dyn std::any::Any + Send>,
}

pub(crate) async fn sqlite() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("queue.db").display());
    Subject {
        store: Arc::new(SqlStore::open_sqlite(&url, 4).await.unwrap()),
        _guard: Box::new(dir),
    }
}

pub(crate) async fn postgres() -> Subject {
    let schema = PgSchema::new();
    let store = SqlStore::open_postgres(&database_url(), Some(&schema.name), 8)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {} (set DATABASE_URL): {e}", database_url()));
    Subject {
        store: Arc::new(store),
        _guard: Box::new(schema),
    }
}

pub(crate) fn message(id: Option<&str>, payload: &str) -> NewMessage {
    NewMessage {
        id: id.map(str::to_string),
        payload: payload.to_string(),
        ..NewMessage::default()
    }
}

pub(crate) async fn settle(
    store: &Arc<dyn QueueStore>,
    lease: Lease,
    disposition: Disposition,
) -> SettleResult {
    store
        .settle(&[Settlement::new(lease, disposition)])
        .await
        .unwrap()
        .remove(0)
}

pub(crate) async fn status_of(store: &Arc<dyn QueueStore>, key: i64) -> Status {
    store
        .get(key)
        .await
        .unwrap()
        .expect("message exists")
        .status
}

/// Declare one `#[tokio::test]` per contract function, for one store.
macro_rules! for_store {
    ($store:ident: $($module:ident::$test:ident),* $(,)?) => {
        mod $store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let subject = super::$store().await;
                    super::$module::$test(subject.store.clone()).await;
                }
            )*
        }
    };
}

/// Every contract test, for every store.
macro_rules! conformance {
    ($($store:ident),*) => {
        $(
            for_store!($store:
                leases::fencing_rejects_a_stale_lease,
                leases::a_retried_completion_is_applied_once,
                leases::expired_lease_on_the_last_attempt_fails,
                leases::abandoned_without_retry_fails,
                leases::release_does_not_count_the_attempt,
                leases::priority_then_date_then_fifo,
                leases::scheduled_messages_wait_for_their_date,
                leases::retries_sleep_until_due,
                identity::same_id_updates_instead_of_adding,
                identity::concurrent_enqueues_of_one_id_leave_one_row,
                identity::idempotent_discards_equal_json_values,
                identity::custom_status_is_kept_until_moved,
                identity::enqueue_stores_an_error_and_a_source_delivery,
                awaiting_release::enqueue_while_leased_waits_for_release,
                awaiting_release::future_destination_sleeps_and_past_is_ready,
                awaiting_release::custom_destination_keeps_its_status,
                awaiting_release::older_outcomes_do_not_overwrite_the_newer_enqueue,
                awaiting_release::further_enqueues_replace_the_deferred_values,
                awaiting_release::idempotent_compares_with_the_deferred_version,
                awaiting_release::abandonment_with_retry_applies_the_newer_version,
                awaiting_release::abandonment_without_retry_fails_the_newer_version,
                awaiting_release::a_moved_in_version_keeps_its_attempts_error_and_source,
                batches::a_batch_applies_repeated_ids_in_order,
                batches::a_batch_defers_leased_ids_and_discards_equal_values,
                batches::batches_larger_than_a_transaction_keep_every_message,
                batches::concurrent_batches_of_the_same_ids_leave_one_row_each,
                retention::retention_zero_still_records_the_previous_version,
                retention::purge_by_age_and_count_is_bounded,
                retention::history_keeps_the_newest_versions,
                management::retry_resubmits_failed_messages,
                management::move_and_delete_skip_leased_messages,
                management::list_pages_by_cursor_and_filters_by_id,
                sessions::one_head_per_session_in_key_order,
                sessions::a_failure_parks_the_session_and_a_successful_retry_drains_it,
                sessions::deleting_or_moving_the_blocker_drains_the_session,
                sessions::a_handoff_blocks_until_an_operator_settles_it,
                sessions::an_abandoned_lease_blocks_its_session,
                sessions::concurrent_processors_keep_every_session_in_order,
                state_reads::concurrent_reads_each_get_their_key,
                state_reads::cancelled_reads_never_stall_the_others,
                counters::increments_sum_per_key_and_follow_their_completion,
                counters::an_increment_that_cannot_apply_is_a_conflict_of_its_settlement_alone,
            );
        )*
    };
}

conformance!(sqlite, postgres);
