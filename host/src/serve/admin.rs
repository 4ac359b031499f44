//! Platform administration while serving: create tenants, issue and revoke their API keys,
//! set their quotas. A tenant changed this way is "admin-managed": its keys and quotas are
//! saved with its control state and win over its manifest at the next start.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::state::{ServingState, TenantState};
use crate::api::error::{ApiError, ErrorKind};
use crate::nn::models::TenantModels;
use crate::registry::Tenant;
use crate::registry::ids::TenantId;
use crate::registry::manifest::Quotas;

/// Hex digits of a key's SHA-256 that name it (for listing and revoking).
const KEY_ID_DIGITS: usize = 16;

/// A tenant as the admin API lists it.
#[derive(Debug, Serialize)]
pub struct TenantSummary {
    pub id: String,
    pub quotas: Quotas,
    /// Key ids: the first hex digits of each key's SHA-256.
    pub keys: Vec<String>,
}

/// A new key, shown once.
#[derive(Debug, Serialize)]
pub struct IssuedKey {
    pub tenant: String,
    pub key: String,
    pub key_id: String,
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("tenant '{id}' not found"))
}

impl ServingState {
    /// Every tenant with its quotas and key ids.
    pub fn tenant_summaries(&self) -> Vec<TenantSummary> {
        let mut summaries: Vec<TenantSummary> = self
            .all_tenants()
            .iter()
            .map(|tenant| {
                let spec = tenant.tenant();
                TenantSummary { id: spec.id.to_string(), quotas: spec.quotas.clone(), keys: self.key_ids(&spec.id) }
            })
            .collect();
        summaries.sort_by(|a, b| a.id.cmp(&b.id));
        summaries
    }

    /// Key digests of a tenant.
    pub fn key_digests_of(&self, tenant: &TenantId) -> Vec<String> {
        let mut digests: Vec<String> =
            self.keys_read().iter().filter(|(_, owner)| *owner == tenant).map(|(digest, _)| digest.clone()).collect();
        digests.sort();
        digests
    }

    fn key_ids(&self, tenant: &TenantId) -> Vec<String> {
        self.key_digests_of(tenant).into_iter().map(|d| d[..KEY_ID_DIGITS].to_string()).collect()
    }

    /// Check quotas against what this server can give (the guest memory pool is sized at start).
    fn check_quotas(&self, quotas: &Quotas) -> Result<(), ApiError> {
        let pool_mib = (self.runtime.max_memory_bytes() >> 20) as u64;
        if quotas.guest_memory_mib > pool_mib {
            return Err(ApiError::invalid(format!(
                "guest_memory_mib {} exceeds this server's guest memory slots of {pool_mib} MiB (restart it with a \
                 tenant manifest asking for more to raise them)",
                quotas.guest_memory_mib
            )));
        }
        if quotas.max_concurrent_requests == 0 || quotas.compute_weight == 0 || quotas.guest_deadline_ms == 0 {
            return Err(ApiError::invalid(
                "max_concurrent_requests, compute_weight and guest_deadline_ms must be at least 1",
            ));
        }
        Ok(())
    }

    /// Create a tenant with no models, apps or keys.
    pub fn create_tenant(&self, id: TenantId, quotas: Quotas) -> Result<Arc<TenantState>, ApiError> {
        self.check_quotas(&quotas)?;
        if self.tenant(&id).is_some() {
            return Err(ApiError::new(ErrorKind::Conflict, format!("tenant '{id}' exists")));
        }
        let spec = Tenant { id: id.clone(), quotas, models: BTreeMap::new(), apps: BTreeMap::new() };
        let tenant = self.insert_tenant(spec);
        tenant.admin_managed.store(true, Ordering::Relaxed);
        self.save_control(&tenant)?;
        tracing::info!(tenant = %id, "tenant created");
        Ok(tenant)
    }

    /// Add a tenant's serving state (and its admission limit) from its spec.
    pub(super) fn insert_tenant(&self, spec: Tenant) -> Arc<TenantState> {
        self.admission.set_limit(spec.id.clone(), spec.quotas.max_concurrent_requests);
        let raw_backend = spec.quotas.allow_raw_model_load.then(|| self.raw_backend()).flatten();
        let models = Arc::new(TenantModels::new(BTreeMap::new(), self.shared_models.clone()));
        let id = spec.id.clone();
        let tenant = Arc::new(TenantState::new(Arc::new(spec), models, BTreeMap::new(), raw_backend));
        self.tenants_write().entry(id).or_insert(tenant).clone()
    }

    /// Replace a tenant's quotas.
    pub fn set_quotas(&self, id: &TenantId, quotas: Quotas) -> Result<(), ApiError> {
        self.check_quotas(&quotas)?;
        let tenant = self.tenant(id).ok_or_else(|| not_found(id.as_str()))?;
        self.admission.set_limit(id.clone(), quotas.max_concurrent_requests);
        tenant.set_quotas(quotas);
        tenant.admin_managed.store(true, Ordering::Relaxed);
        self.save_control(&tenant)
    }

    /// Issue a new random key for a tenant; only its digest is kept.
    pub fn issue_key(&self, id: &TenantId) -> Result<IssuedKey, ApiError> {
        let tenant = self.tenant(id).ok_or_else(|| not_found(id.as_str()))?;
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("no randomness for a key: {e}")))?;
        let key = format!("sk-{}", hex::encode(secret));
        let digest = hex::encode(Sha256::digest(key.as_bytes()));
        let key_id = digest[..KEY_ID_DIGITS].to_string();
        self.keys_write().insert(digest, id.clone());
        tenant.admin_managed.store(true, Ordering::Relaxed);
        self.save_control(&tenant)?;
        tracing::info!(tenant = %id, %key_id, "API key issued");
        Ok(IssuedKey { tenant: id.to_string(), key, key_id })
    }

    /// Revoke a tenant's key by its id; requests with it get 401 from now on.
    pub fn revoke_key(&self, id: &TenantId, key_id: &str) -> Result<(), ApiError> {
        let tenant = self.tenant(id).ok_or_else(|| not_found(id.as_str()))?;
        let removed = {
            let mut keys = self.keys_write();
            let digest = keys
                .iter()
                .find(|(digest, owner)| *owner == id && key_id.len() >= 8 && digest.starts_with(key_id))
                .map(|(digest, _)| digest.clone());
            digest.and_then(|d| keys.remove(&d))
        };
        if removed.is_none() {
            return Err(ApiError::not_found(format!("tenant '{id}' has no key with id '{key_id}'")));
        }
        tenant.admin_managed.store(true, Ordering::Relaxed);
        self.save_control(&tenant)?;
        tracing::info!(tenant = %id, %key_id, "API key revoked");
        Ok(())
    }

    /// Replace a tenant's keys with saved digests (at start, for admin-managed tenants).
    pub(super) fn restore_keys(&self, id: &TenantId, digests: &[String]) {
        let mut keys = self.keys_write();
        keys.retain(|_, owner| owner != id);
        for digest in digests {
            keys.insert(digest.clone(), id.clone());
        }
    }
}
