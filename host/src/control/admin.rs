//! Platform administration while serving: create tenants, issue and revoke their API keys,
//! set their quotas. A tenant changed this way is "admin-managed": its keys and quotas are
//! saved with its control state and win over its manifest at the next start.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::ControlError;
use super::apply::change_and_save;
use crate::registry::Tenant;
use crate::registry::ids::TenantId;
use crate::registry::manifest::Quotas;
use crate::state::{ServingState, TenantState};

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

fn not_found(id: &str) -> ControlError {
    ControlError::NotFound(format!("tenant '{id}' not found"))
}

/// Every tenant with its quotas and key ids.
pub fn tenant_summaries(state: &ServingState) -> Vec<TenantSummary> {
    let mut summaries: Vec<TenantSummary> = state
        .all_tenants()
        .iter()
        .map(|tenant| {
            let spec = tenant.spec();
            TenantSummary { id: spec.id.to_string(), quotas: spec.quotas.clone(), keys: key_ids(state, &spec.id) }
        })
        .collect();
    summaries.sort_by(|a, b| a.id.cmp(&b.id));
    summaries
}

fn key_ids(state: &ServingState, tenant: &TenantId) -> Vec<String> {
    state.key_digests_of(tenant).into_iter().map(|d| d[..KEY_ID_DIGITS].to_string()).collect()
}

/// Check quotas against what this server can give (the guest memory pool is sized at start).
fn check_quotas(state: &ServingState, quotas: &Quotas) -> Result<(), ControlError> {
    let pool_mib = (state.runtime.max_memory_bytes() >> 20) as u64;
    if quotas.guest_memory_mib > pool_mib {
        return Err(ControlError::Invalid(format!(
            "guest_memory_mib {} exceeds this server's guest memory slots of {pool_mib} MiB (restart it with a \
             tenant manifest asking for more to raise them)",
            quotas.guest_memory_mib
        )));
    }
    quotas.validate().map_err(ControlError::Invalid)
}

/// Create a tenant with no models, apps or keys.
pub async fn create_tenant(
    state: &ServingState,
    id: TenantId,
    quotas: Quotas,
) -> Result<Arc<TenantState>, ControlError> {
    check_quotas(state, &quotas)?;
    let spec = Tenant { id: id.clone(), quotas, models: BTreeMap::new(), apps: BTreeMap::new() };
    let tenant =
        state.insert_new_tenant(spec).ok_or_else(|| ControlError::Conflict(format!("tenant '{id}' exists")))?;
    tenant.admin_managed.store(true, Ordering::Relaxed);
    if let Err(error) = change_and_save(state, &tenant, None, || Ok(()), |()| {}).await {
        // Not saved, not created: a restart or another replica would not know it.
        state.remove_tenant_if_same(&tenant);
        return Err(error);
    }
    tracing::info!(tenant = %id, "tenant created");
    Ok(tenant)
}

/// Replace a tenant's quotas.
pub async fn set_quotas(state: &ServingState, id: &TenantId, quotas: Quotas) -> Result<(), ControlError> {
    check_quotas(state, &quotas)?;
    change_quotas(state, id, |_| Ok(quotas.clone())).await.map(drop)
}

/// Change some of a tenant's quotas: `fields` (quota names and values) over the current ones.
/// The change is made on the newest saved version, so two replicas changing different quotas
/// of one tenant at once both keep theirs. Returns the quotas now.
pub async fn patch_quotas(
    state: &ServingState,
    id: &TenantId,
    fields: &serde_json::Map<String, serde_json::Value>,
) -> Result<Quotas, ControlError> {
    change_quotas(state, id, |current| {
        let mut merged = match serde_json::to_value(current) {
            Ok(serde_json::Value::Object(merged)) => merged,
            _ => return Err(ControlError::Internal("quotas did not serialize as an object".to_string())),
        };
        merged.extend(fields.iter().map(|(name, value)| (name.clone(), value.clone())));
        let quotas: Quotas = serde_json::from_value(serde_json::Value::Object(merged))
            .map_err(|e| ControlError::Invalid(format!("quotas: {e}")))?;
        check_quotas(state, &quotas)?;
        Ok(quotas)
    })
    .await
}

/// Set a tenant's quotas to what `make` makes of the current ones, and save them.
async fn change_quotas(
    state: &ServingState,
    id: &TenantId,
    make: impl Fn(&Quotas) -> Result<Quotas, ControlError>,
) -> Result<Quotas, ControlError> {
    let tenant = state.tenant(id).ok_or_else(|| not_found(id.as_str()))?;
    let replace = || {
        let quotas = make(&tenant.spec().quotas)?;
        // A cap below what one of its models takes would leave that model unservable.
        if let Some((model, footprint)) =
            tenant.models.largest_footprint().filter(|(_, f)| *f > quotas.resident_model_bytes())
        {
            return Err(ControlError::Invalid(format!(
                "max_resident_model_mib = {} is less than model '{model}' takes resident ({:.1} MiB)",
                quotas.max_resident_model_mib,
                footprint as f64 / f64::from(1 << 20)
            )));
        }
        let previous = (tenant.spec().quotas.clone(), tenant.admin_managed.swap(true, Ordering::Relaxed));
        tenant.set_quotas(quotas);
        Ok(previous)
    };
    let undo = |(quotas, managed): &(Quotas, bool)| {
        tenant.set_quotas(quotas.clone());
        tenant.admin_managed.store(*managed, Ordering::Relaxed);
    };
    change_and_save(state, &tenant, None, replace, undo).await?;
    Ok(tenant.spec().quotas.clone())
}

/// Issue a new random key for a tenant; only its digest is kept.
pub async fn issue_key(state: &ServingState, id: &TenantId) -> Result<IssuedKey, ControlError> {
    let tenant = state.tenant(id).ok_or_else(|| not_found(id.as_str()))?;
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| ControlError::Internal(format!("no randomness for a key: {e}")))?;
    let key = format!("sk-{}", hex::encode(secret));
    let digest = hex::encode(Sha256::digest(key.as_bytes()));
    let key_id = digest[..KEY_ID_DIGITS].to_string();
    let insert = || {
        state.keys_write().insert(digest.clone(), id.clone());
        Ok(tenant.admin_managed.swap(true, Ordering::Relaxed))
    };
    let undo = |managed: &bool| {
        state.keys_write().remove(&digest);
        tenant.admin_managed.store(*managed, Ordering::Relaxed);
    };
    change_and_save(state, &tenant, None, insert, undo).await?;
    tracing::info!(tenant = %id, %key_id, "API key issued");
    Ok(IssuedKey { tenant: id.to_string(), key, key_id })
}

/// Revoke a tenant's key by its id; requests with it get 401 from now on.
pub async fn revoke_key(state: &ServingState, id: &TenantId, key_id: &str) -> Result<(), ControlError> {
    let tenant = state.tenant(id).ok_or_else(|| not_found(id.as_str()))?;
    let remove = || {
        let mut keys = state.keys_write();
        let digest = keys
            .iter()
            .find(|(digest, owner)| *owner == id && key_id.len() >= 8 && digest.starts_with(key_id))
            .map(|(digest, _)| digest.clone());
        let Some(digest) = digest.filter(|d| keys.remove(d).is_some()) else {
            return Err(ControlError::NotFound(format!("tenant '{id}' has no key with id '{key_id}'")));
        };
        Ok((digest, tenant.admin_managed.swap(true, Ordering::Relaxed)))
    };
    let undo = |(digest, managed): &(String, bool)| {
        state.keys_write().insert(digest.clone(), id.clone());
        tenant.admin_managed.store(*managed, Ordering::Relaxed);
    };
    change_and_save(state, &tenant, None, remove, undo).await?;
    tracing::info!(tenant = %id, %key_id, "API key revoked");
    Ok(())
}
