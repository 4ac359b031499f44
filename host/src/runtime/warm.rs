//! Serial instance reuse, a tenant's opt-in (`instance_reuse = "serial"` in its quotas): after
//! a clean call, the instance may serve the next request of the same app version of the same
//! tenant instead of a fresh one, which skips instantiation. Only the guest's own linear
//! memory carries over (its statics and heap), so one request of a tenant may see what an
//! earlier request of the same tenant left there; nothing crosses to another tenant or app
//! version. An instance is not kept after a trap, a deadline, an error, a refused memory
//! growth, with host resources still held (`wasi:nn` tensors, graphs, contexts, errors:
//! host memory charged to one request only), or with stderr written (its buffer is the
//! request's). Idle instances hold pool slots that every tenant needs: an app version keeps
//! at most [`MAX_IDLE_PER_VERSION`], the server at most a quarter of its slots idle, and an
//! instance serves at most [`MAX_USES`] requests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use wasmtime::Store;

use super::bindings;
use super::store::StoreState;

/// Idle instances one app version keeps.
pub const MAX_IDLE_PER_VERSION: usize = 4;
/// Requests one instance serves before it is dropped (whatever slowly accumulates in a
/// guest's heap does not live for ever).
pub const MAX_USES: u32 = 10_000;

/// An app version's idle instances.
#[derive(Default)]
pub struct WarmPool {
    idle: Mutex<Vec<Idle>>,
    /// `idle`'s length, read without the lock.
    parked: AtomicUsize,
}

/// An instance between two calls, with the store it lives in.
pub(super) struct Warm {
    pub store: Store<StoreState>,
    pub instance: bindings::Component,
    pub uses: u32,
    pub memory_bytes: usize,
}

struct Idle {
    warm: Warm,
    _counted: IdleCount,
}

/// One instance counted among the server's idle ones while it is parked.
struct IdleCount(Arc<AtomicUsize>);

impl Drop for IdleCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WarmPool {
    /// An idle instance made with this memory limit, if one is parked.
    pub(super) fn take(&self, memory_bytes: usize) -> Option<Warm> {
        loop {
            let idle = {
                let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                let last = idle.pop()?;
                self.parked.fetch_sub(1, Ordering::Relaxed);
                last
            };
            // One made under another memory quota is dropped (outside the lock).
            if idle.warm.memory_bytes == memory_bytes {
                return Some(idle.warm);
            }
        }
    }

    /// Keep `warm` for the next request, unless it has served enough, this version keeps
    /// enough, or `server_idle` has reached `server_cap`.
    pub(super) fn park(&self, warm: Warm, server_idle: &Arc<AtomicUsize>, server_cap: usize) {
        if warm.uses >= MAX_USES {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE_PER_VERSION {
            if server_idle.fetch_add(1, Ordering::Relaxed) < server_cap {
                idle.push(Idle { warm, _counted: IdleCount(server_idle.clone()) });
                self.parked.fetch_add(1, Ordering::Relaxed);
                return;
            }
            server_idle.fetch_sub(1, Ordering::Relaxed);
        }
        drop(idle);
        // `warm` is dropped here, outside the lock: its slot is reset for the next instance.
    }

    /// Instances parked now.
    pub fn idle(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    /// Drop every parked instance (the tenant went back to fresh instances).
    pub fn clear(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner));
        self.parked.fetch_sub(idle.len(), Ordering::Relaxed);
    }
}
