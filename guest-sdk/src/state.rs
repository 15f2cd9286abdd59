//! Key-value state through the standard `wasi:keyvalue` imports (granted per handler with
//! `[handlers.NAME] keyvalue = ["bucket", …]`). Every change is staged and committed with the
//! message's outcome: it exists if and only if this attempt succeeds. Reads see the committed
//! state plus this call's own changes; a set of a key this call read first is checked at
//! commit (a change by another call in between runs the message again).
//!
//! ```rust,ignore
//! let orders = wharf_guest::state::Bucket::open("orders")?;
//! orders.increment("events:c1", 1)?;                     // a counter
//! let step: Option<String> = orders.get_json("step:o-1")?; // a saga's step
//! orders.set_json("step:o-1", &"paid")?;
//! ```

use crate::HandlerError;
use crate::bindings::wasi::keyvalue::{atomics, store};

/// A key-value operation failed (a bucket not granted, a limit, a value that is not a
/// counter, the store); the text says why. `?` in a handler turns it into a transient
/// failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError(pub String);

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StateError {}

impl From<store::Error> for StateError {
    fn from(e: store::Error) -> Self {
        StateError(match e {
            store::Error::NoSuchStore => "no such bucket".to_string(),
            store::Error::AccessDenied => "access denied".to_string(),
            store::Error::Other(text) => text,
        })
    }
}

impl From<StateError> for HandlerError {
    fn from(e: StateError) -> Self {
        HandlerError::Transient(e.0)
    }
}

/// An open bucket.
pub struct Bucket(store::Bucket);

impl Bucket {
    /// Open `name` (it must be granted to the handler).
    pub fn open(name: &str) -> Result<Bucket, StateError> {
        Ok(Bucket(store::open(name)?))
    }

    /// The value of `key`, as this call sees it.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.0.get(key)?)
    }

    /// The value of `key` as JSON; `None` when absent. A value that is not such JSON is an
    /// error naming the key.
    pub fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StateError> {
        self.get(key)?
            .map(|bytes| serde_json::from_slice(&bytes))
            .transpose()
            .map_err(|e| {
                StateError(format!(
                    "the value of `{key}` is not the JSON asked for: {e}"
                ))
            })
    }

    /// Stage setting `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StateError> {
        Ok(self.0.set(key, value)?)
    }

    /// Stage setting `key` to `value` as JSON.
    pub fn set_json<T: serde::Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
    ) -> Result<(), StateError> {
        let bytes = serde_json::to_vec(value).map_err(|e| StateError(e.to_string()))?;
        self.set(key, &bytes)
    }

    /// Stage deleting `key`.
    pub fn delete(&self, key: &str) -> Result<(), StateError> {
        Ok(self.0.delete(key)?)
    }

    /// Stage adding `delta` to the counter `key` (absent counts as 0; stored as decimal
    /// digits); returns its value with this call's changes. Never a conflict.
    pub fn increment(&self, key: &str, delta: u64) -> Result<u64, StateError> {
        Ok(atomics::increment(&self.0, key, delta)?)
    }

    /// The counter `key` as this call sees it (absent: 0).
    pub fn counter(&self, key: &str) -> Result<u64, StateError> {
        match self.get(key)? {
            None => Ok(0),
            Some(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| StateError(format!("`{key}` is not a counter"))),
        }
    }
}
