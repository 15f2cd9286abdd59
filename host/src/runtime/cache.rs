//! Compiled components cached on disk, keyed by the `.wasm` content hash and the engine's
//! compatibility hash, so a restart does not recompile unchanged handlers. Components are
//! always served from their cache file, memory-mapped: resident memory holds only the code
//! and data pages in use, not a private copy of every compiled handler.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// The on-disk cache of one engine.
pub struct ComponentCache {
    dir: PathBuf,
    engine_key: String,
}

/// Where a component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Compiled now.
    Compiled,
    /// Read from the cache.
    Cached,
    /// The same content already serves under another handler name: its compiled component
    /// is shared.
    Shared,
}

impl ComponentCache {
    /// A cache in `dir` for components of `engine`.
    pub fn new(dir: &Path, engine: &Engine) -> Self {
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ComponentCache {
            dir: dir.to_path_buf(),
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    fn path_for(&self, content_hash: &str) -> PathBuf {
        self.dir
            .join(format!("{content_hash}-{}.cwasm", self.engine_key))
    }

    /// The component for `bytes` (whose SHA-256 is `content_hash`): from the cache when
    /// present and readable, otherwise compiled and written to the cache.
    pub fn load(
        &self,
        engine: &Engine,
        content_hash: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, Origin)> {
        let path = self.path_for(content_hash);
        if path.exists() {
            // SAFETY: files in the cache directory are only written by `store` below, from
            // components this engine compiled; the name pins content and engine settings.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok((component, Origin::Cached)),
                Err(e) => {
                    tracing::warn!(file = %path.display(), "ignoring unreadable compiled-component cache entry: {e}")
                }
            }
        }
        let component = compile_on_own_threads(engine, bytes)?;
        release_compiler_memory();
        if let Err(e) = self.store(&path, &component) {
            tracing::warn!(dir = %self.dir.display(), "cannot write the compiled-component cache: {e}");
            return Ok((component, Origin::Compiled));
        }
        // Serve from the file just written rather than from the compiler's heap copy: its
        // code is a clean file mapping the kernel can page in and out, and its memory images
        // map the file copy-on-write instead of being copied into anonymous memory.
        // SAFETY: as above; the file was written from `component` a moment ago.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(mapped) => Ok((mapped, Origin::Compiled)),
            Err(_) => Ok((component, Origin::Compiled)),
        }
    }

    fn store(&self, path: &Path, component: &Component) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let bytes = component.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
        // A unique temporary file, synced, then renamed: hosts sharing the directory never
        // see (or map) a half-written entry.
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        std::io::Write::write_all(&mut tmp, &bytes)?;
        tmp.as_file().sync_all()?;
        tmp.persist(path)?;
        Ok(())
    }
}

/// Hand the compiler's freed working memory back to the system. Compiling a 12–18 MB
/// component (an interpreter) allocates hundreds of MB that the system allocator would
/// otherwise keep for the life of the process. (The `wharf` binary allocates with jemalloc,
/// which purges by itself; this still trims what C code allocated, and serves programs that
/// embed the host with the system allocator.)
fn release_compiler_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Compile `bytes` on a thread pool of its own (one thread per core). The compiler spreads a
/// component's functions over the current rayon pool; on the shared global pool a small
/// component deployed beside a large one queued behind all of the large one's functions (a
/// Rust handler waited ~17 s behind a Python one). On pools of their own the compiles share
/// the cores, and the small one is done in its own time.
fn compile_on_own_threads(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    match rayon::ThreadPoolBuilder::new()
        .num_threads(cores)
        .thread_name(|i| format!("wharf-compile-{i}"))
        .build()
    {
        Ok(pool) => pool.install(|| Component::new(engine, bytes)),
        // No threads to be had: compile on the shared pool.
        Err(_) => Component::new(engine, bytes),
    }
}
