//! The handler registry: the handlers currently deployed, each compiled once into an
//! `InstancePre`, swapped atomically when a new version arrives. In-flight messages hold an
//! `Arc` to the version that started them, so a swap never disturbs them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use arc_swap::ArcSwap;
use bytesize::ByteSize;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Linker;

use super::bindings::{HandlerPre, HostState, add_to_linker};
use super::cache::ComponentCache;
pub use super::cache::Origin;
use super::deploy_log::DeployLog;
use super::engine::{EpochTicker, build_engine};
use super::instances::InstanceReturns;
use super::memory::largest_initial_memory;
use super::outbound::OutboundHost;
use crate::config::{Config, Preopen, is_valid_name};

/// Why a handler file was not deployed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The file could not be read.
    #[error("{path}: cannot read: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error (printed, not chained, so a report shows it once).
        error: std::io::Error,
    },
    /// The file name does not give a valid handler name.
    #[error("{path}: `{name}` is not a valid handler name (letters, digits, `_`, `-`, `.`)")]
    BadName {
        /// The file.
        path: PathBuf,
        /// The name taken from it.
        name: String,
    },
    /// The file is not a WebAssembly component wasmtime can compile.
    #[error("{path}: not a valid WebAssembly component: {reason}")]
    Compile {
        /// The file.
        path: PathBuf,
        /// The compiler's message.
        reason: String,
    },
    /// The handler's memory cap is below the memory the component starts with: it could
    /// never be instantiated.
    #[error(
        "{path}: memory cap {cap} is below the handler's initial memory {initial}: raise `memory` in [handlers.{name}] (at most host.max_instance_memory)"
    )]
    Memory {
        /// The file.
        path: PathBuf,
        /// The handler name.
        name: String,
        /// The cap (`[handlers.NAME] memory` or `host.instance_memory`).
        cap: ByteSize,
        /// The largest initial memory of the component.
        initial: ByteSize,
    },
    /// The component makes outbound HTTP requests, which its handler is not granted.
    #[error(
        "{path}: handler `{name}` makes outbound HTTP requests (it imports wasi:http), but no origin is allowed: list the origins it may call in [handlers.{name}] allowed_outbound_hosts, e.g. allowed_outbound_hosts = [\"https://api.example.com\"] (linker: {detail})"
    )]
    NeedsOutboundHttp {
        /// The file.
        path: PathBuf,
        /// The handler name.
        name: String,
        /// What the linker said.
        detail: String,
    },
    /// The component does not fit the `wharf:handler/handler` world.
    #[error("{path}: does not match the wharf:handler/handler world: {reason}")]
    World {
        /// The file.
        path: PathBuf,
        /// What is missing or mismatched.
        reason: String,
    },
}

/// What a handler may reach inside its sandbox (from `[handlers.NAME]`).
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Environment variables.
    pub env: Vec<(String, String)>,
    /// Mounted directories.
    pub preopens: Vec<Preopen>,
    /// Network access.
    pub network: bool,
    /// The host's own stdout/stderr.
    pub inherit_stdio: bool,
    /// Origins the handler may send HTTP requests to.
    pub outbound: Arc<[OutboundHost]>,
    /// Whether `wasi:http` is linked (the handler has `allowed_outbound_hosts`).
    pub http: bool,
    /// The key-value buckets it may open.
    pub keyvalue: Arc<[String]>,
}

/// One deployed handler version.
pub struct LoadedHandler {
    /// Handler name (the file stem).
    pub name: Arc<str>,
    /// The file it was loaded from (from the store: `store:NAME@VERSION`).
    pub path: PathBuf,
    /// Its version in the store (`None`: loaded from a file).
    pub version: Option<i64>,
    /// SHA-256 of the file, hex.
    pub hash: String,
    /// Size of the file in bytes.
    pub size: u64,
    /// When this version was deployed.
    pub loaded_at: SystemTime,
    /// Linear-memory cap of each instance.
    pub memory_limit: ByteSize,
    /// Sandbox grants.
    pub grants: Grants,
    pub(crate) pre: HandlerPre<HostState>,
    /// The engine's returned instances, for a call that finds the pool full.
    pub(crate) returns: Arc<InstanceReturns>,
}

/// What loading a file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// A new version is now serving.
    Deployed {
        /// Handler name.
        name: String,
        /// Content hash.
        hash: String,
        /// Where the compiled component came from.
        origin: Origin,
        /// Milliseconds spent compiling or reading the cache.
        millis: u128,
    },
    /// The file has the content already serving: nothing changed.
    Unchanged {
        /// Handler name.
        name: String,
    },
}

/// The set of deployed handlers.
pub struct HandlerRegistry {
    engine: Engine,
    /// Instances given back to the engine's pool.
    returns: Arc<InstanceReturns>,
    /// Whether the handlers found at start are still being compiled.
    loading: std::sync::atomic::AtomicBool,
    linker: Linker<HostState>,
    /// The linker of handlers with `allowed_outbound_hosts`: adds `wasi:http`.
    http_linker: Linker<HostState>,
    config: Arc<Config>,
    cache: ComponentCache,
    handlers: ArcSwap<HashMap<String, Arc<LoadedHandler>>>,
    changes: tokio::sync::watch::Sender<u64>,
    /// The recent deploys, rejections and removals.
    pub deploys: DeployLog,
    /// Grants narrowed for a dry run (replay): no network, no host stdio, read-only
    /// mounts, every outbound HTTP request refused.
    dry_run: bool,
    _ticker: EpochTicker,
}

impl HandlerRegistry {
    /// An empty registry with its own engine, sized and sandboxed per `config`.
    pub fn new(config: Arc<Config>) -> wasmtime::Result<Self> {
        let engine = build_engine(&config.host)?;
        let mut linker = Linker::new(&engine);
        add_to_linker(&mut linker, false)?;
        let mut http_linker = Linker::new(&engine);
        add_to_linker(&mut http_linker, true)?;
        let cache = ComponentCache::new(&config.host.cache_dir, &engine);
        Ok(HandlerRegistry {
            _ticker: EpochTicker::start(engine.clone()),
            engine,
            returns: Arc::default(),
            loading: Default::default(),
            linker,
            http_linker,
            config,
            cache,
            handlers: ArcSwap::from_pointee(HashMap::new()),
            changes: tokio::sync::watch::channel(0).0,
            deploys: DeployLog::default(),
            dry_run: false,
        })
    }

    /// A registry whose handlers run without side effects beyond their return value: no
    /// network, no host stdio, read-only mounts, every outbound HTTP request refused (the
    /// `wasi:http` link is kept so that such components still load).
    pub fn dry_run(config: Arc<Config>) -> wasmtime::Result<Self> {
        let mut registry = Self::new(config)?;
        registry.dry_run = true;
        Ok(registry)
    }

    /// The serving version of a handler.
    pub fn get(&self, name: &str) -> Option<Arc<LoadedHandler>> {
        self.handlers.load().get(name).cloned()
    }

    /// Every serving handler, by name.
    pub fn list(&self) -> Vec<Arc<LoadedHandler>> {
        let mut all: Vec<_> = self.handlers.load().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Whether the handlers found at start are still being compiled (a handler missing now
    /// may still come).
    pub fn loading(&self) -> bool {
        self.loading.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Mark the start-up compile as under way or done (done wakes the subscribers).
    pub fn set_loading(&self, loading: bool) {
        self.loading
            .store(loading, std::sync::atomic::Ordering::SeqCst);
        if !loading {
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// A receiver that changes whenever a handler is deployed or removed.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether a configured queue runs handler `name`.
    pub fn serves_a_queue(&self, name: &str) -> bool {
        self.config
            .queues
            .values()
            .any(|q| q.handler() == Some(name))
    }

    /// The configuration file the registry was made from.
    pub fn config_file(&self) -> &Path {
        &self.config.source
    }

    /// The handler name a file deploys, if it is a `.wasm` file.
    pub fn name_of(path: &Path) -> Option<String> {
        if path.extension().and_then(|e| e.to_str()) != Some("wasm") {
            return None;
        }
        path.file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_string)
    }

    /// Compile `path` and make it the serving version of its handler. Blocking (compiles):
    /// run it off the async threads. On error the previous version keeps serving.
    pub fn load_file(&self, path: &Path) -> Result<LoadOutcome, DeployError> {
        let name = Self::name_of(path).unwrap_or_default();
        let bytes = std::fs::read(path).map_err(|error| DeployError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        self.load_bytes(&name, path, &bytes, None)
    }

    /// Compile version `version` of handler `name` from the store and make it the serving
    /// version. Blocking, as [`HandlerRegistry::load_file`]; on error the previous version
    /// keeps serving.
    pub fn load_stored(
        &self,
        name: &str,
        version: i64,
        bytes: &[u8],
    ) -> Result<LoadOutcome, DeployError> {
        let path = PathBuf::from(format!("store:{name}@{version}"));
        self.load_bytes(name, &path, bytes, Some(version))
    }

    /// Check that `bytes` would deploy as handler `name` with this configuration (name,
    /// memory, world, grants), without serving it. Blocking (compiles; the compiled
    /// component goes to the cache, so a host on this machine finds it there).
    pub fn check(&self, name: &str, path: &Path, bytes: &[u8]) -> Result<(), DeployError> {
        self.prepare(name, path, bytes, None).map(|_| ())
    }

    fn load_bytes(
        &self,
        name: &str,
        path: &Path,
        bytes: &[u8],
        version: Option<i64>,
    ) -> Result<LoadOutcome, DeployError> {
        let hash = hex::encode(Sha256::digest(bytes));
        if self
            .get(name)
            .is_some_and(|h| h.hash == hash && h.version == version)
        {
            return Ok(LoadOutcome::Unchanged {
                name: name.to_string(),
            });
        }
        let started = Instant::now();
        let (loaded, origin) = self.prepare(name, path, bytes, version)?;
        let millis = started.elapsed().as_millis();
        let loaded = Arc::new(loaded);
        self.handlers.rcu(|current| {
            let mut next = HashMap::clone(current);
            next.insert(name.to_string(), loaded.clone());
            next
        });
        self.changes.send_modify(|n| *n += 1);
        Ok(LoadOutcome::Deployed {
            name: name.to_string(),
            hash,
            origin,
            millis,
        })
    }

    /// Compile and link `bytes` as handler `name` with its grants: everything a deploy does
    /// but the swap.
    fn prepare(
        &self,
        name: &str,
        path: &Path,
        bytes: &[u8],
        version: Option<i64>,
    ) -> Result<(LoadedHandler, Origin), DeployError> {
        if !is_valid_name(name) {
            return Err(DeployError::BadName {
                path: path.to_path_buf(),
                name: name.to_string(),
            });
        }
        let hash = hex::encode(Sha256::digest(bytes));
        let cap = self.config.handler_memory(name);
        if let Some(initial) = largest_initial_memory(bytes)
            && initial > cap.as_u64()
        {
            return Err(DeployError::Memory {
                path: path.to_path_buf(),
                name: name.to_string(),
                cap,
                initial: ByteSize::b(initial),
            });
        }
        let settings = self.config.handler(name);
        let http = !settings.allowed_outbound_hosts.is_empty();
        let outbound: Arc<[OutboundHost]> = if self.dry_run {
            Arc::from([])
        } else {
            settings.allowed_outbound_hosts.clone().into()
        };
        let (pre, origin) = match self.serving_with(&hash, http) {
            // Byte-identical files under several names share one compiled component.
            Some(pre) => (pre, Origin::Shared),
            None => self.compile(path, name, &hash, bytes, http)?,
        };
        let mut env: Vec<(String, String)> = settings.env.clone().into_iter().collect();
        env.extend(
            settings
                .inherit_env
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v))),
        );
        let loaded = LoadedHandler {
            name: Arc::from(name),
            path: path.to_path_buf(),
            version,
            hash,
            size: bytes.len() as u64,
            loaded_at: SystemTime::now(),
            memory_limit: cap,
            grants: Grants {
                env,
                preopens: settings
                    .preopens
                    .iter()
                    .cloned()
                    .map(|mut p| {
                        p.read_only |= self.dry_run;
                        p
                    })
                    .collect(),
                network: settings.network && !self.dry_run,
                inherit_stdio: settings.inherit_stdio && !self.dry_run,
                outbound,
                http,
                keyvalue: settings.keyvalue.clone().into(),
            },
            pre,
            returns: self.returns.clone(),
        };
        Ok((loaded, origin))
    }

    /// The compiled component of a serving handler whose file has content `hash` and that is
    /// linked to `wasi:http` exactly when `http` is.
    fn serving_with(&self, hash: &str, http: bool) -> Option<HandlerPre<HostState>> {
        self.handlers
            .load()
            .values()
            .find(|h| h.hash == hash && h.grants.http == http)
            .map(|h| h.pre.clone())
    }

    /// Compile `bytes` (or read the compiled cache) and link it to the handler world.
    fn compile(
        &self,
        path: &Path,
        name: &str,
        hash: &str,
        bytes: &[u8],
        http: bool,
    ) -> Result<(HandlerPre<HostState>, Origin), DeployError> {
        let (component, origin) =
            self.cache
                .load(&self.engine, hash, bytes)
                .map_err(|e| DeployError::Compile {
                    path: path.to_path_buf(),
                    reason: if bytes.starts_with(b"\0asm") {
                        format!("{e:#}")
                    } else {
                        format!(
                            "the file does not start with the WebAssembly header (`\\0asm`) and is not WebAssembly text either: build the handler as a component (e.g. `cargo build --target wasm32-wasip2`, `wharf handlers new`) and deploy the `.wasm` it writes (detail: {e:#})"
                        )
                    },
                })?;
        let world_error = |e: wasmtime::Error| {
            let detail = format!("{e:#}");
            if !http && detail.contains("wasi:http/") {
                return DeployError::NeedsOutboundHttp {
                    path: path.to_path_buf(),
                    name: name.to_string(),
                    detail,
                };
            }
            DeployError::World {
                path: path.to_path_buf(),
                reason: detail,
            }
        };
        let linker = if http {
            &self.http_linker
        } else {
            &self.linker
        };
        let instance_pre = linker.instantiate_pre(&component).map_err(world_error)?;
        let pre = HandlerPre::new(instance_pre).map_err(world_error)?;
        Ok((pre, origin))
    }

    /// Stop serving a handler (its file was removed). Returns whether it was serving.
    pub fn remove(&self, name: &str) -> bool {
        let mut removed = false;
        self.handlers.rcu(|current| {
            let mut next = HashMap::clone(current);
            removed = next.remove(name).is_some();
            next
        });
        if removed {
            self.changes.send_modify(|n| *n += 1);
        }
        removed
    }
}
