//! The floor server's handlers: the same crates (axum on hyper's HTTP/1, tonic) and the same
//! parsing and encoding as Sluice's front ends (OIP JSON with the binary extension, gRPC with
//! raw contents), and nothing else: no tenant, no key, no queue, no model. Every infer
//! request is parsed and validated and answered with ten FP32 values. It describes that model
//! (metadata and configuration, no statistics) so that NVIDIA's perf_analyzer, which reads
//! them before it sends, drives it as it drives Sluice. With [`Hop::Task`] the answer comes
//! from another task, as Sluice's come from a model queue; with [`Answering::busy`] each
//! request first keeps the CPU busy for that long, so that the floor serves at a slower path's
//! throughput and its network costs what they cost at that throughput. Served by
//! `benches/floor.rs`, called in process by `benches/layers.rs`.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sluice::api::grpc::proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use sluice::api::grpc::proto::*;
use sluice::api::{grpc, json};
use sluice::oip::types::{Datatype, InferOutcome, Payload, TensorLimits, ValidTensor};
use sluice::tensor::ElementType;
use tonic::{Request, Status};

const LIMITS: TensorLimits = TensorLimits { max_elements: 1 << 24 };

/// Ten values, as the digits MLP answers.
fn outcome(model: String) -> InferOutcome {
    let values: Vec<u8> = (0..10).flat_map(|i| (i as f32 / 10.0).to_le_bytes()).collect();
    InferOutcome {
        model_name: model,
        model_version: "1".to_string(),
        id: None,
        outputs: vec![ValidTensor {
            name: "probabilities".to_string(),
            datatype: Datatype::Fixed(ElementType::F32),
            shape: vec![1, 10],
            payload: Payload::Fixed(values),
        }],
        parameters: Vec::new(),
        cost_us: None,
    }
}

/// The model's description: 64 FP32 in, ten FP32 out, batches of up to 32 rows.
const INPUT: (&str, &str, i64) = ("X", "FP32", 64);
const OUTPUT: (&str, &str, i64) = ("probabilities", "FP32", 10);
const MAX_BATCH_SIZE: i32 = 32;

async fn server_metadata_json() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({ "name": "floor", "version": "0", "extensions": [] }))
}

async fn model_metadata_json(axum::extract::Path(model): axum::extract::Path<String>) -> axum::Json<serde_json::Value> {
    let tensor = |(name, datatype, width): (&str, &str, i64)| serde_json::json!({ "name": name, "datatype": datatype, "shape": [-1, width] });
    axum::Json(serde_json::json!({
        "name": model, "versions": ["1"], "platform": "floor",
        "inputs": [tensor(INPUT)], "outputs": [tensor(OUTPUT)],
    }))
}

async fn model_config_json(axum::extract::Path(model): axum::extract::Path<String>) -> axum::Json<serde_json::Value> {
    let tensor = |(name, datatype, width): (&str, &str, i64)| serde_json::json!({ "name": name, "data_type": format!("TYPE_{datatype}"), "dims": [width] });
    axum::Json(serde_json::json!({
        "name": model, "platform": "floor", "max_batch_size": MAX_BATCH_SIZE,
        "input": [tensor(INPUT)], "output": [tensor(OUTPUT)],
    }))
}

/// Hands `value` to a task of its own and waits for it back, as a Sluice request waits for its
/// answer from a model queue: the connection's task goes idle and is woken for the answer.
async fn handed_over<T: Send + 'static>(value: T) -> T {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = sender.send(value);
    });
    receiver.await.expect("the spawned task answers")
}

/// The answer, after `busy` of CPU work, from another task when `hop` is set.
async fn answer(model: String, answering: Answering) -> InferOutcome {
    let started = thread_cpu();
    while thread_cpu() - started < answering.busy {
        std::hint::spin_loop();
    }
    match answering.hop {
        Hop::None => outcome(model),
        Hop::Task => handed_over(outcome(model)).await,
    }
}

/// The calling thread's CPU time: a spin measured by it costs what it says, however often
/// the machine takes the CPU away meanwhile.
pub fn thread_cpu() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the pointer it is given.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now);
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Whether the floor answers from the request's own task or from another one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Hop {
    None,
    Task,
}

/// How the floor answers each request.
#[derive(Clone, Copy, Debug)]
pub struct Answering {
    pub hop: Hop,
    /// CPU time spent on each request before it is answered (a spin, on the request's thread).
    pub busy: Duration,
}

/// Answering as soon as the request is parsed.
impl From<Hop> for Answering {
    fn from(hop: Hop) -> Self {
        Self { hop, busy: Duration::ZERO }
    }
}

async fn infer(
    axum::extract::State(answering): axum::extract::State<Answering>,
    axum::extract::Path(model): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json_length = headers
        .get("inference-header-content-length")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok());
    let parsed = match json::parse_infer_request(&body, json_length, LIMITS) {
        Ok(parsed) => parsed,
        Err(error) => return (StatusCode::BAD_REQUEST, format!("{error:?}")).into_response(),
    };
    let Ok(encoded) = json::encode_response(answer(model, answering).await, &parsed.encoding) else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let mut bytes = encoded.json;
    encoded.binary.iter().for_each(|part| bytes.extend_from_slice(part));
    ([("content-type", "application/json")], bytes).into_response()
}

/// The floor's gRPC service.
pub struct Floor(Answering);

type Answer<T> = Result<tonic::Response<T>, Status>;

fn unimplemented<T>() -> Answer<T> {
    Err(Status::unimplemented("the floor server only infers"))
}

#[tonic::async_trait]
impl GrpcInferenceService for Floor {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Answer<ServerLiveResponse> {
        Ok(tonic::Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Answer<ServerReadyResponse> {
        Ok(tonic::Response::new(ServerReadyResponse { ready: true }))
    }

    async fn model_ready(&self, _: Request<ModelReadyRequest>) -> Answer<ModelReadyResponse> {
        Ok(tonic::Response::new(ModelReadyResponse { ready: true }))
    }

    async fn server_metadata(&self, _: Request<ServerMetadataRequest>) -> Answer<ServerMetadataResponse> {
        Ok(tonic::Response::new(ServerMetadataResponse {
            name: "floor".to_string(),
            version: "0".to_string(),
            extensions: Vec::new(),
        }))
    }

    async fn model_metadata(&self, request: Request<ModelMetadataRequest>) -> Answer<ModelMetadataResponse> {
        let tensor = |(name, datatype, width): (&str, &str, i64)| model_metadata_response::TensorMetadata {
            name: name.to_string(),
            datatype: datatype.to_string(),
            shape: vec![-1, width],
        };
        Ok(tonic::Response::new(ModelMetadataResponse {
            name: request.into_inner().name,
            versions: vec!["1".to_string()],
            platform: "floor".to_string(),
            inputs: vec![tensor(INPUT)],
            outputs: vec![tensor(OUTPUT)],
        }))
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Answer<ModelInferResponse> {
        let message = request.into_inner();
        let model = message.model_name.clone();
        grpc::parse_infer_request(message, LIMITS).map_err(|error| Status::invalid_argument(format!("{error:?}")))?;
        Ok(tonic::Response::new(grpc::encode_response(answer(model, self.0).await)))
    }

    async fn model_config(&self, request: Request<ModelConfigRequest>) -> Answer<ModelConfigResponse> {
        let config = ModelConfig {
            name: request.into_inner().name,
            platform: "floor".to_string(),
            max_batch_size: MAX_BATCH_SIZE,
            input: vec![ModelInput {
                name: INPUT.0.to_string(),
                data_type: DataType::TypeFp32 as i32,
                dims: vec![INPUT.2],
            }],
            output: vec![ModelOutput {
                name: OUTPUT.0.to_string(),
                data_type: DataType::TypeFp32 as i32,
                dims: vec![OUTPUT.2],
            }],
            ..Default::default()
        };
        Ok(tonic::Response::new(ModelConfigResponse { config: Some(config) }))
    }

    async fn model_statistics(&self, _: Request<ModelStatisticsRequest>) -> Answer<ModelStatisticsResponse> {
        unimplemented()
    }

    async fn repository_index(&self, _: Request<RepositoryIndexRequest>) -> Answer<RepositoryIndexResponse> {
        unimplemented()
    }

    async fn repository_model_load(
        &self,
        _: Request<RepositoryModelLoadRequest>,
    ) -> Answer<RepositoryModelLoadResponse> {
        unimplemented()
    }

    async fn repository_model_unload(
        &self,
        _: Request<RepositoryModelUnloadRequest>,
    ) -> Answer<RepositoryModelUnloadResponse> {
        unimplemented()
    }

    type ModelStreamInferStream = futures::stream::Empty<Result<ModelStreamInferResponse, Status>>;

    async fn model_stream_infer(
        &self,
        _: Request<tonic::Streaming<ModelInferRequest>>,
    ) -> Answer<Self::ModelStreamInferStream> {
        unimplemented()
    }
}

/// The floor's HTTP routes.
pub fn http_router(answering: Answering) -> axum::Router {
    axum::Router::new()
        .route("/v2", axum::routing::get(server_metadata_json))
        .route("/v2/models/{model}", axum::routing::get(model_metadata_json))
        .route("/v2/models/{model}/config", axum::routing::get(model_config_json))
        .route("/v2/models/{model}/infer", axum::routing::post(infer))
        .with_state(answering)
}

/// The floor's gRPC service.
pub fn grpc_service(answering: Answering) -> GrpcInferenceServiceServer<Floor> {
    GrpcInferenceServiceServer::new(Floor(answering))
}
