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

/// A model's weights version (Triton's: a positive integer); a model without versions is at 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelVersion(u64);

impl ModelVersion {
    /// The version of weights declared or uploaded without one.
    pub const FIRST: Self = Self(1);

    /// From its decimal text ("1", "2", ...), as URLs and wire fields carry it.
    pub fn parse(value: &str) -> Result<Self, String> {
        let invalid = || format!("invalid model version '{value}': use a whole number from 1");
        if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        value.parse().ok().filter(|&v| v > 0).map(Self).ok_or_else(invalid)
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// Its text, without an allocation for versions 1 to 9 (each plain request names its
    /// version once).
    pub fn text(self) -> std::borrow::Cow<'static, str> {
        const SMALL: [&str; 9] = ["1", "2", "3", "4", "5", "6", "7", "8", "9"];
        match self.0 {
            1..=9 => std::borrow::Cow::Borrowed(SMALL[(self.0 - 1) as usize]),
            other => std::borrow::Cow::Owned(other.to_string()),
        }
    }
}

impl fmt::Display for ModelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Read from a number (`2` in a manifest) or its text (`"2"`, a map key or a URL's).
impl<'de> Deserialize<'de> for ModelVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ModelVersion;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a model version: a whole number from 1")
            }
            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<ModelVersion, E> {
                ModelVersion::parse(&value.to_string()).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<ModelVersion, E> {
                ModelVersion::parse(&value.to_string()).map_err(E::custom)
            }
            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<ModelVersion, E> {
                ModelVersion::parse(value).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Written as its text, so it can key a JSON object.
impl serde::Serialize for ModelVersion {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_versions_are_positive_whole_numbers_from_numbers_or_text() {
        assert_eq!(ModelVersion::parse("2"), Ok(ModelVersion(2)));
        assert_eq!((ModelVersion(9).text(), ModelVersion(10).text()), ("9".into(), "10".into()));
        for bad in ["", "0", "-1", "1.5", "+3", " 2", "99999999999999999999", "v2"] {
            assert!(ModelVersion::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        let pins: std::collections::BTreeMap<String, ModelVersion> =
            toml::from_str("a = 2\nb = \"3\"").expect("numbers and text");
        assert_eq!(pins["a"], ModelVersion(2));
        assert_eq!(pins["b"], ModelVersion(3));
        let keyed: std::collections::BTreeMap<ModelVersion, String> =
            serde_json::from_str(r#"{"4": "x"}"#).expect("a JSON key");
        assert_eq!(serde_json::to_string(&keyed).expect("serialised"), r#"{"4":"x"}"#);
        assert!(toml::from_str::<std::collections::BTreeMap<String, ModelVersion>>("a = 0").is_err());
    }

    #[test]
    fn accepts_safe_names_and_rejects_the_rest() {
        assert!(TenantId::new("acme-2").is_ok());
        assert!(ModelName::new("digits_v1.0").is_ok());
        for bad in ["", "Acme", "a/b", "../x", "-lead", "sp ace", &"x".repeat(65)] {
            assert!(TenantId::new(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
