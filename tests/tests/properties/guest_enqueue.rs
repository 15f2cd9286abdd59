//! A guest's `host.enqueue` with hostile arguments — unknown queues, ids of any length and
//! character (NUL included), payloads that are not JSON, any priority, delays up to
//! `u64::MAX`, headers of any text — on SQLite and PostgreSQL: each call is stored exactly as
//! asked or refused with an error that names the queue or the limit, never a store error and
//! never a panic, and both stores decide alike.

use std::sync::Arc;

use proptest::prelude::*;
use wharf_host::enqueue::{EnqueueError, Enqueuer};
use wharf_host::queue::limits::LATEST_DATE_MS;
use wharf_host::runtime::{EnqueueOptions, guest_message};
use wharf_tests::{PgSchema, TestDir};

const QUEUE: &str = "[queues.work]\nhandler = \"none\"\nmax_payload = \"4KiB\"\n";

#[derive(Debug, Clone)]
struct Call {
    queue: String,
    payload: String,
    id: Option<String>,
    priority: Option<i32>,
    delay_ms: Option<u64>,
    headers: Vec<(String, String)>,
}

fn hostile_text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        6 => proptest::string::string_regex(&format!("\\PC{{0,{max}}}")).unwrap(),
        2 => any::<String>(),
        1 => Just("a\0b".to_string()),
        1 => Just(String::new()),
        1 => Just(" ".repeat(3)),
    ]
}

fn call() -> impl Strategy<Value = Call> {
    (
        prop_oneof![9 => Just("work".to_string()), 1 => hostile_text(8)],
        prop_oneof![
            8 => super::json::json(false).prop_map(|v| super::json::compact(&v)),
            1 => any::<String>(),
            1 => Just("x".repeat(5000)),
        ],
        proptest::option::of(prop_oneof![
            hostile_text(40),
            (1020usize..1030).prop_map(|n| "é".repeat(n)),
        ]),
        proptest::option::of(any::<i32>()),
        proptest::option::of(prop_oneof![
            any::<u64>(),
            Just(u64::MAX),
            Just(i64::MAX as u64 + 1)
        ]),
        prop::collection::vec((hostile_text(10), hostile_text(10)), 0..3),
    )
        .prop_map(|(queue, payload, id, priority, delay_ms, headers)| Call {
            queue,
            payload,
            id,
            priority,
            delay_ms,
            headers,
        })
}

/// Make the call on `host`; `Ok(None)` for a clear refusal, `Err` for anything else.
async fn enqueue(host: &wharf_host::host::RunningHost, call: &Call) -> Result<Option<()>, String> {
    let options = EnqueueOptions {
        id: call.id.clone(),
        priority: call.priority,
        delay_ms: call.delay_ms,
        headers: call.headers.clone(),
    };
    let now = wharf_host::queue::now_ms();
    let message = guest_message(call.payload.clone(), options, now);
    match host.router.enqueue(&call.queue, message).await {
        Ok(done) => {
            let stored = host
                .store
                .get(done.key)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("the enqueued message is not stored")?;
            if stored.payload != call.payload || stored.id != call.id {
                return Err(format!("stored differently: {stored:?}"));
            }
            if stored.headers != call.headers || stored.priority != call.priority.unwrap_or(0) {
                return Err(format!("headers or priority differ: {stored:?}"));
            }
            if stored.process_at_ms < now || stored.process_at_ms > LATEST_DATE_MS {
                return Err(format!(
                    "processing date out of range: {}",
                    stored.process_at_ms
                ));
            }
            Ok(Some(()))
        }
        Err(
            EnqueueError::UnknownQueue { .. }
            | EnqueueError::InvalidPayload { .. }
            | EnqueueError::Limit { .. },
        ) => Ok(None),
        Err(e) => Err(format!("not a clear refusal: {e}")),
    }
}

#[test]
fn hostile_guest_enqueues_are_stored_or_refused_alike_on_every_store() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let sqlite_dir = TestDir::new();
    let postgres_dir = TestDir::new();
    let schema = PgSchema::new();
    let (sqlite, postgres) = runtime.block_on(async {
        (
            Arc::new(sqlite_dir.start(QUEUE).await),
            Arc::new(postgres_dir.start_postgres(&schema, "1s", QUEUE).await),
        )
    });
    let config = proptest::test_runner::Config {
        source_file: Some(file!()),
        ..super::runner(128)
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let outcome = runner.run(&call(), |call| {
        let (on_sqlite, on_postgres) = runtime.block_on(async {
            (
                enqueue(&sqlite, &call).await,
                enqueue(&postgres, &call).await,
            )
        });
        let on_sqlite = on_sqlite.map_err(|e| TestCaseError::fail(format!("SQLite: {e}")))?;
        let on_postgres =
            on_postgres.map_err(|e| TestCaseError::fail(format!("PostgreSQL: {e}")))?;
        prop_assert_eq!(on_sqlite, on_postgres, "the stores decided differently");
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    drop(runtime);
}
