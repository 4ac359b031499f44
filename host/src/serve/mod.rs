//! `sluice serve`, the wiring: load the registry, start the backends and the runtime, build
//! the serving state, bind the listeners, run the background ticks (canary analysis, gauges)
//! and serve until asked to stop. The top layer: it may import every other.

pub mod listen;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::api::grpc_body::BodyLimits;
pub use crate::state::BodyTimeouts;
use crate::state::{ServingState, TenantState};
use crate::telemetry::metrics::Served;

use crate::control::cluster::Cluster;
use crate::nn::backend::Backends;
use crate::nn::backend::{self, BackendKind, BackendSettings};
use crate::nn::devices::Devices;
use crate::nn::models::ModelDefaults;
use crate::registry::Registry;
use crate::registry::placement::DeviceId;
use crate::registry::shared::SharedStore;
use crate::runtime::{Runtime, RuntimeSettings};
use listen::{ConnectionLimits, ConnectionSettings};

/// How often the canary analysis checks whether an app's interval has passed.
const ANALYSIS_TICK: Duration = Duration::from_millis(100);
/// How often the apps' SLO gauges and the models' drift gauges are brought up to date.
const GAUGE_EXPORT_TICK: Duration = Duration::from_secs(1);
/// How often the series and status-page activity of deleted tenants, apps, models and versions
/// are taken out (a scrape interval's order: what is deleted is gone from the next scrapes).
const SWEEP_TICK: Duration = Duration::from_secs(10);
/// gRPC calls open at once on one connection (HTTP/2 streams; a client waits for a free one).
/// tonic sets no limit, so one connection could hold any number of calls whose bodies never
/// come. It also keeps what a well-behaved client's calls can hold buffered unread (a small
/// DATA frame each, under 256 bytes) within h2's per-connection budget for small frames
/// (512 KiB), past which h2 closes the connection with every call on it.
const GRPC_CALLS_PER_CONNECTION: u32 = 1024;
/// How often a gRPC connection is pinged, and how long its client has to answer.
const GRPC_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of `sluice serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    /// Where `/metrics` is served; `None` turns metrics off.
    pub metrics: Option<SocketAddr>,
    /// Largest gRPC message accepted or sent.
    pub grpc_max_message_bytes: usize,
    /// How gRPC responses are compressed for clients that accept it; `None`: never.
    pub grpc_response_compression: Option<tonic::codec::CompressionEncoding>,
    pub tenants_dir: PathBuf,
    pub data_dir: PathBuf,
    pub onnxruntime_library: Option<PathBuf>,
    /// Backend for models that pin none; `None` picks the best available.
    pub default_backend: Option<BackendKind>,
    /// How long a model without calls stays in memory when its manifest does not say;
    /// `None`: for as long as it serves.
    pub idle_unload: Option<Duration>,
    /// Bytes resident models may hold on each device named; the others get their defaults.
    pub model_memory: BTreeMap<DeviceId, u64>,
    /// The most memory ONNX Runtime's CPU runs may hold at once; `None`: unbounded.
    pub run_memory: Option<u64>,
    /// ONNX Runtime's WebGPU plugin execution provider library, if any.
    pub webgpu_library: Option<PathBuf>,
    /// Options of ONNX Runtime's CUDA execution provider, as the admin gave them.
    pub cuda_options: Vec<(String, String)>,
    pub backend_threads: usize,
    /// Runs a GPU takes at once before a tenant's next one waits for its share of them.
    pub gpu_runs: usize,
    pub max_instances: u32,
    pub epoch_tick: Duration,
    /// Requests worked on at once (0: one per CPU); see `tenancy::turn_state`.
    pub cpu_turns: usize,
    pub max_waiting_requests: usize,
    /// The platform admin's token for `/admin/v1`; `None` turns the admin API off.
    pub admin_token: Option<String>,
    /// The bearer token a scrape of `/metrics` must send; `None`: the port is open.
    pub metrics_token: Option<String>,
    /// What clients may hold open: connections, and time to send a request.
    pub connections: ConnectionSettings,
    pub body_timeouts: BodyTimeouts,
    pub drain: DrainSettings,
    /// The store replicas share (`file:///dir` or `s3://bucket/prefix`); `None`: the data
    /// directory alone.
    pub store: Option<String>,
    /// How often the shared store is checked for other replicas' changes (and this
    /// replica's counters published).
    pub store_poll: Duration,
    /// This replica's name in the store.
    pub replica: String,
}

/// What happens on SIGTERM (or Ctrl-C): readiness answers 503 at once; the listeners keep
/// accepting for `grace` (while load balancers take the replica out), then close; requests in
/// flight get up to `timeout` to finish; then the process exits. A second signal ends the
/// grace early.
#[derive(Debug, Clone, Copy)]
pub struct DrainSettings {
    pub grace: Duration,
    pub timeout: Duration,
}

impl Default for DrainSettings {
    fn default() -> Self {
        Self { grace: Duration::ZERO, timeout: Duration::from_secs(30) }
    }
}

/// Descriptors kept free of client connections, for models, uploads and the store.
const RESERVED_DESCRIPTORS: u64 = 256;

/// Build everything, bind the listeners and serve HTTP and gRPC until Ctrl-C / SIGTERM.
pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let state = Arc::new(build_state(&config).await?);
    let http = TcpListener::bind(config.http).await.with_context(|| format!("cannot listen on {}", config.http))?;
    let grpc = TcpListener::bind(config.grpc).await.with_context(|| format!("cannot listen on {}", config.grpc))?;
    let (http_address, grpc_address) = (http.local_addr()?, grpc.local_addr()?);
    tracing::info!(http = %http_address, grpc = %grpc_address, "sluice is serving the Open Inference Protocol");
    // Tests and scripts read these lines to find the ports (the gRPC line comes last).
    println!("listening on http://{http_address}");
    match config.metrics {
        Some(address) => {
            let listener = std::net::TcpListener::bind(address)
                .with_context(|| format!("cannot listen on {address} for metrics"))?;
            println!("metrics listening on http://{}", listener.local_addr()?);
            let router = crate::api::metrics::router(config.metrics_token.as_deref(), state.readiness.clone());
            serve_beside(listener, router).context("starting the metrics thread")?;
        }
        None => crate::telemetry::metrics::metrics().set_enabled(false),
    }
    println!("grpc listening on {grpc_address}");

    // Shared decisions: counters, SLO minutes and drift references through the store (the
    // data directory's for a lone server); the canary analysis where this replica holds the
    // lease, each app's own interval checked every tick.
    let cluster = Arc::new(Cluster::new(telemetry_store(&config)?, &config.replica, config.store_poll));
    tokio::spawn(cluster.clone().run(state.clone(), config.store_poll));
    tokio::spawn(analyse_canaries(state.clone(), cluster, ANALYSIS_TICK));
    if config.store.is_some() {
        tokio::spawn(follow_store(state.clone(), config.store_poll));
    }
    tokio::spawn(sweep_gone_names(state.clone(), SWEEP_TICK));
    if config.metrics.is_some() {
        tokio::spawn(export_gauges(state.clone(), GAUGE_EXPORT_TICK));
        tokio::spawn(export_drift(state.clone(), GAUGE_EXPORT_TICK));
    }

    let limits = ConnectionLimits::new(within_descriptor_limit(config.connections));
    if config.metrics.is_some() {
        tokio::spawn(export_connections(limits.clone(), GAUGE_EXPORT_TICK));
    }
    let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut http_stop = stop.subscribe();
    let mut grpc_stop = stop.subscribe();
    let mut grpc_deadline = stop.subscribe();
    let router = crate::api::http::router(state.clone());
    let http_server = listen::serve_http(
        http,
        router,
        limits.clone(),
        async move {
            let _ = http_stop.recv().await;
        },
        config.drain.timeout,
    );
    let readiness = state.readiness.clone();
    let grpc_server =
        grpc_server(state, &config).serve_with_incoming_shutdown(listen::incoming(grpc, limits, "grpc"), async move {
            let _ = grpc_stop.recv().await;
        });
    // tonic waits for its connections without a bound: the drain timeout is the bound.
    let grpc_server = async move {
        tokio::select! {
            served = grpc_server => served,
            () = async {
                let _ = grpc_deadline.recv().await;
                tokio::time::sleep(config.drain.timeout).await;
            } => {
                tracing::warn!("gRPC calls still open after the drain timeout; closing them");
                Ok(())
            }
        }
    };
    tokio::spawn(async move {
        shutdown_signal().await;
        readiness.start_drain();
        tracing::info!(
            grace_s = config.drain.grace.as_secs_f64(),
            "draining: not ready; still accepting for the grace period"
        );
        tokio::select! {
            () = tokio::time::sleep(config.drain.grace) => {}
            () = shutdown_signal() => tracing::info!("a second signal: the grace period ends now"),
        }
        tracing::info!(
            timeout_s = config.drain.timeout.as_secs_f64(),
            "closing the listeners; requests in flight finish"
        );
        readiness.close();
        let _ = stop.send(());
    });
    let ((), grpc_result) = tokio::join!(http_server, grpc_server);
    grpc_result.context("gRPC server failed")?;
    tracing::info!("drained");
    Ok(())
}

/// The gRPC server `sluice serve` runs on its connections: the inference service behind the
/// layer that admits each call and bounds its body, with the calls a connection may hold.
pub fn grpc_server(
    state: Arc<ServingState>,
    config: &ServeConfig,
) -> tonic::transport::server::Router<tower::layer::util::Stack<BodyLimits, tower::layer::util::Identity>> {
    let body_limits = BodyLimits::new(state.clone(), config.grpc_max_message_bytes, config.body_timeouts.request);
    tonic::transport::Server::builder()
        .max_concurrent_streams(GRPC_CALLS_PER_CONNECTION)
        // A peer that no longer answers pings is gone: its connection, and the streams that
        // hold its tenant's places, end.
        .http2_keepalive_interval(Some(GRPC_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(GRPC_KEEPALIVE_TIMEOUT))
        .layer(body_limits)
        .add_service(crate::api::grpc::service(state, config.grpc_max_message_bytes, config.grpc_response_compression))
}

/// Serve the metrics port (metrics and health) on a thread and runtime of its own, so that
/// scrapes and health probes answer at once even while the serving runtime is saturated.
fn serve_beside(listener: std::net::TcpListener, router: axum::Router) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("sluice-metrics".to_string()).spawn(move || {
        runtime.block_on(async move {
            let served = match TcpListener::from_std(listener) {
                Ok(listener) => axum::serve(listener, router).await,
                Err(err) => Err(err),
            };
            if let Err(err) = served {
                tracing::error!(error = %err, "the metrics server stopped");
            }
        });
    })?;
    Ok(())
}

/// The connection settings, with `max_connections` lowered where the process may not open
/// that many descriptors (after raising its soft limit to the hard one).
fn within_descriptor_limit(mut settings: ConnectionSettings) -> ConnectionSettings {
    let available = listen::raise_descriptor_limit().saturating_sub(RESERVED_DESCRIPTORS);
    let available = usize::try_from(available).unwrap_or(usize::MAX).max(1);
    if settings.max_connections > available {
        tracing::warn!(
            requested = settings.max_connections,
            allowed = available,
            "the descriptor limit allows fewer connections than --max-connections; using fewer"
        );
        settings.max_connections = available;
    }
    settings
}

async fn export_connections(limits: Arc<ConnectionLimits>, tick: Duration) {
    let mut ticker = tokio::time::interval(tick);
    loop {
        ticker.tick().await;
        crate::telemetry::metrics::metrics().connections_open(limits.open());
    }
}

/// Load the registry and build the serving state.
pub async fn build_state(config: &ServeConfig) -> anyhow::Result<ServingState> {
    let registry = Registry::load(&config.tenants_dir)
        .with_context(|| format!("cannot load tenants from {}", config.tenants_dir.display()))?;

    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    crate::nn::scheduler::places::serve_places(cores, config.backend_threads, config.gpu_runs);
    let backends = backend::available(&BackendSettings {
        onnxruntime_library: config.onnxruntime_library.clone(),
        threads: config.backend_threads,
        webgpu_library: config.webgpu_library.clone(),
        cuda_options: config.cuda_options.clone(),
        run_memory: config.run_memory,
    });
    for reason in &backends.unavailable {
        tracing::warn!("{reason}");
    }
    if backends.available.is_empty() {
        anyhow::bail!("no model backend is available: {:?}", backends.unavailable);
    }
    if let Some(kind) = config.default_backend
        && backends.get(kind).is_none()
    {
        anyhow::bail!("--backend {kind} was requested but is not available here");
    }

    let shared = config.store.as_deref().map(SharedStore::open).transpose()?;
    let store = crate::registry::store::Store::open(&config.data_dir, shared)
        .with_context(|| format!("cannot open the registry in {}", config.data_dir.display()))?;
    // Read once: the saved quotas size the guest memory slots, then the states are applied.
    let saved = crate::control::apply::newer_states(&store).await;
    let declared_mib = registry.tenants().map(|t| t.quotas.guest_memory_mib).max();
    let saved_mib = saved.as_deref().ok().and_then(crate::control::apply::saved_guest_memory_mib);
    let max_memory_mib = declared_mib.into_iter().chain(saved_mib).max().unwrap_or(64);
    let runtime = Runtime::new(RuntimeSettings {
        max_instances: config.max_instances,
        max_memory_bytes: usize::try_from(max_memory_mib << 20).context("guest memory quota too large")?,
        epoch_tick: config.epoch_tick,
        cache_dir: config.data_dir.join("compiled"),
    })?;
    let cpu_turns = match config.cpu_turns {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        turns => turns,
    };
    let turns = crate::tenancy::turns::Turns::new(cpu_turns, config.max_waiting_requests);
    let admin_token = config.admin_token.as_deref();
    let inventory = crate::nn::inventory::Inventory::probe();
    inventory.log();
    crate::telemetry::metrics::metrics().device_total("cpu", inventory.cpu.memory_bytes);
    for device in &inventory.cuda {
        crate::telemetry::metrics::metrics().device_total(&format!("cuda:{}", device.index), device.memory_total_bytes);
    }
    if !inventory.cuda.is_empty()
        && let Err(why) = crate::nn::utilisation::sample_cuda_devices(&inventory.cuda)
    {
        tracing::warn!(reason = %why, "CUDA devices' utilisation is not reported");
    }
    let devices = Devices::new(&inventory, &config.model_memory, runs_on_webgpu(&backends))
        .map_err(|why| anyhow::anyhow!("--model-memory: {why}"))?;
    for device in devices.all() {
        tracing::info!(device = %device.id(), budget_mib = device.budget() >> 20, "model memory budget");
    }
    // Engines' optimised forms of models: specific to this machine, rewritten at each start.
    let optimized_dir = config.data_dir.join("optimized");
    let optimized_dir = std::fs::create_dir_all(&optimized_dir)
        .inspect_err(|err| tracing::warn!(error = %err, "no directory for optimised models; reloads optimise again"))
        .ok()
        .map(|()| optimized_dir);
    let defaults = ModelDefaults {
        backend: config.default_backend,
        idle_unload: config.idle_unload,
        devices: Arc::new(devices),
        optimized_dir,
    };
    let mut state = ServingState::build(registry, runtime, backends, defaults, turns, store, admin_token).await?;
    state.body_timeouts = config.body_timeouts;
    let restored = match saved {
        Ok(saved) => crate::control::apply::apply_newer(&state, saved).await,
        Err(error) => Err(error),
    };
    if config.store.is_none() {
        restored.context("restoring the saved control state")?;
    } else if let Err(error) = restored {
        // It serves what its manifests declare meanwhile; ready once the store answers.
        tracing::error!(%error, "the shared store could not be read; not ready until it can");
        state.readiness.set_synced(false);
    }
    Ok(state)
}

/// Whether an engine found a WebGPU adapter (ONNX Runtime's plugin provider), or why the
/// preferred engine did not.
fn runs_on_webgpu(backends: &Backends) -> Result<(), String> {
    let mut why = None;
    for backend in &backends.available {
        match backend.runs_on(DeviceId::WebGpu) {
            Ok(()) => return Ok(()),
            Err(reason) => why = why.or(Some(reason)),
        }
    }
    Err(why.unwrap_or_else(|| "no engine runs on a WebGPU adapter".to_string()))
}

/// The store of the fleet's counts: the shared one, or the data directory.
fn telemetry_store(config: &ServeConfig) -> anyhow::Result<SharedStore> {
    crate::control::cluster::check_replica_name(&config.replica).map_err(|why| anyhow::anyhow!("--replica: {why}"))?;
    let url = match &config.store {
        Some(url) => url.clone(),
        None => {
            let dir = std::fs::canonicalize(&config.data_dir)
                .with_context(|| format!("cannot open the data directory {}", config.data_dir.display()))?;
            format!("file://{}", dir.display())
        }
    };
    Ok(SharedStore::open(&url)?)
}

/// Analyse every app with a canary whose interval has passed, while this replica holds the
/// analysis lease; run until the process ends.
async fn analyse_canaries(state: Arc<ServingState>, cluster: Arc<Cluster>, tick: Duration) {
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_window: std::collections::HashMap<(String, String), std::time::Instant> = Default::default();
    loop {
        ticker.tick().await;
        let leader = cluster.is_leader();
        for tenant in state.all_tenants() {
            let tenant_id = tenant.spec().id.clone();
            for (name, app) in tenant.apps() {
                if !leader {
                    // The holder analyses; this replica opens a fresh window if it takes over.
                    app.analysis.lock().unwrap_or_else(std::sync::PoisonError::into_inner).restart();
                    continue;
                }
                let key = (tenant_id.to_string(), name.to_string());
                let due = last_window.get(&key).is_none_or(|at| at.elapsed() >= app.spec.analysis.interval());
                if due {
                    last_window.insert(key, std::time::Instant::now());
                    let others = cluster.counters_of(tenant_id.as_str(), name.as_str());
                    if app.analyse(&others)
                        && let Err(error) = crate::control::apply::save_control(&state, &tenant).await
                    {
                        tracing::error!(app = %name, %error, "could not save a rollout decision");
                    }
                }
            }
        }
    }
}

/// Apply what other replicas save to the shared store, every `poll`. A store that cannot be
/// read is logged and counted; the replica serves what it has, and is ready as soon as it has
/// read the store once.
async fn follow_store(state: Arc<ServingState>, poll: Duration) {
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match crate::control::apply::sync_control(&state).await {
            Ok(_) => state.readiness.set_synced(true),
            Err(error) => {
                crate::telemetry::metrics::metrics().store_error();
                tracing::warn!(%error, "the shared store could not be read; serving what this replica has");
            }
        }
    }
}

/// Keep every app's SLO gauges current (budgets and burn rates change with time alone).
async fn export_gauges(state: Arc<ServingState>, tick: Duration) {
    let metrics = crate::telemetry::metrics::metrics();
    let mut ticker = tokio::time::interval(tick);
    loop {
        ticker.tick().await;
        for tenant in state.all_tenants() {
            let id = tenant.spec().id.clone();
            for (name, app) in tenant.apps() {
                if let Some(slo) = &app.slo {
                    metrics.slo(id.as_str(), name.as_str(), &slo.report());
                }
            }
        }
    }
}

/// Every `tick`, take what was kept by name out once the name is gone: the metric series of
/// tenants, apps, models and versions no longer served, and the status page's activity of
/// names a tenant no longer has (which would fill its targets). On a blocking thread: reading
/// every series takes milliseconds once there are thousands.
async fn sweep_gone_names(state: Arc<ServingState>, tick: Duration) {
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let state = state.clone();
        let swept =
            tokio::task::spawn_blocking(move || crate::telemetry::metrics::metrics().sweep(|| served(&state))).await;
        match swept {
            Ok(0) => {}
            Ok(removed) => tracing::debug!(removed, "series of deleted names left the metrics"),
            Err(error) => tracing::error!(%error, "sweeping the series of deleted names failed"),
        }
    }
}

/// A tenant's apps and own models, each with its versions.
fn tenant_names(tenant: &TenantState) -> Vec<(String, Vec<String>)> {
    let apps = tenant
        .apps()
        .into_iter()
        .map(|(name, app)| (name.to_string(), app.version_names().iter().map(ToString::to_string).collect::<Vec<_>>()));
    let models = tenant.models.own_names().into_iter().map(|name| {
        let versions = tenant.models.versions(name.as_str()).iter().map(ToString::to_string).collect();
        (name.to_string(), versions)
    });
    apps.chain(models).collect()
}

/// Every tenant's names, as the metrics sweep asks; each tenant's status page forgets the
/// activity of names it no longer has on the way (one look at the names for both).
fn served(state: &ServingState) -> Served {
    let mut served = Served::default();
    for tenant in state.all_tenants() {
        let id = tenant.spec().id.clone();
        served.tenant(id.as_str());
        for (name, versions) in tenant_names(&tenant) {
            served.name(id.as_str(), &name, versions);
        }
        tenant.activity.retain(|name| served.has(id.as_str(), name));
    }
    served
}

/// Bring every model's drift report and gauges up to date with the rows sampled since, on a
/// blocking thread: a report sorts every window, ~5 ms a model at the default 1,000 rows and
/// ~0.5 s at the largest (100,000 rows, 64 features), which on a runtime thread held every
/// tenant's requests behind it. The pause after a pass is at least three times the pass, so
/// however many models and rows the tenants ask for, drift reports take at most a quarter of
/// one CPU.
async fn export_drift(state: Arc<ServingState>, tick: Duration) {
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let mut monitors = Vec::new();
        for tenant in state.all_tenants() {
            let id = tenant.spec().id.clone();
            for name in tenant.models.own_names() {
                if let Some(monitor) =
                    tenant.models.own(name.as_str()).and_then(|(_, model)| model.drift.get(id.as_str()))
                {
                    monitors.push((id.clone(), name, monitor));
                }
            }
        }
        // Also with none left: the last one's series go.
        let began = std::time::Instant::now();
        let refreshed = tokio::task::spawn_blocking(move || {
            let reports: Vec<_> =
                monitors.into_iter().map(|(id, name, monitor)| (id, name, monitor.refresh())).collect();
            let reports = reports.iter().map(|(id, name, report)| (id.as_str(), name.as_str(), &**report));
            crate::telemetry::metrics::metrics().drift(reports);
        })
        .await;
        if let Err(error) = refreshed {
            tracing::error!(%error, "refreshing the drift reports failed");
        }
        tokio::time::sleep(began.elapsed().saturating_mul(3)).await;
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
