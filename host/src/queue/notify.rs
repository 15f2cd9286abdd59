//! Throttled `NOTIFY wharf_ready, '<queue>'` after enqueues on PostgreSQL. PostgreSQL
//! serialises the commits of notifying transactions, so notifying on every insert caps the
//! whole database's commit rate; instead the first enqueue into a quiet queue notifies at
//! once, and further enqueues within [`WINDOW`] are folded into one notification sent at the
//! end of the window. Processors that miss one (a producer writing SQL directly) still poll.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::PgPool;

/// At most one notification per queue per window.
pub const WINDOW: Duration = Duration::from_millis(20);

/// The channel processors listen on.
pub const READY_CHANNEL: &str = "wharf_ready";

#[derive(Default, Debug)]
struct State {
    last_sent: HashMap<String, Instant>,
    owed: HashSet<String>,
    flusher_running: bool,
}

/// Sends ready notifications for one store.
#[derive(Default, Debug)]
pub struct Notifier {
    state: Mutex<State>,
}

impl Notifier {
    /// A message of `queue` became ready: notify now, or owe a notification for the window.
    pub async fn ready(self: &Arc<Self>, pool: &PgPool, queue: &str) {
        let now = Instant::now();
        let send_now = {
            let mut state = self.state.lock().expect("notifier state");
            match state.last_sent.get(queue) {
                Some(at) if now.duration_since(*at) < WINDOW => {
                    state.owed.insert(queue.to_string());
                    if !state.flusher_running {
                        state.flusher_running = true;
                        tokio::spawn(flush(Arc::downgrade(self), pool.clone()));
                    }
                    false
                }
                _ => {
                    state.last_sent.insert(queue.to_string(), now);
                    true
                }
            }
        };
        if send_now {
            send(pool, &[queue.to_string()]).await;
        }
    }
}

async fn send(pool: &PgPool, queues: &[String]) {
    // A lost notification only delays processing until the next poll.
    let sent = sqlx::query("SELECT pg_notify($1, q) FROM unnest($2::text[]) AS q")
        .bind(READY_CHANNEL)
        .bind(queues)
        .execute(pool)
        .await;
    if let Err(e) = sent {
        tracing::debug!("ready notification not sent: {e}");
    }
}

/// Send owed notifications at the end of each window until none are owed.
async fn flush(notifier: Weak<Notifier>, pool: PgPool) {
    loop {
        tokio::time::sleep(WINDOW).await;
        let Some(notifier) = notifier.upgrade() else {
            return;
        };
        let owed: Vec<String> = {
            let mut state = notifier.state.lock().expect("notifier state");
            if state.owed.is_empty() {
                state.flusher_running = false;
                return;
            }
            let now = Instant::now();
            let owed: Vec<String> = state.owed.drain().collect();
            for q in &owed {
                state.last_sent.insert(q.clone(), now);
            }
            owed
        };
        send(&pool, &owed).await;
    }
}
