//! What each layer of a request's path costs, for BENCHMARKS.md: the process's CPU time per
//! operation (user + system from getrusage over many operations, so every thread a layer
//! wakes counts, as in the server's CPU per request that `scripts/bench_overhead.sh`
//! measures) beside the wall time per operation. Criterion measures wall time only, which
//! misses the CPU of the threads a hand-off wakes; this is why the loop is our own.
//!
//! Layers, on the digits example (64 values in, the model's outputs back):
//! - OIP JSON decode and encode (HTTP), and the binary tensor extension;
//! - gRPC decode (protobuf bytes → validated request) and encode (→ protobuf bytes); the
//!   decode of a batch of images (19 MB), and both encodes of a detector's outputs for one
//!   image (2.8 MB);
//! - the queue hop: submit → batch → reply, with a graph that computes nothing, one request
//!   at a time, 64 at once, and 256 callers of one-row jobs batched up to 128 (the queue's
//!   own cost a job, which bounds a model's one-row requests a second); and an instance's
//!   time between runs when its queue is never empty, with a graph that holds its thread for
//!   150 µs or 1 ms a run (as a GPU's run does while its stream synchronises): what the
//!   hand-off of each batch costs the instance; and
//!   image-sized jobs batched 64 at a time on two instances: their batches a second, and
//!   another model's latency meanwhile (where a batch's copies hold the runtime's threads);
//! - the backend call: the digits MLP on ONNX Runtime (1 intra-op thread), one row, and
//!   per row of a batch of 32; and per image of a batch of 32 through a per-channel average
//!   pool (what handing tens of MB to the engine costs beside the engine's read of them); and
//!   callers of images through a Relu, batched 64 at a time, whose outputs are as large as
//!   their inputs (what an image costs from its call to its answer, the run included);
//! - the sandbox: fresh store + instantiate + call of a trivial component, and of the digits
//!   component (whose model call goes through the queue and the backend above);
//! - a request's whole path in process, over HTTP and gRPC (the router and the gRPC service
//!   `sluice serve` runs, the latter behind its body layer, both under its log subscriber,
//!   called without a network: everything Sluice does for a request, the plain model's and
//!   the app's), beside the floor server's handlers called the same way (the protocols' own
//!   cost; also answering from another task, as Sluice's answers come from a model queue, and
//!   spending `BUSY_US` µs of CPU per request, as `scripts/bench_overhead.sh`'s `busy` floor
//!   does end to end), one request at a time and from 64 tasks (as the server runs each
//!   connection as a task of its own);
//! - the same gRPC calls over one HTTP/2 connection held in memory, from a client on a thread
//!   of its own (as `sluice perf --grpc` calls over TCP), to the gRPC server `sluice serve`
//!   runs and to the floor's: what a real connection runs for a call and a handler called in
//!   process does not (h2's frames and HPACK, hyper's task per call, waking the client), without
//!   the kernel's socket. The row is the process's CPU less the client thread's.
//!
//! - the metrics: one scrape rendered, and one sweep of the series of deleted names, with
//!   2,000 request series;
//! - the cores' share: one tenant's runs of 2 ms of CPU on four models a core, two callers
//!   each, with its runs taking places on the cores (as in the server) and unchecked: the runs
//!   a second against what the cores can do, and another tenant's 2 ms run, one at a time,
//!   meanwhile.
//!
//! Run: `cargo bench --bench layers` (or `-- wire queue backend sandbox handler metrics cores`: only
//! those groups; `ROWS=text` picks among the queue rows too (`between runs`, `images`);
//! `TASKS=N`: the handler rows from N tasks instead of 64 (Sluice's concurrent
//! rows print their rows per batch, as `scripts/bench_overhead.sh` prints an end-to-end run's:
//! compare rows with the same batches); `ROWS=text`: only the handler rows whose label
//! contains the text, and `OPS=N`: N requests per handler row instead of 40,000, e.g. to
//! profile one of them for long enough; `ACCEPT_ENCODING=gzip`: the HTTP rows ask for
//! compressed answers; `SPAWN_EACH=1`: each request of the concurrent rows runs as a task of
//! its own, as hyper's HTTP/2 server runs each gRPC call).

#[path = "../../tests/e2e/onnx.rs"]
#[allow(dead_code)]
mod onnx;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::Request;
use futures::StreamExt;
use prost::Message;
use sha2::{Digest, Sha256};
use sluice::api::grpc::proto::ModelInferRequest;
use sluice::api::grpc::proto::model_infer_request::InferInputTensor;
use sluice::api::grpc_body::BodyLimits;
use sluice::api::http::HttpService;
use sluice::nn::backend::{
    self, Author, Backend, BackendError, BackendKind, BackendSettings, Graph, Output, Signature, Stop, TensorSpec,
};
use sluice::nn::models::{ModelCopy, TenantModels};
use sluice::nn::scheduler::{Loaded, ModelQueue, NamedTensors, QueueSettings, Residence, Share};
use sluice::oip::types::{InferOutcome, TensorLimits, ValidTensor};
use sluice::registry::ids::ModelName;
use sluice::registry::placement::Placement;
use sluice::runtime::{
    Component, Datatype, GuestCall, GuestTensor, HttpCall, HttpPrepared, InferRequest, Prepared, Runtime, TensorData,
    WarmPool,
};
use sluice::telemetry::rate::TokenBucket;
use sluice::tensor::{ElementType, Tensor};
use tokio::io::DuplexStream;

const LIMITS: TensorLimits = TensorLimits { max_elements: 1 << 24 };
/// Requests in flight at once in the concurrent rows (the end-to-end runs' concurrency).
const CONCURRENCY: usize = 64;

/// CPU time of the whole process so far (every thread).
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer it is given.
    #[allow(unsafe_code)]
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU and wall time per operation.
struct PerOp {
    cpu: Duration,
    wall: Duration,
}

impl PerOp {
    fn row(&self, layer: &str) {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!("| {layer} | {:.2} | {:.2} |", us(self.cpu), us(self.wall));
    }
}

/// Where a measurement started.
struct Clock {
    cpu: Duration,
    wall: Instant,
}

impl Clock {
    fn start() -> Self {
        Self { cpu: process_cpu(), wall: Instant::now() }
    }

    fn per_op(&self, operations: usize) -> PerOp {
        let operations = operations as u32;
        PerOp { cpu: (process_cpu() - self.cpu) / operations, wall: self.wall.elapsed() / operations }
    }
}

/// Calls of `op` to warm up (a tenth) and to measure, for `count` operations done
/// `per_call` at a time.
fn calls(count: usize, per_call: usize) -> (usize, usize) {
    let measured = count / per_call;
    ((measured / 10).max(1), measured)
}

/// Run `op` for a tenth of `count` operations as warm-up, then for `count` operations
/// (`per_call` operations per call of `op`).
fn measure(count: usize, per_call: usize, mut op: impl FnMut()) -> PerOp {
    let (warm_up, measured) = calls(count, per_call);
    (0..warm_up).for_each(|_| op());
    let clock = Clock::start();
    (0..measured).for_each(|_| op());
    clock.per_op(measured * per_call)
}

/// [`measure`] for an operation that awaits.
async fn measure_async<F: Future<Output = ()>>(count: usize, per_call: usize, mut op: impl FnMut() -> F) -> PerOp {
    let (warm_up, measured) = calls(count, per_call);
    for _ in 0..warm_up {
        op().await;
    }
    let clock = Clock::start();
    for _ in 0..measured {
        op().await;
    }
    clock.per_op(measured * per_call)
}

/// `operations` calls of `op` from `concurrency` tasks spawned on the current runtime, each a
/// closed loop over its share; with `spawn_each`, each call a task of its own.
async fn closed_loops<F>(
    concurrency: usize,
    operations: usize,
    op: impl Fn() -> F + Clone + Send + 'static,
    spawn_each: bool,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let loops = (0..concurrency).map(|_| {
        let op = op.clone();
        tokio::spawn(async move {
            for _ in 0..operations / concurrency {
                if spawn_each {
                    tokio::spawn(op()).await.expect("the operation ran");
                } else {
                    op().await;
                }
            }
        })
    });
    for finished in futures::future::join_all(loops).await {
        finished.expect("a loop ran");
    }
}

/// Tasks of the in-process handler rows: [`CONCURRENCY`], or `TASKS=N` (how the cost per
/// request moves with concurrency).
fn tasks() -> usize {
    env_number("TASKS").filter(|&n| n > 0).unwrap_or(CONCURRENCY)
}

/// Requests per handler row from many tasks (half as many one at a time): 40,000, or `OPS=N`.
fn handler_ops() -> usize {
    env_number("OPS").filter(|&n| n > 1).unwrap_or(40_000)
}

/// A number from the environment variable `name`, where it is set and parses.
fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok()?.parse().ok()
}

/// Whether a handler row is run: all of them, or those whose label contains `ROWS`.
fn wanted(row: &str) -> bool {
    std::env::var("ROWS").map_or(true, |only| row.contains(&only))
}

/// `SPAWN_EACH=1`: each operation of the concurrent rows runs as a task of its own, as
/// hyper's HTTP/2 server runs each stream (a gRPC call), instead of in its caller's task.
static SPAWN_EACH: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| std::env::var_os("SPAWN_EACH").is_some());

/// `count` operations done by [`tasks()`] tasks of their own, each a closed loop (as the
/// server runs each connection as a task), after a tenth as warm-up.
async fn measure_tasks<F>(count: usize, op: impl Fn() -> F + Clone + Send + 'static) -> PerOp
where
    F: Future<Output = ()> + Send + 'static,
{
    let concurrency = tasks();
    let run = |operations: usize| closed_loops(concurrency, operations, op.clone(), *SPAWN_EACH);
    run(count / 10).await;
    let clock = Clock::start();
    run(count).await;
    clock.per_op(count / concurrency * concurrency)
}

mod common;
mod floor_server;

use common::{digits_row, pixels, root, scaled};
use floor_server::{Answering, Hop, thread_cpu};

/// A graph that answers (a copy of) its input at once: the queue's own cost.
struct Echo(Signature);

impl Graph for Echo {
    fn signature(&self) -> &Signature {
        &self.0
    }

    fn run(&self, inputs: &mut Vec<(String, Tensor)>, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
        Ok(Output::all(inputs.clone()))
    }
}

/// A graph whose run holds its thread for a fixed time, as a GPU run does while its stream
/// synchronises (spinning, CUDA's default with fewer contexts than CPUs).
struct Waits(Signature, Duration);

impl Graph for Waits {
    fn signature(&self) -> &Signature {
        &self.0
    }

    fn run(&self, inputs: &mut Vec<(String, Tensor)>, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
        let until = Instant::now() + self.1;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        Ok(Output::all(inputs.clone()))
    }
}

/// A graph whose runs take its time of the thread's CPU (so runs that share a core take longer)
/// and count themselves.
struct Spends(Signature, Duration, Arc<AtomicUsize>);

impl Graph for Spends {
    fn signature(&self) -> &Signature {
        &self.0
    }

    fn run(&self, inputs: &mut Vec<(String, Tensor)>, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
        let started = thread_cpu();
        while thread_cpu().saturating_sub(started) < self.1 {
            std::hint::spin_loop();
        }
        self.2.fetch_add(1, Ordering::Relaxed);
        Ok(Output::all(inputs.clone()))
    }
}

/// One tenant's runs of 2 ms of CPU on four models a core, two callers each, for 2 s, with
/// its runs taking places on the cores and unchecked (twice each, alternately): its runs a
/// second against the cores' 500 a second each, and the p50 / p99 of another tenant's run of
/// 2 ms, called one at a time meanwhile.
async fn cores_layers() {
    const RUN: Duration = Duration::from_millis(2);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let spec = TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(64)] };
    let signature = || Signature { inputs: vec![spec.clone()], outputs: vec![spec.clone()] };
    for checked in [true, false, true, false] {
        let places = sluice::nn::scheduler::places::places_for(cores, 1);
        let gates = checked.then(|| sluice::nn::scheduler::places::DeviceGates::new(places, 1));
        let settings = QueueSettings { max_batch_rows: 1, places: gates, ..queue_settings() };
        let runs = Arc::new(AtomicUsize::new(0));
        let models: Vec<ModelQueue> = (0..4 * cores)
            .map(|i| queue_of(&format!("busy-{i}"), Arc::new(Spends(signature(), RUN, runs.clone())), settings.clone()))
            .collect();
        let other = queue_of("other", Arc::new(Spends(signature(), RUN, Arc::default())), settings);
        let stop = Arc::new(AtomicBool::new(false));
        let callers: Vec<_> = (0..2 * models.len())
            .map(|caller| {
                let (queue, stop) = (models[caller % models.len()].clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                        queue.compute(digits_row(), deadline, Share::new("busy".into(), 1)).await.expect("answered");
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (before, started, cpu_before) = (runs.load(Ordering::Relaxed), Instant::now(), process_cpu());
        let mut took = Vec::new();
        while started.elapsed() < Duration::from_secs(2) {
            let (deadline, sent) = (tokio::time::Instant::now() + Duration::from_secs(10), Instant::now());
            other.compute(digits_row(), deadline, Share::new("other".into(), 1)).await.expect("answered");
            took.push(sent.elapsed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let per_second = (runs.load(Ordering::Relaxed) - before) as f64 / started.elapsed().as_secs_f64();
        let busy = (process_cpu() - cpu_before).as_secs_f64() / started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for caller in callers {
            caller.await.expect("a caller");
        }
        let (p50, p99) = percentiles(std::sync::Mutex::new(took));
        let (p50, p99) = (p50 / 1e3, p99 / 1e3);
        println!(
            "{:<100} {per_second:>8.0} runs/s of {} possible, the process {busy:.2} cores busy; another tenant's 2 ms run p50 {p50:.2} / p99 {p99:.2} ms",
            format!(
                "one tenant's 2 ms runs on {} models, {}",
                4 * cores,
                if checked { "the cores shared" } else { "unchecked" }
            ),
            cores as f64 / RUN.as_secs_f64(),
        );
    }
}

fn queue_settings() -> QueueSettings {
    // The manifest's defaults (`Batching::default`).
    QueueSettings {
        max_batch_rows: 32,
        preferred_batch_rows: Vec::new(),
        max_delay: Duration::ZERO,
        capacity: 1024,
        instances: 1,
        padding: None,
        autoscale: None,
        // As the server's queues: runs on the host's cores take places there.
        places: Some(sluice::nn::scheduler::places::DeviceGates::new(
            std::thread::available_parallelism().map_or(1, usize::from),
            1,
        )),
    }
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let backends = backend::available(&BackendSettings {
        onnxruntime_library: None,
        threads: 1,
        webgpu_library: None,
        cuda_options: Vec::new(),
        // As the server runs by default; SLUICE_RUN_MEMORY=0 as `--run-memory 0` (no arena).
        run_memory: match std::env::var("SLUICE_RUN_MEMORY").as_deref() {
            Ok("0") => None,
            _ => Some(sluice::nn::device::Device::default_run_memory()),
        },
    });
    let onnxruntime =
        backends.get(BackendKind::Onnxruntime).ok_or_else(|| anyhow::anyhow!("{:?}", backends.unavailable))?;
    let model_bytes = std::fs::read(root().join("examples/digits/model/digits.onnx"))?;
    let graph: Arc<dyn Graph> = onnxruntime.load(&model_bytes, &Placement::CPU, Author::Operator)?.into();
    let outputs = Output::into_tensors(graph.run(&mut digits_row(), &Stop::default())?)?;

    println!("### Layers (`cargo bench --bench layers`)\n");
    println!("| layer | CPU µs per request | wall µs per request |\n| --- | --- | --- |");
    // `cargo bench --bench layers -- queue sandbox`: only those groups (for a profiler).
    let groups: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let wanted = |group: &str| groups.is_empty() || groups.iter().any(|g| g == group);
    if wanted("wire") {
        wire_layers(&outputs)?;
    }
    // Callers run as tasks on the runtime's workers, as the server's request handlers do.
    if wanted("queue") {
        runtime.block_on(runtime.spawn(queue_layers()))??;
    }
    if wanted("backend") {
        backend_layers(onnxruntime.as_ref(), graph.as_ref())?;
        runtime.block_on(runtime.spawn(large_outputs(onnxruntime.clone())))??;
    }
    if wanted("sandbox") {
        runtime.block_on(runtime.spawn(sandbox_layers(graph)))??;
    }
    if wanted("handler") {
        runtime.block_on(runtime.spawn(handler_layers()))??;
    }
    if wanted("metrics") {
        metrics_layers();
    }
    if wanted("cores") {
        runtime.block_on(runtime.spawn(cores_layers()))?;
    }
    println!();
    Ok(())
}

/// The server's metrics with 10 tenants of 100 apps each, called over both protocols (2,000
/// request series, each a counter and a histogram): one scrape's rendering, and one sweep of
/// the series of deleted names (every 10 s in the server) that finds none to take.
fn metrics_layers() {
    use sluice::telemetry::metrics::{Protocol, RequestLabels, Served, metrics};
    let names: Vec<(String, String)> = (0..10)
        .flat_map(|tenant| (0..100).map(move |app| (format!("tenant-{tenant}"), format!("app-{app}"))))
        .collect();
    for (tenant, app) in &names {
        for protocol in [Protocol::Http, Protocol::Grpc] {
            let labels = RequestLabels { tenant, app, version: "1", protocol };
            metrics().request(labels, 200, None, Duration::from_millis(1));
        }
    }
    let served = || {
        let mut served = Served::default();
        for (tenant, app) in &names {
            served.name(tenant, app, ["1".to_string()]);
        }
        served
    };
    measure(50, 1, || drop(metrics().render())).row("metrics: one scrape rendered (2,000 request series)");
    measure(50, 1, || assert_eq!(metrics().sweep(served), 0)).row("metrics: one sweep of deleted names (none)");
}

fn outcome(outputs: &NamedTensors) -> InferOutcome {
    InferOutcome {
        model_name: "digits-mlp".to_string(),
        model_version: "1".to_string(),
        id: None,
        outputs: outputs.iter().map(|(name, t)| ValidTensor::from_model_tensor(name.clone(), t.clone())).collect(),
        parameters: Vec::new(),
        cost_us: Some(12.5),
    }
}

fn wire_layers(outputs: &NamedTensors) -> anyhow::Result<()> {
    use sluice::api::{grpc, json};
    let (body, image) = common::request_bodies()?;
    let parse = |body: &[u8], header: Option<usize>| json::parse_infer_request(body, header, LIMITS).expect("valid");
    measure(200_000, 1, || drop(parse(&body, None))).row("HTTP JSON decode (64 FP32)");
    measure(200_000, 1, || drop(parse(&image, None))).row("HTTP JSON decode (64 UINT8, the app's input)");
    let rows: Vec<u8> = (0..128).flat_map(|_| pixels()).collect();
    let batch = common::json_request("image", "UINT8", 128, &rows)?;
    measure(2_000, 1, || drop(parse(&batch, None))).row("HTTP JSON decode (128 × 64 UINT8, the soak's request)");
    let encoding = parse(&body, None).encoding;
    measure(200_000, 1, || drop(json::encode_response(outcome(outputs), &encoding).expect("encodes")))
        .row("HTTP JSON encode (the model's outputs)");

    let header = serde_json::to_vec(&serde_json::json!({
        "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "parameters": { "binary_data_size": 256 } }],
        "parameters": { "binary_data_output": true }
    }))?;
    let mut binary = header.clone();
    binary.extend(scaled_bytes());
    measure(200_000, 1, || drop(parse(&binary, Some(header.len())))).row("HTTP binary decode");
    let encoding = parse(&binary, Some(header.len())).encoding;
    measure(200_000, 1, || drop(json::encode_response(outcome(outputs), &encoding).expect("encodes")))
        .row("HTTP binary encode");

    let message = infer_request("digits-mlp", "X", "FP32", scaled_bytes()).encode_to_vec();
    measure(200_000, 1, || {
        let decoded = ModelInferRequest::decode(message.as_slice()).expect("decodes");
        drop(grpc::parse_infer_request(decoded, LIMITS).expect("valid"));
    })
    .row("gRPC decode (protobuf, raw contents)");
    let mut images = infer_request("images", "X", "FP32", vec![7; 32 * 602_112]);
    images.inputs[0].shape = vec![32, 3, 224, 224];
    let images = images.encode_to_vec();
    measure(500, 1, || {
        let decoded = ModelInferRequest::decode(images.as_slice()).expect("decodes");
        drop(grpc::parse_infer_request(decoded, LIMITS).expect("valid"));
    })
    .row("gRPC decode (a batch of 32 images, 3 × 224 × 224 FP32: 19 MB)");
    measure(200_000, 1, || drop(grpc::encode_response(outcome(outputs)).encode_to_vec())).row("gRPC encode");

    // A detector's outputs for one image (84 × 8400 FP32, 2.8 MB): what answering them costs
    // beyond the copy each row makes of the outcome first (the last row).
    let detections = Tensor::new(ElementType::F32, vec![1, 84, 8400], vec![7; 84 * 8400 * 4])?;
    let detections = vec![("Y".to_string(), detections)];
    measure(2_000, 1, || {
        drop(json::encode_response(outcome(&detections), &encoding).expect("encodes"));
    })
    .row("HTTP binary encode, the body ready for the connection (84 × 8400 FP32, 2.8 MB)");
    measure(2_000, 1, || drop(grpc::encode_response(outcome(&detections)).encode_to_vec()))
        .row("gRPC encode (84 × 8400 FP32, 2.8 MB)");
    measure(2_000, 1, || drop(outcome(&detections))).row("the outcome's copy in the two rows above");
    Ok(())
}

async fn queue_layers() -> anyhow::Result<()> {
    let spec = |name: &str| TensorSpec { name: name.to_string(), ty: ElementType::F32, dims: vec![None, Some(64)] };
    let signature = || Signature { inputs: vec![spec("X")], outputs: vec![spec("X")] };
    let queue = queue_of("echo", Arc::new(Echo(signature())), queue_settings());
    let share = || Share::new("bench".into(), 1);
    let deadline = || tokio::time::Instant::now() + Duration::from_secs(10);
    let row = "queue hop (submit → batch → reply, no model), 1 in flight";
    if wanted(row) {
        measure_async(50_000, 1, || async {
            queue.compute(digits_row(), deadline(), share()).await.expect("answered");
        })
        .await
        .row(row);
    }
    let row = format!("queue hop, {CONCURRENCY} in flight (batches of up to 32)");
    if wanted(&row) {
        let queue = &queue;
        measure_async(100_000, CONCURRENCY, || async move {
            let calls = (0..CONCURRENCY).map(|_| async move {
                queue.compute(digits_row(), deadline(), share()).await.expect("answered");
            });
            futures::future::join_all(calls).await;
        })
        .await
        .row(&row);
    }
    one_row_callers(signature).await;
    if wanted("between runs") {
        gap_between_runs(signature).await;
    }
    if wanted("images") {
        large_batches(signature).await;
    }
    Ok(())
}

/// Many callers of one-row jobs, each a task in a closed loop, batched up to 128 rows on one
/// instance that answers at once (Triton's dynamic batcher's use: perf_analyzer's clients send
/// one row each): the queue's CPU per job, which bounds a model's rows a second whatever its
/// engine (the queue's own task books every job). Four tenants' jobs share the batches.
async fn one_row_callers(signature: impl Fn() -> Signature) {
    const CALLERS: usize = 256;
    const TENANTS: usize = 4;
    let row = format!("queue hop, {CALLERS} callers of one-row jobs, {TENANTS} tenants (batches of up to 128)");
    if !wanted(&row) {
        return;
    }
    let settings = QueueSettings { max_batch_rows: 128, capacity: 4 * CALLERS, ..queue_settings() };
    let queue = Arc::new(queue_of("echo-128", Arc::new(Echo(signature())), settings));
    let job = Arc::new(AtomicUsize::new(0));
    let tenants: Arc<[Arc<str>]> = (0..TENANTS).map(|t| Arc::from(format!("tenant-{t}"))).collect();
    let call = move || {
        let queue = queue.clone();
        let tenant = tenants[job.fetch_add(1, Ordering::Relaxed) % TENANTS].clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            queue.compute(digits_row(), deadline, Share::new(tenant, 1)).await.expect("answered");
        }
    };
    let run = |jobs: usize| closed_loops(CALLERS, jobs, call.clone(), false);
    run(40_000).await;
    let (clock, before) = (Clock::start(), BatchRows::now());
    let jobs = env_number("OPS").filter(|&n| n > CALLERS).unwrap_or(400_000);
    run(jobs).await;
    clock.per_op(jobs / CALLERS * CALLERS).row(&before.label(&row));
}

/// A queue serving `graph` alone, as loaded.
fn queue_of(model: &str, graph: Arc<dyn Graph>, settings: QueueSettings) -> ModelQueue {
    let loaded = Loaded { graphs: vec![graph], memory: Vec::new() };
    ModelQueue::start(model, "none", (loaded, Residence::default()), true, settings, Arc::default())
}

/// A model whose queue is never empty, each job a whole batch: how long from one run to the
/// next beyond the run itself (what the instance waits on the queue between runs).
async fn gap_between_runs(signature: impl Fn() -> Signature) {
    const IN_FLIGHT: usize = 8;
    const RUNS: usize = 4_000;
    for run in [Duration::from_micros(150), Duration::from_micros(1_000)] {
        let settings = QueueSettings { max_batch_rows: 1, ..queue_settings() };
        let queue = Arc::new(queue_of("waits", Arc::new(Waits(signature(), run)), settings));
        let runs = if run > Duration::from_micros(500) { RUNS / 4 } else { RUNS };
        let started = Instant::now();
        let call = move || {
            let queue = queue.clone();
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                queue.compute(digits_row(), deadline, Share::new("bench".into(), 1)).await.expect("answered");
            }
        };
        closed_loops(IN_FLIGHT, runs, call, false).await;
        let per_run = started.elapsed() / (runs / IN_FLIGHT * IN_FLIGHT) as u32;
        println!(
            "{:<100} {:>8.1} µs from one run to the next, {:.1} µs of it between runs",
            format!("a queue never empty, runs of {} µs, {IN_FLIGHT} in flight", run.as_micros()),
            per_run.as_secs_f64() * 1e6,
            (per_run.saturating_sub(run)).as_secs_f64() * 1e6
        );
    }
}

/// A graph whose run leaves the CPU free for its time (a GPU's run, its stream synchronised
/// by blocking rather than spinning), and answers a copy of its input, as an engine copies
/// its outputs out.
struct Sleeps(Signature, Duration);

impl Graph for Sleeps {
    fn signature(&self) -> &Signature {
        &self.0
    }

    fn run(&self, inputs: &mut Vec<(String, Tensor)>, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
        std::thread::sleep(self.1);
        Ok(Output::all(inputs.clone()))
    }
}

/// Image-sized jobs (3×224×224 f32, 602 KB each) on two instances whose queue is never empty,
/// in batches of 64 (38.5 MB) and runs of 5 ms that leave the CPU free: batches a second, and
/// meanwhile the latency of another model's jobs, one at a time, on the same runtime (another
/// tenant's, held up wherever a batch's copies hold a runtime thread).
async fn large_batches(small_signature: impl Fn() -> Signature) {
    const ROWS: usize = 64;
    const SMALL_JOBS: usize = 2_000;
    let image = Tensor::new(ElementType::F32, vec![1, 3, 224, 224], vec![7; 3 * 224 * 224 * 4]).expect("an image");
    let spec =
        TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(3), Some(224), Some(224)] };
    let signature = Signature { inputs: vec![spec.clone()], outputs: vec![spec] };
    let graphs: Vec<Arc<dyn Graph>> =
        (0..2).map(|_| Arc::new(Sleeps(signature.clone(), Duration::from_millis(5))) as Arc<dyn Graph>).collect();
    let settings = QueueSettings { max_batch_rows: ROWS, instances: 2, ..queue_settings() };
    let loaded = Loaded { graphs, memory: Vec::new() };
    let images =
        Arc::new(ModelQueue::start("images", "none", (loaded, Residence::default()), true, settings, Arc::default()));
    let small = queue_of("small", Arc::new(Echo(small_signature())), queue_settings());
    let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    // Four batches' worth of callers: the queue never empties.
    let feeders: Vec<_> = (0..4 * ROWS)
        .map(|_| {
            let (images, image, stop, done) = (images.clone(), image.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                    let inputs = vec![("X".to_string(), image.clone())];
                    images.compute(inputs, deadline, Share::new("images".into(), 1)).await.expect("answered");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (started, done_before) = (Instant::now(), done.load(Ordering::Relaxed));
    let mut took = Vec::with_capacity(SMALL_JOBS);
    for _ in 0..SMALL_JOBS {
        let began = Instant::now();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        small.compute(digits_row(), deadline, Share::new("small".into(), 1)).await.expect("answered");
        took.push(began.elapsed());
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let batches = (done.load(Ordering::Relaxed) - done_before) as f64 / ROWS as f64;
    let per_second = batches / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for feeder in feeders {
        feeder.await.expect("a feeder ran");
    }
    took.sort();
    let ms = |quantile: f64| took[((took.len() - 1) as f64 * quantile) as usize].as_secs_f64() * 1e3;
    println!(
        "{:<100} {per_second:>8.1} batches/s; another model's jobs p50 {:.3} / p99 {:.2} / max {:.2} ms",
        format!("2 instances, batches of {ROWS} images (38.5 MB), runs of 5 ms leaving the CPU"),
        ms(0.5),
        ms(0.99),
        ms(1.0)
    );
}

fn backend_layers(onnxruntime: &dyn Backend, graph: &dyn Graph) -> anyhow::Result<()> {
    measure(100_000, 1, || drop(graph.run(&mut digits_row(), &Stop::default()).expect("runs")))
        .row("backend call: digits MLP on ONNX Runtime, 1 row");
    let data: Vec<u8> = (0..32).flat_map(|_| scaled()).flat_map(|v| v.to_le_bytes()).collect();
    let batch = vec![("X".to_string(), Tensor::new(ElementType::F32, vec![32, 64], data)?)];
    measure(200_000, 32, || drop(graph.run(&mut batch.clone(), &Stop::default()).expect("runs")))
        .row("backend call: the same, per row of a batch of 32");
    // An engine call that reads tens of MB and computes little, as a GPU's does on the host:
    // what handing a batch of images to the engine costs beside the engine's own read of it
    // (each call copies the batch first, as each batch is stacked).
    let pool = onnxruntime.load(&on_images("GlobalAveragePool", [1, 1]), &Placement::CPU, Author::Operator)?;
    let images = vec![("X".to_string(), Tensor::new(ElementType::F32, vec![32, 3, 224, 224], vec![7; 32 * 602_112])?)];
    measure(3_200, 32, || drop(pool.run(&mut images.clone(), &Stop::default()).expect("runs")))
        .row("backend call: per image of a batch of 32 (19 MB) averaged per channel, on ONNX Runtime");
    Ok(())
}

/// A model of one operator from a batch of 3×224×224 f32 images `X` to `Y` of 3 channels of
/// `height_width`.
fn on_images(operator: &str, [height, width]: [i64; 2]) -> Vec<u8> {
    onnx::model(onnx::GraphProto {
        node: vec![onnx::node(operator, &["X"], &["Y"], Vec::new())],
        name: operator.to_lowercase(),
        initializer: Vec::new(),
        input: vec![onnx::value("X", onnx::FLOAT, &[None, Some(3), Some(224), Some(224)])],
        output: vec![onnx::value("Y", onnx::FLOAT, &[None, Some(3), Some(height), Some(width)])],
        ..Default::default()
    })
}

/// Callers of images through ONNX Runtime whose outputs are as large as their inputs (as a
/// segmentation's or a detector's are), batched 64 at a time (38.5 MB each way) on one instance
/// whose queue is never empty: what an image costs the process from its call to its answer,
/// the engine's run (one element-wise op) included.
async fn large_outputs(onnxruntime: Arc<dyn Backend>) -> anyhow::Result<()> {
    const ROWS: usize = 64;
    const IMAGES: usize = 40 * ROWS;
    let graph: Arc<dyn Graph> =
        onnxruntime.load(&on_images("Relu", [224, 224]), &Placement::CPU, Author::Operator)?.into();
    let settings = QueueSettings { max_batch_rows: ROWS, ..queue_settings() };
    let queue = Arc::new(queue_of("relu", graph, settings));
    let image = Tensor::new(ElementType::F32, vec![1, 3, 224, 224], vec![7; 3 * 224 * 224 * 4])?;
    let call = move || {
        let (queue, image) = (queue.clone(), image.clone());
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            let outputs = queue.compute(vec![("X".to_string(), image)], deadline, Share::new("images".into(), 1));
            assert_eq!(outputs.await.expect("answered")[0].1.data().len(), 3 * 224 * 224 * 4);
        }
    };
    // Two batches' worth of callers: one batch waits while the other runs.
    closed_loops(2 * ROWS, IMAGES / 4, call.clone(), false).await;
    let clock = Clock::start();
    closed_loops(2 * ROWS, IMAGES, call, false).await;
    clock.per_op(IMAGES).row(&format!(
        "backend and answers: per image of batches of {ROWS} (38.5 MB) through Relu on ONNX Runtime, as large out"
    ));
    Ok(())
}

async fn sandbox_layers(graph: Arc<dyn Graph>) -> anyhow::Result<()> {
    let cache = tempfile::tempdir()?;
    let runtime = common::runtime(cache.path())?;
    let (trivial, digits) = (common::prepare(&runtime, "echo_guest.wasm")?, common::prepare(&runtime, "digits.wasm")?);
    // The hostile test guest imports all of WASI (files, sockets, clocks): 94 lowered host
    // functions to the echo guest's 13, each set up again in every fresh instance.
    let wide = common::prepare(&runtime, "hostile_guest.wasm")?;
    let copy = ModelCopy::start(
        "digits-mlp",
        "bench".to_string(),
        BackendKind::Onnxruntime,
        (Loaded { graphs: vec![graph], memory: Vec::new() }, Residence::default()),
        queue_settings(),
    );
    let own = BTreeMap::from([(ModelName::new("digits-mlp").map_err(anyhow::Error::msg)?, Arc::new(copy))]);
    let models = Arc::new(TenantModels::new(own, Default::default(), u64::MAX));
    let allowance = Arc::new(TokenBucket::new(1e9, 1e9));
    let call = |request: InferRequest| common::guest_call(&models, &allowance, request);
    let echo = || InferRequest { id: None, inputs: Vec::new(), parameters: vec![("mode".into(), "echo".into())] };
    let image = || InferRequest {
        id: None,
        inputs: vec![GuestTensor {
            name: "image".to_string(),
            datatype: Datatype::Uint8,
            shape: vec![1, 64],
            data: TensorData::Raw(pixels()),
        }],
        parameters: Vec::new(),
    };
    let (runtime, trivial, digits) = (&runtime, &trivial, &digits);
    measure_async(20_000, 1, || async {
        runtime.invoke(trivial, call(echo())).await.expect("echoes");
    })
    .await
    .row("sandbox: fresh store + instantiate + call, trivial component");
    measure_async(20_000, 1, || async {
        runtime.invoke(&wide, call(echo())).await.expect("echoes");
    })
    .await
    .row("sandbox: the same, a component importing all of WASI (the hostile test guest; its echo logs a line)");
    measure_async(20_000, 1, || async {
        runtime.invoke(digits, call(image())).await.expect("classifies");
    })
    .await
    .row("sandbox: the same, digits component (its model call included)");
    python_rows(runtime, digits, &call, image).await?;
    http_app_rows(runtime, &models, &allowance).await?;
    let (trivial_pool, digits_pool) = (WarmPool::default(), WarmPool::default());
    measure_async(20_000, 1, || async {
        runtime.invoke_reusing(trivial, &trivial_pool, call(echo())).await.expect("echoes");
    })
    .await
    .row("sandbox: serial reuse (a parked instance, no instantiation), trivial component");
    measure_async(20_000, 1, || async {
        runtime.invoke_reusing(digits, &digits_pool, call(image())).await.expect("classifies");
    })
    .await
    .row("sandbox: serial reuse, digits component");
    let concurrent = |request: fn() -> InferRequest, prepared| {
        let call = &call;
        move || async move {
            let calls = (0..CONCURRENCY).map(|_| runtime.invoke(prepared, call(request())));
            for answer in futures::future::join_all(calls).await {
                answer.expect("answers");
            }
        }
    };
    measure_async(40_000, CONCURRENCY, concurrent(echo, trivial))
        .await
        .row(&format!("sandbox: trivial component, {CONCURRENCY} in flight"));
    measure_async(40_000, CONCURRENCY, concurrent(image, digits))
        .await
        .row(&format!("sandbox: digits component, {CONCURRENCY} in flight"));
    Ok(())
}

/// The Python `digits` component (examples/digits-py, built by componentize-py through
/// scripts/build_python_guests.sh) beside the Rust one: compile once, then per request with
/// a fresh instance and with serial reuse; p50 and p99 of the fresh calls' wall time.
async fn python_rows(
    runtime: &Runtime,
    rust: &Prepared,
    call: &impl Fn(InferRequest) -> GuestCall,
    image: fn() -> InferRequest,
) -> anyhow::Result<()> {
    let built = std::process::Command::new(root().join("scripts/build_python_guests.sh")).output()?;
    anyhow::ensure!(
        built.status.success(),
        "building the Python guest failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let path = std::path::PathBuf::from(String::from_utf8(built.stdout)?.trim());
    let size_mb = std::fs::metadata(&path)?.len() >> 20;
    let clock = Clock::start();
    let python = common::oip(runtime, &path)?;
    clock.per_op(1).row(&format!("sandbox: compile the Python digits component ({size_mb} MB), once"));
    for (what, prepared, count) in [("Rust", rust, 20_000), ("Python", &python, 400)] {
        let took = std::sync::Mutex::new(Vec::with_capacity(count));
        let per_op = measure_async(count, 1, || async {
            let started = Instant::now();
            runtime.invoke(prepared, call(image())).await.expect("classifies");
            took.lock().expect("not poisoned").push(started.elapsed());
        })
        .await;
        let (p50, p99) = percentiles(took);
        per_op.row(&format!("sandbox: fresh, {what} digits component (wall p50 {p50:.0} µs, p99 {p99:.0} µs)"));
    }
    let pool = WarmPool::default();
    measure_async(4_000, 1, || async {
        runtime.invoke_reusing(&python, &pool, call(image())).await.expect("classifies");
    })
    .await
    .row("sandbox: serial reuse, Python digits component");
    Ok(())
}

/// The `digits` app as an HTTP app (examples/digits-http: the `wasi:http/proxy` world) beside
/// the OIP component: per request with a fresh instance, one image, its model call included;
/// p50 and p99 of the calls' wall time.
async fn http_app_rows(
    runtime: &Runtime,
    models: &Arc<TenantModels>,
    allowance: &Arc<TokenBucket>,
) -> anyhow::Result<()> {
    let prepared = http_app(runtime, "digits_http.wasm")?;
    let took = std::sync::Mutex::new(Vec::with_capacity(20_000));
    let per_op = measure_async(20_000, 1, || async {
        let started = Instant::now();
        let response = runtime.serve_http(&prepared, http_call(models, allowance, pixels())).await;
        assert_eq!(response.expect("classifies").status(), 200);
        took.lock().expect("not poisoned").push(started.elapsed());
    })
    .await;
    let (p50, p99) = percentiles(took);
    per_op.row(&format!(
        "sandbox: fresh, digits as an HTTP app (wasi:http/proxy; wall p50 {p50:.0} µs, p99 {p99:.0} µs)"
    ));
    Ok(())
}

/// The p50 and p99 of calls' wall times, in µs.
fn percentiles(took: std::sync::Mutex<Vec<Duration>>) -> (f64, f64) {
    let mut took = took.into_inner().expect("not poisoned");
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.99))
}

/// A `wasi:http/proxy` component (an HTTP app) of the built guests, ready to call.
fn http_app(runtime: &Runtime, file: &str) -> anyhow::Result<HttpPrepared> {
    let path = std::path::Path::new(env!("SLUICE_GUEST_DIR")).join(file);
    let wasm = std::fs::read(&path)?;
    match runtime.prepare(&path, &hex::encode(Sha256::digest(&wasm)), &wasm, None)? {
        Component::Http(prepared) => Ok(prepared),
        Component::Oip(_) => anyhow::bail!("{} is an OIP component, not an HTTP app", path.display()),
    }
}

/// One HTTP app call as the server builds it: `POST /classify` with `pixels` as the body,
/// tenant `bench`, 64 MiB, 1 s, no outgoing hosts, 16 MiB of response.
fn http_call(models: &Arc<TenantModels>, allowance: &Arc<TokenBucket>, pixels: Vec<u8>) -> HttpCall {
    let GuestCall { nn, memory_bytes, log, deadline, deadline_ms, .. } =
        common::guest_call(models, allowance, InferRequest { id: None, inputs: Vec::new(), parameters: Vec::new() });
    let mut request = Request::new(Bytes::from(pixels));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static("/classify");
    request.headers_mut().insert(http::header::HOST, http::HeaderValue::from_static("localhost"));
    HttpCall {
        nn,
        memory_bytes,
        log,
        deadline,
        deadline_ms,
        outgoing_hosts: Arc::from([]),
        max_response_bytes: 16 << 20,
        request,
    }
}

/// `ACCEPT_ENCODING`: the HTTP rows' requests send it as `Accept-Encoding` (as browsers and
/// Python's `requests` do by default), so their answers come compressed.
static ACCEPT_ENCODING: std::sync::LazyLock<Option<String>> =
    std::sync::LazyLock::new(|| std::env::var("ACCEPT_ENCODING").ok());

/// One OIP infer request over HTTP to `router`, in process; panics unless it succeeds.
async fn http_infer(router: impl HttpService<Body>, model: &str, body: Bytes) {
    use tower::ServiceExt;
    let mut request = Request::post(format!("/v2/models/{model}/infer"))
        .header("authorization", format!("Bearer {}", common::KEY))
        .header("content-type", "application/json");
    if let Some(encoding) = ACCEPT_ENCODING.as_deref() {
        request = request.header("accept-encoding", encoding);
    }
    let request = request.body(Body::from(body)).expect("a request");
    let response = router.oneshot(request).await.expect("infallible");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("a body");
    assert!(status.is_success(), "{status}: {}", String::from_utf8_lossy(&body));
}

/// A gRPC service as tonic's server calls it: a generated service, or one behind layers.
trait GrpcService:
    tower::Service<
        Request<tonic::body::Body>,
        Response = http::Response<tonic::body::Body>,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> GrpcService for S where
    S: tower::Service<
            Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// One gRPC ModelInfer call (`frame`: the length-prefixed message) to `service`, in process;
/// panics unless it succeeds.
async fn grpc_infer<S: GrpcService>(service: S, frame: Bytes) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let request = Request::post("/inference.GRPCInferenceService/ModelInfer")
        .header("authorization", format!("Bearer {}", common::KEY))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(frame)))
        .expect("a request");
    let response = service.oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("a body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let status = trailers.get("grpc-status").or(parts.headers.get("grpc-status"));
    assert_eq!(status.map(|s| s.as_bytes()), Some(&b"0"[..]), "{parts:?} {trailers:?}");
}

/// The digits row's 64 FP32 values, little-endian.
fn scaled_bytes() -> Vec<u8> {
    scaled().iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A gRPC ModelInfer request of one 64-value row, in raw contents.
fn infer_request(model: &str, input: &str, datatype: &str, contents: Vec<u8>) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.to_string(),
        inputs: vec![InferInputTensor {
            name: input.to_string(),
            datatype: datatype.to_string(),
            shape: vec![1, 64],
            ..Default::default()
        }],
        raw_input_contents: vec![contents],
        ..Default::default()
    }
}

/// [`infer_request`] encoded and length-prefixed, as gRPC frames it on the wire.
fn grpc_frame(request: &ModelInferRequest) -> Bytes {
    let message = request.encode_to_vec();
    let mut frame = vec![0];
    frame.extend((message.len() as u32).to_be_bytes());
    frame.extend(message);
    frame.into()
}

/// A request's whole path in process, without a network: the floor's handlers (the protocols'
/// own cost) and the router and gRPC service `sluice serve` runs, under its log subscriber
/// (all that Sluice does), one request at a time and from `CONCURRENCY` tasks (as the server
/// runs each connection as a task of its own).
async fn handler_layers() -> anyhow::Result<()> {
    serve_logging();
    let (tenants, data) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let config = common::digits_config(tenants.path(), data.path())?;
    let state = Arc::new(sluice::serve::build_state(&config).await?);
    let (plain, image) = common::request_bodies()?;
    let (plain, image) = (Bytes::from(plain), Bytes::from(image));
    let plain_request = infer_request("digits-mlp", "X", "FP32", scaled_bytes());
    let image_request = infer_request("digits", "image", "UINT8", pixels());
    let (plain_frame, image_frame) = (grpc_frame(&plain_request), grpc_frame(&image_request));

    let sluice_router = sluice::api::http::router(state.clone());
    http_rows("floor", floor_server::http_router(Hop::None.into()), "digits-mlp", &plain).await;
    http_rows("floor answering from another task", floor_server::http_router(Hop::Task.into()), "digits-mlp", &plain)
        .await;
    let (busy_row, busy) = busy_floor();
    http_rows(&busy_row, floor_server::http_router(busy), "digits-mlp", &plain).await;
    http_rows("plain model", sluice_router.clone(), "digits-mlp", &plain).await;
    http_rows("digits app", sluice_router, "digits", &image).await;
    // As `sluice serve` runs it: behind the layer that admits the call and bounds its body.
    let sluice_grpc = tower::Layer::layer(
        &BodyLimits::new(state.clone(), config.grpc_max_message_bytes, config.body_timeouts.request),
        sluice::api::grpc::service(state.clone(), config.grpc_max_message_bytes, config.grpc_response_compression),
    );
    grpc_rows("floor", floor_server::grpc_service(Hop::None.into()), &plain_frame).await;
    grpc_rows("floor answering from another task", floor_server::grpc_service(Hop::Task.into()), &plain_frame).await;
    grpc_rows(&busy_row, floor_server::grpc_service(busy), &plain_frame).await;
    grpc_rows("plain model", sluice_grpc.clone(), &plain_frame).await;
    grpc_rows("digits app", sluice_grpc, &image_frame).await;

    let floor = |answering: Answering| {
        move |connection| {
            serve_one(
                tonic::transport::Server::builder().add_service(floor_server::grpc_service(answering)),
                connection,
            )
        }
    };
    let sluice = || {
        let server = sluice::serve::grpc_server(state.clone(), &config);
        move |connection| serve_one(server, connection)
    };
    grpc_connection_row("floor", floor(Hop::None.into()), &plain_request).await?;
    grpc_connection_row("floor answering from another task", floor(Hop::Task.into()), &plain_request).await?;
    grpc_connection_row(&busy_row, floor(busy), &plain_request).await?;
    grpc_connection_row("plain model", sluice(), &plain_request).await?;
    grpc_connection_row("digits app", sluice(), &image_request).await?;
    Ok(())
}

type GrpcRequest = Request<tonic::body::Body>;

/// Serve the one connection `connection` with `server` (as `sluice serve` and the floor
/// serve each of theirs) until the row drops it.
async fn serve_one<L>(server: tonic::transport::server::Router<L>, connection: DuplexStream)
where
    L: tower::Layer<tonic::service::Routes> + Clone,
    L::Service: tower::Service<GrpcRequest, Response = http::Response<tonic::body::Body>> + Clone + Send + 'static,
    <L::Service as tower::Service<GrpcRequest>>::Future: Send + 'static,
    <L::Service as tower::Service<GrpcRequest>>::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    // The stream stays open after its one connection: an ended one would make tonic close it.
    let incoming =
        futures::stream::once(async { Ok::<_, std::io::Error>(connection) }).chain(futures::stream::pending());
    let _ = server.serve_with_incoming(incoming).await;
}

/// gRPC calls from [`tasks()`] tasks of one client over one HTTP/2 connection held in memory
/// (`tokio::io::duplex`), as `sluice perf --grpc` makes them over TCP: what a real connection
/// runs for a call and the rows called in process do not (h2's frames, HPACK, flow control,
/// hyper's task per call, waking the client), without the kernel's socket. The client runs on
/// a thread and runtime of its own; the row is the process's CPU less that thread's.
async fn grpc_connection_row<Served>(
    what: &str,
    serve: impl FnOnce(DuplexStream) -> Served,
    request: &ModelInferRequest,
) -> anyhow::Result<()>
where
    Served: Future<Output = ()> + Send + 'static,
{
    let row = format!("over an HTTP/2 connection in memory, gRPC, {what}, {} tasks", tasks());
    if !wanted(&row) {
        return Ok(());
    }
    let (client, server) = tokio::io::duplex(CONNECTION_BUFFER_BYTES);
    let served = tokio::spawn(serve(server));
    let before = BatchRows::now();
    let request = request.clone();
    // Named, so that a profile of the row can leave the client out.
    let calls = std::thread::Builder::new()
        .name("grpc-client".to_string())
        .spawn(move || grpc_client_calls(client, request))?;
    let per_op = tokio::task::spawn_blocking(move || calls.join().expect("the client ran")).await??;
    served.abort();
    per_op.row(&before.label(&row));
    Ok(())
}

/// Bytes a direction of an in-memory connection buffers (a socket's send buffer holds more;
/// a call's frames are far smaller).
const CONNECTION_BUFFER_BYTES: usize = 256 << 10;

/// The client of [`grpc_connection_row`]: [`handler_ops`] calls (after a tenth as warm-up)
/// from [`tasks()`] tasks on this thread; the process's CPU per call less this thread's.
fn grpc_client_calls(connection: DuplexStream, request: ModelInferRequest) -> anyhow::Result<PerOp> {
    use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let connection = std::sync::Mutex::new(Some(connection));
        let channel = tonic::transport::Endpoint::from_static("http://in-memory")
            .connect_with_connector(tower::service_fn(move |_| {
                let connection = connection.lock().expect("not poisoned").take();
                async move {
                    connection.map(hyper_util::rt::TokioIo::new).ok_or_else(|| std::io::Error::other("one connection"))
                }
            }))
            .await?;
        let client = GrpcInferenceServiceClient::new(channel);
        let authorization: tonic::metadata::MetadataValue<_> = format!("Bearer {}", common::KEY).parse()?;
        let call = move || {
            let mut client = client.clone();
            let mut call = tonic::Request::new(request.clone());
            call.metadata_mut().insert("authorization", authorization.clone());
            async move {
                client.model_infer(call).await.expect("the call succeeds");
            }
        };
        let run = |operations: usize| closed_loops(tasks(), operations, call.clone(), false);
        run(handler_ops() / 10).await;
        let (clock, client_cpu) = (Clock::start(), thread_cpu());
        run(handler_ops()).await;
        let calls = (handler_ops() / tasks() * tasks()) as u32;
        let per_op = clock.per_op(1);
        Ok(PerOp { cpu: per_op.cpu.saturating_sub(thread_cpu() - client_cpu) / calls, wall: per_op.wall / calls })
    })
}

/// The log subscriber `sluice serve` runs by default (text to stderr, its default filter), so
/// that a request's spans and events cost here what they cost in the server.
fn serve_logging() {
    use tracing_subscriber::prelude::*;
    let log = tracing_subscriber::fmt::layer().with_ansi(false).with_writer(std::io::stderr);
    let filter = tracing_subscriber::EnvFilter::new(sluice::telemetry::traces::DEFAULT_LOG_FILTER);
    let _ = tracing_subscriber::registry().with(log.with_filter(filter)).try_init();
}

/// The row label and answering of the floor spending `BUSY_US` (default 80) µs of CPU per
/// request, as `scripts/bench_overhead.sh` serves it: in process it should cost the floor's
/// figure and that much more.
fn busy_floor() -> (String, Answering) {
    let busy_us = env_number("BUSY_US").unwrap_or(80);
    (
        format!("floor spending {busy_us} µs per request"),
        Answering { busy: Duration::from_micros(busy_us), ..Hop::None.into() },
    )
}

/// The HTTP rows of one router.
async fn http_rows<S: HttpService<Body>>(what: &str, router: S, model: &'static str, body: &Bytes) {
    let row = format!("in process, HTTP, {what}, 1 in flight");
    if wanted(&row) {
        measure_async(handler_ops() / 2, 1, || http_infer(router.clone(), model, body.clone())).await.row(&row);
    }
    let row = format!("in process, HTTP, {what}, {} tasks", tasks());
    if wanted(&row) {
        let body = body.clone();
        measure_batched(&row, move || http_infer(router.clone(), model, body.clone())).await;
    }
}

/// The gRPC rows of one service.
async fn grpc_rows<S: GrpcService>(what: &str, service: S, frame: &Bytes) {
    let row = format!("in process, gRPC, {what}, 1 in flight");
    if wanted(&row) {
        measure_async(handler_ops() / 2, 1, || grpc_infer(service.clone(), frame.clone())).await.row(&row);
    }
    let row = format!("in process, gRPC, {what}, {} tasks", tasks());
    if wanted(&row) {
        let frame = frame.clone();
        measure_batched(&row, move || grpc_infer(service.clone(), frame.clone())).await;
    }
}

/// A concurrent handler row: [`handler_ops`] requests from [`tasks()`] tasks, its label with
/// the rows per batch they made.
async fn measure_batched<F>(row: &str, op: impl Fn() -> F + Clone + Send + 'static)
where
    F: Future<Output = ()> + Send + 'static,
{
    let before = BatchRows::now();
    let per_op = measure_tasks(handler_ops(), op).await;
    per_op.row(&before.label(row));
}

/// The model queues' batches so far (`sluice_batch_rows`' sum and count over every series):
/// a concurrent row's rows per batch is the operating point its cost belongs to, since each
/// batch's fixed cost is shared by its rows. An end-to-end run at the same concurrency makes
/// smaller batches (part of its requests are in the network, not in the server), so it is
/// compared with the row whose batches match its own (`TASKS`).
struct BatchRows {
    rows: f64,
    batches: f64,
}

impl BatchRows {
    fn now() -> Self {
        let text = sluice::telemetry::metrics::metrics().render();
        let total = |series: &str| -> f64 {
            text.lines()
                .filter(|line| line.starts_with(series))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        Self { rows: total("sluice_batch_rows_sum"), batches: total("sluice_batch_rows_count") }
    }

    /// `row`, with the rows per batch since `self` where there were batches.
    fn label(&self, row: &str) -> String {
        let now = Self::now();
        let batches = now.batches - self.batches;
        if batches == 0.0 {
            return row.to_string();
        }
        format!("{row} ({:.1} rows a batch)", (now.rows - self.rows) / batches)
    }
}
