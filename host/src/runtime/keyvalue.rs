//! The `wasi:keyvalue` imports (`store`, `atomics`, `batch` at 0.2.0-draft, the WIT under
//! `wit/deps/keyvalue`) as the host implements them for a handler: each operation goes to
//! the call's [`StateCall`], which reads the SQL store and stages every change for the
//! settlement. An error the guest can act on is a `wasi:keyvalue` `error` (`other`, with
//! the reason and what to do); a bad resource handle traps.

use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker, Resource};

use super::bindings::HostState;
use super::state::{StateCall, StateError};

/// Code generated from `wit/deps/keyvalue`; the WIT files document every function.
#[allow(missing_docs)]
mod generated {
    wasmtime::component::bindgen!({
        path: "../wit/deps/keyvalue",
        world: "wasi:keyvalue/imports",
        imports: { default: async | trappable },
        with: {
            "wasi:keyvalue/store.bucket": super::Bucket,
        },
    });
}

use generated::wasi::keyvalue::{atomics, batch, store};
use store::{Error, KeyResponse};

/// An open bucket: its name.
pub struct Bucket {
    name: String,
}

/// What an operation answers: a trap (outer) or the guest-visible result (inner).
type Answer<T> = wasmtime::Result<Result<T, Error>>;

/// The guest's error for `e`: `other` with the reason, which for a bucket not granted names
/// the handler and the key to set (`access-denied` would carry no text).
fn to_guest(handler: &str, e: StateError) -> Error {
    if let StateError::NotGranted { .. } = e {
        tracing::warn!(handler, "{e}");
    }
    Error::Other(e.to_string())
}

impl HostState {
    /// The call's state and the bucket's name.
    fn bucket(&self, bucket: &Resource<Bucket>) -> wasmtime::Result<(Arc<StateCall>, String)> {
        let name = self.table.get(bucket)?.name.clone();
        let state = self
            .state
            .clone()
            .ok_or_else(|| wasmtime::Error::msg("no key-value state in this call"))?;
        Ok((state, name))
    }

    fn answer<T>(&self, result: Result<T, StateError>) -> Answer<T> {
        Ok(result.map_err(|e| to_guest(&self.handler, e)))
    }
}

/// Add the `wasi:keyvalue` interfaces to a linker.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    generated::Imports::add_to_linker::<_, HasSelf<HostState>>(linker, |state| state)
}

impl store::Host for HostState {
    async fn open(&mut self, identifier: String) -> Answer<Resource<Bucket>> {
        let Some(state) = self.state.clone() else {
            // A call without state: its handler has no bucket granted.
            let denied = StateError::NotGranted {
                handler: self.handler.to_string(),
                bucket: identifier,
            };
            return self.answer(Err(denied));
        };
        if let Err(e) = state.open(&identifier) {
            return self.answer(Err(e));
        }
        Ok(Ok(self.table.push(Bucket { name: identifier })?))
    }
}

impl store::HostBucket for HostState {
    async fn get(&mut self, bucket: Resource<Bucket>, key: String) -> Answer<Option<Vec<u8>>> {
        let (state, name) = self.bucket(&bucket)?;
        let result = state.get(&name, &key).await;
        self.answer(result)
    }

    async fn set(&mut self, bucket: Resource<Bucket>, key: String, value: Vec<u8>) -> Answer<()> {
        let (state, name) = self.bucket(&bucket)?;
        self.answer(state.set(&name, &key, value))
    }

    async fn delete(&mut self, bucket: Resource<Bucket>, key: String) -> Answer<()> {
        let (state, name) = self.bucket(&bucket)?;
        self.answer(state.delete(&name, &key))
    }

    async fn exists(&mut self, bucket: Resource<Bucket>, key: String) -> Answer<bool> {
        let (state, name) = self.bucket(&bucket)?;
        let result = state.get(&name, &key).await;
        self.answer(result.map(|v| v.is_some()))
    }

    async fn list_keys(
        &mut self,
        bucket: Resource<Bucket>,
        cursor: Option<u64>,
    ) -> Answer<KeyResponse> {
        let (state, name) = self.bucket(&bucket)?;
        let page = state.keys(&name, cursor.unwrap_or(0)).await;
        self.answer(page.map(|(keys, cursor)| KeyResponse { keys, cursor }))
    }

    async fn drop(&mut self, bucket: Resource<Bucket>) -> wasmtime::Result<()> {
        self.table.delete(bucket)?;
        Ok(())
    }
}

impl atomics::Host for HostState {
    async fn increment(
        &mut self,
        bucket: Resource<Bucket>,
        key: String,
        delta: u64,
    ) -> Answer<u64> {
        let (state, name) = self.bucket(&bucket)?;
        let result = state.increment(&name, &key, delta).await;
        self.answer(result)
    }
}

impl batch::Host for HostState {
    async fn get_many(
        &mut self,
        bucket: Resource<Bucket>,
        keys: Vec<String>,
    ) -> Answer<Vec<Option<(String, Vec<u8>)>>> {
        let (state, name) = self.bucket(&bucket)?;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let result = state.get(&name, &key).await;
            match result {
                Ok(value) => out.push(value.map(|v| (key, v))),
                Err(e) => return self.answer(Err(e)),
            }
        }
        Ok(Ok(out))
    }

    async fn set_many(
        &mut self,
        bucket: Resource<Bucket>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> Answer<()> {
        let (state, name) = self.bucket(&bucket)?;
        let result = key_values
            .into_iter()
            .try_for_each(|(key, value)| state.set(&name, &key, value));
        self.answer(result)
    }

    async fn delete_many(&mut self, bucket: Resource<Bucket>, keys: Vec<String>) -> Answer<()> {
        let (state, name) = self.bucket(&bucket)?;
        let result = keys.iter().try_for_each(|key| state.delete(&name, key));
        self.answer(result)
    }
}
