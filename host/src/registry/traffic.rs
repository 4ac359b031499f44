//! An app's traffic as declared (in a manifest, through the control API, in saved state):
//! the stable version, an optional canary with a weight, an optional shadow with a sample
//! rate, and an optional sticky-key header. How a request is routed by it is rollout's.

use serde::{Deserialize, Serialize};

use super::ids::VersionName;

/// A canary: `version` receives `weight` percent of unpinned requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Canary {
    pub version: VersionName,
    pub weight: f64,
}

/// A shadow: a `sample` fraction of unpinned requests is mirrored to `version`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shadow {
    pub version: VersionName,
    pub sample: f64,
}

/// How an app's unpinned requests are split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Traffic {
    pub stable: VersionName,
    pub canary: Option<Canary>,
    pub shadow: Option<Shadow>,
    /// Request header whose value pins a caller to one side of the split.
    #[serde(default)]
    pub sticky_header: Option<String>,
}

impl Traffic {
    pub fn stable_only(stable: VersionName) -> Self {
        Self { stable, canary: None, shadow: None, sticky_header: None }
    }

    /// Whether `version` has a role in the split (stable, canary or shadow).
    pub fn uses(&self, version: &VersionName) -> bool {
        self.stable == *version
            || self.canary.as_ref().is_some_and(|c| c.version == *version)
            || self.shadow.as_ref().is_some_and(|s| s.version == *version)
    }

    /// Check the split against the app's versions and the weight and sample ranges.
    pub fn check(&self, has_version: impl Fn(&VersionName) -> bool) -> Result<(), String> {
        let known = |version: &VersionName, role: &str| {
            if has_version(version) { Ok(()) } else { Err(format!("{role} version '{version}' does not exist")) }
        };
        known(&self.stable, "stable")?;
        if let Some(canary) = &self.canary {
            known(&canary.version, "canary")?;
            if !(0.0..=100.0).contains(&canary.weight) {
                return Err(format!("canary weight {} must be 0 to 100 (percent)", canary.weight));
            }
            if canary.version == self.stable {
                return Err(format!("canary version '{}' is the stable version", canary.version));
            }
        }
        if let Some(shadow) = &self.shadow {
            known(&shadow.version, "shadow")?;
            if !(0.0..=1.0).contains(&shadow.sample) {
                return Err(format!("shadow sample {} must be 0 to 1 (a fraction)", shadow.sample));
            }
        }
        Ok(())
    }
}
