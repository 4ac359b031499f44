//! The wasmtime runtime that runs tenant components.
//!
//! One [`Runtime`] per process: an engine with the pooling allocator, copy-on-write memory
//! images and epoch interruption (a ticker thread advances the epoch). Components are
//! compiled once per content hash and cached on disk ([`compile`]); each app version keeps a
//! pre-linked [`Prepared`] component; each request gets a fresh store with its tenant's
//! limits and calls the export `infer` ([`invoke`]).

pub mod bindings;
mod compile;
mod invoke;
mod limits;
mod store;

use std::path::PathBuf;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

pub use bindings::sluice::tenant::types::{Datatype, InferRequest, InferResponse, Tensor as GuestTensor, TensorData};
pub use invoke::{GuestCall, GuestError};
pub use store::{GuestLog, StoreState};

/// A component ready to instantiate: compiled and linked against the host's imports.
pub type Prepared = bindings::ComponentPre<StoreState>;

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
    linker: Linker<StoreState>,
    settings: RuntimeSettings,
}

impl Runtime {
    pub fn new(settings: RuntimeSettings) -> Result<Self, RuntimeError> {
        let engine_error = |e: wasmtime::Error| RuntimeError::Engine(format!("{e:#}"));
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(settings.max_instances)
            .total_core_instances(settings.max_instances.saturating_mul(8))
            .total_memories(settings.max_instances.saturating_mul(2))
            .total_tables(settings.max_instances.saturating_mul(4))
            .max_memory_size(settings.max_memory_bytes);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
            .memory_init_cow(true)
            .epoch_interruption(true);
        let engine = Engine::new(&config).map_err(engine_error)?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_error)?;
        crate::nn::host::add_to_linker(&mut linker, |state: &mut StoreState| crate::nn::host::NnView {
            ctx: &mut state.nn,
            table: &mut state.table,
        })
        .map_err(engine_error)?;
        bindings::sluice::tenant::log::add_to_linker::<StoreState, HasSelf<GuestLog>>(&mut linker, |state| {
            &mut state.log
        })
        .map_err(engine_error)?;

        start_epoch_ticker(&engine, settings.epoch_tick);
        Ok(Self { engine, linker, settings })
    }

    /// Compile (or load from the cache) and link a component.
    pub fn prepare(&self, path: &std::path::Path, sha256: &str, wasm: &[u8]) -> Result<Prepared, RuntimeError> {
        let component_error = |message: String| RuntimeError::Component { path: path.display().to_string(), message };
        let component = compile::load_or_compile(&self.engine, &self.settings.cache_dir, sha256, wasm)
            .map_err(|e| component_error(format!("{e:#}")))?;
        let instance_pre = self.linker.instantiate_pre(&component).map_err(|e| {
            component_error(format!(
                "{e:#}; it must target the sluice:tenant/component world (build it with sluice-guest)"
            ))
        })?;
        Prepared::new(instance_pre).map_err(|e| component_error(format!("{e:#}")))
    }

    /// The most linear memory one guest may have (the pool's slot size).
    pub fn max_memory_bytes(&self) -> usize {
        self.settings.max_memory_bytes
    }

    pub fn epoch_tick(&self) -> Duration {
        self.settings.epoch_tick
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// Advance the engine's epoch every tick for as long as the process runs.
fn start_epoch_ticker(engine: &Engine, tick: Duration) {
    let engine = engine.weak();
    std::thread::Builder::new()
        .name("sluice-epoch".to_string())
        .spawn(move || {
            while let Some(engine) = engine.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(tick);
            }
        })
        .expect("spawning the epoch thread at startup");
}
