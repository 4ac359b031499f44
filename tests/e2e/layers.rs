//! The host's layering (scripts/check-layers): no import cycle between files, no import
//! from a lower layer to a higher one.

use std::path::Path;
use std::process::Command;

#[test]
fn host_modules_import_only_downward_and_without_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = if root.join("scripts").exists() { root } else { root.parent().expect("workspace root") };
    let output = Command::new("python3")
        .arg(root.join("scripts/check-layers"))
        .arg(root.join("host/src"))
        .output()
        .expect("python3 runs scripts/check-layers");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{report}{}", String::from_utf8_lossy(&output.stderr));
    assert!(report.contains(" 0 problems"), "{report}");
}
