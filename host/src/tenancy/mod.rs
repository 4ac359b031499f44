//! Tenancy: who is calling (API-key authentication) and whether they may start another
//! request now (per-tenant concurrency admission), and fair turns on the host CPU (the
//! [`turns::Turn`] implements `nn`'s `CpuTurn` hook), and what its requests cost
//! ([`usage::Usage`]), and the answers it keeps ([`response_cache::ResponseCache`]). Its
//! refusals are [`TenancyError`]s. Imports `nn` (the hook), `oip` (tensors) and `registry`
//! (ids) only.

mod error;
pub mod response_cache;
pub mod turn_state;
pub mod turns;
pub mod usage;

pub use error::TenancyError;

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::registry::ids::TenantId;

/// The key from an `Authorization: Bearer <key>` header value.
pub fn bearer_key(authorization: Option<&str>) -> Result<&str, TenancyError> {
    let value = authorization.ok_or(TenancyError::MissingKey)?;
    let (scheme, key) = value.trim().split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") || key.trim().is_empty() {
        return Err(TenancyError::MalformedKey);
    }
    Ok(key.trim())
}

/// One tenant's limit on requests in flight (`max_concurrent_requests`). A quota change
/// makes a new one; requests admitted under the old limit finish under it.
pub struct Admission {
    slots: Arc<Semaphore>,
    max: u32,
}

impl Admission {
    pub fn new(max: u32) -> Self {
        Self { slots: Arc::new(Semaphore::new(max as usize)), max }
    }

    /// A permit for one request of `tenant`; dropping it frees the slot.
    pub fn admit(&self, tenant: &TenantId) -> Result<OwnedSemaphorePermit, TenancyError> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| TenancyError::TooManyInFlight { tenant: tenant.to_string(), max: self.max })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_keys() {
        assert_eq!(bearer_key(Some("Bearer abc")).expect("valid"), "abc");
        assert_eq!(bearer_key(Some("bearer  abc ")).expect("valid"), "abc");
        assert_eq!(bearer_key(None), Err(TenancyError::MissingKey));
        assert_eq!(bearer_key(Some("Basic abc")), Err(TenancyError::MalformedKey));
        assert_eq!(bearer_key(Some("Bearer")), Err(TenancyError::MalformedKey));
    }

    #[test]
    fn admission_caps_requests_in_flight_per_tenant() {
        let acme = TenantId::new("acme").expect("valid id");
        let globex = TenantId::new("globex").expect("valid id");
        let (for_acme, for_globex) = (Admission::new(1), Admission::new(1));
        let held = for_acme.admit(&acme).expect("first is admitted");
        assert!(matches!(for_acme.admit(&acme), Err(TenancyError::TooManyInFlight { max: 1, .. })), "second waits");
        assert!(for_globex.admit(&globex).is_ok(), "another tenant is unaffected");
        drop(held);
        assert!(for_acme.admit(&acme).is_ok(), "a finished request frees its slot");
    }
}
