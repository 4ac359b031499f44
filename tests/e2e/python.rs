//! Python guests: `examples/digits-py`, written against `guest-sdk/python` and built into a
//! component with componentize-py (pinned; installed into the project's venv by this test),
//! answers as the Rust `digits` component does, and refuses bad input the same way; a hostile
//! Python guest (tests/guests/python) is held to the tenant's memory and deadline like any
//! other, and its failures stay its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::support::*;

const KEY: &str = "test-key-acme";
/// componentize-py's pin, shared with scripts/build_python_guests.sh.
const COMPONENTIZE_PY: &str = include_str!("../../guest-sdk/python/build-requirements.txt");

/// The Python digits example as a component, built once per test run.
fn python_digits() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| componentize("examples/digits-py", "app", "digits_py.wasm"))
}

/// The hostile Python test guest (tests/guests/python), built once per test run.
fn python_hostile() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| componentize("tests/guests/python", "hostile", "hostile_py.wasm"))
}

/// Build the Python module `module` of `folder`, with the Python guest SDK, into
/// target/guests/python/`file`.
fn componentize(folder: &str, module: &str, file: &str) -> PathBuf {
    let python = python_with(&[COMPONENTIZE_PY.trim()]);
    let out = repo_root().join("target/guests/python").join(file);
    std::fs::create_dir_all(out.parent().expect("a folder")).expect("the output folder");
    let status = Command::new(python.with_file_name("componentize-py"))
        .current_dir(repo_root())
        .args(["-d", "wit", "-w", "sluice:tenant/component", "componentize", module])
        .args(["-p", folder, "-p", "guest-sdk/python", "-o"])
        .arg(&out)
        .status()
        .expect("componentize-py runs");
    assert!(status.success(), "componentize-py failed for {folder}: {status}");
    out
}

/// A server whose tenant has the digits model and these apps (each Python component compiles
/// for ~12 s on first load, so each test names only those it needs).
fn start(apps: &[(&str, &Path)]) -> (Tenants, Server) {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "guest_memory_mib = 64\nguest_deadline_ms = 1000");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    for (name, component) in apps {
        manifest += &app_entry(name, component);
    }
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    (tenants, server)
}

/// A request in JSON or in the binary extension (header, bytes).
enum Ask {
    Json(Value),
    Binary(Value, Vec<u8>),
}

impl Ask {
    async fn send(&self, server: &Server, app: &str) -> (u16, Value) {
        match self {
            Ask::Json(body) => server.infer(app, KEY, body).await,
            Ask::Binary(header, bytes) => server.infer_binary(app, KEY, header, bytes).await,
        }
    }
}

/// The outputs of an answer by name, probabilities as f32s.
fn outputs(body: &Value) -> (Vec<i64>, Vec<i64>, Vec<f32>) {
    (
        i64s(&output(body, "label")["data"]),
        i64s(&output(body, "top3_labels")["data"]),
        f32s(&output(body, "top3_probabilities")["data"]),
    )
}

#[tokio::test]
async fn a_python_component_answers_as_the_rust_one_does() {
    let heavy = CPU_HEAVY.read().await;
    let (_tenants, server) = start(&[("digits", &guest("digits")), ("digits-py", python_digits())]);
    drop(heavy);
    let digits = heldout_digits();
    let pixels: Vec<u8> = digits.iter().take(20).flat_map(|(image, _)| image.clone()).collect();
    let one: Vec<u8> = digits[0].0.clone();
    // BYTES: one 64-byte string per image, length-prefixed in the binary extension.
    let strings: Vec<u8> =
        digits.iter().take(3).flat_map(|(image, _)| [&64u32.to_le_bytes()[..], image].concat()).collect();
    let bytes_header = json!({ "inputs": [{ "name": "image", "shape": [3], "datatype": "BYTES",
                                            "parameters": { "binary_data_size": strings.len() } }] });
    let requests = [
        ("20 images [20, 64]", Ask::Json(image_request(&pixels, &[20, 64]))),
        ("one image [8, 8]", Ask::Json(image_request(&one, &[8, 8]))),
        ("3 images as BYTES", Ask::Binary(bytes_header, strings)),
    ];
    for (case, request) in &requests {
        let (code, rust) = request.send(&server, "digits").await;
        assert_eq!(code, 200, "{case}, Rust: {rust}");
        let (code, python) = request.send(&server, "digits-py").await;
        assert_eq!(code, 200, "{case}, Python: {python}");
        let (rust, python) = (outputs(&rust), outputs(&python));
        assert_eq!(python.0, rust.0, "{case}: labels");
        assert_eq!(python.1, rust.1, "{case}: top-3 labels");
        let worst = python.2.iter().zip(&rust.2).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-6, "{case}: top-3 probabilities differ by {worst}");
    }
    let right = outputs(&requests[0].1.send(&server, "digits-py").await.1).0;
    let truth: Vec<i64> = digits.iter().take(20).map(|&(_, label)| label).collect();
    assert!(right.iter().zip(&truth).filter(|(a, b)| a == b).count() >= 19, "{right:?} vs {truth:?}");

    // Bad input is the client's error, named by the component, as from the Rust one.
    for (case, request, expected) in [
        ("63 bytes", image_request(&one[..63], &[63]), "expected a multiple of 64"),
        (
            "FP32 pixels",
            json!({ "inputs": [{ "name": "image", "shape": [64], "datatype": "FP32", "data": vec![0.5; 64] }] }),
            "must be UINT8 or BYTES",
        ),
        (
            "no image",
            json!({ "inputs": [{ "name": "pixels", "shape": [64], "datatype": "UINT8", "data": one }] }),
            "missing input 'image'",
        ),
    ] {
        let (code, body) = server.infer("digits-py", KEY, &request).await;
        assert_eq!(code, 400, "{case}: {body}");
        assert!(error_message(&body).contains(expected), "{case}: expected '{expected}' in {body}");
    }
}

#[tokio::test]
async fn a_python_component_gets_the_same_limits_and_its_failures_stay_its_own() {
    let heavy = CPU_HEAVY.read().await;
    let (_tenants, server) = start(&[("hostile-py", python_hostile()), ("digits", &guest("digits"))]);
    drop(heavy);
    let hostile = |mode: &str| json!({ "inputs": [], "parameters": { "mode": mode } });
    let (code, body) = server.infer("hostile-py", KEY, &hostile("bomb")).await;
    assert_eq!(code, 500, "a list grown past 64 MiB: {body}");
    assert!(error_message(&body).contains("memory limit of 64 MiB"), "{body}");
    let started = std::time::Instant::now();
    let (code, body) = server.infer("hostile-py", KEY, &hostile("loop")).await;
    assert_eq!(code, 504, "a spinning loop: {body}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "cut at the 1 s deadline: {:?}", started.elapsed());
    let (code, body) = server.infer("hostile-py", KEY, &hostile("raise")).await;
    assert_eq!(code, 500, "an exception of its own: {body}");
    assert!(error_message(&body).contains("KeyError"), "{body}");
    // None of it touched the server or the tenant's other app.
    let one = heldout_digits()[0].0.clone();
    let (code, body) = server.infer("digits", KEY, &image_request(&one, &[1, 64])).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = server.infer("hostile-py", KEY, &hostile("")).await;
    assert_eq!(code, 200, "a fresh instance after the failures: {body}");
}
