//! A Service Bus contract server: the documented subset of the Azure Service Bus REST API a
//! provider uses, over plain HTTP on loopback, for tests (nothing here can reach Azure, and
//! no emulator runs without Docker). It is a contract, not a convenience mock: every handler
//! follows a section of the REST reference (named at each handler), and
//! `tests/tests/servicebus_contract.rs` checks those documented behaviours against it. Used
//! by the tests and by the Service Bus benchmark.
//!
//! Model: topics with subscriptions; a send fans a copy out to every subscription; a
//! peek-lock takes the first visible, unlocked message, increments its `DeliveryCount` and
//! locks it for the lock duration; an expired lock makes it visible again; a message whose
//! next delivery would exceed `MaxDeliveryCount` moves to the subscription's
//! `$DeadLetterQueue`; scheduled messages stay invisible until `ScheduledEnqueueTimeUtc`.
//! Every request must carry a valid SAS token for the configured key (401 otherwise).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use tokio::sync::Notify;

mod dates;
mod direct;
mod handlers;
mod locks;
mod sas;

pub use direct::send_direct;
use handlers::{peek_lock, peek_lock_dead_letter, receive_and_delete, send};
use locks::{complete, renew, unlock};
pub use sas::sas_token;

/// The content type of Send Message Batch.
pub const BATCH_CONTENT_TYPE: &str = "application/vnd.microsoft.servicebus.json";

/// One message in a subscription.
#[derive(Debug, Clone)]
struct Message {
    sequence: i64,
    message_id: String,
    body: Bytes,
    /// Custom (user) properties, sent and returned as headers.
    properties: Vec<(String, String)>,
    enqueued: SystemTime,
    visible_at: SystemTime,
    delivery_count: u32,
    lock: Option<(String, SystemTime)>,
}

#[derive(Debug, Default)]
struct Subscription {
    messages: BTreeMap<i64, Message>,
    dead_letters: VecDeque<Message>,
}

#[derive(Debug)]
struct Broker {
    topics: HashMap<String, HashMap<String, Subscription>>,
    sequence: i64,
    lock_duration: Duration,
    max_delivery_count: u32,
    requests: u64,
    /// Send and batch send requests.
    sends: u64,
    /// Lock operations answered 404 (the lock was unknown or expired).
    refused_locks: u64,
}

struct Shared {
    key_name: String,
    key: Mutex<String>,
    broker: Mutex<Broker>,
    sent: Notify,
}

/// A running contract server; stopped on drop.
pub struct ContractServer {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl ContractServer {
    /// Start on a free loopback port, accepting SAS tokens signed with `key` under
    /// `key_name`.
    pub async fn start(key_name: &str, key: &str) -> ContractServer {
        let shared = Arc::new(Shared {
            key_name: key_name.to_string(),
            key: Mutex::new(key.to_string()),
            broker: Mutex::new(Broker {
                topics: HashMap::new(),
                sequence: 0,
                lock_duration: Duration::from_secs(60),
                max_delivery_count: 10,
                requests: 0,
                sends: 0,
                refused_locks: 0,
            }),
            sent: Notify::new(),
        });
        let lock_url = "/{topic}/subscriptions/{sub}/messages/{id}/{token}";
        let app = Router::new()
            .route("/{topic}/messages", post(send))
            .route(
                "/{topic}/subscriptions/{sub}/messages/head",
                post(peek_lock).delete(receive_and_delete),
            )
            .route(
                "/{topic}/subscriptions/{sub}/{dlq}/messages/head",
                post(peek_lock_dead_letter),
            )
            .route(lock_url, delete(complete).put(unlock).post(renew))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ContractServer { addr, shared, task }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT` (what replaces `https://{namespace}.servicebus.windows.net`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Create `topic` with `subscriptions` (entity management is outside the subset).
    pub fn create_topic(&self, topic: &str, subscriptions: &[&str]) {
        let mut broker = self.shared.broker.lock().unwrap();
        let subs = broker.topics.entry(topic.to_string()).or_default();
        for s in subscriptions {
            subs.entry(s.to_string()).or_default();
        }
    }

    /// The lock duration of every subscription (default 60 s, as Service Bus).
    pub fn set_lock_duration(&self, duration: Duration) {
        self.shared.broker.lock().unwrap().lock_duration = duration;
    }

    /// `MaxDeliveryCount` of every subscription (default 10, as Service Bus).
    pub fn set_max_delivery_count(&self, n: u32) {
        self.shared.broker.lock().unwrap().max_delivery_count = n;
    }

    /// Expire every current lock now (a lock lost early).
    pub fn expire_locks(&self) {
        let mut broker = self.shared.broker.lock().unwrap();
        for subs in broker.topics.values_mut() {
            for sub in subs.values_mut() {
                for m in sub.messages.values_mut() {
                    m.lock = None;
                }
            }
        }
    }

    /// Messages in a subscription: (active or scheduled, locked now, dead-lettered).
    pub fn counts(&self, topic: &str, subscription: &str) -> (usize, usize, usize) {
        let broker = self.shared.broker.lock().unwrap();
        let Some(sub) = broker.topics.get(topic).and_then(|t| t.get(subscription)) else {
            return (0, 0, 0);
        };
        let now = SystemTime::now();
        let locked = sub
            .messages
            .values()
            .filter(|m| m.lock.as_ref().is_some_and(|(_, until)| *until > now))
            .count();
        (sub.messages.len(), locked, sub.dead_letters.len())
    }

    /// Accept signatures made with `key` from now on (a rotated key; the old one is 401).
    pub fn set_key(&self, key: &str) {
        *self.shared.key.lock().unwrap() = key.to_string();
    }

    /// Delete every message of a subscription.
    pub fn purge(&self, topic: &str, subscription: &str) {
        let mut broker = self.shared.broker.lock().unwrap();
        if let Some(sub) = broker
            .topics
            .get_mut(topic)
            .and_then(|t| t.get_mut(subscription))
        {
            sub.messages.clear();
        }
    }

    /// Complete, unlock or renew requests refused so far because the lock was gone.
    pub fn refused_locks(&self) -> u64 {
        self.shared.broker.lock().unwrap().refused_locks
    }

    /// Send (and batch send) requests answered so far.
    pub fn sends(&self) -> u64 {
        self.shared.broker.lock().unwrap().sends
    }

    /// HTTP requests answered so far.
    pub fn requests(&self) -> u64 {
        self.shared.broker.lock().unwrap().requests
    }
}

impl Drop for ContractServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn count_request(shared: &Shared) {
    shared.broker.lock().unwrap().requests += 1;
}

/// An error answer: its status and text.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

fn gone(what: &str) -> Refusal {
    Refusal(StatusCode::GONE, format!("{what} does not exist"))
}
