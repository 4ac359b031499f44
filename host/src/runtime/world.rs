//! Which world an uploaded component targets, read from its top-level import and export
//! names before anything is compiled: compiling a large component takes seconds of CPU, and
//! one that cannot serve must cost no more than reading its headers. Linking
//! (`instantiate_pre`) stays the full check after compiling; this one only refuses early
//! what linking would refuse.

use wasmparser::{Encoding, Parser, Payload};

/// The export every tenant component provides (`sluice:tenant/component`).
const HANDLER: &str = "sluice:tenant/handler";
/// The interface packages the host links for tenant components; an import of any other
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

/// Refuse `wasm` unless it is a component that exports the tenant handler and imports only
/// what the host provides; the message says what it is instead.
pub fn check(wasm: &[u8]) -> Result<(), String> {
    let mut depth = 0usize;
    let mut exports = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(|e| format!("not a WebAssembly component: {e}"))?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != Encoding::Component {
                    return Err("a core WebAssembly module, not a component: build it for wasm32-wasip2 with \
                                sluice-guest"
                        .to_string());
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(imports) if depth == 1 => {
                for import in imports {
                    let name = import.map_err(|e| format!("not a WebAssembly component: {e}"))?.name.name;
                    if !PROVIDED.iter().any(|package| name.starts_with(package)) {
                        return Err(format!(
                            "it imports '{}', which the sluice:tenant/component world does not provide",
                            crate::telemetry::text::cut(name, 128)
                        ));
                    }
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
    if exports.iter().any(|name| name.split('@').next() == Some(HANDLER)) {
        return Ok(());
    }
    let shown: Vec<&str> = exports.iter().take(8).map(|name| crate::telemetry::text::cut(name, 64)).collect();
    Err(format!(
        "it exports {shown:?}, not {HANDLER}: it targets another world than sluice:tenant/component (build it \
         with sluice-guest)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest(name: &str) -> Vec<u8> {
        std::fs::read(std::path::Path::new(env!("SLUICE_GUEST_DIR")).join(format!("{name}.wasm"))).expect("guest")
    }

    #[test]
    fn tenant_components_pass_and_other_worlds_and_modules_do_not() {
        assert_eq!(check(&guest("digits")), Ok(()));
        assert_eq!(check(&guest("hostile_guest")), Ok(()));
        let other = check(&guest("other_world_guest")).expect_err("a wasi:cli/command");
        assert!(other.contains("wasi:cli/run") && other.contains("sluice:tenant/component"), "{other}");
        let module = check(b"\0asm\x01\0\0\0").expect_err("a core module");
        assert!(module.contains("core WebAssembly module"), "{module}");
        assert!(check(b"not wasm").expect_err("garbage").contains("not a WebAssembly component"));
    }
}
