//! The wasmtime runtime that runs tenant components.
//!
//! One [`Runtime`] per process: an engine with the pooling allocator, copy-on-write memory
//! images and epoch interruption (a ticker thread advances the epoch). Components are
//! compiled once per content hash and cached on disk ([`compile`]); each app version keeps a
//! pre-linked [`Component`] of one of the two worlds ([`world`]); each request gets a fresh
//! store with its tenant's limits and calls the export `infer` ([`invoke`]) or, for an HTTP
//! app, `wasi:http/incoming-handler.handle` ([`http`]). Imports `nn` (whose `wasi:nn`
//! bindings its world reuses), `oip`, `telemetry` and `tensor`.

mod bindings;
mod compile;
mod http;
mod invoke;
mod limits;
mod outgoing;
mod poll;
mod store;
mod tensors;
mod warm;
mod world;

use std::path::PathBuf;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::nn::scheduler::tick_batching_turns;

pub use bindings::sluice::tenant::types::{Datatype, InferRequest, InferResponse, Tensor as GuestTensor, TensorData};
pub use http::HttpCall;
pub use invoke::{GuestCall, GuestError};
pub use store::{GuestLog, StoreState};
pub use warm::WarmPool;
pub use world::{World, initial_memory_bytes};

/// A `sluice:tenant/component` ready to instantiate: compiled and linked against the host's imports.
pub type Prepared = bindings::ComponentPre<StoreState>;
/// A `wasi:http/proxy` component (an HTTP app) ready to instantiate.
pub type HttpPrepared = wasmtime_wasi_http::p2::bindings::ProxyPre<StoreState>;

/// A tenant component ready to instantiate, in the world it targets.
#[derive(Clone)]
pub enum Component {
    Oip(Prepared),
    Http(HttpPrepared),
}

impl Component {
    pub fn world(&self) -> World {
        match self {
            Self::Oip(_) => World::Oip,
            Self::Http(_) => World::Http,
        }
    }
}

/// Runtime settings.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// Component instances alive at once across all tenants (pool slots).
    pub max_instances: u32,
    /// Largest linear memory any tenant may be granted (pool slot size).
    pub max_memory_bytes: usize,
    /// Epoch tick: the granularity of guest deadlines.
    pub epoch_tick: Duration,
    /// Where compiled components are cached.
    pub cache_dir: PathBuf,
}

/// Why the runtime could not start or prepare a component.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot configure wasmtime: {0}")]
    Engine(String),
    #[error("component {path} is not usable: {message}")]
    Component { path: String, message: String },
}

pub struct Runtime {
    engine: Engine,
    /// The `sluice:tenant/component` world's imports.
    linker: Linker<StoreState>,
    /// The same and `wasi:http`'s, for HTTP apps: a component of the tenant world cannot
    /// import `wasi:http`.
    http_linker: Linker<StoreState>,
    settings: RuntimeSettings,
    /// Uploaded components compile one at a time.
    uploads: tokio::sync::Semaphore,
    /// Instances parked for serial reuse, across every tenant ([`warm`]).
    idle_instances: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// Bytes of each pooled linear memory kept resident and reset in place (a Rust guest's stack
/// and first heap pages); beyond it, pages go back to the kernel.
const KEEP_RESIDENT_MEMORY: usize = 1 << 20;
/// The same for each pooled table.
const KEEP_RESIDENT_TABLE: usize = 64 << 10;

impl Runtime {
    pub fn new(settings: RuntimeSettings) -> Result<Self, RuntimeError> {
        let engine_error = |e: wasmtime::Error| RuntimeError::Engine(format!("{e:#}"));
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(settings.max_instances)
            .total_core_instances(settings.max_instances.saturating_mul(8))
            .total_memories(settings.max_instances.saturating_mul(2))
            .total_tables(settings.max_instances.saturating_mul(4))
            .max_memory_size(settings.max_memory_bytes)
            // A freed slot's memory is reset to its image (zeros past it) by writing the pages
            // the guest dirtied, found with Linux's PAGEMAP_SCAN (6.7+; elsewhere the low
            // addresses are written), instead of being released with madvise: the next
            // request then takes no page faults, and no TLB flush interrupts every CPU. On
            // these machines that halved a fresh sandbox's CPU (`cargo bench --bench layers`).
            .pagemap_scan(Enabled::Auto)
            .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY)
            .table_keep_resident(KEEP_RESIDENT_TABLE);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
            .memory_init_cow(true)
            .epoch_interruption(true)
            // Compiling on the calling thread only: an upload's compile runs at the lowest
            // priority and must not fan out to threads of normal priority.
            .parallel_compilation(false);
        let engine = Engine::new(&config).map_err(engine_error)?;

        let linker = tenant_linker(&engine).map_err(engine_error)?;
        let mut http_linker = tenant_linker(&engine).map_err(engine_error)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut http_linker).map_err(engine_error)?;

        start_epoch_ticker(&engine, settings.epoch_tick);
        Ok(Self {
            engine,
            linker,
            http_linker,
            settings,
            uploads: tokio::sync::Semaphore::new(1),
            idle_instances: Default::default(),
        })
    }

    /// Compile (or load from the cache) and link a component of either world. A compiled
    /// form that does not link is not kept. `uploaded_by`: the tenant whose upload it is,
    /// whose compiled form is its own (`None`: the operator's, shared by every tenant).
    pub fn prepare(
        &self,
        path: &std::path::Path,
        sha256: &str,
        wasm: &[u8],
        uploaded_by: Option<&str>,
    ) -> Result<Component, RuntimeError> {
        let world = world::check(wasm)
            .map_err(|message| RuntimeError::Component { path: path.display().to_string(), message })?;
        self.prepare_world(world, path, &compile::CacheKey::new(sha256, uploaded_by), wasm)
    }

    /// [`Runtime::prepare`] of a component whose world has been read.
    fn prepare_world(
        &self,
        world: World,
        path: &std::path::Path,
        key: &compile::CacheKey,
        wasm: &[u8],
    ) -> Result<Component, RuntimeError> {
        let component_error = |message: String| RuntimeError::Component { path: path.display().to_string(), message };
        let compile::Compiled { component, stored } =
            compile::load_or_compile(&self.engine, &self.settings.cache_dir, key, wasm)
                .map_err(|e| component_error(format!("{e:#}")))?;
        let linker = match world {
            World::Oip => &self.linker,
            World::Http => &self.http_linker,
        };
        let not_linked = |e: wasmtime::Error| component_error(format!("{e:#}; it targets the {world} world"));
        let prepared = linker.instantiate_pre(&component).map_err(not_linked).and_then(|pre| match world {
            World::Oip => Prepared::new(pre).map(Component::Oip).map_err(not_linked),
            World::Http => HttpPrepared::new(pre).map(Component::Http).map_err(not_linked),
        });
        if let (Err(_), Some(stored)) = (&prepared, stored) {
            let _ = std::fs::remove_file(stored);
        }
        prepared
    }

    /// [`Runtime::prepare`] for a component a tenant uploads: its world is checked before it
    /// is compiled, and it compiles on a thread of the lowest CPU priority, one upload at a
    /// time, so that compiling never takes CPU from serving. The caller holds its tenant's
    /// turn of uploads, so this line holds at most one of each tenant's: another tenant's
    /// backlog of uploads never stands in front of it.
    pub async fn prepare_upload(
        self: &std::sync::Arc<Self>,
        label: PathBuf,
        (sha256, uploaded_by): (&str, &str),
        wasm: Vec<u8>,
    ) -> Result<Component, RuntimeError> {
        let key = compile::CacheKey::new(sha256, Some(uploaded_by));
        let world = world::check(&wasm)
            .map_err(|message| RuntimeError::Component { path: label.display().to_string(), message })?;
        let _one_at_a_time = self.uploads.acquire().await;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let runtime = self.clone();
        let spawned = std::thread::Builder::new().name("sluice-compile".to_string()).spawn(move || {
            lowest_cpu_priority();
            let _ = sender.send(runtime.prepare_world(world, &label, &key, &wasm));
        });
        let failed = |message: String| RuntimeError::Engine(message);
        spawned.map_err(|e| failed(format!("cannot start a compile thread: {e}")))?;
        receiver.await.map_err(|_| failed("the compile thread ended without an answer".to_string()))?
    }

    /// Remove the cached compiled forms of the component `sha256`, which nothing serves.
    pub fn forget_compiled(&self, sha256: &str) -> std::io::Result<()> {
        compile::forget(&self.settings.cache_dir, sha256)
    }

    /// The most linear memory one guest may have (the pool's slot size).
    pub fn max_memory_bytes(&self) -> usize {
        self.settings.max_memory_bytes
    }

    /// Most instances parked for reuse at once: a quarter of the pool's slots, so that idle
    /// instances never take the slots that other tenants' requests need.
    fn idle_cap(&self) -> usize {
        self.settings.max_instances as usize / 4
    }

    pub fn epoch_tick(&self) -> Duration {
        self.settings.epoch_tick
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// A linker with what every tenant component may import: WASI (nothing granted: see
/// [`store`]) with the turn-yielding `wasi:io/poll`, `wasi:nn` and the tenant log.
fn tenant_linker(engine: &Engine) -> wasmtime::Result<Linker<StoreState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    poll::add_to_linker(&mut linker)?;
    crate::nn::host::add_to_linker(&mut linker, |state: &mut StoreState| crate::nn::host::NnView {
        ctx: &mut state.nn,
        table: &mut state.table,
    })?;
    bindings::sluice::tenant::log::add_to_linker::<StoreState, HasSelf<GuestLog>>(&mut linker, |state| &mut state.log)?;
    Ok(linker)
}

/// Give this thread the lowest CPU priority, so what it does (shadow requests, compiling
/// uploads) runs on otherwise idle CPU time.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // setpriority(2) on this thread's id: no memory is shared with the call
pub fn lowest_cpu_priority() {
    // SAFETY: both calls take plain integers and only change this thread's scheduling.
    let changed = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    if changed != 0 {
        tracing::warn!("could not lower a background thread's CPU priority; it competes with requests");
    }
}

#[cfg(not(target_os = "linux"))]
pub fn lowest_cpu_priority() {}

/// Advance the engine's epoch every tick for as long as the process runs, and end the model
/// queues' batching turns.
fn start_epoch_ticker(engine: &Engine, tick: Duration) {
    let engine = engine.weak();
    std::thread::Builder::new()
        .name("sluice-epoch".to_string())
        .spawn(move || {
            while let Some(engine) = engine.upgrade() {
                engine.increment_epoch();
                drop(engine);
                // Bounds a batch's wait behind any long poll.
                tick_batching_turns();
                std::thread::sleep(tick);
            }
        })
        .expect("spawning the epoch thread at startup");
}
