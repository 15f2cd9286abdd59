//! Replay: run stored messages (any status) against a candidate component, with the limits
//! of the queue's handler, without side effects. The candidate's `host.enqueue` calls are
//! captured and reported, never executed; its log lines are captured; its grants are
//! narrowed (no network, no host stdio, read-only mounts, outbound HTTP refused); the stored
//! messages are not touched. Each result stands next to the outcome the message last had.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::Serialize;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};

use crate::config::Config;
use crate::queue::{
    EnqueueStatus, Enqueued, MessageFilter, NewMessage, QueueError, QueueStore, StateChange,
    Status, StoredMessage,
};
use crate::runtime::{
    CallEffects, HandlerError, HandlerRegistry, InvokeError, Message, Outcome, StateCall, invoke,
};
use crate::runtime::{EnqueueError, Enqueuer};

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The message's queue is not configured.
    #[error("message {key} is in queue `{queue}`, which is not configured")]
    UnknownQueue {
        /// The message key.
        key: i64,
        /// Its queue.
        queue: String,
    },
    /// No message has this key.
    #[error("no message with key {0}")]
    NoMessage(i64),
    /// The queue to replay is not configured.
    #[error("no queue `{0}` is configured")]
    NoQueue(String),
    /// The queue has no handler to stand in for.
    #[error(
        "queue `{0}` has no handler: a replay runs the candidate as a queue's handler (set queues.{0}.handler)"
    )]
    NoHandler(String),
    /// The queue storage failed.
    #[error(transparent)]
    Store(#[from] QueueError),
    /// The replay sandbox could not be set up.
    #[error("cannot set up the replay: {0}")]
    Setup(String),
    /// The candidate file could not be deployed.
    #[error("the candidate cannot run as handler `{handler}`: {reason}")]
    Candidate {
        /// The queue's handler name.
        handler: String,
        /// Why.
        reason: String,
    },
}

/// An enqueue the candidate asked for (captured, not executed).
#[derive(Debug, Clone, Serialize)]
pub struct CapturedEnqueue {
    /// The target queue.
    pub queue: String,
    /// The payload.
    pub payload: String,
    /// The MessageId asked for.
    pub id: Option<String>,
}

/// The result of one message against the candidate.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayResult {
    /// The message key.
    pub key: i64,
    /// Its queue.
    pub queue: String,
    /// Its stored status.
    pub status: String,
    /// Its last recorded outcome or error.
    pub last: Option<String>,
    /// What the candidate did: `completed`, `pending-handoff`, `retry-after N ms`,
    /// `transient: …`, `permanent: …`, or the trap / timeout.
    pub candidate: String,
    /// Whether the candidate succeeded (completed or handed off).
    pub succeeded: bool,
    /// The enqueues it asked for.
    pub enqueues: Vec<CapturedEnqueue>,
    /// Its log lines (`host.log`, stdout, stderr).
    pub logs: Vec<String>,
    /// The committed key-value state it read.
    pub state_reads: Vec<StateValue>,
    /// The key-value changes it would commit (none is).
    pub state_changes: Vec<StateValue>,
}

/// A key-value read or change a candidate made, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct StateValue {
    /// The bucket.
    pub bucket: String,
    /// The key.
    pub key: String,
    /// The value read or set (UTF-8, invalid bytes replaced), `+N` for an increment,
    /// `None` for an absent key or a delete.
    pub value: Option<String>,
}

/// Captures enqueues instead of executing them.
#[derive(Default)]
struct Capture(Mutex<Vec<CapturedEnqueue>>);

#[async_trait]
impl Enqueuer for Capture {
    async fn enqueue(&self, queue: &str, message: NewMessage) -> Result<Enqueued, EnqueueError> {
        self.0.lock().expect("capture").push(CapturedEnqueue {
            queue: queue.to_string(),
            payload: message.payload,
            id: message.id,
        });
        Ok(Enqueued {
            key: 0,
            status: EnqueueStatus::Added,
        })
    }
}

/// Collects the guest's log lines (target `wharf::guest`).
#[derive(Clone, Default)]
struct GuestLogs(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for GuestLogs {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "wharf::guest" {
            return;
        }
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        let level = event.metadata().level().as_str().to_lowercase();
        self.0
            .lock()
            .expect("logs")
            .push(format!("{level}: {}", text.0));
    }
}

/// Runs messages against one candidate file.
pub struct Replayer {
    config: Arc<Config>,
    candidate: Vec<u8>,
    registry: HandlerRegistry,
    dir: tempfile::TempDir,
    /// Where the candidate reads key-value state (never writes).
    state: Option<Arc<dyn QueueStore>>,
}

impl Replayer {
    /// A replayer of `candidate` (the component's bytes) under `config`'s queues and grants.
    pub fn new(config: Config, candidate: Vec<u8>) -> Result<Self, ReplayError> {
        let dir = tempfile::tempdir()
            .map_err(|e| ReplayError::Setup(format!("a temporary directory: {e}")))?;
        let mut config = config;
        // Compile into a private cache: a candidate never lands in the host's cache.
        config.host.cache_dir = dir.path().join("cache");
        let config = Arc::new(config);
        let registry = HandlerRegistry::dry_run(config.clone())
            .map_err(|e| ReplayError::Setup(e.to_string()))?;
        Ok(Replayer {
            config,
            candidate,
            registry,
            dir,
            state: None,
        })
    }

    /// Let the candidate read key-value state from `store` (its changes are reported, never
    /// committed).
    pub fn reading_state(mut self, store: Arc<dyn QueueStore>) -> Self {
        self.state = Some(store);
        self
    }

    /// The candidate deployed as handler `name` (compiled once, shared by every name).
    fn handler(&self, name: &str) -> Result<Arc<crate::runtime::LoadedHandler>, String> {
        if let Some(loaded) = self.registry.get(name) {
            return Ok(loaded);
        }
        let file = self.dir.path().join(format!("{name}.wasm"));
        std::fs::write(&file, &self.candidate).map_err(|e| e.to_string())?;
        self.registry.load_file(&file).map_err(|e| e.to_string())?;
        Ok(self.registry.get(name).expect("just loaded"))
    }

    /// Run `message` against the candidate as the handler of its queue.
    pub async fn replay(&self, message: &StoredMessage) -> Result<ReplayResult, ReplayError> {
        let queue =
            self.config
                .queues
                .get(&message.queue)
                .ok_or_else(|| ReplayError::UnknownQueue {
                    key: message.key,
                    queue: message.queue.clone(),
                })?;
        let name = queue
            .handler()
            .ok_or_else(|| ReplayError::NoHandler(message.queue.clone()))?;
        let handler = self
            .handler(name)
            .map_err(|reason| ReplayError::Candidate {
                handler: name.to_string(),
                reason,
            })?;
        let capture = Arc::new(Capture::default());
        let logs = GuestLogs::default();
        let subscriber = tracing_subscriber::registry().with(logs.clone());
        let guest_message = Message {
            queue: message.queue.clone(),
            id: message.id.clone(),
            delivery_id: message.delivery_id.clone(),
            payload: message.payload.clone(),
            priority: message.priority,
            attempt: message.attempts.max(1),
            max_attempts: queue.max_attempts,
            enqueued_at_ms: message.enqueued_at_ms.max(0) as u64,
            headers: message.headers.clone(),
        };
        let state = self.state.clone().map(|store| {
            StateCall::recording(store, handler.name.clone(), handler.grants.keyvalue.clone())
        });
        let effects = CallEffects {
            enqueuer: capture.clone(),
            state: state.clone(),
            trace: None,
        };
        let result = invoke(&handler, guest_message, queue.timeout, effects)
            .with_subscriber(subscriber)
            .await;
        // The handler's environment is granted to the candidate too (a faithful run), but its
        // values never leave through the report: a candidate that prints them shows `***`.
        let secrets: Vec<&str> = handler
            .grants
            .env
            .iter()
            .map(|(_, value)| value.as_str())
            .filter(|value| value.len() >= 4)
            .collect();
        let hide = |text: String| redact(text, &secrets);
        let (candidate, succeeded) = describe(&result);
        let candidate = hide(candidate);
        let enqueues = std::mem::take(&mut *capture.0.lock().expect("capture"))
            .into_iter()
            .map(|e| CapturedEnqueue {
                queue: e.queue,
                payload: hide(e.payload),
                id: e.id.map(&hide),
            })
            .collect();
        let logs = std::mem::take(&mut *logs.0.lock().expect("logs"))
            .into_iter()
            .map(&hide)
            .collect();
        let text = |bytes: Option<Vec<u8>>| bytes.map(|b| hide(String::from_utf8_lossy(&b).into()));
        let state_reads = state.as_ref().map_or_else(Vec::new, |s| {
            s.reads()
                .into_iter()
                .map(|r| StateValue {
                    bucket: r.bucket,
                    key: r.key,
                    value: text(r.value),
                })
                .collect()
        });
        let state_changes = state.as_ref().map_or_else(Vec::new, |s| {
            s.take()
                .into_iter()
                .map(|w| StateValue {
                    bucket: w.bucket,
                    key: w.key,
                    value: match w.change {
                        StateChange::Set(value) => text(Some(value)),
                        StateChange::Delete => None,
                        StateChange::Add(delta) => Some(format!("+{delta}")),
                    },
                })
                .collect()
        });
        Ok(ReplayResult {
            key: message.key,
            queue: message.queue.clone(),
            status: message.status.as_str().to_string(),
            last: message.last_error.clone().or(message.outcome.clone()),
            candidate,
            succeeded,
            enqueues,
            logs,
            state_reads,
            state_changes,
        })
    }
}

/// Which stored messages to replay.
#[derive(Debug, Clone)]
pub enum Selection {
    /// One message, by key.
    One(i64),
    /// The newest `limit` messages of `queue` in `status`.
    Queue {
        /// The queue.
        queue: String,
        /// The status.
        status: Status,
        /// At most this many.
        limit: u32,
    },
}

/// The results of a replay and its summary line.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// One result per message, newest first.
    pub results: Vec<ReplayResult>,
    /// How many the candidate completed (or handed off).
    pub succeeded: usize,
    /// "the candidate completes 37 of 40 failed messages".
    pub summary: String,
}

/// Replay the `selection` of `store`'s messages against `candidate` under `config`.
pub async fn replay_selection(
    config: Config,
    store: &Arc<dyn QueueStore>,
    candidate: Vec<u8>,
    selection: &Selection,
) -> Result<ReplayReport, ReplayError> {
    let messages = match selection {
        Selection::One(key) => vec![store.get(*key).await?.ok_or(ReplayError::NoMessage(*key))?],
        Selection::Queue {
            queue,
            status,
            limit,
        } => {
            if !config.queues.contains_key(queue) {
                return Err(ReplayError::NoQueue(queue.clone()));
            }
            store
                .list(&MessageFilter {
                    queue: Some(queue.clone()),
                    status: Some(status.clone()),
                    limit: *limit,
                    ..Default::default()
                })
                .await?
        }
    };
    let replayer = Replayer::new(config, candidate)?.reading_state(store.clone());
    let mut results = Vec::with_capacity(messages.len());
    for message in &messages {
        results.push(replayer.replay(message).await?);
    }
    let succeeded = results.iter().filter(|r| r.succeeded).count();
    let summary = format!(
        "the candidate completes {succeeded} of {} {}",
        results.len(),
        match selection {
            Selection::One(_) => "message".to_string(),
            Selection::Queue { status, .. } => format!("{} messages", status.as_str()),
        }
    );
    Ok(ReplayReport {
        results,
        succeeded,
        summary,
    })
}

/// `text` with every occurrence of each of `secrets` replaced by `***`.
fn redact(mut text: String, secrets: &[&str]) -> String {
    for secret in secrets {
        if text.contains(secret) {
            text = text.replace(secret, "***");
        }
    }
    text
}

fn describe(result: &Result<Result<Outcome, HandlerError>, InvokeError>) -> (String, bool) {
    match result {
        Ok(Ok(Outcome::Completed)) => ("completed".into(), true),
        Ok(Ok(Outcome::PendingHandoff)) => ("pending-handoff".into(), true),
        Ok(Ok(Outcome::RetryAfter(ms))) => (format!("retry-after {ms} ms"), false),
        Ok(Err(HandlerError::Transient(e))) => (format!("transient: {e}"), false),
        Ok(Err(HandlerError::Permanent(e))) => (format!("permanent: {e}"), false),
        Err(e) => (e.to_string(), false),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn granted_values_are_hidden_from_the_report() {
        assert_eq!(
            redact(
                "token=s3cr3t-value and s3cr3t-value".into(),
                &["s3cr3t-value"]
            ),
            "token=*** and ***"
        );
        assert_eq!(redact("nothing here".into(), &["s3cr3t"]), "nothing here");
    }
}
