//! What the benches share: a server's state built in process for one tenant `bench` (key
//! `bench-key`) with the digits MLP on ONNX Runtime and the `digits` app, the sandbox as the
//! server makes it, and one digit's inputs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sluice::nn::host::{NnCtx, Unmetered};
use sluice::nn::models::TenantModels;
use sluice::nn::scheduler::Share;
use sluice::runtime::{Component, GuestCall, GuestLog, InferRequest, Prepared, Runtime, RuntimeSettings};
use sluice::serve::ServeConfig;
use sluice::telemetry::rate::TokenBucket;
use sluice::tensor::{ElementType, Tensor};

pub const KEY: &str = "bench-key";

pub fn root() -> PathBuf {
    PathBuf::from(env!("SLUICE_REPO_ROOT"))
}

/// `ORT_DYLIB_PATH` if set; else the backend finds the library the build fetched.
pub fn onnxruntime_library() -> Option<PathBuf> {
    std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from)
}

/// The settings of a `sluice serve` of the bench tenant, its manifest written into `tenants`
/// and state kept in `data`.
pub fn digits_config(tenants: &Path, data: &Path) -> anyhow::Result<ServeConfig> {
    let model = root().join("examples/digits/model/digits.onnx");
    let component = Path::new(env!("SLUICE_GUEST_DIR")).join("digits.wasm");
    let manifest = format!(
        "version = 1\nid = \"bench\"\napi_key_sha256 = [\"{}\"]\n\n[quotas]\nmax_concurrent_requests = 256\n\n\
         [models.digits-mlp]\npath = \"{}\"\nsha256 = \"{}\"\nbackend = \"onnxruntime\"\n\n\
         [apps.digits]\nstable = \"1\"\nversions.\"1\".component = \"{}\"\n",
        hex::encode(Sha256::digest(KEY)),
        model.display(),
        hex::encode(Sha256::digest(std::fs::read(&model)?)),
        component.display()
    );
    std::fs::write(tenants.join("bench.toml"), manifest)?;
    let config = ServeConfig {
        http: "127.0.0.1:0".parse()?,
        grpc: "127.0.0.1:0".parse()?,
        metrics: None,
        grpc_max_message_bytes: 64 << 20,
        grpc_response_compression: None,
        tenants_dir: tenants.to_path_buf(),
        data_dir: data.to_path_buf(),
        onnxruntime_library: onnxruntime_library(),
        default_backend: None,
        idle_unload: None,
        model_memory: Default::default(),
        run_memory: Some(sluice::nn::device::Device::default_run_memory()),
        webgpu_library: None,
        cuda_options: Vec::new(),
        backend_threads: 1,
        gpu_runs: 2,
        max_instances: 64,
        epoch_tick: Duration::from_millis(5),
        cpu_turns: 0,
        max_waiting_requests: 1024,
        admin_token: None,
        metrics_token: None,
        connections: Default::default(),
        body_timeouts: Default::default(),
        drain: Default::default(),
        store: None,
        store_poll: Duration::from_secs(1),
        replica: "local".to_string(),
    };
    Ok(config)
}

/// A sandbox runtime as the server makes one (pooling, 64 MiB guests), caching into `cache`.
pub fn runtime(cache: &Path) -> anyhow::Result<Runtime> {
    Ok(Runtime::new(RuntimeSettings {
        max_instances: 128,
        max_memory_bytes: 64 << 20,
        epoch_tick: Duration::from_millis(5),
        cache_dir: cache.to_path_buf(),
    })?)
}

/// One of the built guest components (`digits.wasm`, `hostile_guest.wasm`), ready to call.
pub fn prepare(runtime: &Runtime, file: &str) -> anyhow::Result<Prepared> {
    let path = Path::new(env!("SLUICE_GUEST_DIR")).join(file);
    oip(runtime, &path)
}

/// A `sluice:tenant/component` at `path`, ready to call.
pub fn oip(runtime: &Runtime, path: &Path) -> anyhow::Result<Prepared> {
    let wasm = std::fs::read(path)?;
    match runtime.prepare(path, &hex::encode(Sha256::digest(&wasm)), &wasm, None)? {
        Component::Oip(prepared) => Ok(prepared),
        Component::Http(_) => anyhow::bail!("{} is an HTTP app, not an OIP component", path.display()),
    }
}

/// One request's guest call as the server builds it: tenant `bench`, 64 MiB, 1 s.
pub fn guest_call(models: &Arc<TenantModels>, allowance: &Arc<TokenBucket>, request: InferRequest) -> GuestCall {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let share = Share::new("bench".into(), 1);
    GuestCall {
        nn: NnCtx::new(models.clone(), share, deadline, None, 64 << 20, Box::new(Unmetered)),
        memory_bytes: 64 << 20,
        log: GuestLog::new("bench".into(), "app".into(), "1".into(), 64 << 10, allowance.clone()),
        deadline,
        deadline_ms: 1000,
        request,
    }
}

/// One 8×8 image's pixels, as the `digits` app takes them.
pub fn pixels() -> Vec<u8> {
    (0..64).map(|i| ((i * 37) % 256) as u8).collect()
}

/// The same image as the digits MLP takes it (what the `digits` component sends).
pub fn scaled() -> Vec<f32> {
    pixels().iter().map(|&p| f32::from(p) / 255.0).collect()
}

/// [`scaled`] as one row of the model's input `X`.
pub fn digits_row() -> Vec<(String, Tensor)> {
    let data = scaled().iter().flat_map(|v| v.to_le_bytes()).collect();
    vec![("X".to_string(), Tensor::new(ElementType::F32, vec![1, 64], data).expect("a row"))]
}

/// OIP JSON infer requests of the plain model `digits-mlp` and of the `digits` app.
pub fn request_bodies() -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let plain = json_request("X", "FP32", 1, &scaled())?;
    let app = json_request("image", "UINT8", 1, &pixels())?;
    Ok((plain, app))
}

/// An OIP JSON infer request of one input of `rows` rows of 64 values, its keys in the order
/// Triton's clients write them (`json!` would sort them, data first).
pub fn json_request(name: &str, datatype: &str, rows: usize, data: &impl serde::Serialize) -> anyhow::Result<Vec<u8>> {
    let data = serde_json::to_string(data)?;
    let body =
        format!(r#"{{"inputs":[{{"name":"{name}","shape":[{rows},64],"datatype":"{datatype}","data":{data}}}]}}"#);
    Ok(body.into_bytes())
}
