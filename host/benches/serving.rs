//! Serving-path measurements, printed as Markdown for BENCHMARKS.md:
//! 1. the per-request sandbox cost (fresh store + instantiate + call of a trivial component);
//! 2. each example model's raw throughput on each backend at batch 1 and 32;
//! 3. one digits request end to end over loopback next to the raw backend compute time for
//!    the same input, in the same run.
//!
//! Run: `cargo bench --bench serving` (on the ONNX Runtime the build fetched, or the one
//! ORT_DYLIB_PATH names).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::nn::backend::{self, Author, BackendKind, BackendSettings, Graph, Stop};
use sluice::nn::models::TenantModels;
use sluice::registry::placement::Placement;
use sluice::runtime::{InferRequest, Prepared, Runtime};
use sluice::tensor::{ElementType, Tensor};

mod common;

use common::{onnxruntime_library, root};

const SANDBOX_CALLS: usize = 10_000;
const E2E_CALLS: usize = 2_000;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() -> anyhow::Result<()> {
    // `cargo bench --bench serving -- raw MODEL BATCH...`: only one model's raw throughput at
    // the given batch sizes (scripts/bench_batching.sh puts it beside the served figures).
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if let [mode, model, batches @ ..] = args.as_slice()
        && mode == "raw"
    {
        let batches = batches.iter().map(|b| b.parse()).collect::<Result<Vec<usize>, _>>()?;
        return raw_throughput(model, &batches);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    println!("## Serving path (`cargo bench --bench serving`)\n");
    runtime.block_on(sandbox_cost())?;
    backend_throughput()?;
    runtime.block_on(end_to_end())?;
    Ok(())
}

async fn sandbox_cost() -> anyhow::Result<()> {
    let cache = tempfile::tempdir()?;
    let runtime = common::runtime(cache.path())?;
    println!("### Per-request sandbox cost\n");
    println!("Fresh store + instantiate + call `infer`, {SANDBOX_CALLS} calls after 500 warm-up:\n");
    println!("| component | p50 | p99 |\n| --- | --- | --- |");
    // The echo guest imports what Rust's std brings (13 lowered host functions); the hostile
    // test guest all of WASI (94), each set up again in every fresh instance.
    for (what, file) in [
        ("trivial (the echo test guest)", "echo_guest.wasm"),
        ("importing all of WASI (the hostile test guest's `echo`)", "hostile_guest.wasm"),
    ] {
        let (p50, p99) = fresh_sandbox_percentiles(&runtime, &common::prepare(&runtime, file)?).await?;
        println!("| {what} | {} | {} |", micros(p50), micros(p99));
    }
    println!();
    Ok(())
}

async fn fresh_sandbox_percentiles(runtime: &Runtime, prepared: &Prepared) -> anyhow::Result<(Duration, Duration)> {
    let models = Arc::new(TenantModels::new(Default::default(), Default::default(), u64::MAX));
    let log_allowance = Arc::new(sluice::telemetry::rate::TokenBucket::new(1e9, 1e9));
    let mut samples = Vec::with_capacity(SANDBOX_CALLS);
    for i in 0..(SANDBOX_CALLS + 500) {
        let echo = InferRequest { id: None, inputs: Vec::new(), parameters: vec![("mode".into(), "echo".into())] };
        let call = common::guest_call(&models, &log_allowance, echo);
        let started = Instant::now();
        runtime.invoke(prepared, call).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        if i >= 500 {
            samples.push(started.elapsed());
        }
    }
    Ok((percentile(&mut samples, 0.5), percentile(&mut samples, 0.99)))
}

struct BenchModel {
    name: &'static str,
    path: PathBuf,
    input: &'static str,
    ty: ElementType,
    width: usize,
}

fn example_models() -> Vec<BenchModel> {
    vec![
        BenchModel {
            name: "digits-mlp",
            path: root().join("examples/digits/model/digits.onnx"),
            input: "X",
            ty: ElementType::F32,
            width: 64,
        },
        BenchModel {
            name: "digits-mlp-small",
            path: root().join("examples/digits/model/digits_small.onnx"),
            input: "X",
            ty: ElementType::F32,
            width: 64,
        },
        BenchModel {
            name: "magika-v3",
            path: root().join("examples/magika/model/model.onnx"),
            input: "bytes",
            ty: ElementType::I32,
            width: 2048,
        },
    ]
}

fn batch_input(model: &BenchModel, batch: usize) -> Vec<(String, Tensor)> {
    let values = batch * model.width;
    let data: Vec<u8> = match model.ty {
        ElementType::F32 => (0..values).flat_map(|i| ((i % 17) as f32 / 16.0).to_le_bytes()).collect(),
        _ => (0..values).flat_map(|i| ((i * 31 % 257) as i32).to_le_bytes()).collect(),
    };
    vec![(model.input.to_string(), Tensor::new(model.ty, vec![batch, model.width], data).expect("consistent input"))]
}

/// Inferences per second over at least one second of back-to-back runs.
fn throughput(graph: &dyn Graph, inputs: &[(String, Tensor)], batch: usize) -> anyhow::Result<f64> {
    for _ in 0..20 {
        graph.run(&mut inputs.to_vec(), &Stop::default())?;
    }
    let started = Instant::now();
    let mut runs = 0usize;
    while started.elapsed() < Duration::from_secs(1) || runs < 20 {
        graph.run(&mut inputs.to_vec(), &Stop::default())?;
        runs += 1;
    }
    Ok((runs * batch) as f64 / started.elapsed().as_secs_f64())
}

fn backend_throughput() -> anyhow::Result<()> {
    let backends = backend::available(&BackendSettings {
        onnxruntime_library: onnxruntime_library(),
        threads: 1,
        webgpu_library: None,
        cuda_options: Vec::new(),
        run_memory: Some(sluice::nn::device::Device::default_run_memory()),
    });
    println!("### Raw backend throughput (1 intra-op thread, inferences/s)\n");
    for reason in &backends.unavailable {
        println!("(not measured: {reason})\n");
    }
    println!("| model | backend | batch 1 | batch 32 |\n| --- | --- | --- | --- |");
    for model in example_models() {
        let onnx = std::fs::read(&model.path)?;
        for kind in [BackendKind::Onnxruntime, BackendKind::Tract] {
            let Some(backend) = backends.get(kind) else {
                continue;
            };
            let graph = backend.load(&onnx, &Placement::CPU, Author::Operator)?;
            let b1 = throughput(graph.as_ref(), &batch_input(&model, 1), 1)?;
            let b32 = throughput(graph.as_ref(), &batch_input(&model, 32), 32)?;
            println!("| {} | {kind} | {b1:.0} | {b32:.0} |", model.name);
        }
    }
    println!();
    Ok(())
}

fn raw_throughput(name: &str, batches: &[usize]) -> anyhow::Result<()> {
    let model = example_models()
        .into_iter()
        .find(|m| m.name == name)
        .ok_or_else(|| anyhow::anyhow!("no example model named {name}"))?;
    let backends = backend::available(&BackendSettings {
        onnxruntime_library: onnxruntime_library(),
        threads: 1,
        webgpu_library: None,
        cuda_options: Vec::new(),
        run_memory: Some(sluice::nn::device::Device::default_run_memory()),
    });
    let backend = backends.preferred().ok_or_else(|| anyhow::anyhow!("no backend: {:?}", backends.unavailable))?;
    let graph = backend.load(&std::fs::read(&model.path)?, &Placement::CPU, Author::Operator)?;
    println!("| model | backend | batch | raw throughput (inf/s) |\n| --- | --- | --- | --- |");
    for &batch in batches {
        let rate = throughput(graph.as_ref(), &batch_input(&model, batch), batch)?;
        println!("| {name} | {} | {batch} | {rate:.1} |", backend.kind());
    }
    Ok(())
}

/// Latencies of sequential POSTs after a warm-up.
async fn timed_requests(client: &reqwest::Client, url: &str, body: &[u8]) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(E2E_CALLS);
    for i in 0..(E2E_CALLS + 200) {
        let started = Instant::now();
        let response = client.post(url).bearer_auth(common::KEY).body(body.to_vec()).send().await?;
        anyhow::ensure!(response.status().is_success(), "{url}: status {}", response.status());
        response.bytes().await?;
        if i >= 200 {
            samples.push(started.elapsed());
        }
    }
    Ok(samples)
}

async fn end_to_end() -> anyhow::Result<()> {
    let (tenants, data) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let model = root().join("examples/digits/model/digits.onnx");
    let config = common::digits_config(tenants.path(), data.path())?;
    let state = match sluice::serve::build_state(&config).await {
        Ok(state) => state,
        Err(err) => {
            println!("### End to end\n\n(not measured: {err:#})\n");
            return Ok(());
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    // The server's own listener, as `sluice serve` runs it.
    let limits = sluice::serve::listen::ConnectionLimits::new(Default::default());
    let router = sluice::api::http::router(Arc::new(state));
    let served = sluice::serve::listen::serve_http(listener, router, limits, std::future::pending(), Duration::ZERO);
    tokio::spawn(served);

    let (plain_body, body) = common::request_bodies()?;
    let client = reqwest::Client::new();
    let e2e = timed_requests(&client, &format!("http://{address}/v2/models/digits/infer"), &body).await?;
    let plain = timed_requests(&client, &format!("http://{address}/v2/models/digits-mlp/infer"), &plain_body).await?;

    // The same input straight into the backend, as the component sends it.
    let backends = backend::available(&BackendSettings {
        onnxruntime_library: onnxruntime_library(),
        threads: 1,
        webgpu_library: None,
        cuda_options: Vec::new(),
        run_memory: Some(sluice::nn::device::Device::default_run_memory()),
    });
    let graph = backends.get(BackendKind::Onnxruntime).ok_or_else(|| anyhow::anyhow!("onnxruntime missing"))?.load(
        &std::fs::read(&model)?,
        &Placement::CPU,
        Author::Operator,
    )?;
    let input = common::digits_row();
    let mut raw = Vec::with_capacity(E2E_CALLS);
    for i in 0..(E2E_CALLS + 200) {
        let started = Instant::now();
        graph.run(&mut input.clone(), &Stop::default())?;
        if i >= 200 {
            raw.push(started.elapsed());
        }
    }
    let (mut e2e, mut plain) = (e2e, plain);
    let (e2e_p50, raw_p50) = (percentile(&mut e2e, 0.5), percentile(&mut raw, 0.5));
    println!("### One digits request end to end vs the raw backend\n");
    println!(
        "{E2E_CALLS} sequential requests over loopback HTTP (JSON, `digits` component → `digits-mlp` on onnxruntime) after 200 warm-up, and the same input run directly on the backend:\n"
    );
    println!("| path | p50 | p99 |\n| --- | --- | --- |");
    println!("| HTTP → `digits` component → model | {} | {} |", micros(e2e_p50), micros(percentile(&mut e2e, 0.99)));
    let plain_p50 = percentile(&mut plain, 0.5);
    println!(
        "| HTTP → plain model `digits-mlp` (no component) | {} | {} |",
        micros(plain_p50),
        micros(percentile(&mut plain, 0.99))
    );
    println!("| raw backend compute, same input | {} | {} |", micros(raw_p50), micros(percentile(&mut raw, 0.99)));
    println!("\nHost overhead over raw compute at p50: {}.\n", micros(e2e_p50.saturating_sub(raw_p50)));
    Ok(())
}
