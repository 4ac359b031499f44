//! Tenant manifests: any text is a manifest or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::registry::manifest::{PlatformManifest, TenantManifest};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = toml::from_str::<TenantManifest>(text);
    let _ = toml::from_str::<PlatformManifest>(text);
});
