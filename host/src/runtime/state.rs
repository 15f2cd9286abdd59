//! A handler's key-value state as one call sees it ([`StateCall`]): reads see the committed
//! state plus the call's own changes; every change is staged here and handed to the
//! settlement ([`StateCall::take`]), which commits it with a successful outcome and drops it
//! with any other. A set or delete of a key the call read first carries the revision it read,
//! so a change another call committed in between is found at commit (a state conflict: the
//! message runs again). Increments commit as increments and are never checked.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::queue::{QueueError, QueueStore, StateChange, StateWrite, counter_bytes, counter_value};

/// Longest key, in bytes.
pub const MAX_STATE_KEY_BYTES: usize = 512;

/// Largest value, in bytes.
pub const MAX_STATE_VALUE_BYTES: usize = 1 << 20;

/// Most changes (sets, deletes, increments) one call may stage.
pub const MAX_STATE_WRITES: usize = 1000;

/// Keys per page of `list-keys`.
pub const STATE_PAGE: u32 = 1000;

/// Why a key-value operation failed; the text is what the guest sees.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The bucket is not granted to the handler.
    #[error(
        "bucket `{bucket}` is not granted to handler `{handler}`: add it to [handlers.{handler}] keyvalue"
    )]
    NotGranted {
        /// The handler.
        handler: String,
        /// The bucket it asked for.
        bucket: String,
    },
    /// A key that is empty or too long.
    #[error("key `{key}` is {len} bytes: a key has 1 to {MAX_STATE_KEY_BYTES} bytes")]
    BadKey {
        /// The key, shortened.
        key: String,
        /// Its length.
        len: usize,
    },
    /// A value over the limit.
    #[error(
        "the value for `{key}` is {len} bytes, more than the {MAX_STATE_VALUE_BYTES} a value may have"
    )]
    ValueTooLarge {
        /// The key.
        key: String,
        /// The value's length.
        len: usize,
    },
    /// More changes than a call may stage.
    #[error(
        "a handler call may change at most {MAX_STATE_WRITES} keys (sets, deletes and increments)"
    )]
    TooManyWrites,
    /// An increment of a value that is not a counter.
    #[error(
        "`{bucket}/{key}` is not a counter: increment needs a value of decimal digits (an unsigned 64-bit number)"
    )]
    NotACounter {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
    /// An increment past `u64::MAX`.
    #[error("incrementing `{bucket}/{key}` would pass the largest counter (2^64 - 1)")]
    Overflow {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
    /// The store failed.
    #[error("reading state failed: {0}")]
    Store(#[from] QueueError),
}

/// What one call staged for one key.
#[derive(Debug, Default)]
struct Pending {
    /// The change to commit.
    change: Option<StateChange>,
    /// The committed revision the call read (0: absent), if it read the key.
    read: Option<i64>,
}

/// A call's staged changes by (bucket, key), and how many it made.
type Staged = (BTreeMap<(String, String), Pending>, usize);

/// One handler call's view of its state and its staged changes.
pub struct StateCall {
    store: Arc<dyn QueueStore>,
    handler: Arc<str>,
    granted: Arc<[String]>,
    staged: Mutex<Staged>,
    /// Every committed read, kept for a replay's report (`None`: not kept).
    reads: Option<Mutex<Vec<StateRead>>>,
}

/// A committed value a call read (kept for a replay's report).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StateRead {
    /// The bucket.
    pub bucket: String,
    /// The key.
    pub key: String,
    /// The committed value (`None`: absent).
    pub value: Option<Vec<u8>>,
}

impl StateCall {
    /// The state of one call of `handler`, which may open the buckets `granted`.
    pub fn new(store: Arc<dyn QueueStore>, handler: Arc<str>, granted: Arc<[String]>) -> Arc<Self> {
        Arc::new(StateCall {
            store,
            handler,
            granted,
            staged: Mutex::new((BTreeMap::new(), 0)),
            reads: None,
        })
    }

    /// A call whose committed reads are kept ([`StateCall::reads`]): a replay, which shows
    /// what the candidate read and would change and commits nothing.
    pub fn recording(
        store: Arc<dyn QueueStore>,
        handler: Arc<str>,
        granted: Arc<[String]>,
    ) -> Arc<Self> {
        Arc::new(StateCall {
            store,
            handler,
            granted,
            staged: Mutex::new((BTreeMap::new(), 0)),
            reads: Some(Mutex::new(Vec::new())),
        })
    }

    /// The committed values read so far (kept by a [`StateCall::recording`] call only).
    pub fn reads(&self) -> Vec<StateRead> {
        self.reads
            .as_ref()
            .map(|r| r.lock().expect("reads").clone())
            .unwrap_or_default()
    }

    /// Check that `bucket` may be opened.
    pub fn open(&self, bucket: &str) -> Result<(), StateError> {
        if self.granted.iter().any(|b| b == bucket) {
            return Ok(());
        }
        Err(StateError::NotGranted {
            handler: self.handler.to_string(),
            bucket: bucket.to_string(),
        })
    }

    fn check_key(key: &str) -> Result<(), StateError> {
        if key.is_empty() || key.len() > MAX_STATE_KEY_BYTES {
            return Err(StateError::BadKey {
                key: key.chars().take(40).collect(),
                len: key.len(),
            });
        }
        Ok(())
    }

    /// The committed value and revision of a key; `(None, 0)` when absent.
    async fn committed(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<(Option<Vec<u8>>, i64), StateError> {
        let (value, revision) = match self.store.state_read(bucket, key).await? {
            Some((value, revision)) => (Some(value), revision),
            None => (None, 0),
        };
        if let Some(reads) = &self.reads {
            reads.lock().expect("reads").push(StateRead {
                bucket: bucket.to_string(),
                key: key.to_string(),
                value: value.clone(),
            });
        }
        Ok((value, revision))
    }

    /// The value of `key` as this call sees it.
    pub async fn get(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        Self::check_key(key)?;
        let id = (bucket.to_string(), key.to_string());
        let add = {
            let staged = self.staged.lock().expect("staged state");
            match staged.0.get(&id).and_then(|p| p.change.as_ref()) {
                Some(StateChange::Set(value)) => return Ok(Some(value.clone())),
                Some(StateChange::Delete) => return Ok(None),
                Some(StateChange::Add(delta)) => Some(*delta),
                None => None,
            }
        };
        let (value, revision) = self.committed(bucket, key).await?;
        let mut staged = self.staged.lock().expect("staged state");
        staged.0.entry(id).or_default().read.get_or_insert(revision);
        Ok(match add {
            Some(delta) => {
                let base = value.as_deref().and_then(counter_value).unwrap_or(0);
                Some(counter_bytes(base.saturating_add(delta)))
            }
            None => value,
        })
    }

    /// Stage `change` for `key`.
    fn stage(&self, bucket: &str, key: &str, change: StateChange) -> Result<(), StateError> {
        Self::check_key(key)?;
        if let StateChange::Set(value) = &change
            && value.len() > MAX_STATE_VALUE_BYTES
        {
            return Err(StateError::ValueTooLarge {
                key: key.to_string(),
                len: value.len(),
            });
        }
        let mut staged = self.staged.lock().expect("staged state");
        if staged.1 >= MAX_STATE_WRITES {
            return Err(StateError::TooManyWrites);
        }
        staged.1 += 1;
        staged
            .0
            .entry((bucket.to_string(), key.to_string()))
            .or_default()
            .change = Some(change);
        Ok(())
    }

    /// Stage a set.
    pub fn set(&self, bucket: &str, key: &str, value: Vec<u8>) -> Result<(), StateError> {
        self.stage(bucket, key, StateChange::Set(value))
    }

    /// Stage a delete.
    pub fn delete(&self, bucket: &str, key: &str) -> Result<(), StateError> {
        self.stage(bucket, key, StateChange::Delete)
    }

    /// Stage an increment by `delta`; returns the committed value plus this call's changes.
    pub async fn increment(&self, bucket: &str, key: &str, delta: u64) -> Result<u64, StateError> {
        Self::check_key(key)?;
        let not_a_counter = || StateError::NotACounter {
            bucket: bucket.to_string(),
            key: key.to_string(),
        };
        let overflow = || StateError::Overflow {
            bucket: bucket.to_string(),
            key: key.to_string(),
        };
        let id = (bucket.to_string(), key.to_string());
        let before = {
            let staged = self.staged.lock().expect("staged state");
            staged.0.get(&id).and_then(|p| p.change.clone())
        };
        let (change, value) = match before {
            Some(StateChange::Set(value)) => {
                let base = counter_value(&value).ok_or_else(not_a_counter)?;
                let next = base.checked_add(delta).ok_or_else(overflow)?;
                (StateChange::Set(counter_bytes(next)), next)
            }
            Some(StateChange::Delete) => (StateChange::Set(counter_bytes(delta)), delta),
            earlier => {
                let (value, _) = self.committed(bucket, key).await?;
                let base = match value {
                    Some(bytes) => counter_value(&bytes).ok_or_else(not_a_counter)?,
                    None => 0,
                };
                let staged = match earlier {
                    Some(StateChange::Add(d)) => d,
                    _ => 0,
                };
                let total = staged.checked_add(delta).ok_or_else(overflow)?;
                let next = base.checked_add(total).ok_or_else(overflow)?;
                (StateChange::Add(total), next)
            }
        };
        self.stage(bucket, key, change)?;
        Ok(value)
    }

    /// One page of the keys of `bucket` as this call sees them, in key order: the committed
    /// keys from position `cursor` without the ones this call deleted; on the last page, the
    /// keys this call added. Returns the keys and the next page's cursor.
    pub async fn keys(
        &self,
        bucket: &str,
        cursor: u64,
    ) -> Result<(Vec<String>, Option<u64>), StateError> {
        let committed = self.store.state_keys(bucket, cursor, STATE_PAGE).await?;
        let last = (committed.len() as u32) < STATE_PAGE;
        let (mut deleted, mut added) = (Vec::new(), Vec::new());
        {
            let staged = self.staged.lock().expect("staged state");
            for ((b, key), pending) in &staged.0 {
                match (b == bucket, &pending.change) {
                    (true, Some(StateChange::Delete)) => deleted.push(key.clone()),
                    (true, Some(_)) => added.push(key.clone()),
                    _ => {}
                }
            }
        }
        let mut keys: Vec<String> = committed
            .iter()
            .filter(|k| !deleted.contains(k))
            .cloned()
            .collect();
        if last {
            for key in added {
                if self.store.state_read(bucket, &key).await?.is_none() {
                    keys.push(key);
                }
            }
        }
        let next = (!last).then(|| cursor + STATE_PAGE as u64);
        Ok((keys, next))
    }

    /// The staged changes, in key order, for the settlement: a set or delete of a key the
    /// call read first expects the revision it read.
    pub fn take(&self) -> Vec<StateWrite> {
        let mut staged = self.staged.lock().expect("staged state");
        std::mem::take(&mut staged.0)
            .into_iter()
            .filter_map(|((bucket, key), pending)| {
                let change = pending.change?;
                let expect = match change {
                    StateChange::Add(_) => None,
                    _ => pending.read,
                };
                Some(StateWrite {
                    bucket,
                    key,
                    change,
                    expect,
                })
            })
            .collect()
    }
}
