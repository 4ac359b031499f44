//! Resolve a name inside the caller's tenant: an app (with its pinned or stable version) or
//! a plain model. Unknown and foreign names get the same answer.

use std::borrow::Cow;
use std::sync::Arc;

use super::error::ApiError;
use crate::nn::models::ModelCopy;
use crate::registry::ids::{ModelName, ModelVersion, VersionName};
use crate::rollout::app::{AppState, AppVersion};
use crate::state::TenantState;

/// What a name resolves to inside a tenant.
pub enum Target {
    /// An app: the pinned version, or (when `pinned` is false) the stable one; unpinned
    /// requests are routed by the app's traffic when they run.
    App { app: Arc<AppState>, version: VersionName, chosen: AppVersion, pinned: bool },
    /// A plain model: the pinned version, or its newest.
    Model {
        name: ModelName,
        version: ModelVersion,
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

    pub fn version(&self) -> Cow<'_, str> {
        match self {
            Self::App { version, .. } => Cow::Borrowed(version.as_str()),
            Self::Model { version, .. } => version.text(),
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
    if let Some((model_name, newest_version, newest)) = tenant.models.own_newest(name) {
        let (version, model) = match version {
            None => (newest_version, newest),
            Some(pinned) => {
                let found = ModelVersion::parse(pinned)
                    .ok()
                    .and_then(|version| Some((version, tenant.models.own_version(name, version)?.1)));
                found.ok_or_else(|| {
                    let versions: Vec<String> = tenant.models.versions(name).iter().map(ToString::to_string).collect();
                    ApiError::not_found(format!(
                        "version '{pinned}' of model '{name}' not found; versions: {versions:?}"
                    ))
                })?
            }
        };
        let response_cache = tenant.spec().declared_model(&model_name).is_some_and(|spec| spec.response_cache);
        return Ok(Target::Model { name: model_name, version, model, response_cache });
    }
    let mut known: Vec<String> = tenant.apps().into_iter().map(|(a, _)| a.to_string()).collect();
    known.extend(tenant.models.own_names().iter().map(ToString::to_string));
    Err(ApiError::not_found(format!("model '{name}' not found; this tenant's models: {known:?}")))
}
