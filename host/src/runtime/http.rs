//! One HTTP app call: a fresh store with the tenant's limits, the request (its body already
//! read by the API) handed to the component's `wasi:http/incoming-handler.handle`, and the
//! response it sets read within the tenant's response size, all under the request's deadline.
//! Nothing here waits on the client's network: the body arrived before the call and the answer
//! is sent after it, so no CPU turn is held for a slow client. The answer is given once
//! `handle` returns (work a component does after setting its response counts in its deadline).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tokio::time::Instant;
use wasmtime::Store;
use wasmtime_wasi_http::p2::bindings::http::types::{ErrorCode, Scheme};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use super::invoke::{GuestError, classify_trap, time_slice};
use super::limits::GuestLimiter;
use super::outgoing::OutgoingHttp;
use super::store::{GuestLog, StoreState};
use super::{HttpPrepared, Runtime};
use crate::nn::host::NnCtx;
use crate::nn::scheduler::ComputeError;
use crate::telemetry::text::bounded;

/// Everything one HTTP app call needs besides the component.
pub struct HttpCall {
    pub nn: NnCtx,
    pub memory_bytes: usize,
    pub log: GuestLog,
    pub deadline: Instant,
    pub deadline_ms: u64,
    /// Hosts the tenant's quota lets its components reach (`outgoing_http_hosts`).
    pub outgoing_hosts: Arc<[String]>,
    /// Largest response body.
    pub max_response_bytes: usize,
    pub request: http::Request<Bytes>,
}

/// Longest description of a failed response kept in an error.
const MAX_RESPONSE_ERROR: usize = 256;

impl Runtime {
    /// Serve one request with a fresh instance of an HTTP app.
    pub async fn serve_http(
        &self,
        prepared: &HttpPrepared,
        call: HttpCall,
    ) -> Result<http::Response<Bytes>, GuestError> {
        let HttpCall { nn, memory_bytes, log, deadline, deadline_ms, outgoing_hosts, max_response_bytes, request } =
            call;
        let mut state = StoreState::new(nn, GuestLimiter::new(memory_bytes), log);
        state.serve_http(OutgoingHttp::granted(outgoing_hosts, deadline.into_std()));
        let mut store = Store::new(self.engine(), state);
        store.limiter(|state| &mut state.limiter);
        time_slice(&mut store, deadline);

        let (sender, receiver) =
            tokio::sync::oneshot::channel::<Result<http::Response<HyperOutgoingBody>, ErrorCode>>();
        let mut answer = Box::pin(async move {
            let response = receiver.await.map_err(|_| GuestError::NoResponse)?;
            let response =
                response.map_err(|code| GuestError::Response(bounded(format!("{code:?}"), MAX_RESPONSE_ERROR)))?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, max_response_bytes).collect().await.map_err(|error| {
                if error.is::<LengthLimitError>() {
                    GuestError::ResponseTooLarge { max: max_response_bytes }
                } else {
                    GuestError::Response(bounded(format!("its body failed: {error}"), MAX_RESPONSE_ERROR))
                }
            })?;
            Ok(http::Response::from_parts(parts, body.to_bytes()))
        });
        let request =
            request.map(|body| Full::new(body).map_err(|never| -> wasmtime_wasi_http::Error { match never {} }));
        let ran = {
            let guest = async {
                let mut http = wasmtime_wasi_http::WasiHttpView::http(store.data_mut());
                let incoming = http.new_incoming_request(Scheme::Http, request)?;
                let outparam = http.new_response_outparam(sender)?;
                let proxy = prepared.instantiate_async(&mut store).await?;
                proxy.wasi_http_incoming_handler().call_handle(&mut store, incoming, outparam).await
            };
            // The response body streams from the guest while it runs: read both together.
            tokio::time::timeout_at(deadline, async {
                let mut guest = std::pin::pin!(guest);
                tokio::select! {
                    ran = &mut guest => (ran, None),
                    answered = &mut answer => (guest.await, Some(answered)),
                }
            })
            .await
        };
        let (ran, answered) = ran.map_err(|_elapsed| GuestError::Deadline { ms: deadline_ms })?;
        if let Err(error) = ran {
            let state = store.data();
            // A model call that ran out of time ends the guest's time too.
            return Err(match state.nn.queue_failure {
                Some(ComputeError::DeadlineExceeded { .. } | ComputeError::TooLate { .. }) => {
                    GuestError::Deadline { ms: deadline_ms }
                }
                _ => classify_trap(&error, state, deadline_ms),
            });
        }
        if let Some(answered) = answered {
            return answered;
        }
        // `handle` returned before its response was read to its end: what it left in its
        // store (an unfinished body, a response never set) ends with the store.
        drop(store);
        tokio::time::timeout_at(deadline, answer).await.map_err(|_| GuestError::Deadline { ms: deadline_ms })?
    }
}
