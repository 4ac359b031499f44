//! Generates the OIP gRPC code from `proto/` (with a vendored `protoc`, so no system
//! install is needed), and builds what the demo tenants and the end-to-end tests run: the
//! example and test guest components (compiled to wasm32-wasip2 components by a nested
//! cargo), after fetching the Magika model that the magika component embeds a label table
//! of; and fetches ONNX Runtime's library from its pinned wheel, so that `serve` runs on it
//! without any other install step.
//!
//! Outputs land in `target/guests/wasm32-wasip2/release/`, which the demo manifests in
//! `tenants/` reference; `SLUICE_GUEST_DIR` points tests at the same folder.

use std::path::{Path, PathBuf};
use std::process::Command;

const GUESTS: [&str; 8] =
    ["digits", "digits-http", "magika", "cascade", "hostile-guest", "echo-guest", "http-guest", "other-world-guest"];
const TARGET: &str = "wasm32-wasip2";

fn main() {
    // Read when the script runs, not when it is compiled: cargo reuses a compiled build script
    // for an identical checkout elsewhere sharing the target directory.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest_dir).parent().expect("host/ sits in the workspace").to_path_buf();
    compile_proto(&root);
    let scripts = ["scripts/fetch_magika.py", "scripts/fetch_onnxruntime.py", "scripts/pinned_wheel.py"];
    for watched in ["guest-sdk", "wit", "examples", "tests/guests"].into_iter().chain(scripts) {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let target_dir = root.join("target").join("guests");
    // The fuzz targets (`--cfg fuzzing`, a nightly build) need no guests and no model.
    if std::env::var_os("CARGO_CFG_FUZZING").is_none() {
        fetch_magika(&root);
        fetch_onnxruntime(&root);
        ensure_target();
        build_guests(&root, &target_dir);
    }
    println!("cargo:rustc-env=SLUICE_GUEST_DIR={}", target_dir.join(TARGET).join("release").display());
    println!("cargo:rustc-env=SLUICE_REPO_ROOT={}", root.display());
}

fn compile_proto(root: &Path) {
    let proto = root.join("proto/grpc_predict_v2.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("the vendored protoc is available for this platform");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // prost's, counting an inference request's small messages before building them.
        .codec_path("crate::api::grpc_codec::BoundedCodec")
        .compile_with_config(config, &[proto], &[root.join("proto")])
        .expect("compiling proto/grpc_predict_v2.proto");
}

fn fetch_magika(root: &Path) {
    let status = Command::new("python3").arg(root.join("scripts/fetch_magika.py")).status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!(
            "fetching the Magika model failed ({other:?}); it needs python3 with pip and access to PyPI. \
             Run `python3 scripts/fetch_magika.py` to see the error."
        ),
    }
}

/// ONNX Runtime's library into `target/onnxruntime/`, that folder compiled into the server
/// as where to look first. Without it (no network, an architecture with no pinned wheel) the
/// build goes on: the server serves on tract and its log says why.
fn fetch_onnxruntime(root: &Path) {
    let folder = root.join("target/onnxruntime");
    // Fetched again when removed.
    println!("cargo:rerun-if-changed={}", folder.display());
    let status = Command::new("python3").arg(root.join("scripts/fetch_onnxruntime.py")).status();
    if !status.is_ok_and(|s| s.success()) {
        println!(
            "cargo:warning=fetching ONNX Runtime failed (run `python3 scripts/fetch_onnxruntime.py` to see why): \
             `serve` will use tract unless it finds another ONNX Runtime library"
        );
    }
    println!("cargo:rustc-env=SLUICE_BUILT_ONNXRUNTIME={}", folder.display());
}

/// Install the wasm32-wasip2 target where rustup does not do it from rust-toolchain.toml.
fn ensure_target() {
    let installed = Command::new("rustup").args(["target", "list", "--installed"]).output();
    if let Ok(output) = installed
        && !String::from_utf8_lossy(&output.stdout).lines().any(|l| l.trim() == TARGET)
    {
        let _ = Command::new("rustup").args(["target", "add", TARGET]).status();
    }
}

fn build_guests(root: &Path, target_dir: &PathBuf) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut command = Command::new(cargo);
    command.current_dir(root).args(["build", "--release", "--target", TARGET, "--target-dir"]).arg(target_dir);
    for guest in GUESTS {
        command.args(["-p", guest]);
    }
    // The outer build's settings are not the guests' settings.
    for (key, _) in std::env::vars() {
        if key.starts_with("CARGO_") && key != "CARGO_HOME"
            || key.starts_with("RUST") && key != "RUSTUP_HOME" && key != "RUSTUP_TOOLCHAIN"
        {
            command.env_remove(key);
        }
    }
    command.env("CARGO_PROFILE_RELEASE_DEBUG", "false").env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    let status = command.status().expect("running cargo to build the guest components");
    assert!(status.success(), "building the guest components for {TARGET} failed (see the output above)");
}
