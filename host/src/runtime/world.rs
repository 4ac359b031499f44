//! Which world an uploaded component targets, read from its top-level import and export
//! names before anything is compiled: compiling a large component takes seconds of CPU, and
//! one that cannot serve must cost no more than reading its headers. Linking
//! (`instantiate_pre`) stays the full check after compiling; this one only refuses early
//! what linking would refuse.

use std::fmt;

use wasmparser::{Encoding, Parser, Payload};

/// The worlds a tenant component may target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// `sluice:tenant/component`: called with Open Inference Protocol requests (the default).
    Oip,
    /// `wasi:http/proxy`, importing `wasi:nn` too: an HTTP app, as written for `wasmtime serve`.
    Http,
}

impl World {
    /// The world's name as WIT spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Oip => "sluice:tenant/component",
            Self::Http => "wasi:http/proxy",
        }
    }
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The export of each world, without its version.
const OIP_HANDLER: &str = "sluice:tenant/handler";
const HTTP_HANDLER: &str = "wasi:http/incoming-handler";
/// What an HTTP app imports beyond what every tenant component may.
const HTTP_ONLY: &str = "wasi:http/";
/// The interface packages the host links for every tenant component; an import of any other
/// cannot be satisfied.
const PROVIDED: [&str; 8] = [
    "sluice:tenant/",
    "wasi:nn/",
    "wasi:cli/",
    "wasi:io/",
    "wasi:clocks/",
    "wasi:random/",
    "wasi:filesystem/",
    "wasi:sockets/",
];

/// Which world `wasm` targets; refused unless it is a component that exports one of the
/// worlds' handlers and imports only what the host provides for that world. The message says
/// what it is instead, naming the worlds accepted.
pub fn check(wasm: &[u8]) -> Result<World, String> {
    let mut depth = 0usize;
    let mut exports = Vec::new();
    let mut imports = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(|e| format!("not a WebAssembly component: {e}"))?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != Encoding::Component {
                    return Err(format!(
                        "a core WebAssembly module, not a component: build it for wasm32-wasip2 ({})",
                        accepted()
                    ));
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(section) if depth == 1 => {
                for import in section {
                    imports.push(import.map_err(|e| format!("not a WebAssembly component: {e}"))?.name.name);
                }
            }
            Payload::ComponentExportSection(section) if depth == 1 => {
                for export in section {
                    exports.push(export.map_err(|e| format!("not a WebAssembly component: {e}"))?.name.name);
                }
            }
            _ => {}
        }
    }
    let exports_handler = |handler: &str| exports.iter().any(|name| name.split('@').next() == Some(handler));
    let world = if exports_handler(OIP_HANDLER) {
        World::Oip
    } else if exports_handler(HTTP_HANDLER) {
        World::Http
    } else {
        let shown: Vec<&str> = exports.iter().take(8).map(|name| crate::telemetry::text::cut(name, 64)).collect();
        return Err(format!(
            "it exports {shown:?}, neither {OIP_HANDLER} nor {HTTP_HANDLER}: it targets another world ({})",
            accepted()
        ));
    };
    let provided = |name: &str| {
        PROVIDED.iter().any(|package| name.starts_with(package)) || world == World::Http && name.starts_with(HTTP_ONLY)
    };
    if let Some(name) = imports.iter().find(|name| !provided(name)) {
        return Err(format!(
            "it imports '{}', which the {world} world does not provide here ({})",
            crate::telemetry::text::cut(name, 128),
            accepted()
        ));
    }
    Ok(world)
}

/// The most linear memory any one of the component's core modules defines at its start, in
/// bytes (each memory is held to the tenant's guest memory on its own, its start included).
/// Read from the headers: a component whose start exceeds the tenant's memory would be
/// accepted, then fail every request. Unreadable sections count as nothing ([`check`] refuses
/// them).
pub fn initial_memory_bytes(wasm: &[u8]) -> u64 {
    let mut largest = 0u64;
    for payload in Parser::new(0).parse_all(wasm) {
        let Ok(Payload::MemorySection(memories)) = payload else { continue };
        for memory in memories.into_iter().flatten() {
            let page_bytes = 1u64.checked_shl(memory.page_size_log2.unwrap_or(16)).unwrap_or(u64::MAX);
            largest = largest.max(memory.initial.saturating_mul(page_bytes));
        }
    }
    largest
}

/// The worlds accepted, for messages.
fn accepted() -> String {
    format!(
        "Sluice serves components of the {} world (built with sluice-guest or componentize-py) and of the {} world \
         importing wasi:nn (HTTP apps)",
        World::Oip,
        World::Http
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest(name: &str) -> Vec<u8> {
        std::fs::read(std::path::Path::new(env!("SLUICE_GUEST_DIR")).join(format!("{name}.wasm"))).expect("guest")
    }

    #[test]
    fn tenant_components_pass_and_other_worlds_and_modules_do_not() {
        assert_eq!(check(&guest("digits")), Ok(World::Oip));
        assert_eq!(check(&guest("hostile_guest")), Ok(World::Oip));
        assert_eq!(check(&guest("digits_http")), Ok(World::Http));
        assert_eq!(check(&guest("http_guest")), Ok(World::Http));
        let other = check(&guest("other_world_guest")).expect_err("a wasi:cli/command");
        assert!(
            other.contains("wasi:cli/run")
                && other.contains("sluice:tenant/component")
                && other.contains("wasi:http/proxy"),
            "{other}"
        );
        // Rust's guests start with a megabyte or two (their stack and data).
        let echo = initial_memory_bytes(&guest("echo_guest"));
        assert!((1 << 20..4 << 20).contains(&echo), "{echo}");
        let module = check(b"\0asm\x01\0\0\0").expect_err("a core module");
        assert!(module.contains("core WebAssembly module"), "{module}");
        assert!(check(b"not wasm").expect_err("garbage").contains("not a WebAssembly component"));
    }
}
