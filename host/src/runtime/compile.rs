//! Compiled-component cache: a component is compiled once per content hash and engine
//! configuration and kept on disk, so a restart does not recompile.

use std::hash::{Hash, Hasher};
use std::path::Path;

use wasmtime::Engine;
use wasmtime::component::Component;

/// A component, and the cache file it was stored in when it was compiled just now.
pub struct Compiled {
    pub component: Component,
    pub stored: Option<std::path::PathBuf>,
}

/// Whose compiled form is cached: the component's digest, and the tenant whose upload it is.
/// A tenant's upload never takes another tenant's compiled form, nor the operator's: taken
/// from the cache it answered in 2 ms where a compile took 115 ms, telling the uploader that
/// someone else holds the component.
pub struct CacheKey {
    sha256: String,
    uploaded_by: Option<String>,
}

impl CacheKey {
    pub fn new(sha256: &str, uploaded_by: Option<&str>) -> Self {
        Self { sha256: sha256.to_string(), uploaded_by: uploaded_by.map(str::to_string) }
    }
}

/// Load the compiled form of `wasm` from `cache_dir`, or compile and store it.
pub fn load_or_compile(engine: &Engine, cache_dir: &Path, key: &CacheKey, wasm: &[u8]) -> wasmtime::Result<Compiled> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let engine_hash = hasher.finish();
    let sha256 = &key.sha256;
    let name = match &key.uploaded_by {
        None => format!("{sha256}-{engine_hash:016x}.cwasm"),
        Some(tenant) => format!("{sha256}-{engine_hash:016x}-{tenant}.cwasm"),
    };
    let file = cache_dir.join(name);
    if file.is_file() {
        match deserialize(engine, &file) {
            Ok(component) => {
                tracing::debug!(file = %file.display(), "compiled component loaded from cache");
                return Ok(Compiled { component, stored: None });
            }
            Err(err) => {
                tracing::warn!(file = %file.display(), error = %format!("{err:#}"), "cached component unusable; recompiling")
            }
        }
    }
    let started = std::time::Instant::now();
    let component = Component::new(engine, wasm)?;
    tracing::info!(sha256, compile_ms = started.elapsed().as_millis() as u64, "component compiled");
    let stored = match store(&component, cache_dir, &file) {
        Ok(()) => Some(file),
        Err(err) => {
            tracing::warn!(file = %file.display(), error = %format!("{err:#}"), "cannot cache the compiled component");
            None
        }
    };
    Ok(Compiled { component, stored })
}

/// Remove every compiled form of the component `sha256` (one per engine configuration it
/// was compiled for): its upload is gone, and what stays would be disk no quota counts.
pub fn forget(cache_dir: &Path, sha256: &str) -> std::io::Result<()> {
    let prefix = format!("{sha256}-");
    for entry in std::fs::read_dir(cache_dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if name.starts_with(&prefix) && name.ends_with(".cwasm") {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

#[allow(unsafe_code)] // deserializing native code: only files this module wrote, checked by wasmtime's header
fn deserialize(engine: &Engine, file: &Path) -> wasmtime::Result<Component> {
    // SAFETY: the file was produced by `Component::serialize` for an engine with the same
    // compatibility hash (it is in the file name), written atomically by `store` into the
    // server's own data directory.
    unsafe { Component::deserialize_file(engine, file) }
}

fn store(component: &Component, cache_dir: &Path, file: &Path) -> wasmtime::Result<()> {
    std::fs::create_dir_all(cache_dir)?;
    let bytes = component.serialize()?;
    let temp = tempfile_in(cache_dir)?;
    let stored = std::fs::write(&temp, bytes).and_then(|()| std::fs::rename(&temp, file));
    if stored.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    Ok(stored?)
}

fn tempfile_in(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    let name = format!(".tmp-{}-{:?}", std::process::id(), std::thread::current().id());
    Ok(dir.join(name.replace(['(', ')'], "")))
}
