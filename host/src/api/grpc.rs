//! OIP over gRPC (`inference.GRPCInferenceService`, tonic): the same resolution, limits,
//! inference and error table as HTTP. Inputs arrive as typed `contents` or as
//! `raw_input_contents`; outputs always go back as `raw_output_contents`, as Triton does
//! (its client reads only those). `authorization: Bearer` metadata names the tenant; the
//! `grpc-timeout` deadline bounds the guest and the model queue.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::error::ApiError;
use super::{grpc_body, grpc_stream, metadata, request_id, triton};
use crate::infer;
use crate::oip::raw;
use crate::oip::types::{
    COST_PARAMETER, Datatype, InferOutcome, InputValidator, Payload, TensorLimits, ValidInferRequest,
};
use crate::state::{ServingState, TenantState};
use crate::telemetry::metrics::Protocol;
use crate::telemetry::traces;
use crate::tensor::ElementType;

/// Code generated from `proto/grpc_predict_v2.proto`.
#[allow(missing_docs, clippy::all, unused_qualifications)] // generated code
pub mod proto {
    tonic::include_proto!("inference");
}

use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::*;

/// The gRPC service, with message limits raised for tensors. Requests may come gzip- or
/// deflate-compressed; responses are compressed only with `response_compression`, for a
/// client that accepts it.
pub fn service(
    state: Arc<ServingState>,
    max_message_bytes: usize,
    response_compression: Option<CompressionEncoding>,
) -> GrpcInferenceServiceServer<GrpcApi> {
    let service = GrpcInferenceServiceServer::new(GrpcApi { state })
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    match response_compression {
        Some(encoding) => service.send_compressed(encoding),
        None => service,
    }
}

pub struct GrpcApi {
    state: Arc<ServingState>,
}

impl GrpcApi {
    fn tenant<T>(&self, request: &Request<T>) -> Result<Arc<TenantState>, ApiError> {
        let authorization = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        super::auth::tenant_for_key(&self.state, authorization)
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for GrpcApi {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: self.state.readiness.is_ready() }))
    }

    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        let tenant = &self.tenant(&request)?;
        let message = request.get_ref();
        let ready = triton::readiness(tenant, &message.name, version(&message.version))?;
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        let server = metadata::server();
        Ok(Response::new(ServerMetadataResponse {
            name: server.name.to_string(),
            version: server.version.to_string(),
            extensions: server.extensions.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let tenant = &self.tenant(&request)?;
        let message = request.get_ref();
        let target = infer::resolve(tenant, &message.name, version(&message.version))?;
        let meta = metadata::model(tenant, &message.name, &target);
        let tensor = |t: crate::registry::manifest::TensorMetadata| model_metadata_response::TensorMetadata {
            name: t.name,
            datatype: t.datatype,
            shape: t.shape,
        };
        Ok(Response::new(ModelMetadataResponse {
            name: meta.name,
            versions: meta.versions,
            platform: meta.platform,
            inputs: meta.inputs.into_iter().map(tensor).collect(),
            outputs: meta.outputs.into_iter().map(tensor).collect(),
        }))
    }

    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let tenant = &self.tenant(&request)?;
        let message = request.get_ref();
        let target = infer::resolve(tenant, &message.name, version(&message.version))?;
        let config = triton::config(tenant, &message.name, &target);
        let input = config
            .input
            .into_iter()
            .map(|t| ModelInput { name: t.name, data_type: t.data_type_number, dims: t.dims })
            .collect();
        let output = config
            .output
            .into_iter()
            .map(|t| ModelOutput { name: t.name, data_type: t.data_type_number, dims: t.dims })
            .collect();
        let instance_group = config
            .instance_group
            .into_iter()
            .map(|g| ModelInstanceGroup {
                name: g.name,
                count: g.count,
                kind: match g.kind {
                    triton::GroupKind::Gpu => model_instance_group::Kind::Gpu,
                    triton::GroupKind::Cpu => model_instance_group::Kind::Cpu,
                } as i32,
                gpus: g.gpus,
            })
            .collect();
        Ok(Response::new(ModelConfigResponse {
            config: Some(ModelConfig {
                name: config.name,
                platform: config.platform,
                version_policy: config.version_policy.map(version_policy),
                backend: config.backend,
                max_batch_size: config.max_batch_size,
                input,
                output,
                instance_group,
                dynamic_batching: config.dynamic_batching.map(|d| ModelDynamicBatching {
                    preferred_batch_size: d.preferred_batch_size,
                    max_queue_delay_microseconds: d.max_queue_delay_microseconds,
                }),
                response_cache: config.response_cache.map(|c| ModelResponseCache { enable: c.enable }),
            }),
        }))
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let tenant = &self.tenant(&request)?;
        let models = triton::repository_index(tenant, request.get_ref().ready)
            .into_iter()
            .map(|entry| repository_index_response::ModelIndex {
                name: entry.name,
                version: entry.version,
                state: entry.state.to_string(),
                reason: entry.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        let tenant = &self.tenant(&request)?;
        let message = request.get_ref();
        triton::check_load_parameters(message.parameters.keys().map(String::as_str))?;
        triton::load(tenant, &message.model_name).await?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        let tenant = &self.tenant(&request)?;
        triton::unload(tenant, &request.get_ref().model_name).await?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn model_statistics(
        &self,
        request: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let tenant = &self.tenant(&request)?;
        let message = request.get_ref();
        let target = infer::resolve(tenant, &message.name, version(&message.version))?;
        let duration = |d: triton::Duration| Some(StatisticDuration { count: d.count, ns: d.ns });
        let named = !message.version.is_empty();
        let model_stats = triton::statistics(tenant, &message.name, &target, named)
            .model_stats
            .into_iter()
            .map(|m| ModelStatistics {
                name: m.name,
                version: m.version,
                last_inference: m.last_inference,
                inference_count: m.inference_count,
                execution_count: m.execution_count,
                inference_stats: Some(InferStatistics {
                    success: duration(m.inference_stats.success),
                    fail: duration(m.inference_stats.fail),
                    queue: duration(m.inference_stats.queue),
                    compute_input: duration(m.inference_stats.compute_input),
                    compute_infer: duration(m.inference_stats.compute_infer),
                    compute_output: duration(m.inference_stats.compute_output),
                    cache_hit: duration(m.inference_stats.cache_hit),
                    cache_miss: duration(m.inference_stats.cache_miss),
                }),
                batch_stats: Vec::new(),
            })
            .collect();
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let id = request_id::choose(request.metadata().get(request_id::KEY).and_then(|v| v.to_str().ok()));
        let span = request_span(&id, &request.get_ref().model_name, request.metadata());
        let mut response = self.serve_infer(request).instrument(span.clone()).await;
        record_code(&span, response.as_ref().err().map_or(tonic::Code::Ok, Status::code));
        let id = tonic::metadata::MetadataValue::try_from(id.as_str()).ok();
        let metadata = match &mut response {
            Ok(response) => response.metadata_mut(),
            Err(status) => status.metadata_mut(),
        };
        if let Some(id) = id {
            metadata.insert(request_id::KEY, id);
        }
        response
    }

    type ModelStreamInferStream = grpc_stream::Answers<ModelStreamInferResponse>;

    async fn model_stream_infer(
        &self,
        request: Request<tonic::Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let tenant = self.tenant(&request)?;
        let (metadata, _, requests) = request.into_parts();
        let (state, metadata) = (self.state.clone(), Arc::new(metadata));
        let closing = state.readiness.closing();
        let most_running = move || tenant.spec().quotas.max_concurrent_requests as usize;
        let answer = move |request| stream_answer(state.clone(), metadata.clone(), request);
        Ok(Response::new(grpc_stream::answers(requests, most_running, closing, answer)))
    }
}

/// One request of a stream, answered as a call would be (its key checked again), with its
/// place in the tenant's quota (see `grpc_stream`): a failure is its message on the stream.
async fn stream_answer(
    state: Arc<ServingState>,
    metadata: Arc<tonic::metadata::MetadataMap>,
    request: ModelInferRequest,
) -> (ModelStreamInferResponse, Option<infer::InFlight>) {
    let (name, version, id) = (request.model_name.clone(), request.model_version.clone(), request.id.clone());
    let failed = |error: ApiError| ModelStreamInferResponse {
        error_message: Status::from(error).message().to_string(),
        infer_response: Some(ModelInferResponse {
            model_name: name,
            model_version: version,
            id: id.clone(),
            ..Default::default()
        }),
    };
    // The key is checked for each request, as for each call: one revoked while the stream is
    // open serves no more.
    let authorization = metadata.get("authorization").and_then(|v| v.to_str().ok());
    let tenant = match super::auth::tenant_for_key(&state, authorization) {
        Ok(tenant) => tenant,
        Err(refused) => return (failed(refused), None),
    };
    // Each request of the stream joins the trace the client opened the stream in.
    let span = request_span(&request_id::choose(Some(&id)), &request.model_name, &metadata);
    let spec = tenant.spec();
    let routed = infer::Routed::default();
    let mut in_flight = None;
    let serve = async {
        let admitted = infer::admit(&tenant)?;
        in_flight = Some(admitted.in_flight());
        infer_message(&state, &tenant, Some(admitted), None, &metadata, request, &routed).await
    };
    let answered =
        infer::observed(spec.id.as_str(), Protocol::Grpc, &routed, Box::pin(serve)).instrument(span.clone()).await;
    record_code(&span, answered.as_ref().err().map_or(tonic::Code::Ok, |error| error.kind.grpc_code()));
    let answer = match answered {
        Ok(outcome) => {
            ModelStreamInferResponse { error_message: String::new(), infer_response: Some(encode_response(outcome)) }
        }
        Err(error) => failed(error),
    };
    (answer, in_flight)
}

impl GrpcApi {
    async fn serve_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let tenant = &self.tenant(&request)?;
        let spec = tenant.spec();
        let routed = infer::Routed::default();
        // Answer DEADLINE_EXCEEDED a little before tonic's own timer cancels the call.
        let client_timeout = grpc_timeout(&request).map(|t| t.saturating_sub((t / 10).min(DEADLINE_MARGIN)));
        // Admitted by the body layer before the message was read (see `grpc_body`).
        let admitted = request.extensions().get::<grpc_body::Admission>().and_then(|a| a.take());
        let (metadata, _, message) = request.into_parts();
        // Boxed: this future is large (~19 KB inline), and each move of the call's future
        // (tonic boxes it, the span wraps it) would copy all of it.
        let serve = Box::pin(infer_message(&self.state, tenant, admitted, client_timeout, &metadata, message, &routed));
        let outcome = infer::observed(spec.id.as_str(), Protocol::Grpc, &routed, serve).await?;
        Ok(Response::new(encode_response(outcome)))
    }
}

/// One inference message of `tenant`, on its admission (the body layer's, for a call) or
/// admitted here, within the client's timeout: the path of a call and of a stream's requests.
async fn infer_message(
    state: &ServingState,
    tenant: &TenantState,
    admitted: Option<infer::Admitted>,
    client_timeout: Option<Duration>,
    metadata: &tonic::metadata::MetadataMap,
    message: ModelInferRequest,
    routed: &infer::Routed,
) -> Result<InferOutcome, ApiError> {
    let spec = tenant.spec();
    let admitted = match admitted {
        Some(admitted) => admitted,
        None => infer::admit(tenant)?,
    };
    let entry = infer::enter(state, tenant, admitted, client_timeout).await?;
    // A compressed message is checked here, at its decoded size.
    let limit = usize::try_from(spec.quotas.max_request_bytes).unwrap_or(usize::MAX);
    if prost::Message::encoded_len(&message) > limit {
        return Err(ApiError::body_too_large(limit));
    }
    let limits = TensorLimits { max_elements: spec.quotas.max_tensor_elements };
    let name = message.model_name.clone();
    let pinned = (!message.model_version.is_empty()).then(|| message.model_version.clone());
    let valid = parse_infer_request(message, limits)?;
    let header = |name: &str| metadata.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let caller = infer::Caller { header: &header, routed };
    infer::infer(state, tenant, entry, &name, pinned.as_deref(), valid, caller).await
}

/// At most how much earlier than the client's deadline (a tenth of it) Sluice gives up, so its own
/// DEADLINE_EXCEEDED (with a message) reaches the client rather than a bare cancellation.
const DEADLINE_MARGIN: Duration = Duration::from_millis(100);

/// The codes that are the server's failure rather than the caller's (OpenTelemetry's rule
/// for gRPC server spans).
/// The span of an inference request (a call, or one request of a stream), a child of the
/// client's span when its metadata carries one.
fn request_span(id: &str, model: &str, metadata: &tonic::metadata::MetadataMap) -> tracing::Span {
    let span = request_id::span(id, "grpc", model);
    let header = |key: &str| metadata.get(key).and_then(|v| v.to_str().ok());
    traces::continue_client_trace(&span, header(traces::TRACEPARENT), header(traces::TRACESTATE));
    span
}

/// Record how a request ended on its span (server-side codes mark it as an error).
fn record_code(span: &tracing::Span, code: tonic::Code) {
    request_id::record_status(span, code as u16, is_server_failure(code));
}

fn is_server_failure(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(code, Unknown | DeadlineExceeded | Unimplemented | Internal | Unavailable | DataLoss)
}

/// Triton's `ModelVersionPolicy` message for a configuration's policy.
fn version_policy(policy: triton::VersionPolicyConfig) -> ModelVersionPolicy {
    use model_version_policy::{All, Latest, PolicyChoice, Specific};
    let choice = match policy {
        triton::VersionPolicyConfig::Latest { num_versions } => PolicyChoice::Latest(Latest { num_versions }),
        triton::VersionPolicyConfig::All {} => PolicyChoice::All(All {}),
        triton::VersionPolicyConfig::Specific { versions } => PolicyChoice::Specific(Specific {
            versions: versions.into_iter().map(|v| i64::try_from(v).unwrap_or(i64::MAX)).collect(),
        }),
    };
    ModelVersionPolicy { policy_choice: Some(choice) }
}

fn version(version: &str) -> Option<&str> {
    (!version.is_empty()).then_some(version)
}

/// The `grpc-timeout` header (`<digits><unit>`, units H M S m u n).
fn grpc_timeout<T>(request: &Request<T>) -> Option<Duration> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

fn parameter_text(parameter: &InferParameter) -> Option<String> {
    use infer_parameter::ParameterChoice;
    Some(match parameter.parameter_choice.as_ref()? {
        ParameterChoice::BoolParam(v) => v.to_string(),
        ParameterChoice::Int64Param(v) => v.to_string(),
        ParameterChoice::StringParam(v) => v.clone(),
        ParameterChoice::DoubleParam(v) => v.to_string(),
        ParameterChoice::Uint64Param(v) => v.to_string(),
    })
}

fn parameters(map: &HashMap<String, InferParameter>) -> Vec<(String, String)> {
    let mut parameters: Vec<(String, String)> =
        map.iter().filter_map(|(k, v)| parameter_text(v).map(|text| (k.clone(), text))).collect();
    parameters.sort();
    parameters
}

/// Turn a wire request into a validated one.
pub fn parse_infer_request(message: ModelInferRequest, limits: TensorLimits) -> Result<ValidInferRequest, ApiError> {
    let use_raw = !message.raw_input_contents.is_empty();
    if use_raw && message.raw_input_contents.len() != message.inputs.len() {
        return Err(ApiError::invalid(format!(
            "raw_input_contents has {} entries for {} inputs; send one per input or none",
            message.raw_input_contents.len(),
            message.inputs.len()
        )));
    }
    let mut raw_contents = message.raw_input_contents.into_iter();
    let mut inputs = InputValidator::new(limits, message.inputs.len());
    for input in message.inputs {
        let header = inputs.header(input.name, &input.datatype, &input.shape)?;
        let payload = match raw_contents.next() {
            Some(bytes) => raw::decode(&header, std::borrow::Cow::Owned(bytes))?,
            None => typed_contents(header.datatype(), input.contents.unwrap_or_default(), header.name())?,
        };
        inputs.push(header, payload)?;
    }
    let requested_outputs =
        (!message.outputs.is_empty()).then(|| message.outputs.into_iter().map(|o| o.name).collect());
    Ok(ValidInferRequest {
        id: (!message.id.is_empty()).then_some(message.id),
        inputs: inputs.finish(),
        parameters: parameters(&message.parameters),
        requested_outputs,
    })
}

fn typed_contents(datatype: Datatype, contents: InferTensorContents, name: &str) -> Result<Payload, ApiError> {
    fn le<T: Copy, const N: usize>(values: &[T], to_bytes: impl Fn(T) -> [u8; N]) -> Payload {
        Payload::Fixed(values.iter().flat_map(|&v| to_bytes(v)).collect())
    }
    // Narrower integer types travel in the 32-bit fields; each value must fit.
    fn narrow<S: Copy>(values: &[S], name: &str, encode: impl Fn(S) -> Option<Vec<u8>>) -> Result<Payload, ApiError> {
        let bytes: Option<Vec<Vec<u8>>> = values.iter().map(|&v| encode(v)).collect();
        bytes
            .map(|b| Payload::Fixed(b.concat()))
            .ok_or_else(|| ApiError::invalid(format!("input '{name}': a value is out of range for its datatype")))
    }
    let ty = match datatype {
        Datatype::Bytes => return Ok(Payload::Bytes(contents.bytes_contents)),
        Datatype::Fixed(ty) => ty,
    };
    Ok(match ty {
        ElementType::Bool => Payload::Fixed(contents.bool_contents.iter().map(|&b| u8::from(b)).collect()),
        ElementType::I32 => le(&contents.int_contents, i32::to_le_bytes),
        ElementType::I16 => {
            narrow(&contents.int_contents, name, |v: i32| i16::try_from(v).ok().map(|v| v.to_le_bytes().to_vec()))?
        }
        ElementType::I8 => {
            narrow(&contents.int_contents, name, |v: i32| i8::try_from(v).ok().map(|v| v.to_le_bytes().to_vec()))?
        }
        ElementType::I64 => le(&contents.int64_contents, i64::to_le_bytes),
        ElementType::U32 => le(&contents.uint_contents, u32::to_le_bytes),
        ElementType::U16 => {
            narrow(&contents.uint_contents, name, |v: u32| u16::try_from(v).ok().map(|v| v.to_le_bytes().to_vec()))?
        }
        ElementType::U8 => narrow(&contents.uint_contents, name, |v: u32| u8::try_from(v).ok().map(|v| vec![v]))?,
        ElementType::U64 => le(&contents.uint64_contents, u64::to_le_bytes),
        ElementType::F32 => le(&contents.fp32_contents, f32::to_le_bytes),
        ElementType::F64 => le(&contents.fp64_contents, f64::to_le_bytes),
        ElementType::F16 | ElementType::BF16 => {
            return Err(ApiError::invalid(format!("input '{name}': {ty} data must be sent in raw_input_contents")));
        }
    })
}

/// Encode a result with `raw_output_contents`, one entry per output.
pub fn encode_response(outcome: InferOutcome) -> ModelInferResponse {
    let mut raw_output_contents = Vec::with_capacity(outcome.outputs.len());
    let outputs = outcome
        .outputs
        .into_iter()
        .map(|output| {
            raw_output_contents.push(raw::encode(output.payload));
            model_infer_response::InferOutputTensor {
                name: output.name,
                datatype: output.datatype.name().to_string(),
                shape: output.shape.iter().map(|&d| d as i64).collect(),
                parameters: HashMap::new(),
                contents: None,
            }
        })
        .collect();
    ModelInferResponse {
        model_name: outcome.model_name,
        model_version: outcome.model_version,
        id: outcome.id.unwrap_or_default(),
        parameters: outcome
            .parameters
            .into_iter()
            .map(|(k, v)| {
                (k, InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::StringParam(v)) })
            })
            .chain(outcome.cost_us.map(|cost| {
                let cost =
                    InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::DoubleParam(cost)) };
                (COST_PARAMETER.to_string(), cost)
            }))
            .collect(),
        outputs,
        raw_output_contents,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_datatype_numbers_are_the_protos() {
        for datatype in ElementType::ALL.map(Datatype::Fixed).into_iter().chain([Datatype::Bytes]) {
            let proto = DataType::from_str_name(datatype.triton_name()).expect("a Triton datatype");
            assert_eq!(proto as i32, datatype.triton_number(), "{}", datatype.name());
        }
    }

    #[test]
    fn narrow_integer_contents_must_fit_their_datatype() {
        let contents = |values: Vec<u32>| InferTensorContents { uint_contents: values, ..Default::default() };
        let payload = typed_contents(Datatype::Fixed(ElementType::U16), contents(vec![1, 65535]), "x").expect("fits");
        assert_eq!(payload, Payload::Fixed(vec![1, 0, 255, 255]));
        let error = typed_contents(Datatype::Fixed(ElementType::U8), contents(vec![256]), "x").expect_err("too big");
        assert!(error.message.contains("out of range"), "{}", error.message);
    }

    #[test]
    fn raw_contents_become_the_tensors_bytes_without_a_copy() {
        let raw: Vec<u8> = (0..64u8).collect();
        let address = raw.as_ptr();
        let input = model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![4, 4],
            ..Default::default()
        };
        let message = ModelInferRequest { inputs: vec![input], raw_input_contents: vec![raw], ..Default::default() };
        let parsed = parse_infer_request(message, TensorLimits { max_elements: 1000 }).expect("valid");
        let Payload::Fixed(bytes) = &parsed.inputs[0].payload else { panic!("fixed-size") };
        assert_eq!(bytes.len(), 64);
        assert_eq!(bytes.as_ptr(), address, "the message's own bytes (a batch of images is tens of MB)");
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// Whatever a gRPC message decodes to, converting it answers (never panics) and
            /// keeps the tensor limit.
            #[test]
            fn any_message_converts_or_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let limits = TensorLimits { max_elements: 1000 };
                if let Ok(message) = <ModelInferRequest as prost::Message>::decode(bytes.as_slice())
                    && let Ok(valid) = parse_infer_request(message, limits)
                {
                    for input in valid.inputs {
                        prop_assert!(input.shape.iter().product::<u64>() <= 1000);
                    }
                }
            }

            /// Typed contents of any shape: valid when they match it, refused when not.
            #[test]
            fn typed_contents_match_their_shape(values in proptest::collection::vec(any::<i64>(), 0..30), rows in 0i64..40) {
                let input = model_infer_request::InferInputTensor {
                    name: "x".into(),
                    datatype: "INT64".into(),
                    shape: vec![rows],
                    contents: Some(InferTensorContents { int64_contents: values.clone(), ..Default::default() }),
                    ..Default::default()
                };
                let message = ModelInferRequest { inputs: vec![input], ..Default::default() };
                let parsed = parse_infer_request(message, TensorLimits { max_elements: 1000 });
                prop_assert_eq!(parsed.is_ok(), values.len() as i64 == rows);
            }
        }
    }
}
