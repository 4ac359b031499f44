//! Identifier newtypes that validate on construction and deserialization: tenant, app,
//! model and version names are safe in paths, URLs and metric labels.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// Longest accepted identifier.
const MAX_LEN: usize = 64;

fn check(kind: &str, value: &str) -> Result<(), String> {
    let valid_chars =
        value.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    let valid_start = value.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    if value.is_empty() || value.len() > MAX_LEN || !valid_chars || !valid_start {
        return Err(format!(
            "invalid {kind} '{value}': use 1 to {MAX_LEN} lowercase letters, digits, '-', '_' or '.', starting with a letter or digit"
        ));
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn new(value: &str) -> Result<Self, String> {
                check($kind, value)?;
                Ok(Self(value.to_string()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = String::deserialize(deserializer)?;
                Self::new(&value).map_err(serde::de::Error::custom)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A tenant's id.
    TenantId, "tenant id"
);
id_type!(
    /// An app's name inside a tenant.
    AppName, "app name"
);
id_type!(
    /// A model's name inside a tenant.
    ModelName, "model name"
);
id_type!(
    /// An app version.
    VersionName, "version"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_safe_names_and_rejects_the_rest() {
        assert!(TenantId::new("acme-2").is_ok());
        assert!(ModelName::new("digits_v1.0").is_ok());
        for bad in ["", "Acme", "a/b", "../x", "-lead", "sp ace", &"x".repeat(65)] {
            assert!(TenantId::new(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
