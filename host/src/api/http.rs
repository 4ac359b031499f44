//! OIP REST over axum: health, server and model metadata, readiness and inference, with
//! and without a pinned version, and HTTP apps under `/v2/apps/{app}/http/`. Every model
//! and app route authenticates the tenant first; the body is read only up to the tenant's
//! request-size limit.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use serde::Deserialize;

use super::auth::{authenticate, declared_length};
use super::error::{ApiError, ErrorKind};
use super::held::held;
use super::json::{EncodedResponse, HttpInferRequest, encode_response, parse_infer_request};
use super::{metadata, triton};
use crate::infer;
use crate::infer::Caller;
use crate::oip::types::TensorLimits;
use crate::registry::manifest::Quotas;
use crate::state::{ServingState, TenantState};
use crate::telemetry::drift::DriftReport;
use crate::telemetry::metrics::Protocol;

type Shared = Arc<ServingState>;

/// The binary tensor extension's header: the byte length of the JSON part of a body.
const INFERENCE_HEADER_CONTENT_LENGTH: header::HeaderName =
    header::HeaderName::from_static("inference-header-content-length");

/// The HTTP port's service: the routes behind the middleware. The middleware wraps the router
/// once (as a layer on the router it would wrap every route, and each wrapper would be cloned,
/// allocated, again for every request), and the request's own envelope is one service with one
/// boxed future (axum's `from_fn` boxes its future and its `Next` again per layer and request).
pub fn router(state: Shared) -> Enveloped<impl HttpService<Body>> {
    let routes = axum::Router::new()
        .route("/v2/health/live", get(|| async { Json(serde_json::json!({ "live": true })) }))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2", get(|| async { Json(metadata::server()) }))
        .route("/v2/models/{model}", get(model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(model_metadata))
        .route("/v2/models/{model}/ready", get(model_ready))
        .route("/v2/models/{model}/config", get(model_config))
        .route("/v2/models/{model}/versions/{version}/config", get(model_config))
        .route("/v2/models/{model}/stats", get(model_stats))
        .route("/v2/models/{model}/drift", get(model_drift))
        .route("/v2/models/{model}/drift/baseline", put(model_drift_baseline))
        .route("/v2/models/{model}/versions/{version}/stats", get(model_stats))
        .route("/v2/models/{model}/versions/{version}/ready", get(model_ready))
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{model}/load", post(repository_load))
        .route("/v2/repository/models/{model}/unload", post(repository_unload))
        .route("/v2/models/{model}/infer", post(model_infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(model_infer))
        .route("/v2/apps/{app}/http", any(app_http))
        .route("/v2/apps/{app}/http/", any(app_http))
        .route("/v2/apps/{app}/http/{*rest}", any(app_http))
        .merge(super::control::routes())
        .merge(super::admin::routes())
        .merge(super::ui::routes())
        .fallback(|| async {
            ApiError::not_found("no such endpoint; see the Open Inference Protocol REST paths under /v2")
        })
        .with_state(state);
    Enveloped(
        tower::ServiceBuilder::new()
            .map_response(IntoResponse::into_response)
            // tritonclient may compress requests and ask for compressed responses.
            .layer(tower_http::compression::CompressionLayer::new().compress_when(worth_compressing()))
            .layer(tower_http::decompression::RequestDecompressionLayer::new())
            .service(routes),
    )
}

/// Answers smaller than this go uncompressed even to a client that accepts gzip (browsers
/// and Python's `requests` say so on every call): such an answer fits one TCP segment
/// either way, and compressing the plain model's answer tripled its request's server CPU
/// (BENCHMARKS.md). tower-http's default compresses anything over 32 bytes.
const COMPRESS_ABOVE_BYTES: u16 = 1024;

/// tower-http's default predicate with [`COMPRESS_ABOVE_BYTES`] for its size.
fn worth_compressing() -> impl tower_http::compression::Predicate {
    use tower_http::compression::Predicate;
    use tower_http::compression::predicate::{NotForContentType, SizeAbove};
    SizeAbove::new(COMPRESS_ABOVE_BYTES)
        .and(NotForContentType::GRPC)
        .and(NotForContentType::IMAGES)
        .and(NotForContentType::SSE)
}

/// What the HTTP port serves requests with bodies of type `B` through: [`router`]'s service
/// (for hyper's bodies by default), or another router in its place (the benches' floor).
pub trait HttpService<B = hyper::body::Incoming>:
    tower::Service<http::Request<B>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S, B> HttpService<B> for S where
    S: tower::Service<http::Request<B>, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + 'static
{
}

/// Every HTTP request's envelope around `S`: its id and span ([`super::request_id::http`]),
/// and the rest of a body its answer left unread ([`close_when_body_unread`]).
#[derive(Clone)]
pub struct Enveloped<S>(S);

impl<S, B> tower::Service<http::Request<B>> for Enveloped<S>
where
    S: HttpService<Body>,
    B: http_body::Body<Data = bytes::Bytes, Error: Into<axum::BoxError>> + Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        // `S` is made ready in the request's future (`oneshot`).
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let inner = self.0.clone();
        let request = request.map(Body::new);
        Box::pin(async move {
            let routed = |request| async move {
                match tower::ServiceExt::oneshot(inner, request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            };
            Ok(close_when_body_unread(request, |request| super::request_id::http(request, routed)).await)
        })
    }
}

/// The most of a body left unread by an early answer (a refusal before the body: a wrong
/// key, a quota) that is read and dropped so that the connection stays open, and how long
/// that may take (a little over the 40 ms a body written apart from its head may wait for
/// Nagle's algorithm). Inference bodies are mostly this small and already arrived: a client
/// refused at overload keeps its connection instead of paying a new one per request.
/// A gRPC call refused on its headers (a wrong key, a quota) has its message read too, at
/// most [`DRAIN_LIMIT`] of it but within the body timeout ([`super::grpc_body`]).
const DRAIN_LIMIT: usize = 64 * 1024;
const DRAIN_WAIT: Duration = Duration::from_millis(50);

/// Read and drop what is left of a body where it is small ([`DRAIN_LIMIT`]) and ends within
/// `wait`: whether it was read to its end. Each frame is dropped as it comes, so a body read
/// here holds no memory of the server's while it is slow to come.
pub(super) async fn read_rest<B: http_body::Body>(rest: B, wait: Duration) -> bool {
    let read = async {
        let mut rest = std::pin::pin!(rest);
        let mut left = DRAIN_LIMIT;
        while let Some(frame) = http_body_util::BodyExt::frame(&mut rest).await {
            let Ok(frame) = frame else { return false };
            let length = frame.data_ref().map_or(0, bytes::Buf::remaining);
            let Some(still) = left.checked_sub(length) else { return false };
            left = still;
        }
        true
    };
    tokio::time::timeout(wait, read).await.unwrap_or(false)
}

/// When an answer was made before the request's body was read to its end, read and drop the
/// rest where it is small and has arrived ([`DRAIN_LIMIT`], [`DRAIN_WAIT`]); otherwise answer
/// `Connection: close`: the server closes such a connection, and a client told nothing may
/// reuse it just as it closes.
async fn close_when_body_unread<Answered: Future<Output = Response>>(
    request: axum::extract::Request,
    next: impl FnOnce(axum::extract::Request) -> Answered,
) -> Response {
    let declared = declared_length(request.headers());
    let has_body =
        declared.is_some_and(|length| length > 0) || request.headers().contains_key(header::TRANSFER_ENCODING);
    if !has_body {
        return next(request).await;
    }
    let rest = Arc::new(Mutex::new(Rest::Reading));
    let request = request.map(|body| Body::new(Tracked { body: Some(body), rest: rest.clone() }));
    let mut response = next(request).await;
    let rest = std::mem::replace(&mut *rest.lock().unwrap_or_else(std::sync::PoisonError::into_inner), Rest::Ended);
    let drained = match rest {
        Rest::Ended => true,
        Rest::Unread(rest)
            if declared.is_none_or(|length| usize::try_from(length).is_ok_and(|length| length <= DRAIN_LIMIT)) =>
        {
            read_rest(rest, DRAIN_WAIT).await
        }
        // Too large to drain, or still held by a task that outlives the answer.
        Rest::Unread(_) | Rest::Reading => false,
    };
    if !drained {
        response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    response
}

/// Where a request body stands once its answer is ready.
enum Rest {
    Reading,
    Ended,
    /// Dropped before its end: the rest, for the middleware to drain.
    Unread(Body),
}

/// A request body that tells [`close_when_body_unread`] whether it was read to its end.
struct Tracked {
    body: Option<Body>,
    rest: Arc<Mutex<Rest>>,
}

impl Tracked {
    fn settle(&self, rest: Rest) {
        *self.rest.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = rest;
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        match self.body.take() {
            Some(body) if !http_body::Body::is_end_stream(&body) => self.settle(Rest::Unread(body)),
            _ => self.settle(Rest::Ended),
        }
    }
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let Some(body) = self.body.as_mut() else { return std::task::Poll::Ready(None) };
        let polled = std::pin::Pin::new(body).poll_frame(context);
        if matches!(polled, std::task::Poll::Ready(None)) {
            self.body = None;
            self.settle(Rest::Ended);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.as_ref().map_or_else(|| http_body::SizeHint::with_exact(0), http_body::Body::size_hint)
    }
}

#[derive(Debug, Deserialize)]
struct ModelPath {
    model: String,
    version: Option<String>,
}

/// The model a describing request names, in the caller's tenant, rendered as JSON.
fn describe<T: serde::Serialize>(
    state: &ServingState,
    headers: &HeaderMap,
    path: &ModelPath,
    render: impl FnOnce(&TenantState, &str, &infer::Target) -> T,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(state, headers)?;
    let target = infer::resolve(tenant, &path.model, path.version.as_deref())?;
    Ok(Json(render(tenant, &path.model, &target)).into_response())
}

async fn model_metadata(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    describe(&state, &headers, &path, metadata::model)
}

async fn server_ready(State(state): State<Shared>) -> Response {
    super::metrics::readiness_answer(&state.readiness)
}

async fn model_ready(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let ready = triton::readiness(tenant, &path.model, path.version.as_deref())?;
    // The protocol's answer is the status: 200 ready, a 4xx not.
    let status = if ready { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    Ok((status, Json(serde_json::json!({ "name": path.model, "ready": ready }))).into_response())
}

/// A repository request's body, empty or JSON (`{"ready": true}` for the index,
/// `{"parameters": {...}}` for load and unload).
#[derive(Debug, Default, Deserialize)]
struct RepositoryRequest {
    #[serde(default)]
    ready: bool,
    #[serde(default)]
    parameters: serde_json::Map<String, serde_json::Value>,
}

fn repository_request(body: &[u8]) -> Result<RepositoryRequest, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(RepositoryRequest::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(format!("a repository request's body is empty or JSON like {{\"parameters\": {{}}}}: {e}"))
    })
}

/// Triton's `POST /v2/repository/index`: the caller's apps and models with their states.
async fn repository_index(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let request = repository_request(&body)?;
    Ok(Json(triton::repository_index(tenant, request.ready)).into_response())
}

/// Triton's `POST /v2/repository/models/{m}/load`: answered once the model is ready.
async fn repository_load(
    State(state): State<Shared>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let request = repository_request(&body)?;
    triton::check_load_parameters(request.parameters.keys().map(String::as_str))?;
    triton::load(tenant, &model).await?;
    Ok(Json(serde_json::json!({})).into_response())
}

/// Triton's `POST /v2/repository/models/{m}/unload`.
async fn repository_unload(
    State(state): State<Shared>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    repository_request(&body)?;
    triton::unload(tenant, &model).await?;
    Ok(Json(serde_json::json!({})).into_response())
}

async fn model_config(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    describe(&state, &headers, &path, triton::config)
}

async fn model_stats(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let target = infer::resolve(tenant, &path.model, path.version.as_deref())?;
    let named = path.version.is_some();
    Ok(Json(triton::statistics(tenant, &path.model, &target, named)).into_response())
}

/// `GET /v2/models/{model}/drift`: the caller's drift figures for one of its models.
async fn model_drift(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let infer::Target::Model { name, model, .. } = infer::resolve(tenant, &path.model, None)? else {
        return Err(ApiError::invalid(format!(
            "'{}' is an app; drift is tracked per model: ask for the models it calls",
            path.model
        )));
    };
    let report = match model.drift.get(tenant.spec().id.as_str()) {
        // A new reference's report sorts every window: not on the runtime's threads.
        Some(monitor) => Some(
            tokio::task::spawn_blocking(move || monitor.report())
                .await
                .map_err(|e| ApiError::new(ErrorKind::Internal, format!("drift report: {e}")))?,
        ),
        None => None,
    };
    let mut body = serde_json::to_value(report.as_deref().unwrap_or(&DriftReport::empty()))
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("drift report: {e}")))?;
    body["model"] = serde_json::json!(name);
    Ok(Json(body).into_response())
}

/// `PUT /v2/models/{model}/drift/baseline`: an OIP infer body of known-good rows (such as
/// the training set); the model is run on them and they become the caller's drift reference.
async fn model_drift_baseline(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    if !crate::telemetry::metrics::metrics().is_enabled() {
        return Err(ApiError::new(ErrorKind::Conflict, "drift is not tracked on this server (--no-metrics)"));
    }
    let spec = tenant.spec();
    let (entry, HttpInferRequest { request, .. }) =
        enter_and_read(&state, tenant, &spec.quotas, &headers, body).await?;
    let rows = infer::set_drift_baseline(tenant, entry, &path.model, request).await?;
    Ok(Json(serde_json::json!({ "model": path.model, "reference": "baseline", "rows": rows })).into_response())
}

async fn model_infer(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    // The headers taken from the request, not copied by axum's `HeaderMap` extractor.
    let (http::request::Parts { headers, .. }, body) = request.into_parts();
    let tenant = &authenticate(&state, &headers)?;
    let spec = tenant.spec();
    let routed = infer::Routed::default();
    infer::observed(
        spec.id.as_str(),
        Protocol::Http,
        &routed,
        // Boxed: axum moves the handler's future, and this one is large.
        Box::pin(serve_infer(&state, tenant, &spec.quotas, &path, &headers, body, &routed)),
    )
    .await
}

/// Admit a request, read its body within the tenant's size limit and the body timeout, then
/// wait for a CPU turn. A body declared too large is refused before it is read; no turn is
/// held while the body arrives.
async fn enter_with_body(
    state: &ServingState,
    tenant: &TenantState,
    quotas: &Quotas,
    headers: &HeaderMap,
    body: Body,
) -> Result<(infer::Entry, bytes::Bytes), ApiError> {
    let limit = usize::try_from(quotas.max_request_bytes).unwrap_or(usize::MAX);
    if declared_length(headers).is_some_and(|length| length > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    let admitted = infer::admit(tenant)?;
    let timeout = state.body_timeouts.request;
    let body = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| ApiError::body_timeout(timeout))?
        .map_err(|_| ApiError::body_too_large(limit))?;
    Ok((infer::enter(state, tenant, admitted, None).await?, body))
}

/// [`enter_with_body`] for an OIP infer body (JSON, or with binary tensors), parsed within the
/// tenant's tensor limits.
async fn enter_and_read(
    state: &ServingState,
    tenant: &TenantState,
    quotas: &Quotas,
    headers: &HeaderMap,
    body: Body,
) -> Result<(infer::Entry, HttpInferRequest), ApiError> {
    let (entry, body) = enter_with_body(state, tenant, quotas, headers, body).await?;
    let limits = TensorLimits { max_elements: quotas.max_tensor_elements };
    let json_length = match headers.get(INFERENCE_HEADER_CONTENT_LENGTH) {
        None => None,
        Some(value) => Some(value.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok()).ok_or_else(|| {
            ApiError::invalid("Inference-Header-Content-Length must be the byte length of the JSON header")
        })?),
    };
    Ok((entry, parse_infer_request(&body, json_length, limits)?))
}

async fn serve_infer(
    state: &ServingState,
    tenant: &TenantState,
    quotas: &Quotas,
    path: &ModelPath,
    headers: &HeaderMap,
    body: Body,
    routed: &infer::Routed,
) -> Result<Response, ApiError> {
    let (entry, HttpInferRequest { request, encoding }) = enter_and_read(state, tenant, quotas, headers, body).await?;
    let in_flight = entry.in_flight();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let outcome = infer::infer(
        state,
        tenant,
        entry,
        &path.model,
        path.version.as_deref(),
        request,
        Caller { header: &header, routed },
    )
    .await?;
    let EncodedResponse { json, binary } = encode_response(outcome, &encoding)?;
    let response = if binary.is_empty() {
        ([(header::CONTENT_TYPE, "application/json")], json).into_response()
    } else {
        binary_response(json, binary)
    };
    Ok(response.map(|body| Body::new(held(body, in_flight))))
}

/// An answer with outputs as binary data: its JSON, then each output's own bytes.
fn binary_response(json: Vec<u8>, binary: Vec<Vec<u8>>) -> Response {
    let (json_length, length) = (json.len(), json.len() + binary.iter().map(Vec::len).sum::<usize>());
    // The JSON, then each output's own bytes as they are: hyper writes them out together,
    // where one body of them all was a copy (MB a request for an image model's outputs).
    let parts = std::iter::once(json).chain(binary).map(|part| Ok::<_, Infallible>(axum::body::Bytes::from(part)));
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, length.to_string()),
            (INFERENCE_HEADER_CONTENT_LENGTH, json_length.to_string()),
        ],
        Body::from_stream(futures::stream::iter(parts)),
    )
        .into_response()
}

/// An HTTP app route's parameters (the path below the prefix is read raw, not decoded).
#[derive(Debug, Deserialize)]
struct AppPath {
    app: String,
}

/// The prefix of an HTTP app's paths; what follows it is the path its component sees.
fn app_path_below(path: &str) -> Option<&str> {
    let after_apps = path.strip_prefix("/v2/apps/")?;
    let (_app, rest) = after_apps.split_once('/')?;
    rest.strip_prefix("http")
}

/// Any method on `/v2/apps/{app}/http/{rest}`: the tenant's HTTP app answers, seeing the
/// request as sent to `/{rest}` (method, query, headers but the caller's API key, body).
async fn app_http(
    State(state): State<Shared>,
    Path(AppPath { app }): Path<AppPath>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let tenant = &authenticate(&state, &parts.headers)?;
    let spec = tenant.spec();
    let routed = infer::Routed::default();
    infer::observed_with(
        spec.id.as_str(),
        Protocol::Http,
        &routed,
        |response: &Response| response.status().as_u16(),
        Box::pin(serve_app_http(&state, tenant, &spec.quotas, &app, parts, body, &routed)),
    )
    .await
}

async fn serve_app_http(
    state: &ServingState,
    tenant: &TenantState,
    quotas: &Quotas,
    app: &str,
    parts: http::request::Parts,
    body: Body,
    routed: &infer::Routed,
) -> Result<Response, ApiError> {
    let (entry, body) = enter_with_body(state, tenant, quotas, &parts.headers, body).await?;
    let in_flight = entry.in_flight();
    let below = app_path_below(parts.uri.path()).unwrap_or_default();
    let mut uri = if below.is_empty() { "/".to_string() } else { below.to_string() };
    if let Some(query) = parts.uri.query() {
        uri = format!("{uri}?{query}");
    }
    let mut headers = parts.headers.clone();
    headers.remove(header::AUTHORIZATION);
    if !headers.contains_key(header::HOST) {
        headers.insert(header::HOST, header::HeaderValue::from_static("localhost"));
    }
    let mut request = http::Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = uri.parse().map_err(|_| ApiError::invalid("the request's path is not a valid URI"))?;
    *request.headers_mut() = headers;

    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let response =
        infer::serve_http_app(state, tenant, entry, app, request, Caller { header: &header, routed }).await?;
    Ok(response.map(|body| Body::new(held(http_body_util::Full::new(body), in_flight))))
}

#[cfg(test)]
mod tests {
    use super::app_path_below;

    #[test]
    fn an_app_sees_the_path_below_its_prefix() {
        assert_eq!(app_path_below("/v2/apps/digits/http/classify"), Some("/classify"));
        assert_eq!(app_path_below("/v2/apps/digits/http/a/b%20c"), Some("/a/b%20c"));
        assert_eq!(app_path_below("/v2/apps/digits/http"), Some(""));
        assert_eq!(app_path_below("/v2/apps/digits/http/"), Some("/"));
        assert_eq!(app_path_below("/v2/models/digits/infer"), None);
    }
}
