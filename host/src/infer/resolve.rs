//! Resolve a name inside the caller's tenant: an app (with its pinned or stable version) or
//! a plain model. Unknown and foreign names get the same answer.

use std::sync::Arc;

use super::error::ApiError;
use crate::nn::models::ModelCopy;
use crate::registry::ids::{ModelName, VersionName};
use crate::rollout::app::{AppState, AppVersion};
use crate::state::TenantState;

/// The version every plain model reports.
pub const PLAIN_MODEL_VERSION: &str = "1";

/// What a name resolves to inside a tenant.
pub enum Target {
    /// An app: the pinned version, or (when `pinned` is false) the stable one; unpinned
    /// requests are routed by the app's traffic when they run.
    App { app: Arc<AppState>, version: VersionName, chosen: AppVersion, pinned: bool },
    Model {
        name: ModelName,
        model: Arc<ModelCopy>,
        /// The tenant's manifest keeps its answers in the response cache.
        response_cache: bool,
    },
}

impl Target {
    /// Whether its answers are kept in the tenant's response cache.
    pub fn caches_answers(&self) -> bool {
        match self {
            Self::App { app, .. } => app.spec.response_cache,
            Self::Model { response_cache, .. } => *response_cache,
        }
    }

    pub fn version(&self) -> &str {
        match self {
            Self::App { version, .. } => version.as_str(),
            Self::Model { .. } => PLAIN_MODEL_VERSION,
        }
    }
}

/// Resolve `name` (and an optional pinned version) in the tenant's namespace. Unknown and
/// foreign names get the same answer.
pub fn resolve(tenant: &TenantState, name: &str, version: Option<&str>) -> Result<Target, ApiError> {
    if let Some(app) = tenant.app(name) {
        let (chosen_name, chosen) = app.select(version)?;
        return Ok(Target::App { app, version: chosen_name, chosen, pinned: version.is_some() });
    }
    if let Some((model_name, model)) = tenant.models.own(name) {
        if let Some(pinned) = version
            && pinned != PLAIN_MODEL_VERSION
        {
            return Err(ApiError::not_found(format!(
                "version '{pinned}' of model '{name}' not found; versions: [\"{PLAIN_MODEL_VERSION}\"]"
            )));
        }
        let response_cache = tenant.spec().models.get(&model_name).is_some_and(|spec| spec.response_cache);
        return Ok(Target::Model { name: model_name, model, response_cache });
    }
    let mut known: Vec<String> = tenant.apps().into_iter().map(|(a, _)| a.to_string()).collect();
    known.extend(tenant.models.own_names().iter().map(ToString::to_string));
    Err(ApiError::not_found(format!("model '{name}' not found; this tenant's models: {known:?}")))
}
