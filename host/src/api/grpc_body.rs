//! gRPC requests before tonic reads them. tonic reads a unary call's whole message before
//! the method runs, so what must hold while a body is on its way is applied here, in a tower
//! layer in front of the service:
//! - a call of a method that needs a key is refused on its headers without a known one, so
//!   nobody without a key can make the server hold a message (the methods that need none take
//!   only empty messages, bounded to [`KEYLESS_MESSAGE_BYTES`]);
//! - an inference call is admitted first (the tenant's `max_concurrent_requests`), so one
//!   tenant's slow or stalled bodies count against its own quota only, and the admission
//!   travels to the method in the request's extensions, and its answer's bytes hold it until
//!   written out (see `held`); a tenant's calls of the other methods
//!   whose messages are still on their way are at most [`OTHER_CALLS_READING`] (past it
//!   RESOURCE_EXHAUSTED), so no tenant can make the server hold their messages without bound
//!   (1,024 calls a connection would otherwise hold up to 64 MiB, on every connection);
//! - each message is refused as soon as its length prefix says it exceeds the tenant's
//!   `max_request_bytes` (other methods: a small fixed limit), with RESOURCE_EXHAUSTED as
//!   HTTP answers 413;
//! - the whole body of a call must arrive within the body timeout (a stream's requests come
//!   as the client has them; see `grpc_stream` for what bounds a stream);
//! - a refused call's message, where small, is still read after the refusal, so that it
//!   costs the client's connection nothing (h2's small-DATA-frame budget).
//!
//! No CPU turn is held while a body is read: the method takes one once it has the message.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tonic::body::Body;

use super::error::{ApiError, ErrorKind};
use super::held::held;
use crate::infer::{self, Admitted, InFlight};
use crate::state::ServingState;
use crate::telemetry::metrics::Protocol;

/// The service's methods: each needs a tenant's key but those in [`KEYLESS`].
const SERVICE: &str = "/inference.GRPCInferenceService/";
/// The methods whose messages carry tensors: a call, and a stream of them.
const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
const MODEL_STREAM_INFER: &str = "/inference.GRPCInferenceService/ModelStreamInfer";
/// The methods any client may call: the server's liveness, readiness and metadata.
const KEYLESS: [&str; 3] = [
    "/inference.GRPCInferenceService/ServerLive",
    "/inference.GRPCInferenceService/ServerReady",
    "/inference.GRPCInferenceService/ServerMetadata",
];
/// Largest message of a keyless method: their requests have no fields.
const KEYLESS_MESSAGE_BYTES: usize = 1 << 10;
/// Largest message of any other method (names and versions).
const SMALL_MESSAGE_BYTES: usize = 64 << 10;
/// A tenant's calls of methods other than inference whose messages are on their way at once:
/// at most 16 MiB of [`SMALL_MESSAGE_BYTES`] messages. A message comes with its call's
/// headers, so only calls whose messages are held back count for long.
const OTHER_CALLS_READING: usize = 256;
/// gRPC's message prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// The admission of an inference call, handed from the layer to the method.
#[derive(Clone)]
pub struct Admission(Arc<Mutex<Option<Admitted>>>);

impl Admission {
    /// Take the admission (once).
    pub fn take(&self) -> Option<Admitted> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// The layer: see the module doc.
#[derive(Clone)]
pub struct BodyLimits {
    state: Arc<ServingState>,
    max_message_bytes: usize,
    timeout: Duration,
    /// Per tenant, its calls of the other methods whose messages are on their way.
    reading: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
    /// Per tenant, its open inference streams.
    streams: Arc<Mutex<HashMap<String, StreamPlaces>>>,
}

impl BodyLimits {
    pub fn new(state: Arc<ServingState>, max_message_bytes: usize, timeout: Duration) -> Self {
        Self { state, max_message_bytes, timeout, reading: Arc::default(), streams: Arc::default() }
    }

    /// What a call may send, decided on its headers (see [`Allowed`]), or why it is refused.
    /// An admitted inference call carries its admission to the method in the request's
    /// extensions.
    fn admit(&self, request: &mut http::Request<Body>) -> Result<Allowed, ApiError> {
        let path = request.uri().path();
        let allowed = |limit, reading, in_flight| Allowed { limit, reading, in_flight, stream: false };
        if KEYLESS.contains(&path) {
            return Ok(allowed(KEYLESS_MESSAGE_BYTES.min(self.max_message_bytes), None, None));
        }
        let small = SMALL_MESSAGE_BYTES.min(self.max_message_bytes);
        if !path.starts_with(SERVICE) {
            // No such method: tonic answers UNIMPLEMENTED.
            return Ok(allowed(small, None, None));
        }
        let authorization = request.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        // As the method would answer a call without a known key, but before its message is read.
        let tenant = super::auth::tenant_for_key(&self.state, authorization)?;
        let spec = tenant.spec();
        let quota = usize::try_from(spec.quotas.max_request_bytes).unwrap_or(usize::MAX);
        if path == MODEL_STREAM_INFER {
            // Its requests are admitted one by one as they come (see `grpc_stream`).
            let open = self.stream_slot(spec.id.as_str(), spec.quotas.max_concurrent_requests)?;
            let limit = self.max_message_bytes.min(quota);
            return Ok(Allowed { limit, reading: None, in_flight: Some(InFlight::new(open)), stream: true });
        }
        if path != MODEL_INFER {
            return Ok(allowed(small, Some(self.reading_slot(spec.id.as_str())?), None));
        }
        let admitted = infer::admit(&tenant)
            .inspect_err(|refused| infer::count_refused(spec.id.as_str(), Protocol::Grpc, refused))?;
        let in_flight = admitted.in_flight();
        request.extensions_mut().insert(Admission(Arc::new(Mutex::new(Some(admitted)))));
        Ok(allowed(self.max_message_bytes.min(quota), None, Some(in_flight)))
    }

    /// A place for `tenant`'s call of a method other than inference while its message comes,
    /// or the refusal when [`OTHER_CALLS_READING`] are already waiting for theirs.
    fn reading_slot(&self, tenant: &str) -> Result<OwnedSemaphorePermit, ApiError> {
        let places = {
            let mut reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
            match reading.get(tenant) {
                Some(places) => places.clone(),
                None => reading
                    .entry(tenant.to_string())
                    .or_insert_with(|| Arc::new(Semaphore::new(OTHER_CALLS_READING)))
                    .clone(),
            }
        };
        places.try_acquire_owned().map_err(|_| {
            ApiError::new(
                ErrorKind::QuotaExceeded,
                format!(
                    "tenant '{tenant}' has {OTHER_CALLS_READING} calls whose messages have not all arrived; \
                     finish or cancel some first"
                ),
            )
        })
    }

    /// A place for one of `tenant`'s inference streams, of at most `max` open at once, or the
    /// refusal. A changed limit makes a new count; streams open under the old one end under it.
    fn stream_slot(&self, tenant: &str, max: u32) -> Result<OwnedSemaphorePermit, ApiError> {
        let places = {
            let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
            match streams.get(tenant) {
                Some((made_for, places)) if *made_for == max => places.clone(),
                _ => {
                    let places = Arc::new(Semaphore::new(max as usize));
                    streams.insert(tenant.to_string(), (max, places.clone()));
                    places
                }
            }
        };
        places.try_acquire_owned().map_err(|_| {
            ApiError::new(
                ErrorKind::QuotaExceeded,
                format!(
                    "tenant '{tenant}' has {max} inference streams open (max_concurrent_requests); \
                     close one first"
                ),
            )
        })
    }
}

/// A tenant's places for open inference streams, and the limit they were made for.
type StreamPlaces = (u32, Arc<Semaphore>);

/// What a call may send, decided on its headers.
struct Allowed {
    /// Its messages' size limit.
    limit: usize,
    /// For a tenant's call of a method other than inference, its place while its message comes.
    reading: Option<OwnedSemaphorePermit>,
    /// For an inference call, its place in the tenant's quota, which its answer holds until
    /// written out; for a stream, its place among the tenant's streams, likewise.
    in_flight: Option<InFlight>,
    /// A stream's messages come as the client has them: no deadline for all of them.
    stream: bool,
}

impl<S> tower::Layer<S> for BodyLimits {
    type Service = Limited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Limited { inner, limits: self.clone() }
    }
}

#[derive(Clone)]
pub struct Limited<S> {
    inner: S,
    limits: BodyLimits,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Limited<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let timeout = self.limits.timeout;
        match self.limits.admit(&mut request) {
            Ok(Allowed { limit, reading, in_flight, stream }) => {
                let deadline = (!stream).then_some(timeout);
                let request = request.map(|body| Body::new(LimitedBody::new(body, limit, deadline, reading)));
                // The service was made ready by `poll_ready`; the clone takes its place for next time.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let answered = inner.call(request);
                match in_flight {
                    Some(in_flight) => Box::pin(async move {
                        let response = answered.await?;
                        Ok(response.map(|body| Body::new(held(body, in_flight))))
                    }),
                    None => Box::pin(answered),
                }
            }
            Err(refused) => refuse(request, refused, timeout),
        }
    }
}

/// Answer a call with `error` at once, with its request id (as inference calls' answers carry
/// theirs). Its message is still read and dropped (where small, within the body timeout): h2
/// charges each small DATA frame that arrives for a stream nobody reads to a budget of the
/// connection's that it never gives back, and closes the connection, admitted calls and all,
/// once a run of refusals has spent it. Read after the answer, not before: an overloaded
/// server may take longer than any short wait to read it.
fn refuse<E: Send + 'static>(
    request: http::Request<Body>,
    error: ApiError,
    timeout: Duration,
) -> BoxFuture<Result<http::Response<Body>, E>> {
    let id = super::request_id::choose(request.headers().get(super::request_id::KEY).and_then(|v| v.to_str().ok()));
    let mut status = Status::from(error);
    if let Ok(id) = tonic::metadata::MetadataValue::try_from(id.as_str()) {
        status.metadata_mut().insert(super::request_id::KEY, id);
    }
    tokio::spawn(super::http::read_rest(request.into_body(), timeout));
    Box::pin(std::future::ready(Ok(status.into_http())))
}

/// A request body whose messages are checked against a size limit as their prefixes arrive,
/// and which must end before its deadline, where it has one (a stream's has none).
struct LimitedBody {
    inner: Body,
    limit: usize,
    prefix: [u8; PREFIX],
    prefix_read: usize,
    /// Bytes of the current message still to come.
    message_left: usize,
    /// The body timeout, and when it runs out.
    deadline: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
    /// The tenant's place for a call whose message is on its way, given back at its end.
    reading: Option<OwnedSemaphorePermit>,
}

impl LimitedBody {
    fn new(inner: Body, limit: usize, timeout: Option<Duration>, reading: Option<OwnedSemaphorePermit>) -> Self {
        let deadline = timeout.map(|timeout| (timeout, Box::pin(tokio::time::sleep(timeout))));
        Self { inner, limit, prefix: [0; PREFIX], prefix_read: 0, message_left: 0, deadline, reading }
    }

    /// Follow the message boundaries through `data`; an error for a message over the limit.
    fn scan(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.message_left > 0 {
                let skip = self.message_left.min(data.len());
                self.message_left -= skip;
                data.advance(skip);
                continue;
            }
            let take = (PREFIX - self.prefix_read).min(data.len());
            self.prefix[self.prefix_read..self.prefix_read + take].copy_from_slice(&data[..take]);
            self.prefix_read += take;
            data.advance(take);
            if self.prefix_read == PREFIX {
                self.prefix_read = 0;
                let length = u32::from_be_bytes([self.prefix[1], self.prefix[2], self.prefix[3], self.prefix[4]]);
                let length = usize::try_from(length).unwrap_or(usize::MAX);
                if length > self.limit {
                    return Err(ApiError::body_too_large(self.limit).into());
                }
                self.message_left = length;
            }
        }
        Ok(())
    }
}

impl HttpBody for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Pending => {
                if let Some((timeout, deadline)) = &mut self.deadline
                    && deadline.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Some(Err(ApiError::body_timeout(*timeout).into())));
                }
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(refused) = self.scan(data)
                {
                    return Poll::Ready(Some(Err(refused)));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.reading = None;
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(limit: usize) -> LimitedBody {
        LimitedBody {
            inner: Body::empty(),
            limit,
            prefix: [0; PREFIX],
            prefix_read: 0,
            message_left: 0,
            deadline: Some((Duration::from_secs(1), Box::pin(tokio::time::sleep(Duration::from_secs(1))))),
            reading: None,
        }
    }

    fn message(length: u32) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes.extend(std::iter::repeat_n(7u8, length as usize));
        bytes
    }

    #[tokio::test]
    async fn a_calls_place_is_given_back_when_its_message_has_come() {
        let places = Arc::new(Semaphore::new(1));
        let place = places.clone().try_acquire_owned().expect("a free place");
        let inner = Body::new(http_body_util::Full::new(Bytes::from(message(3))));
        let mut limited = LimitedBody::new(inner, 10, Some(Duration::from_secs(1)), Some(place));
        while let Some(frame) = http_body_util::BodyExt::frame(&mut limited).await {
            frame.expect("within the limit");
        }
        assert_eq!(places.available_permits(), 1, "given back at the end, not when the body is dropped");
        drop(limited);
    }

    #[tokio::test]
    async fn messages_are_followed_across_chunks_and_the_first_over_the_limit_is_refused() {
        let mut limited = body(10);
        let mut stream = message(10);
        stream.extend(message(3));
        // One byte at a time: prefixes split across chunks still parse.
        for byte in &stream {
            limited.scan(std::slice::from_ref(byte)).expect("within the limit");
        }
        assert_eq!((limited.prefix_read, limited.message_left), (0, 0));
        let mut over = body(10);
        over.scan(&message(5)).expect("fits");
        let refused = over.scan(&message(11)[..3]).and_then(|()| over.scan(&message(11)[3..5]));
        let status = refused.expect_err("11 bytes is over 10");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("max_request_bytes"), "{}", status.message());
    }
}
