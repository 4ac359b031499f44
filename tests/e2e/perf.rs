//! `sluice perf` against a running server: per-tenant rows, an alternating tenant that sends
//! only in its on periods, and the other tenant reported for the periods without and beside it.

use std::process::Command;

use crate::support::*;

fn perf(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice")).arg("perf").args(args).output().expect("runs sluice perf");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The table row whose tenant cell is `tenant`, as its cells.
fn row(report: &str, tenant: &str) -> Vec<String> {
    report
        .lines()
        .map(|line| line.split('|').map(|cell| cell.trim().to_string()).filter(|c| !c.is_empty()).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(tenant))
        .unwrap_or_else(|| panic!("no row for {tenant} in\n{report}"))
}

#[tokio::test]
async fn an_alternating_tenant_splits_the_others_report_into_periods_without_and_beside_it() {
    let tenants = Tenants::new();
    for id in ["a", "b"] {
        let mut manifest = tenant_header(id, &format!("key-{id}"), "max_concurrent_requests = 64");
        manifest += &model_entry("digits-mlp", &digits_model(), None);
        tenants.write(&format!("{id}.toml"), &manifest);
    }
    let server = Server::start(tenants.path(), &[]);
    let address = server.base.trim_start_matches("http://");
    // 1 s measured in 0.25 s periods: off, on, off, on. A paced at 200/s sends 100 requests.
    let report = perf(&[
        "--address",
        address,
        "--model",
        "digits-mlp",
        "--tenant",
        "a:key-a:200",
        "--tenant",
        "b:key-b:c2",
        "--alternate",
        "a",
        "--alternate-period-s",
        "0.25",
        "--warmup-s",
        "0.3",
        "--duration-s",
        "1",
    ]);
    let a = row(&report, "a");
    let sent: u64 = a[1].parse().expect("a count");
    assert!((98..=102).contains(&sent), "a sends only in its on periods: {report}");
    assert_eq!(a[2], "0", "{report}");
    let throughput: f64 = a[3].parse().expect("a throughput");
    assert!((190.0..=210.0).contains(&throughput), "a's rate over its on time: {report}");
    for tenant in ["b (a off)", "b (a on)"] {
        let b = row(&report, tenant);
        assert!(b[1].parse::<u64>().expect("b count") > 10 && b[2] == "0", "{report}");
        assert!(b[6].ends_with(" ms"), "{report}");
    }

    // Over gRPC, a single tenant at a fixed concurrency.
    let report = perf(&[
        "--address",
        &server.grpc,
        "--grpc",
        "--model",
        "digits-mlp",
        "--key",
        "key-b",
        "--concurrency",
        "2",
        "--warmup-s",
        "0.2",
        "--duration-s",
        "0.5",
    ]);
    let single = row(&report, "-");
    assert!(single[1].parse::<u64>().expect("count") > 10 && single[2] == "0", "{report}");

    let refused = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["perf", "--address", address, "--model", "digits-mlp", "--tenant", "b:key-b:10", "--alternate", "c"])
        .output()
        .expect("runs sluice perf");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("--alternate names no --tenant: c"), "{message}");
}

/// A measurement for BENCHMARKS.md, not a check (`--ignored` runs it): a victim calls
/// `digits-mlp` (with `VICTIM_SIZE` set, a heavy model of its own, `onnx::slow_compute(
/// VICTIM_SIZE, 4)`) 300 times, one at a time and 5 ms apart, alone and then beside a hog tenant
/// whose `HOG_MODELS` (default 8) uploaded heavy models (`onnx::slow_compute(HOG_SIZE, 4 + i)`,
/// `HOG_SIZE` default 384: MatMul chains, each its own copy) two client tasks each keep busy
/// (`HOG_CLIENTS` in all, if set). Prints the victim's p50 and p99 both ways and the hog's
/// requests a second:
/// `HOG_MODELS=16 cargo test --release -p sluice --test e2e -- --ignored --nocapture heavy_models`.
#[tokio::test]
#[ignore = "a measurement: run with --ignored"]
async fn heavy_models_of_one_tenant_beside_anothers_light_one() {
    use std::sync::Arc;

    let setting = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (models, size, victim_size) = (setting("HOG_MODELS", 8), setting("HOG_SIZE", 384), setting("VICTIM_SIZE", 0));
    let clients = setting("HOG_CLIENTS", 2 * models);
    let tenants = Tenants::new();
    let victim = tenant_header("victim", "key-victim", "") + &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("victim.toml", &victim);
    tenants.write("hog.toml", &tenant_header("hog", "key-hog", "guest_deadline_ms = 60000"));
    let server = Arc::new(Server::start(tenants.path(), &[]));
    let (victim_model, row) = match victim_size {
        0 => {
            let row = serde_json::json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }] });
            ("digits-mlp", row)
        }
        size => {
            let weights = crate::onnx::slow_compute(size as i64, 4);
            let (status, body) =
                server.send(reqwest::Method::PUT, "/control/v1/models/own", "key-victim", weights).await;
            assert_eq!(status, 201, "{body}");
            (
                "own",
                serde_json::json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.001] }] }),
            )
        }
    };
    for i in 0..models {
        let weights = crate::onnx::slow_compute(size as i64, 4 + i);
        let (status, body) =
            server.send(reqwest::Method::PUT, &format!("/control/v1/models/hog-{i}"), "key-hog", weights).await;
        assert_eq!(status, 201, "{body}");
    }
    let victim_run = || victim_calls(&server, (victim_model, "key-victim"), &row, 300);
    let alone = victim_run().await;
    let body = serde_json::json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.001] }] });
    let (beside, rate) = beside_the_hog(&server, (models, clients), &body, victim_run()).await;
    println!(
        "| {models} ({size}) | {:.2} / {:.2} ms | {:.2} / {:.2} ms | {rate:.0} |",
        alone.0, alone.1, beside.0, beside.1
    );
}

/// `victim` run while the hog tenant's `clients` call its `hog-0` .. `hog-{models - 1}` with
/// `body` in closed loops (from 2 s before): what `victim` gave, and the hog's requests
/// answered a second meanwhile.
async fn beside_the_hog<T>(
    server: &std::sync::Arc<Server>,
    (models, clients): (usize, usize),
    body: &serde_json::Value,
    victim: impl Future<Output = T>,
) -> (T, f64) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let (stop, served) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let hogs: Vec<_> = (0..clients)
        .map(|client| {
            let (server, stop, served, body) = (server.clone(), stop.clone(), served.clone(), body.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if server.infer(&format!("hog-{}", client % models), "key-hog", &body).await.0 == 200 {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (before, started) = (served.load(Ordering::Relaxed), std::time::Instant::now());
    let beside = victim.await;
    let rate = (served.load(Ordering::Relaxed) - before) as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for hog in hogs {
        hog.await.expect("a hog client");
    }
    (beside, rate)
}

/// `calls` calls of `model` with `key`, one at a time and 5 ms apart: their p50 and p99 (ms).
async fn victim_calls(
    server: &Server,
    (model, key): (&str, &str),
    body: &serde_json::Value,
    calls: usize,
) -> (f64, f64) {
    let mut times = Vec::new();
    for _ in 0..calls {
        let started = std::time::Instant::now();
        let (code, answer) = server.infer(model, key, body).await;
        assert_eq!(code, 200, "{answer}");
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    times.sort_by(f64::total_cmp);
    (times[calls / 2], times[calls * 99 / 100])
}

/// A measurement for BENCHMARKS.md, not a check (`--ignored` runs it): on the software WebGPU
/// adapter, which runs one run at a time, a victim calls its own model (`onnx::slow_compute(64,
/// 4)`) 300 times, one at a time and 5 ms apart, alone and then beside a hog tenant whose
/// `HOG_MODELS` (default 3) models there (`slow_compute(64, 5 + i)`) two client tasks each keep
/// busy. Prints the victim's p50 and p99 both ways, the hog's requests a second, and the
/// time one run of the victim's model takes alone:
/// `cargo test --release -p sluice --test e2e -- --ignored --nocapture webgpu_turns`.
#[tokio::test]
#[ignore = "a measurement: run with --ignored"]
async fn webgpu_turns_of_one_tenants_models_beside_anothers() {
    use std::sync::Arc;

    let models = std::env::var("HOG_MODELS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let (flags, env) = software_webgpu();
    let tenants = Tenants::new();
    let on_webgpu = |name: &str, steps: usize| {
        let path = tenants.path().join(format!("{name}.onnx"));
        std::fs::write(&path, crate::onnx::slow_compute(64, steps)).expect("a model file");
        model_entry(name, &path, Some("onnxruntime"))
            + &format!("on_missing_device = \"refuse\"\n[[models.{name}.instances]]\nkind = \"webgpu\"\n\n")
    };
    let mut hog = tenant_header("hog", "key-hog", "guest_deadline_ms = 60000");
    for i in 0..models {
        hog += &on_webgpu(&format!("hog-{i}"), 5 + i);
    }
    tenants.write("hog.toml", &hog);
    tenants.write("victim.toml", &(tenant_header("victim", "key-victim", "") + &on_webgpu("own", 4)));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = Arc::new(Server::start_with_env(tenants.path(), &args, &env));
    let body = serde_json::json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.001] }] });

    let alone = victim_calls(&server, ("own", "key-victim"), &body, 300).await;
    let run_ms = 1000.0 * server.metric("sluice_compute_seconds_sum{backend=\"onnxruntime\",model=\"own\"}").await
        / server.metric("sluice_compute_seconds_count{backend=\"onnxruntime\",model=\"own\"}").await;
    let victim = victim_calls(&server, ("own", "key-victim"), &body, 300);
    let (beside, rate) = beside_the_hog(&server, (models, 2 * models), &body, victim).await;
    println!(
        "| {models} | {run_ms:.2} ms | {:.2} / {:.2} ms | {:.2} / {:.2} ms | {rate:.0} |",
        alone.0, alone.1, beside.0, beside.1
    );
}

/// A measurement for BENCHMARKS.md, not a check (`--ignored` runs it): what a tenant's model
/// loses by computing nothing from its constants at load (`backend::Author`). The same weights
/// (magika, the digits MLP) as an operator's manifest model and as a tenant's upload, on one
/// server: each called `CALLS` times (default 300) with `ROWS` rows (default 8), one at a time,
/// alternately; prints the mean engine time a run of each (`sluice_compute_seconds`):
/// `cargo test --release -p sluice --test e2e -- --ignored --nocapture uploads_compute`.
#[tokio::test]
#[ignore = "a measurement: run with --ignored"]
async fn uploads_compute_as_the_operators_models_do() {
    let setting = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (calls, rows) = (setting("CALLS", 300), setting("ROWS", 8));
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", "key-acme", "guest_deadline_ms = 60000");
    manifest += &model_entry("magika", &magika_model(), Some("onnxruntime"));
    manifest += &model_entry("digits", &digits_model(), Some("onnxruntime"));
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    for (name, path) in [("magika", magika_model()), ("digits", digits_model())] {
        // Its own digest (a `doc_string`, ModelProto field 6), so its own copy: identical
        // weights would share the manifest's.
        let weights = [std::fs::read(path).expect("weights"), vec![0x32, 1, b'u']].concat();
        let (code, body) =
            server.send(reqwest::Method::PUT, &format!("/control/v1/models/{name}-up"), "key-acme", weights).await;
        assert_eq!(code, 201, "{body}");
    }
    let magika = serde_json::json!({ "inputs": [{ "name": "bytes", "shape": [rows, 2048], "datatype": "INT32",
        "data": (0..rows * 2048).map(|i| (i * 7 % 256) as i32).collect::<Vec<_>>() }] });
    let digits = serde_json::json!({ "inputs": [{ "name": "X", "shape": [rows, 64], "datatype": "FP32",
        "data": vec![0.5f32; rows * 64] }] });
    for (model, body) in [("magika", &magika), ("digits", &digits)] {
        for _ in 0..calls {
            for name in [model.to_string(), format!("{model}-up")] {
                let (code, answer) = server.infer(&name, "key-acme", body).await;
                assert_eq!(code, 200, "{answer}");
            }
        }
        let mean_us = |name: &str| {
            let labels = format!("{{backend=\"onnxruntime\",model=\"{name}\"}}");
            let server = &server;
            async move {
                let sum = server.metric(&format!("sluice_compute_seconds_sum{labels}")).await;
                1e6 * sum / server.metric(&format!("sluice_compute_seconds_count{labels}")).await
            }
        };
        let (operators, tenants) = (mean_us(model).await, mean_us(&format!("{model}-up")).await);
        println!("| {model}, {rows} rows | {operators:.1} µs | {tenants:.1} µs | {:.2} |", tenants / operators);
    }
}
