//! Routing an app's traffic (the split itself, [`Traffic`], is declared in the registry).
//! Routing is a pure function
//! of the traffic and two numbers in [0, 1) (a draw for the split, one for the shadow
//! sample), so it is unit-tested without randomness; a sticky key replaces the split draw
//! with a hash of the key, so one key always lands on one version.

use sha2::{Digest, Sha256};

use crate::registry::ids::VersionName;
pub use crate::registry::traffic::{Canary, Shadow, Traffic};

/// Where one request goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub version: VersionName,
    /// The version to mirror the request to, if it is sampled.
    pub shadow: Option<VersionName>,
}

impl Traffic {
    /// Route an unpinned request. `split_draw` and `shadow_draw` are uniform in [0, 1);
    /// with a sticky key, the key's hash takes the place of `split_draw`.
    pub fn route(&self, app: &str, sticky_key: Option<&str>, split_draw: f64, shadow_draw: f64) -> Route {
        let point = sticky_key.map_or(split_draw, |key| sticky_point(app, key));
        let version = match &self.canary {
            Some(canary) if point * 100.0 < canary.weight => canary.version.clone(),
            _ => self.stable.clone(),
        };
        let shadow = self
            .shadow
            .as_ref()
            .filter(|shadow| shadow_draw < shadow.sample && shadow.version != version)
            .map(|shadow| shadow.version.clone());
        Route { version, shadow }
    }
}

/// A key's fixed point in [0, 1): the first 8 bytes of SHA-256(app, key).
fn sticky_point(app: &str, key: &str) -> f64 {
    let digest = Sha256::new().chain_update(app.as_bytes()).chain_update([0]).chain_update(key.as_bytes()).finalize();
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(head) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(name: &str) -> VersionName {
        VersionName::new(name).expect("valid")
    }

    fn canary(weight: f64) -> Traffic {
        Traffic { canary: Some(Canary { version: version("2"), weight }), ..Traffic::stable_only(version("1")) }
    }

    #[test]
    fn the_canary_gets_its_weight_of_the_draws() {
        let traffic = canary(20.0);
        let to_canary = (0..1000)
            .filter(|i| traffic.route("app", None, f64::from(*i) / 1000.0, 0.5).version == version("2"))
            .count();
        assert_eq!(to_canary, 200);
        assert_eq!(canary(0.0).route("app", None, 0.0, 0.5).version, version("1"));
        assert_eq!(canary(100.0).route("app", None, 0.999, 0.5).version, version("2"));
    }

    #[test]
    fn a_sticky_key_always_lands_on_one_version_and_keys_split_by_weight() {
        let traffic = canary(30.0);
        let mut to_canary = 0;
        for user in 0..2000 {
            let key = format!("user-{user}");
            let first = traffic.route("app", Some(&key), 0.0, 0.5).version;
            for draw in [0.3, 0.6, 0.99] {
                assert_eq!(traffic.route("app", Some(&key), draw, 0.5).version, first, "{key}");
            }
            to_canary += usize::from(first == version("2"));
        }
        assert!((540..=660).contains(&to_canary), "{to_canary} of 2000 keys on the 30% canary");
    }

    #[test]
    fn shadows_are_sampled_and_never_mirror_a_version_to_itself() {
        let traffic = Traffic {
            shadow: Some(Shadow { version: version("3"), sample: 0.25 }),
            ..Traffic::stable_only(version("1"))
        };
        assert_eq!(traffic.route("app", None, 0.5, 0.1).shadow, Some(version("3")));
        assert_eq!(traffic.route("app", None, 0.5, 0.3).shadow, None);
        let onto_itself = Traffic { stable: version("3"), ..traffic };
        assert_eq!(onto_itself.route("app", None, 0.5, 0.1).shadow, None);
    }
}
