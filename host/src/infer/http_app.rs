//! Serving an HTTP app (a `wasi:http/proxy` component, as written for `wasmtime serve`): the
//! request, its body already read within the tenant's limits and holding a CPU turn, is
//! routed by the app's traffic (stable, canary, sticky key; there is no version pinning) to a
//! version and handed to a fresh instance with the tenant's limits. Its `wasi:nn` calls go
//! through the same model queues, batches and fair share as an OIP app's. HTTP apps have no
//! shadow (the control API refuses one: their answers have no tensors to compare).

use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::Instrument;

use super::error::ApiError;
use super::{Caller, Entry, guest_log, memory_bytes, raw_load, routed_by_traffic};
use crate::nn::host::NnCtx;
use crate::nn::scheduler::Share;
use crate::runtime::{Component, GuestError, HttpCall};
use crate::state::{ServingState, TenantState};
use crate::telemetry::metrics::metrics;

/// Serve one HTTP request with the tenant's HTTP app `name`.
pub async fn serve_http_app(
    state: &ServingState,
    tenant: &TenantState,
    entry: Entry,
    name: &str,
    request: http::Request<Bytes>,
    caller: Caller<'_>,
) -> Result<http::Response<Bytes>, ApiError> {
    let Entry { in_flight: _in_flight, turn, budget } = entry;
    let holding = turn.holding();
    let not_found = || ApiError::not_found(format!("no HTTP app '{name}' in this tenant"));
    let app = tenant.app(name).ok_or_else(not_found)?;
    let (route, chosen) = routed_by_traffic(&app, name, caller)?;
    let Component::Http(prepared) = &chosen.component else {
        return Err(ApiError::invalid(format!(
            "'{name}' is an Open Inference Protocol app: POST its requests to /v2/models/{name}/infer"
        )));
    };
    caller.routed.set(name, route.version.as_str(), app.slo.as_ref(), tenant.activity.of(name));

    let spec = tenant.spec();
    let quotas = &spec.quotas;
    let share = Share::new(spec.id.as_str().into(), quotas.compute_weight);
    let bill = share.bill.clone();
    let (deadline, memory_bytes) = (budget.deadline(), memory_bytes(quotas));
    let call = HttpCall {
        nn: NnCtx::new(tenant.models.clone(), share, deadline, raw_load(tenant, quotas), memory_bytes, Box::new(turn))
            .with_pins(chosen.models.clone()),
        memory_bytes,
        log: guest_log(tenant, &spec, &app, &route.version),
        deadline,
        deadline_ms: budget.length().as_millis() as u64,
        outgoing_hosts: Arc::from(quotas.outgoing_http_hosts.as_slice()),
        max_response_bytes: usize::try_from(quotas.max_response_bytes).unwrap_or(usize::MAX),
        request,
    };
    let (queued, started) = (budget.waited(), Instant::now());
    let span = tracing::debug_span!("guest", app = %name, version = %route.version);
    let response = state.runtime.serve_http(prepared, call).instrument(span).await;
    let elapsed = started.elapsed();
    tenant.usage.record(holding.held_for(), bill.total());

    let trap = response.as_ref().err().and_then(GuestError::trap_kind);
    metrics().guest(spec.id.as_str(), name, route.version.as_str(), elapsed, trap);
    // The component's own 5xx answers count against its version as the host's failures do
    // (canary analysis, SLOs).
    let server_error = match &response {
        Ok(response) => response.status().is_server_error(),
        Err(error) => ApiError::from(error.clone()).kind.status().is_server_error(),
    };
    chosen.stats.record(server_error, elapsed);
    app.stats.queue.record(queued);
    app.stats.execution(std::time::Duration::ZERO, elapsed, std::time::Duration::ZERO);
    app.stats.request(!server_error, queued + elapsed, 1);
    Ok(response?)
}
