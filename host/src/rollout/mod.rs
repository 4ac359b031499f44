//! Rollout: which version of an app serves a request. A version named in the request path
//! pins it; otherwise the app's traffic decides (stable, a weighted canary with an optional
//! sticky key), and a sample may be mirrored to a shadow version whose answers are compared
//! with the primary's.

pub mod analysis;
pub mod compare;
pub mod shadow;
pub mod status;
pub mod traffic;

use crate::api::error::ApiError;
use crate::registry::ids::VersionName;

/// The version to run: the pinned one if it exists, else `stable`.
pub fn select<'a, V>(
    app: &str,
    stable: &VersionName,
    versions: &'a std::collections::BTreeMap<VersionName, V>,
    pinned: Option<&str>,
) -> Result<(&'a VersionName, &'a V), ApiError> {
    let chosen = match pinned {
        None => versions.get_key_value(stable),
        Some(version) => versions.iter().find(|(name, _)| name.as_str() == version),
    };
    chosen.ok_or_else(|| {
        let known: Vec<&str> = versions.keys().map(VersionName::as_str).collect();
        ApiError::not_found(format!(
            "version '{}' of model '{app}' not found; versions: {known:?}",
            pinned.unwrap_or(stable.as_str())
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn pins_a_version_or_uses_stable() {
        let v1 = VersionName::new("1").expect("valid");
        let v2 = VersionName::new("2").expect("valid");
        let versions = BTreeMap::from([(v1.clone(), "one"), (v2, "two")]);
        assert_eq!(select("app", &v1, &versions, None).expect("stable").1, &"one");
        assert_eq!(select("app", &v1, &versions, Some("2")).expect("pinned").1, &"two");
        let error = select("app", &v1, &versions, Some("9")).expect_err("unknown");
        assert!(error.message.contains("version '9' of model 'app' not found"), "{}", error.message);
    }
}
