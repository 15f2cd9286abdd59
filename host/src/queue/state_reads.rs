//! Coalesced reads of handlers' committed key-value state. A handler call reads a key's
//! committed value when it gets a key first or increments it (the increment returns the
//! value); with many calls running at once, a round trip per read costs more than the rest
//! of the message. A call that finds no read under way runs its own statement at once, on
//! its own task (no hand-off to another task and back); calls that read meanwhile wait, and
//! when the statement returns the first of them runs one statement for all of them
//! (deduplicated), answering the others. So a quiet store answers a lone read in one round
//! trip and a busy one answers many calls per round trip, each woken once.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::QueueError;
use super::state::{Committed, Id, ROW_OF_KEY, ROWS_OF_KEYS, bind_keys};
use crate::sql::Pool;

/// Most reads answered by one statement.
const MAX_BATCH: usize = 512;

type Answer = Result<Option<Committed>, String>;

/// What a waiting read is woken with: its answer, or the turn to read for everyone waiting.
enum Wake {
    Answer(Answer),
    Lead,
}

type Waiter = (Id, oneshot::Sender<Wake>);

#[derive(Default)]
struct Line {
    /// A statement is under way (its caller leads).
    busy: bool,
    waiting: VecDeque<Waiter>,
}

/// Reads for every caller of one store.
#[derive(Clone)]
pub(crate) struct StateReads {
    pool: Pool,
    line: Arc<Mutex<Line>>,
}

impl std::fmt::Debug for StateReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateReads").finish_non_exhaustive()
    }
}

impl StateReads {
    /// Read from `pool`.
    pub(crate) fn new(pool: Pool) -> StateReads {
        StateReads {
            pool,
            line: Arc::default(),
        }
    }

    /// The committed value and revision of `bucket`/`key`, read with whatever else is asked
    /// meanwhile.
    pub(crate) async fn read(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Option<Committed>, QueueError> {
        let id: Id = (bucket.to_string(), key.to_string());
        loop {
            let waiting = {
                let mut line = lock(&self.line);
                if line.busy {
                    let (tx, rx) = oneshot::channel();
                    line.waiting.push_back((id.clone(), tx));
                    Some(Waiting {
                        line: &self.line,
                        rx: Some(rx),
                    })
                } else {
                    line.busy = true;
                    None
                }
            };
            if let Some(mut waiting) = waiting {
                match waiting.woken().await {
                    Ok(Wake::Answer(answer)) => return answer.map_err(QueueError::Read),
                    Ok(Wake::Lead) => {}
                    // The leader was cancelled holding this read: ask again.
                    Err(_) => continue,
                }
            }
            return self.lead(id).await.map_err(QueueError::Read);
        }
    }

    /// Read `own` and whatever waits, answer the waiting, and pass the turn on.
    async fn lead(&self, own: Id) -> Answer {
        let mut turn = Turn {
            line: &self.line,
            batch: Vec::new(),
        };
        {
            let mut line = lock(&self.line);
            let n = line.waiting.len().min(MAX_BATCH - 1);
            turn.batch.extend(line.waiting.drain(..n));
        }
        if turn.batch.is_empty() {
            return read_one(&self.pool, &own).await.map_err(|e| e.to_string());
        }
        let ids: BTreeSet<&Id> = turn
            .batch
            .iter()
            .map(|(id, _)| id)
            .chain(std::iter::once(&own))
            .collect();
        tracing::trace!(
            reads = turn.batch.len() + 1,
            keys = ids.len(),
            "reading committed state"
        );
        let found = read_many(&self.pool, ids).await.map_err(|e| e.to_string());
        let answer = |id: &Id| match &found {
            Ok(found) => Ok(found.get(id).cloned()),
            Err(e) => Err(e.clone()),
        };
        for (id, reply) in turn.batch.drain(..) {
            let _ = reply.send(Wake::Answer(answer(&id)));
        }
        answer(&own)
    }
}

fn lock(line: &Mutex<Line>) -> std::sync::MutexGuard<'_, Line> {
    // The line's state stays whole whatever panicked while it was held.
    line.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Wake the first read still waiting to lead the next statement, or mark the line idle.
fn pass_turn(line: &mut Line) {
    while let Some((_, next)) = line.waiting.pop_front() {
        if next.send(Wake::Lead).is_ok() {
            return;
        }
        // That read was cancelled while it waited: try the next.
    }
    line.busy = false;
}

/// The leader's turn; dropping it (done, or the call cancelled mid-read) puts unanswered
/// reads back in line and passes the turn on.
struct Turn<'a> {
    line: &'a Mutex<Line>,
    batch: Vec<Waiter>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut line = lock(self.line);
        for waiter in self.batch.drain(..).rev() {
            line.waiting.push_front(waiter);
        }
        pass_turn(&mut line);
    }
}

/// A read waiting in line. Dropped after the turn was sent to it but before it took it (its
/// call cancelled), it passes the turn on, so the line never stalls.
struct Waiting<'a> {
    line: &'a Mutex<Line>,
    rx: Option<oneshot::Receiver<Wake>>,
}

impl Waiting<'_> {
    async fn woken(&mut self) -> Result<Wake, oneshot::error::RecvError> {
        let woken = self.rx.as_mut().expect("woken once").await;
        self.rx = None;
        woken
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if let Ok(Wake::Lead) = rx.try_recv() {
                pass_turn(&mut lock(self.line));
            }
        }
    }
}

/// The committed value of `id`, alone.
async fn read_one(pool: &Pool, id: &Id) -> Result<Option<Committed>, QueueError> {
    let row = pool
        .query(&ROW_OF_KEY)
        .bind(id.0.as_str())
        .bind(id.1.as_str())
        .fetch_optional()
        .await?;
    match row {
        Some(row) => Ok(Some((row.get("value")?, row.get("revision")?))),
        None => Ok(None),
    }
}

/// The committed values of `ids` (the absent ones left out), in one statement.
async fn read_many(pool: &Pool, ids: BTreeSet<&Id>) -> Result<BTreeMap<Id, Committed>, QueueError> {
    let query = bind_keys(pool.query(&ROWS_OF_KEYS), pool.dialect(), ids);
    let mut found = BTreeMap::new();
    for row in query.fetch_all().await? {
        found.insert(
            (row.get("bucket")?, row.get("key")?),
            (row.get("value")?, row.get("revision")?),
        );
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_in_line<'a>(line: &'a Mutex<Line>, key: &str) -> Waiting<'a> {
        let (tx, rx) = oneshot::channel();
        lock(line)
            .waiting
            .push_back((("b".to_string(), key.to_string()), tx));
        Waiting { line, rx: Some(rx) }
    }

    fn woken_to_lead(waiting: &mut Waiting<'_>) -> bool {
        matches!(waiting.rx.as_mut().unwrap().try_recv(), Ok(Wake::Lead))
    }

    fn busy_line() -> Mutex<Line> {
        Mutex::new(Line {
            busy: true,
            waiting: VecDeque::new(),
        })
    }

    #[test]
    fn a_read_cancelled_after_its_turn_came_passes_it_on() {
        let line = busy_line();
        let first = wait_in_line(&line, "a");
        let mut second = wait_in_line(&line, "b");
        // The leader is done: the first waiting read gets the turn, and is cancelled before
        // it takes it.
        pass_turn(&mut lock(&line));
        drop(first);
        assert!(woken_to_lead(&mut second), "the next read leads");
        assert!(lock(&line).busy);
    }

    #[test]
    fn a_cancelled_leader_puts_its_reads_back_and_passes_the_turn() {
        let line = busy_line();
        let mut taken = wait_in_line(&line, "a");
        let mut after = wait_in_line(&line, "b");
        let batch = vec![lock(&line).waiting.pop_front().unwrap()];
        drop(Turn { line: &line, batch });
        assert!(woken_to_lead(&mut taken), "the unanswered read leads");
        assert!(!woken_to_lead(&mut after), "one leader at a time");
        assert_eq!(lock(&line).waiting.len(), 1);
    }

    #[test]
    fn the_line_is_idle_once_no_read_waits() {
        let line = busy_line();
        let cancelled = wait_in_line(&line, "a");
        drop(cancelled);
        drop(Turn {
            line: &line,
            batch: Vec::new(),
        });
        let line = lock(&line);
        assert!(!line.busy && line.waiting.is_empty());
    }
}
