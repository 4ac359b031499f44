//! One guest call: a fresh store with the tenant's limits, instantiate from the pre-linked
//! component (or take a parked instance: [`super::warm`]), call `infer` under the request
//! deadline, and classify how it ended.

use tokio::time::Instant;
use wasmtime::component::ResourceTableError;
use wasmtime::{Store, Trap, UpdateDeadline};

use super::bindings::sluice::tenant::types::{InferError, InferRequest, InferResponse};
use super::limits::GuestLimiter;
use super::store::{GuestLog, StoreState};
use super::warm::{Warm, WarmPool};
use super::{Prepared, Runtime};
use crate::nn::host::NnCtx;
use crate::nn::scheduler::ComputeError;
use crate::telemetry::text::bounded;

/// Longest text of the guest's own (an error message, its stderr) kept in an error.
const MAX_GUEST_TEXT: usize = 1024;

/// Everything one call needs besides the component.
pub struct GuestCall {
    pub nn: NnCtx,
    pub memory_bytes: usize,
    pub log: GuestLog,
    pub deadline: Instant,
    pub deadline_ms: u64,
    pub request: InferRequest,
}

/// How a guest call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GuestError {
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("model error: {0}")]
    Model(String),
    #[error("component error: {0}")]
    Internal(String),
    #[error("the request exceeded its deadline of {ms} ms")]
    Deadline { ms: u64 },
    #[error("the component exceeded its memory limit of {mib} MiB")]
    OutOfMemory { mib: usize },
    #[error("the component overflowed its call stack")]
    StackOverflow,
    #[error("the component held more than {max} host resources at once (header maps, bodies, streams, tensors)")]
    TooManyResources { max: usize },
    #[error("the component trapped: {0}")]
    Trap(String),
    #[error("{0}")]
    Queue(ComputeError),
    #[error("the server is at capacity: all {slots} component instance slots are in use; retry later")]
    NoInstanceSlot { slots: u32 },
    #[error("the component returned without setting a response")]
    NoResponse,
    #[error("the component's response failed: {0}")]
    Response(String),
    #[error("the component's response body is over the tenant's limit of {max} bytes (max_response_bytes)")]
    ResponseTooLarge { max: usize },
}

impl GuestError {
    /// The kind of trap or limit that ended the call, as a metric label; `None` for errors
    /// the guest returned or the model queue reported.
    pub fn trap_kind(&self) -> Option<&'static str> {
        match self {
            Self::Deadline { .. } => Some("deadline"),
            Self::OutOfMemory { .. } => Some("out_of_memory"),
            Self::StackOverflow => Some("stack_overflow"),
            Self::TooManyResources { .. } => Some("resources"),
            Self::Trap(_) => Some("trap"),
            Self::InvalidInput(_)
            | Self::Model(_)
            | Self::Internal(_)
            | Self::Queue(_)
            | Self::NoInstanceSlot { .. }
            | Self::NoResponse
            | Self::Response(_)
            | Self::ResponseTooLarge { .. } => None,
        }
    }
}

impl Runtime {
    /// Run one request through a fresh instance of a component.
    pub async fn invoke(&self, prepared: &Prepared, call: GuestCall) -> Result<InferResponse, GuestError> {
        self.run(prepared, None, call).await
    }

    /// Run one request through an idle instance of `pool` when one is parked (else a fresh
    /// one), and park the instance after a clean call ([`super::warm`]).
    pub async fn invoke_reusing(
        &self,
        prepared: &Prepared,
        pool: &WarmPool,
        call: GuestCall,
    ) -> Result<InferResponse, GuestError> {
        self.run(prepared, Some(pool), call).await
    }

    async fn run(
        &self,
        prepared: &Prepared,
        pool: Option<&WarmPool>,
        call: GuestCall,
    ) -> Result<InferResponse, GuestError> {
        let GuestCall { nn, memory_bytes, log, deadline, deadline_ms, request } = call;
        let limiter = GuestLimiter::new(memory_bytes);
        let (mut store, warm_instance, uses) = match pool.and_then(|pool| pool.take(memory_bytes)) {
            Some(Warm { mut store, instance, uses, .. }) => {
                store.data_mut().renew(nn, limiter, log);
                (store, Some(instance), uses)
            }
            None => {
                let mut store = Store::new(self.engine(), StoreState::new(nn, limiter, log));
                store.limiter(|state| &mut state.limiter);
                (store, None, 0)
            }
        };
        time_slice(&mut store, deadline);

        let outcome = {
            let call = async {
                let instance = match warm_instance {
                    Some(instance) => instance,
                    None => prepared.instantiate_async(&mut store).await?,
                };
                let answer = instance.sluice_tenant_handler().call_infer(&mut store, &request).await?;
                wasmtime::Result::Ok((instance, answer))
            };
            // The epoch stops guest code; this stops waits in host calls (the model queue).
            tokio::time::timeout_at(deadline, call).await
        };
        if let Ok(Ok((instance, Ok(response)))) = outcome {
            if let Some(pool) = pool
                && store.data_mut().finish_for_reuse()
            {
                pool.park(
                    Warm { store, instance, uses: uses + 1, memory_bytes },
                    &self.idle_instances,
                    self.idle_cap(),
                );
            }
            return Ok(response);
        }
        let state = store.data();
        match outcome {
            Err(_elapsed) => Err(GuestError::Deadline { ms: deadline_ms }),
            Ok(Ok((_, Ok(_)))) => unreachable!("answered above"),
            Ok(Ok((_, Err(guest_error)))) => Err(match state.nn.queue_failure.clone() {
                // The guest failed because a model call was shed or timed out: report that.
                Some(ComputeError::DeadlineExceeded { .. } | ComputeError::TooLate { .. }) => {
                    GuestError::Deadline { ms: deadline_ms }
                }
                Some(failure) => GuestError::Queue(failure),
                None => match guest_error {
                    InferError::InvalidInput(message) => GuestError::InvalidInput(bounded(message, MAX_GUEST_TEXT)),
                    InferError::ModelError(message) => GuestError::Model(bounded(message, MAX_GUEST_TEXT)),
                    InferError::Internal(message) => GuestError::Internal(bounded(message, MAX_GUEST_TEXT)),
                },
            }),
            Ok(Err(error)) => Err(classify_trap(&error, state, deadline_ms)),
        }
    }
}

/// Guest code yields to the async runtime every epoch tick, so a busy guest never holds a
/// runtime thread that other requests need; at each tick it also ends its time slice, giving
/// its CPU turn to a waiting request and waiting for it back in round robin; past the
/// deadline it is interrupted.
pub(super) fn time_slice(store: &mut Store<StoreState>, deadline: Instant) {
    let hard_deadline = deadline.into_std();
    store.epoch_deadline_callback(move |mut context| {
        if std::time::Instant::now() >= hard_deadline {
            return Ok(UpdateDeadline::Interrupt);
        }
        Ok(match context.data_mut().end_slice() {
            Some(wait_for_turn) => UpdateDeadline::YieldCustom(1, wait_for_turn),
            None => UpdateDeadline::Yield(1),
        })
    });
    store.set_epoch_deadline(1);
}

/// How a call that failed in wasmtime (a trap, a limit, no pool slot) is reported.
pub(super) fn classify_trap(error: &wasmtime::Error, state: &StoreState, deadline_ms: u64) -> GuestError {
    // Every pool slot taken is the server's capacity, not the guest's fault.
    if let Some(limit) = error.downcast_ref::<wasmtime::PoolConcurrencyLimitError>() {
        let slots = limit.to_string().split_whitespace().find_map(|word| word.parse().ok()).unwrap_or(0);
        return GuestError::NoInstanceSlot { slots };
    }
    if state.limiter.memory_refused || state.nn.tensor_bytes_refused {
        return GuestError::OutOfMemory { mib: state.limiter.memory_bytes >> 20 };
    }
    if let Some(ResourceTableError::Full) = error.root_cause().downcast_ref::<ResourceTableError>() {
        return GuestError::TooManyResources { max: state.table.max_capacity() };
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => GuestError::Deadline { ms: deadline_ms },
        Some(Trap::StackOverflow) => GuestError::StackOverflow,
        trap => {
            let cause = trap.map_or_else(|| error.root_cause().to_string(), |t| t.to_string());
            let stderr = state.stderr_tail();
            let first_line = cause.lines().next().unwrap_or_default().to_string();
            let text = if stderr.is_empty() { first_line } else { format!("{first_line}; guest stderr: {stderr}") };
            GuestError::Trap(bounded(text, MAX_GUEST_TEXT))
        }
    }
}
