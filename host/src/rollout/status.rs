//! An app's rollout status as the API reports it: its traffic, each version's outcomes so
//! far, and how the shadow compares with the primary.

use std::collections::BTreeMap;

use serde::Serialize;

use super::analysis::Event;
use super::app::AppState;
use super::shadow::ShadowReport;
use crate::runtime::World;
use crate::telemetry::slo::ObjectiveReport;

#[derive(Debug, Serialize)]
pub struct RolloutStatus {
    pub name: String,
    /// The world its components target (`sluice:tenant/component`, or `wasi:http/proxy` for
    /// an HTTP app).
    pub world: Option<&'static str>,
    pub stable: String,
    pub canary: Option<Weighted>,
    pub shadow: Option<Sampled>,
    pub sticky_header: Option<String>,
    pub versions: BTreeMap<String, VersionStatus>,
    /// Its saved versions this server could not prepare, each with why.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unavailable: BTreeMap<String, String>,
    pub shadow_comparison: ShadowReport,
    /// The canary analysis' decisions, oldest first.
    pub events: Vec<Event>,
    /// The app's objectives: budget left, burn rates and alert conditions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo: Option<Vec<ObjectiveReport>>,
}

#[derive(Debug, Serialize)]
pub struct Weighted {
    pub version: String,
    pub weight: f64,
}

#[derive(Debug, Serialize)]
pub struct Sampled {
    pub version: String,
    pub sample: f64,
}

#[derive(Debug, Serialize)]
pub struct VersionStatus {
    pub requests: u64,
    pub errors: u64,
    /// Upper bound of the latency bucket holding the 99th percentile, in ms.
    pub p99_ms: Option<f64>,
    /// The model versions it pins (a weights-only canary differs here alone).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, String>,
}

pub fn status(app: &AppState) -> RolloutStatus {
    let traffic = app.traffic();
    let versions = app
        .version_names()
        .into_iter()
        .filter_map(|version| Some((version.clone(), app.version(&version)?)))
        .map(|(version, state)| {
            let snapshot = state.stats.snapshot();
            let status = VersionStatus {
                requests: snapshot.requests,
                errors: snapshot.errors,
                p99_ms: snapshot.quantile_ms(0.99).filter(|ms| ms.is_finite()),
                models: state.models.iter().map(|(model, pinned)| (model.to_string(), pinned.to_string())).collect(),
            };
            (version.to_string(), status)
        })
        .collect();
    RolloutStatus {
        name: app.spec.name.to_string(),
        world: app.world().map(World::name),
        stable: traffic.stable.to_string(),
        canary: traffic.canary.map(|c| Weighted { version: c.version.to_string(), weight: c.weight }),
        shadow: traffic.shadow.map(|s| Sampled { version: s.version.to_string(), sample: s.sample }),
        sticky_header: traffic.sticky_header,
        versions,
        unavailable: app.unprepared().into_iter().map(|(name, version)| (name.to_string(), version.reason)).collect(),
        shadow_comparison: app.shadow.report(),
        events: app.analysis.lock().unwrap_or_else(std::sync::PoisonError::into_inner).events.iter().cloned().collect(),
        slo: app.slo.as_ref().map(|slo| slo.report()),
    }
}
