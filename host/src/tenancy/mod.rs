//! Tenancy: who is calling (API-key authentication) and whether they may start another
//! request now (per-tenant concurrency admission), and fair turns on the host CPU.

mod error;
pub mod turn_state;
pub mod turns;

pub use error::TenancyError;

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

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

/// Per-tenant limits on requests in flight.
#[derive(Default)]
pub struct Admission {
    in_flight: RwLock<HashMap<TenantId, (Arc<Semaphore>, u32)>>,
}

impl Admission {
    pub fn new(limits: impl IntoIterator<Item = (TenantId, u32)>) -> Self {
        let admission = Self::default();
        for (tenant, max) in limits {
            admission.set_limit(tenant, max);
        }
        admission
    }

    /// Set (or change) a tenant's limit; requests in flight under an old limit finish.
    pub fn set_limit(&self, tenant: TenantId, max: u32) {
        let mut in_flight = self.in_flight.write().unwrap_or_else(PoisonError::into_inner);
        in_flight.insert(tenant, (Arc::new(Semaphore::new(max as usize)), max));
    }

    /// A permit for one request; dropping it frees the slot.
    pub fn admit(&self, tenant: &TenantId) -> Result<OwnedSemaphorePermit, TenancyError> {
        let in_flight = self.in_flight.read().unwrap_or_else(PoisonError::into_inner);
        let (semaphore, max) =
            in_flight.get(tenant).ok_or_else(|| TenancyError::NoAdmissionState { tenant: tenant.to_string() })?;
        semaphore
            .clone()
            .try_acquire_owned()
            .map_err(|_| TenancyError::TooManyInFlight { tenant: tenant.to_string(), max: *max })
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
        let admission = Admission::new([(acme.clone(), 1), (globex.clone(), 1)]);
        let held = admission.admit(&acme).expect("first is admitted");
        assert!(matches!(admission.admit(&acme), Err(TenancyError::TooManyInFlight { max: 1, .. })), "second waits");
        assert!(admission.admit(&globex).is_ok(), "another tenant is unaffected");
        drop(held);
        assert!(admission.admit(&acme).is_ok(), "a finished request frees its slot");
    }
}
