//! The `sluice` command line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sluice::nn::backend::BackendKind;
use sluice::perf::{Protocol, TenantLoad};
use sluice::registry::placement::DeviceId;
use sluice::serve::listen::ConnectionSettings;
use sluice::serve::{BodyTimeouts, DrainSettings, ServeConfig, serve};
use sluice::telemetry::traces::OtlpExport;
use tonic::codec::CompressionEncoding;
use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::prelude::*;

/// Sluice: a multi-tenant inference server. Tenants' WebAssembly components run beside
/// shared model backends; clients speak the Open Inference Protocol (KServe v2).
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the tenants in a directory over HTTP and gRPC.
    Serve(Box<ServeArgs>),
    /// Drive an OIP server with load and report throughput and latency (like perf_analyzer).
    Perf(PerfArgs),
    /// Print the Prometheus alert rules for the apps' SLO burn rates (deploy/prometheus/).
    SloRules,
    #[command(flatten)]
    Control(sluice::cli::ControlCommand),
    #[command(flatten)]
    Admin(sluice::cli::AdminCommand),
}

#[derive(Debug, clap::Args)]
struct PerfArgs {
    /// Server address (`host:port`): the HTTP port, or the gRPC port with `--grpc`.
    #[arg(long, default_value = "127.0.0.1:8000")]
    address: String,
    /// Speak gRPC instead of HTTP.
    #[arg(long)]
    grpc: bool,
    /// Model (or app) name.
    #[arg(long)]
    model: String,
    /// Pin a model version.
    #[arg(long)]
    version: Option<String>,
    /// API key for a single-tenant run.
    #[arg(long, env = "SLUICE_KEY")]
    key: Option<String>,
    /// An OIP JSON infer request to send; by default one is generated from the model's metadata.
    /// With `--http-app`, the request body to send, as it is.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Drive an HTTP app instead: POST `--input` to this path below the app's
    /// `/v2/apps/{model}/http` (e.g. `/classify`).
    #[arg(long, conflicts_with_all = ["grpc", "version"], requires = "input")]
    http_app: Option<String>,
    /// Requests in flight at once (closed loop), for a single-tenant run.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Requests per second (open loop) instead of a fixed concurrency.
    #[arg(long)]
    rate: Option<f64>,
    /// Several tenants at once: `NAME:KEY:RATE` (requests/s) or `NAME:KEY:cCONCURRENCY`; repeatable.
    #[arg(long = "tenant")]
    tenants: Vec<String>,
    /// A `--tenant` that sends only in every other period; the others are reported for the
    /// periods without it and beside it (a noisy-neighbour comparison in one run).
    #[arg(long)]
    alternate: Option<String>,
    /// Length of one `--alternate` period, in seconds.
    #[arg(long, default_value_t = 1.0)]
    alternate_period_s: f64,
    /// Also report how long failed requests (refusals, timeouts) took to get their error.
    #[arg(long)]
    refusals: bool,
    /// Seconds of warm-up before measuring.
    #[arg(long, default_value_t = 2.0)]
    warmup_s: f64,
    /// Seconds measured.
    #[arg(long, default_value_t = 10.0)]
    duration_s: f64,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address for the OIP HTTP API.
    #[arg(long, env = "SLUICE_HTTP", default_value = "127.0.0.1:8000")]
    http: SocketAddr,
    /// Address for the OIP gRPC API (`inference.GRPCInferenceService`).
    #[arg(long, env = "SLUICE_GRPC", default_value = "127.0.0.1:8001")]
    grpc: SocketAddr,
    /// Address for Prometheus metrics (`GET /metrics`).
    #[arg(long, env = "SLUICE_METRICS", default_value = "127.0.0.1:8002")]
    metrics: SocketAddr,
    /// A token that scrapes of `/metrics` must send (`Authorization: Bearer <token>`); without
    /// it the metrics port is open to whoever can reach it.
    #[arg(long, env = "SLUICE_METRICS_TOKEN", hide_env_values = true)]
    metrics_token: Option<String>,
    /// Serve no metrics and record none on the serving path (drift sampling included).
    #[arg(long, env = "SLUICE_NO_METRICS")]
    no_metrics: bool,
    /// Largest gRPC message accepted or sent, in MiB.
    #[arg(long, env = "SLUICE_GRPC_MAX_MESSAGE_MIB", default_value_t = 64)]
    grpc_max_message_mib: usize,
    /// Compress gRPC responses with this encoding for clients that accept it. Off by
    /// default, as in Triton: gRPC's C core (perf_analyzer, grpcio, tritonclient) says it
    /// accepts gzip and deflate on every call, and compressing a small answer costs the
    /// server more than it saves. Compressed requests are accepted either way.
    #[arg(long, env = "SLUICE_GRPC_RESPONSE_COMPRESSION", value_enum, default_value_t = CompressionArg::None)]
    grpc_response_compression: CompressionArg,
    /// Directory of tenant manifests (`*.toml`, plus an optional `platform.toml`).
    #[arg(long, env = "SLUICE_TENANTS", default_value = "tenants")]
    tenants: PathBuf,
    /// Directory for server state (compiled-component cache).
    #[arg(long, env = "SLUICE_DATA_DIR", default_value = "data")]
    data_dir: PathBuf,
    /// Path of the ONNX Runtime shared library (`libonnxruntime.so.*`). Without it, the one
    /// the build fetched (target/onnxruntime/), then an `onnxruntime` Python package
    /// (./.venv, then python3).
    #[arg(long, env = "ORT_DYLIB_PATH")]
    onnxruntime_lib: Option<PathBuf>,
    /// Backend for models whose manifest pins none (default: onnxruntime if its library
    /// is found, else tract).
    #[arg(long, env = "SLUICE_BACKEND", value_enum)]
    backend: Option<BackendArg>,
    /// Intra-op threads per model execution instance (0: the backend decides). One keeps a
    /// model from taking the CPUs other tenants' requests need; raise it for large models, or
    /// add execution instances (`[models.X.batching] instances`) to run batches in parallel.
    #[arg(long, env = "SLUICE_BACKEND_THREADS", default_value_t = 1)]
    backend_threads: usize,
    /// Model runs each GPU (and the WebGPU adapter) takes at once, of every tenant's models;
    /// beyond that a tenant's run starts only while the tenant runs fewer than its weighted
    /// share of them, and otherwise waits for one to end. Two: one computing, the next ready.
    #[arg(long, env = "SLUICE_GPU_RUNS", default_value_t = 2)]
    gpu_runs: usize,
    /// Seconds without a call after which a model leaves memory (the next call loads it
    /// again) where its manifest sets no `idle_unload_s`; 0: models stay resident.
    #[arg(long, env = "SLUICE_IDLE_UNLOAD_S", default_value_t = 0)]
    idle_unload_s: u64,
    /// Memory resident models may hold on each device, as `DEVICE=SIZE` pairs separated by
    /// commas (`cpu=8GiB,cuda:0=20GiB`; SIZE in bytes or KiB, MiB, GiB, TiB); loads that
    /// would pass it evict idle models or wait. Default: half the host's memory for `cpu`
    /// and `webgpu`, nine tenths of each GPU's.
    #[arg(long, env = "SLUICE_MODEL_MEMORY", value_parser = parse_model_memory)]
    model_memory: Option<ModelMemory>,
    /// Memory ONNX Runtime's model runs on the CPU may hold at once, all models together
    /// (SIZE as for `--model-memory`): a run that would need more fails with an error where it
    /// would take the host's memory. Default: a quarter of the host's memory; 0: unbounded.
    #[arg(long, env = "SLUICE_RUN_MEMORY", value_parser = parse_run_memory)]
    run_memory: Option<u64>,
    /// ONNX Runtime's WebGPU plugin execution provider (`libonnxruntime_providers_webgpu.so`
    /// from the `onnxruntime-ep-webgpu` package): models with `kind = "webgpu"` instances run
    /// on the adapter it finds.
    #[arg(long, env = "SLUICE_WEBGPU_EP_LIB")]
    webgpu_ep_lib: Option<PathBuf>,
    /// An option of ONNX Runtime's CUDA execution provider for every model on a CUDA GPU,
    /// `KEY=VALUE` in the provider's own names (`cudnn_conv_algo_search=HEURISTIC`,
    /// `use_tf32=0`); repeatable, or separated by commas. One the provider refuses fails the
    /// model's load with its reason.
    #[arg(long = "cuda-option", env = "SLUICE_CUDA_OPTIONS", value_delimiter = ',', value_parser = parse_key_value)]
    cuda_options: Vec<(String, String)>,
    /// Guest instances alive at once across all tenants.
    #[arg(long, env = "SLUICE_MAX_INSTANCES", default_value_t = 256)]
    max_instances: u32,
    /// Epoch tick in milliseconds: the granularity of guest deadlines.
    #[arg(long, env = "SLUICE_EPOCH_TICK_MS", default_value_t = 5)]
    epoch_tick_ms: u64,
    /// Requests the host works on at once (parsing, guest code, encoding); when all are busy,
    /// waiting requests start in weighted fair order across tenants. 0: one per CPU.
    #[arg(long, env = "SLUICE_CPU_TURNS", default_value_t = 0)]
    cpu_turns: usize,
    /// Tasks the runtime runs between two looks for network events (tokio's `event_interval`).
    /// While the server is saturated, a new request is seen only at such a look: 16 lets a
    /// light tenant's request in sooner beside a heavy tenant's flood, at some throughput and
    /// at no gain below saturation (BENCHMARKS.md, noisy neighbour).
    #[arg(long, env = "SLUICE_IO_POLL_INTERVAL", default_value_t = 61,
          value_parser = clap::value_parser!(u32).range(1..))]
    io_poll_interval: u32,
    /// Requests waiting to start, at most; past it a tenant over its share gets 429, else 503.
    #[arg(long, env = "SLUICE_MAX_WAITING_REQUESTS", default_value_t = 1024)]
    max_waiting_requests: usize,
    /// Token for the platform admin API (`/admin/v1`: tenants, keys, quotas); without it the
    /// admin API is off.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Client connections open at once across the HTTP and gRPC ports; past it a new one is
    /// closed at once (lowered to what the descriptor limit allows).
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = 16384)]
    max_connections: usize,
    /// Client connections open at once from one IP address. Below what one busy client (a
    /// load balancer) holds, refused connections come back as reconnects, which cost more than
    /// the 503s the waiting room answers (BENCHMARKS.md, soak).
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS_PER_CLIENT", default_value_t = 4096)]
    max_connections_per_client: usize,
    /// Milliseconds a client has to send a request's line and headers, and that an idle
    /// HTTP connection stays open waiting for the next request.
    #[arg(long, env = "SLUICE_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    header_timeout_ms: u64,
    /// Milliseconds the server waits for a client to read any of what it sends (an answer,
    /// on either port) before it closes the connection.
    #[arg(long, env = "SLUICE_SEND_TIMEOUT_MS", default_value_t = 30_000)]
    send_timeout_ms: u64,
    /// Milliseconds a client has to send an inference request's body (HTTP and gRPC).
    #[arg(long, env = "SLUICE_BODY_TIMEOUT_MS", default_value_t = 30_000)]
    body_timeout_ms: u64,
    /// Seconds a client has to send an upload (a model's weights or a component).
    #[arg(long, env = "SLUICE_UPLOAD_TIMEOUT_S", default_value_t = 300)]
    upload_timeout_s: u64,
    /// Seconds after SIGTERM during which the server, already answering not-ready, still
    /// accepts connections (while load balancers take it out); a second signal ends it early.
    #[arg(long, env = "SLUICE_DRAIN_GRACE_S", default_value_t = 0)]
    drain_grace_s: u64,
    /// Seconds requests in flight get to finish once the listeners close; then the process exits.
    #[arg(long, env = "SLUICE_DRAIN_TIMEOUT_S", default_value_t = 30)]
    drain_timeout_s: u64,
    /// The store replicas share: `s3://bucket/prefix` (any S3-compatible server; credentials,
    /// region and endpoint from the AWS variables) or `file:///dir`. Without it: the data
    /// directory alone.
    #[arg(long, env = "SLUICE_STORE")]
    store: Option<String>,
    /// Milliseconds between checks of the shared store for other replicas' changes; each
    /// replica publishes its counters as often, and the canary analysis' lease lasts ten.
    #[arg(long, env = "SLUICE_STORE_POLL_MS", default_value_t = 1000)]
    store_poll_ms: u64,
    /// This replica's name in the shared store (unique among the replicas; a replica that
    /// restarts under its name takes up its own counts). Default: the host name and the
    /// process id with `--store`, `local` without.
    #[arg(long, env = "SLUICE_REPLICA")]
    replica: Option<String>,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "SLUICE_LOG_JSON")]
    log_json: bool,
    /// Log every request's spans as they close, with their durations: request (api), guest,
    /// queue and compute (a batch, linked to the requests in it).
    #[arg(long, env = "SLUICE_LOG_SPANS")]
    log_spans: bool,
    /// Send the spans to an OpenTelemetry collector over OTLP/gRPC (`http://host:4317`):
    /// request, guest, queue and compute, joined to the client's trace by `traceparent`.
    #[arg(long, env = "SLUICE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CompressionArg {
    None,
    Gzip,
    Deflate,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BackendArg {
    Onnxruntime,
    Tract,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .event_interval(args.io_poll_interval)
                .enable_all()
                .build()?;
            let export = runtime
                .block_on(async { init_logging(args.log_json, args.log_spans, args.otlp_endpoint.as_deref()) })?;
            let config = ServeConfig {
                http: args.http,
                grpc: args.grpc,
                metrics: (!args.no_metrics).then_some(args.metrics),
                grpc_max_message_bytes: args.grpc_max_message_mib.saturating_mul(1 << 20),
                grpc_response_compression: match args.grpc_response_compression {
                    CompressionArg::None => None,
                    CompressionArg::Gzip => Some(CompressionEncoding::Gzip),
                    CompressionArg::Deflate => Some(CompressionEncoding::Deflate),
                },
                tenants_dir: args.tenants,
                data_dir: args.data_dir,
                onnxruntime_library: args.onnxruntime_lib,
                default_backend: args.backend.map(|b| match b {
                    BackendArg::Onnxruntime => BackendKind::Onnxruntime,
                    BackendArg::Tract => BackendKind::Tract,
                }),
                idle_unload: (args.idle_unload_s > 0).then(|| Duration::from_secs(args.idle_unload_s)),
                model_memory: args.model_memory.map(|budgets| budgets.0).unwrap_or_default(),
                run_memory: match args.run_memory {
                    Some(bytes) => (bytes > 0).then_some(bytes),
                    None => Some(sluice::nn::device::Device::default_run_memory()),
                },
                webgpu_library: args.webgpu_ep_lib,
                cuda_options: args.cuda_options,
                backend_threads: args.backend_threads,
                gpu_runs: args.gpu_runs.max(1),
                max_instances: args.max_instances,
                epoch_tick: Duration::from_millis(args.epoch_tick_ms.max(1)),
                cpu_turns: args.cpu_turns,
                max_waiting_requests: args.max_waiting_requests,
                admin_token: args.admin_token,
                metrics_token: args.metrics_token,
                connections: ConnectionSettings {
                    max_connections: args.max_connections.max(1),
                    max_per_client: args.max_connections_per_client.max(1),
                    header_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
                    send_timeout: Duration::from_millis(args.send_timeout_ms.max(1)),
                },
                body_timeouts: BodyTimeouts {
                    request: Duration::from_millis(args.body_timeout_ms.max(1)),
                    upload: Duration::from_secs(args.upload_timeout_s.max(1)),
                },
                drain: DrainSettings {
                    grace: Duration::from_secs(args.drain_grace_s),
                    timeout: Duration::from_secs(args.drain_timeout_s),
                },
                replica: args.replica.unwrap_or_else(|| default_replica_name(args.store.is_some())),
                store: args.store,
                store_poll: Duration::from_millis(args.store_poll_ms.max(10)),
            };
            let served = runtime.block_on(serve(config));
            if let Some(export) = export {
                export.shutdown();
            }
            served
        }
        Command::Control(command) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(sluice::cli::run(command))
        }
        Command::Admin(command) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(sluice::cli::admin::run(command))
        }
        Command::SloRules => {
            print!("{}", sluice::telemetry::slo::alert_rules(sluice::telemetry::metrics::names::SLO_BURN_RATE));
            Ok(())
        }
        Command::Perf(args) => {
            let config = perf_config(args)?;
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            print!("{}", runtime.block_on(sluice::perf::run(config))?);
            Ok(())
        }
    }
}

fn perf_config(args: PerfArgs) -> anyhow::Result<sluice::perf::PerfConfig> {
    let tenants = if args.tenants.is_empty() {
        vec![TenantLoad { name: "-".to_string(), key: args.key, rate: args.rate, concurrency: args.concurrency }]
    } else {
        args.tenants.iter().map(|spec| parse_tenant(spec)).collect::<anyhow::Result<_>>()?
    };
    anyhow::ensure!(args.alternate_period_s > 0.0, "--alternate-period-s must be above 0");
    Ok(sluice::perf::PerfConfig {
        protocol: if args.grpc { Protocol::Grpc } else { Protocol::Http },
        address: args.address,
        model: args.model,
        version: args.version,
        input: args.input,
        http_app: args.http_app,
        warmup: Duration::from_secs_f64(args.warmup_s),
        duration: Duration::from_secs_f64(args.duration_s),
        tenants,
        refusals: args.refusals,
        alternate: args
            .alternate
            .map(|tenant| sluice::perf::Alternate { tenant, period: Duration::from_secs_f64(args.alternate_period_s) }),
    })
}

/// `NAME:KEY:RATE` or `NAME:KEY:cCONCURRENCY`.
fn parse_tenant(spec: &str) -> anyhow::Result<TenantLoad> {
    let parts: Vec<&str> = spec.splitn(3, ':').collect();
    let [name, key, load] = parts[..] else {
        anyhow::bail!("--tenant '{spec}': expected NAME:KEY:RATE or NAME:KEY:cCONCURRENCY");
    };
    let key = (!key.is_empty()).then(|| key.to_string());
    let (rate, concurrency) = match load.strip_prefix('c') {
        Some(concurrency) => {
            (None, concurrency.parse().map_err(|_| anyhow::anyhow!("--tenant '{spec}': bad concurrency"))?)
        }
        None => (Some(load.parse().map_err(|_| anyhow::anyhow!("--tenant '{spec}': bad rate"))?), 1),
    };
    Ok(TenantLoad { name: name.to_string(), key, rate, concurrency })
}

/// Log to stderr (text, coloured on a terminal, or JSON lines, filtered by `SLUICE_LOG`)
/// and, with an OTLP endpoint, export Sluice's spans; the export must be shut down at exit to
/// send its last spans.
fn init_logging(json: bool, spans: bool, otlp_endpoint: Option<&str>) -> anyhow::Result<Option<OtlpExport>> {
    let mut filter = EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| EnvFilter::new(sluice::telemetry::traces::DEFAULT_LOG_FILTER));
    if spans {
        // The guest, queue and compute spans are debug spans: free unless asked for.
        filter = filter.add_directive("sluice=debug".parse().expect("a valid directive"));
    }
    let span_events = if spans { FmtSpan::CLOSE } else { FmtSpan::NONE };
    sluice::telemetry::traces::set_spans_logged(spans);
    // Colour only for a terminal: in a file or a log collector the codes are noise (and cost
    // CPU on every request's span).
    let log = tracing_subscriber::fmt::layer()
        .with_span_events(span_events)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let log = if json { log.json().boxed() } else { log.boxed() };
    let (export, export_layer) = match otlp_endpoint {
        Some(endpoint) => {
            let (export, layer) = OtlpExport::start(endpoint)?;
            // Sluice's own spans, whatever the log level; not those of the libraries under it.
            (Some(export), Some(layer.with_filter(Targets::new().with_target("sluice", Level::DEBUG))))
        }
        None => (None, None),
    };
    tracing_subscriber::registry().with(log.with_filter(filter)).with(export_layer).init();
    Ok(export)
}

/// Budgets per device from `--model-memory`.
#[derive(Debug, Clone)]
struct ModelMemory(BTreeMap<DeviceId, u64>);

/// `KEY=VALUE` for `--cuda-option`.
fn parse_key_value(value: &str) -> Result<(String, String), String> {
    let (key, value) = value.split_once('=').ok_or("give it as KEY=VALUE, e.g. use_tf32=0")?;
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() {
        return Err("the option has no name (KEY=VALUE)".to_string());
    }
    Ok((key.to_string(), value.to_string()))
}

/// `DEVICE=SIZE[,DEVICE=SIZE...]` for `--model-memory`: SIZE in bytes or with KiB, MiB, GiB or TiB.
fn parse_model_memory(value: &str) -> Result<ModelMemory, String> {
    let mut budgets = BTreeMap::new();
    for pair in value.split(',') {
        let (device, size) = pair.trim().split_once('=').ok_or("give it as DEVICE=SIZE, e.g. cpu=8GiB,cuda:0=20GiB")?;
        let device = DeviceId::parse(device.trim())
            .ok_or_else(|| format!("'{device}' is not a device: cpu, cuda:N or webgpu"))?;
        let bytes = Some(parse_size(size)?)
            .filter(|&bytes| bytes > 0)
            .ok_or_else(|| format!("'{size}' is not a usable size"))?;
        if budgets.insert(device, bytes).is_some() {
            return Err(format!("{device} is given twice"));
        }
    }
    Ok(ModelMemory(budgets))
}

/// SIZE for `--run-memory`: 0 turns the bound off.
fn parse_run_memory(value: &str) -> Result<u64, String> {
    parse_size(value.trim())
}

/// SIZE in bytes or with KiB, MiB, GiB or TiB.
fn parse_size(size: &str) -> Result<u64, String> {
    let units = [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("", 1)];
    let (number, unit) = units
        .iter()
        .find_map(|(suffix, unit)| size.strip_suffix(suffix).map(|number| (number, *unit)))
        .ok_or("no size")?;
    let number: u64 =
        number.trim().parse().map_err(|_| format!("'{size}' is not a size like 8GiB, 512MiB or bytes"))?;
    number.checked_mul(unit).ok_or_else(|| format!("'{size}' is not a usable size"))
}

/// `local` for a lone server; with a shared store, the host name (a Kubernetes pod's name)
/// and the process id, so that replicas on one machine differ.
fn default_replica_name(shared: bool) -> String {
    if !shared {
        return "local".to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.')).collect())
        .filter(|name: &String| !name.is_empty() && !name.starts_with('.'))
        .unwrap_or_else(|| "replica".to_string());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_options_are_key_value_pairs() {
        assert_eq!(parse_key_value(" use_tf32 = 0"), Ok(("use_tf32".to_string(), "0".to_string())));
        assert_eq!(parse_key_value("gpu_mem_limit=1=2"), Ok(("gpu_mem_limit".to_string(), "1=2".to_string())));
        assert!(parse_key_value("use_tf32").is_err_and(|e| e.contains("KEY=VALUE")));
        assert!(parse_key_value("=0").is_err());
        let args =
            Cli::try_parse_from(["sluice", "serve", "--cuda-option", "use_tf32=0,cudnn_conv_algo_search=HEURISTIC"]);
        let Ok(Cli { command: Command::Serve(serve), .. }) = args else { panic!("parses") };
        assert_eq!(serve.cuda_options.len(), 2);
    }
}
