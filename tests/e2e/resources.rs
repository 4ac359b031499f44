//! Host resources a tenant's request makes the server spend are bounded and charged to it:
//! what a guest makes the host hold through wasi-nn, what a JSON body costs to parse, what a
//! model allocates and computes, how large an answer may be, how much a guest may log.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::onnx;
use crate::support::*;

const VICTIM: &str = "test-key-victim";
const EVIL: &str = "test-key-evil";

fn tenants(evil_quotas: &str) -> Tenants {
    let tenants = Tenants::new();
    let mut victim = tenant_header("victim", VICTIM, "");
    victim += &model_entry("digits-mlp", &digits_model(), None);
    victim += &app_entry("digits", &guest("digits"));
    tenants.write("victim.toml", &victim);
    let mut evil = tenant_header("evil", EVIL, evil_quotas);
    evil += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("evil.toml", &evil);
    tenants
}

fn mode(name: &str, parameters: serde_json::Value) -> serde_json::Value {
    let mut parameters = parameters;
    parameters["mode"] = json!(name);
    json!({ "inputs": [], "parameters": parameters })
}

async fn victim_served(server: &Server) {
    let (pixels, label) = &heldout_digits()[3];
    let (status, body) = server.infer("digits", VICTIM, &image_request(pixels, &[1, 64])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(i64s(&output(&body, "label")["data"]), vec![*label]);
}

#[tokio::test]
async fn a_guest_cannot_flood_or_forge_the_server_log() {
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &[]);
    let before = server.log().len();
    // 20,000 lines of 1,000 bytes asked for: 20 MB.
    let (status, body) =
        server.infer("hostile", EVIL, &mode("log-flood", json!({ "lines": "20000", "bytes": "1000" }))).await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = server.log();
    let written = log.len() - before;
    assert!(written < 200_000, "one request wrote {written} bytes of log");
    assert!(log.contains("guest log lines dropped"), "the drop is reported once");
    for line in log.lines() {
        assert!(!line.contains("admin token accepted") || line.contains("tenant"), "a forged line: {line}");
        assert!(!line.starts_with("2026-12-01T00:00:00"), "a guest began a log line: {line}");
    }
    // Many requests each within its own budget are held to the tenant's rate (256 KiB/s).
    let before = server.log().len();
    let started = Instant::now();
    for _ in 0..8 {
        let request = mode("log-flood", json!({ "lines": "60", "bytes": "1000" }));
        assert_eq!(server.infer("hostile", EVIL, &request).await.0, 200);
    }
    let seconds = started.elapsed().as_secs_f64();
    let written = server.log().len() - before;
    let allowed = (256.0 * 1024.0 * (1.0 + seconds)) as usize + 64_000;
    assert!(written < allowed, "{written} bytes of log in {seconds:.2} s (allowed about {allowed})");

    // A long guest error is cut, in the answer and in the log.
    let (status, body) = server.infer("hostile", EVIL, &mode("long-error", json!({ "bytes": "1000000" }))).await;
    assert_eq!(status, 500, "{body}");
    let message = error_message(&body);
    assert!(message.len() < 2048 && message.contains("more bytes cut"), "{} bytes", message.len());
    assert!(server.log().lines().all(|line| line.len() < 8192), "no huge log line");
    victim_served(&server).await;
}

#[tokio::test]
async fn an_answer_over_the_response_limit_is_refused_before_it_is_encoded() {
    let tenants = tenants("guest_memory_mib = 160\nmax_response_bytes = 4000000");
    let server = Server::start(tenants.path(), &[]);
    let started = Instant::now();
    let (status, body) = server.infer("hostile", EVIL, &mode("big-output", json!({ "mib": "40" }))).await;
    assert_eq!(status, 500, "{}", &body.to_string()[..body.to_string().len().min(300)]);
    assert!(error_message(&body).contains("max_response_bytes"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(2), "refused in {:?}", started.elapsed());
    let (status, body) = server.infer("hostile", EVIL, &mode("big-output", json!({ "mib": "1" }))).await;
    assert_eq!(status, 200, "within the limit: {}", &body.to_string()[..200]);
    victim_served(&server).await;
}

#[tokio::test]
async fn a_model_that_allocates_per_call_returns_its_memory_and_its_answer_is_bounded() {
    let tenants = tenants("max_model_bytes = 1000000");
    let server = Server::start(tenants.path(), &[]);
    let (code, body) =
        server.send(Method::PUT, "/control/v1/models/huge", EVIL, onnx::output_of_requested_size()).await;
    assert_eq!(code, 201, "{body}");
    let small = json!({ "inputs": [{ "name": "n", "shape": [1], "datatype": "INT64", "data": [4] }] });
    let (code, body) = server.infer("huge", EVIL, &small).await;
    assert_eq!((code, &output(&body, "big")["data"]), (200, &json!([1.0, 1.0, 1.0, 1.0])), "{body}");
    let before = server.rss_bytes();
    // 50 million floats: 200 MB made by the engine on each call.
    let huge = json!({ "inputs": [{ "name": "n", "shape": [1], "datatype": "INT64", "data": [50_000_000] }] });
    for _ in 0..3 {
        // Refused before the outputs leave the engine: no copy of them (it was 382 MiB at the
        // peak with the copy).
        let ((code, body), peak) = server.peak_growth(server.infer("huge", EVIL, &huge)).await;
        assert_eq!(code, 500, "{}", &body.to_string()[..body.to_string().len().min(300)]);
        assert!(error_message(&body).contains("max_response_bytes"), "{body}");
        assert!(peak < 280 << 20, "the server's memory grew by {} MiB for a 191 MiB output", peak >> 20);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let grown = server.rss_bytes().saturating_sub(before);
    assert!(grown < 150 << 20, "the server kept {} MiB after the calls", grown >> 20);
    victim_served(&server).await;
}

#[tokio::test]
async fn a_run_that_would_take_more_memory_than_runs_may_hold_fails_alone() {
    let tenants = tenants("max_model_bytes = 1000000");
    let server = Server::start(tenants.path(), &["--run-memory", "512MiB"]);
    let (code, body) =
        server.send(Method::PUT, "/control/v1/models/huge", EVIL, onnx::output_of_requested_size()).await;
    assert_eq!(code, 201, "{body}");
    victim_served(&server).await;
    // 400 million floats: 1.6 GB asked of the engine by a 100-byte model, past the 512 MiB
    // (unbounded, the engine's output and its copy took 3.2 GB).
    let huge = json!({ "inputs": [{ "name": "n", "shape": [1], "datatype": "INT64", "data": [400_000_000] }] });
    let ((code, body), grown) = server.peak_growth(server.infer("huge", EVIL, &huge)).await;
    assert_eq!(code, 500, "{body}");
    let message = error_message(&body);
    assert!(message.contains("asked for 1526 MiB at once during its run"), "{message}");
    assert!(message.contains("more than all model runs on this server may hold (512 MiB); ask for less"), "{message}");
    assert!(!message.contains(".cc"), "the engine's source files are not named: {message}");
    assert!(grown < 100 << 20, "the server's memory grew by {} MiB for one run", grown >> 20);
    let small = json!({ "inputs": [{ "name": "n", "shape": [1], "datatype": "INT64", "data": [4] }] });
    let (code, body) = server.infer("huge", EVIL, &small).await;
    assert_eq!((code, &output(&body, "big")["data"]), (200, &json!([1.0, 1.0, 1.0, 1.0])), "{body}");
    victim_served(&server).await;
}

#[tokio::test]
async fn a_run_holding_most_of_the_run_memory_leaves_small_runs_served_and_asks_large_ones_to_retry() {
    let tenants = tenants("max_model_bytes = 1000000\nguest_deadline_ms = 30000");
    let server = Server::start(tenants.path(), &["--run-memory", "512MiB"]);
    let upload = |name: &'static str, key: &'static str, model: Vec<u8>| {
        let server = &server;
        async move {
            let (code, body) = server.send(Method::PUT, &format!("/control/v1/models/{name}"), key, model).await;
            assert_eq!(code, 201, "{body}");
        }
    };
    upload("hold", EVIL, onnx::holds_ones_while_computing(512, 300)).await;
    upload("ones", VICTIM, onnx::sum_of_ones()).await;
    // 200 MB at once: the victim's run fits alone.
    let ones = json!({ "inputs": [{ "name": "n", "shape": [1], "datatype": "INT64", "data": [50_000_000] }] });
    let sum_is_about = |body: &serde_json::Value, n: f64| {
        let total = output(body, "total")["data"][0].as_f64().expect("a sum");
        assert!((total - n).abs() < n / 100.0, "{total} for {n} ones");
    };
    let (code, body) = server.infer("ones", VICTIM, &ones).await;
    assert_eq!(code, 200, "{body}");
    sum_is_about(&body, 5e7);

    // The other tenant's run holds 400 MB of the 512 MiB for seconds.
    let before = server.rss_bytes();
    let held = json!({ "inputs": [
        { "name": "n", "shape": [1], "datatype": "INT64", "data": [100_000_000] },
        { "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0] },
    ] });
    let holding = server.infer("hold", EVIL, &held);
    let meanwhile = async {
        let started = Instant::now();
        while server.rss_bytes().saturating_sub(before) < 350 << 20 {
            assert!(started.elapsed() < Duration::from_secs(20), "the other run never held its memory");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        victim_served(&server).await;
        let refused = server.infer("ones", VICTIM, &ones).await;
        let still_running = server.rss_bytes().saturating_sub(before) >= 350 << 20;
        (refused, still_running)
    };
    let ((code, body), ((refused, message), still_running)) = tokio::join!(holding, meanwhile);
    assert_eq!(code, 200, "{body}");
    sum_is_about(&body, 1e8);
    assert!(still_running, "the other run ended before the victim's large run was tried");
    assert_eq!(refused, 503, "{message}");
    let message = error_message(&message);
    assert!(message.contains("asked for 191 MiB at once") && message.ends_with("retry later"), "{message}");
    // Once that run ends, the same request fits again.
    let (code, body) = server.infer("ones", VICTIM, &ones).await;
    assert_eq!(code, 200, "{body}");
    sum_is_about(&body, 5e7);
}

#[tokio::test]
async fn a_model_that_computes_past_every_deadline_is_stopped() {
    let tenants = tenants("max_model_bytes = 1000000\nguest_deadline_ms = 800");
    let server = Server::start(tenants.path(), &[]);
    // About a hundred 1024² matrix products: many seconds on one thread.
    let (code, body) = server.send(Method::PUT, "/control/v1/models/slow", EVIL, onnx::slow_compute(1024, 100)).await;
    assert_eq!(code, 201, "{body}");
    let request = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0] }] });
    let started = Instant::now();
    let (code, body) = server.infer("slow", EVIL, &request).await;
    assert_eq!(code, 504, "{body}");
    assert!(started.elapsed() < Duration::from_millis(1500), "answered after {:?}", started.elapsed());
    // Once the caller has its answer the run is stopped: the server is idle again.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let cpu = server.cpu_time();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spent = server.cpu_time().saturating_sub(cpu);
    assert!(spent < Duration::from_millis(500), "the server computed for {spent:?} after the caller got 504");
    victim_served(&server).await;
}

#[tokio::test]
async fn a_graph_that_computes_from_its_constants_does_it_when_it_runs_under_a_deadline_not_at_its_upload() {
    let tenants = tenants("max_model_bytes = 1000000\nguest_deadline_ms = 800");
    let server = Server::start(tenants.path(), &[]);
    // A 2048² matrix of ones multiplied by itself 200 times: 3.4 TFLOP from 5 KB of graph, all
    // of it from constants. ONNX Runtime's constant folding did it as the upload loaded: the
    // server's CPU for tens of seconds, outside any deadline or share, the upload answered only
    // after.
    let (cpu, started) = (server.cpu_time(), Instant::now());
    let model = onnx::computes_from_constants(2048, 200);
    let (code, body) = server.send(Method::PUT, "/control/v1/models/folds", EVIL, model).await;
    assert_eq!(code, 201, "{body}");
    let spent = server.cpu_time().saturating_sub(cpu);
    assert!(spent < Duration::from_secs(2), "the upload took {spent:?} of CPU, {:?} in all", started.elapsed());
    // Its runs do the work, under their callers' deadlines: stopped there.
    let request = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0] }] });
    let started = Instant::now();
    let (code, body) = server.infer("folds", EVIL, &request).await;
    assert_eq!(code, 504, "{body}");
    assert!(started.elapsed() < Duration::from_millis(1500), "answered after {:?}", started.elapsed());
    victim_served(&server).await;
}

#[tokio::test]
async fn a_guests_raw_load_of_a_graph_computes_nothing_from_its_constants() {
    let tenants = tenants("allow_raw_model_load = true\nguest_deadline_ms = 60000");
    let server = Server::start(tenants.path(), &[]);
    // The graph above, loaded from the guest's bytes: folded, the load held a blocking thread
    // and a core for tens of seconds while the guest waited (without its turn).
    let graph = onnx::computes_from_constants(2048, 200);
    let request = load_bytes_request(&graph);
    let (cpu, started) = (server.cpu_time(), Instant::now());
    let (status, body) = server.infer("hostile", EVIL, &request).await;
    assert_eq!(status, 200, "{body}");
    let spent = server.cpu_time().saturating_sub(cpu);
    assert!(spent < Duration::from_secs(2), "the load took {spent:?} of CPU, {:?} in all", started.elapsed());
    victim_served(&server).await;
}

#[tokio::test]
async fn a_sparse_tensor_counts_at_its_dense_size_before_any_engine_sees_it() {
    let tenants = tenants("allow_raw_model_load = true");
    let server = Server::start(tenants.path(), &[]);
    // 206 bytes naming 2^28 floats (1 GiB) of which one is set: ONNX Runtime makes them dense as
    // it loads. The upload grew the server by 3 GiB over 7 s before the model's measured memory
    // passed the tenant's resident quota (1024 MiB); at 2^30 floats, by some 12 GiB.
    let model = onnx::sparse_of_dense_len(1 << 28);
    let started = Instant::now();
    let ((code, body), grown) =
        server.peak_growth(server.send(Method::PUT, "/control/v1/models/sparse", EVIL, model.clone())).await;
    assert_eq!(code, 413, "{body}");
    assert!(error_message(&body).contains("max_resident_model_mib"), "{body}");
    assert!(grown < 100 << 20, "the server grew by {} MiB in {:?}", grown >> 20, started.elapsed());
    // Through a guest's raw load, the same against its raw graph limit (32 MiB).
    let request = load_bytes_request(&model);
    let ((status, body), grown) = server.peak_growth(server.infer("hostile", EVIL, &request)).await;
    assert_eq!(status, 500, "{body}");
    assert!(error_message(&body).contains("once its sparse tensors are dense"), "{body}");
    assert!(grown < 100 << 20, "the server grew by {} MiB", grown >> 20);
    // Small enough once dense, it loads and answers.
    let (code, body) =
        server.send(Method::PUT, "/control/v1/models/small", EVIL, onnx::sparse_of_dense_len(1000)).await;
    assert_eq!(code, 201, "{body}");
    let request = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5] }] });
    let (code, body) = server.infer("small", EVIL, &request).await;
    assert_eq!((code, &output(&body, "sum")["data"]), (200, &json!([1.5])), "{body}");
    victim_served(&server).await;
}

#[tokio::test]
async fn nested_functions_count_as_the_nodes_they_expand_to() {
    let tenants = tenants("guest_deadline_ms = 60000");
    let server = Server::start(tenants.path(), &[]);
    let upload = |name: &'static str, model: Vec<u8>| {
        let server = &server;
        async move {
            let (cpu, started) = (server.cpu_time(), Instant::now());
            let (code, body) = server.send(Method::PUT, &format!("/control/v1/models/{name}"), EVIL, model).await;
            (code, body, server.cpu_time().saturating_sub(cpu), started.elapsed())
        }
    };
    // 1,256 bytes: a function calling another twice, sixteen deep, 65,535 calls that ONNX
    // Runtime inlined one by one as it loaded (80 s of CPU).
    let (code, body, cpu, took) = upload("nested", onnx::nested_functions(16)).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("local functions expand to 65535 calls"), "{body}");
    assert!(cpu < Duration::from_secs(1), "refusing it took {cpu:?} of CPU, {took:?} in all");
    // Twelve deep (4,095 calls) loads, and answers.
    let (code, body, cpu, took) = upload("twelve", onnx::nested_functions(12)).await;
    assert_eq!(code, 201, "{body}");
    assert!(cpu < Duration::from_secs(3), "loading it took {cpu:?} of CPU, {took:?} in all");
    let request = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0] }] });
    let (code, body) = server.infer("twelve", EVIL, &request).await;
    assert_eq!((code, &output(&body, "sum")["data"]), (200, &json!([0.0])), "{body}");
    // 16,384 nodes in a chain (660 KB): ONNX Runtime's common subexpression elimination took
    // 13.5 s of CPU over them as the upload loaded.
    let (code, body, cpu, took) = upload("chain", onnx::add_chain(16_384)).await;
    assert_eq!(code, 201, "{body}");
    assert!(cpu < Duration::from_secs(3), "loading it took {cpu:?} of CPU, {took:?} in all");
    victim_served(&server).await;
}

#[tokio::test]
async fn a_tenants_model_holds_at_most_16384_constants() {
    let tenants = tenants("guest_deadline_ms = 60000");
    let server = Server::start(tenants.path(), &[]);
    let upload = |name: &'static str, model: Vec<u8>| {
        let server = &server;
        async move {
            let (cpu, started) = (server.cpu_time(), Instant::now());
            let (code, body) = server.send(Method::PUT, &format!("/control/v1/models/{name}"), EVIL, model).await;
            (code, body, server.cpu_time().saturating_sub(cpu), started.elapsed())
        }
    };
    // ONNX Runtime loads initializers and `Constant` nodes in time quadratic in their number,
    // used or not: 65,536 one-float initializers (1.3 MB) took 10.5 s of CPU on the build
    // before, as did 65,536 constants (4.5 MB); a 256 MiB upload holds millions.
    for (name, model) in
        [("initializers", onnx::many_initializers(65_536)), ("constants", onnx::many_constants(65_536))]
    {
        let (code, body, cpu, took) = upload(name, model).await;
        assert_eq!(code, 400, "{name}: {body}");
        let message = error_message(&body);
        assert!(message.contains("holds 65536 initializers and constants"), "{message}");
        assert!(message.contains("more than the 16384 a tenant's model may"), "{message}");
        assert!(cpu < Duration::from_secs(1), "{name}: refusing it took {cpu:?} of CPU, {took:?} in all");
    }
    // 16,384 load (0.34 s of CPU measured) and answer.
    let (code, body, cpu, took) = upload("fewer", onnx::many_initializers(16_384)).await;
    assert_eq!(code, 201, "{body}");
    assert!(cpu < Duration::from_secs(3), "loading it took {cpu:?} of CPU, {took:?} in all");
    let request = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5] }] });
    let (code, body) = server.infer("fewer", EVIL, &request).await;
    assert_eq!((code, &output(&body, "sum")["data"]), (200, &json!([0.5])), "{body}");
    victim_served(&server).await;
}

#[tokio::test]
async fn a_graphs_inputs_outputs_and_attributes_count_before_it_loads() {
    let tenants = tenants("guest_deadline_ms = 60000");
    let server = Server::start(tenants.path(), &[]);
    // 50,000 graph outputs (each an `Identity` of the input), or as many inputs no node reads:
    // loading them takes time quadratic in their number, in ONNX Runtime and in `ort`'s session.
    for (what, model) in [("outputs", onnx::many_graph_outputs(50_000)), ("inputs", onnx::many_graph_inputs(50_000))] {
        let (cpu, started) = (server.cpu_time(), Instant::now());
        let (code, body) = server.send(Method::PUT, &format!("/control/v1/models/{what}"), EVIL, model).await;
        assert_eq!(code, 400, "{body}");
        let expected = format!("graphs have 50001 {what}, more than the 4096");
        assert!(error_message(&body).contains(&expected), "{body}");
        let spent = server.cpu_time().saturating_sub(cpu);
        assert!(
            spent < Duration::from_secs(1),
            "refusing {what} took {spent:?} of CPU, {:?} in all",
            started.elapsed()
        );
    }
    // 1.2 million attributes on one node (19 MB): ONNX Runtime holds ~1 KiB for each as it
    // reads them, past the tenant's 1 GiB of resident model memory before its footprint was
    // measured; and 8 million empty ones (16 MB), which the server's own reading of the model
    // grew to 3.9 GiB of structs before it counted them. Now each counts before the load, and
    // reading them costs no memory.
    for (count, empty) in [(1_200_000, false), (8_000_000, true)] {
        let path = format!("/control/v1/models/attributes-{count}");
        let upload = server.send(Method::PUT, &path, EVIL, onnx::many_attributes(count, empty));
        let ((code, body), grown) = server.peak_growth(upload).await;
        assert_eq!(code, 413, "{body}");
        assert!(error_message(&body).contains("max_resident_model_mib"), "{body}");
        assert!(grown < 200 << 20, "{count} attributes grew the server by {} MiB", grown >> 20);
    }
    // A model of 4,096 inputs loads, and answers a request that gives them in any order.
    let (code, body) = server.send(Method::PUT, "/control/v1/models/fewer", EVIL, onnx::many_graph_inputs(4095)).await;
    assert_eq!(code, 201, "{body}");
    let mut inputs: Vec<serde_json::Value> = (0..4095)
        .rev()
        .map(|i| json!({ "name": format!("i{i}"), "shape": [1], "datatype": "FP32", "data": [1.0] }))
        .collect();
    inputs.push(json!({ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5] }));
    let (code, body) = server.infer("fewer", EVIL, &json!({ "inputs": inputs })).await;
    assert_eq!((code, &output(&body, "sum")["data"]), (200, &json!([0.5])), "{body}");
    victim_served(&server).await;
}

#[tokio::test]
async fn a_tenants_graph_may_not_hold_memory_that_no_cap_sees() {
    let tenants = tenants("allow_raw_model_load = true");
    let server = Server::start(tenants.path(), &["--run-memory", "64MiB"]);
    // ONNX Runtime's arena, capped at 64 MiB, counts 32 bytes a string, nothing of an empty
    // tensor, and nothing of what a kernel keeps in the heap as it works. On the build before:
    // 1,460 bytes doubling a one-letter string 27 times, one run grew the server by 280 MiB
    // (thirty doublings: by 2 GiB, and each one more twice as much); a split of an empty tensor
    // into n pieces (the arena holds the n sizes), a million by 249 MiB, seven million by
    // 1.7 GiB before the caller's deadline of 2 s; `RoiAlign` of one 4000×4000 region of an 8×8
    // image (its sampling grid as fine as the region is large), by 732 MiB from 260 bytes of
    // graph and 272 bytes of input, growing as the region's area; `NonZero` of 4 MB of
    // booleans shaped [4000000, 1, ..., 1] (rank 32), by 977 MiB for one request; a cubic
    // `Resize` of a row of 2 million ones to four rows, by 462 MiB in 1.7 s, answered 200;
    // `NonMaxSuppression` of one box in 12 million classes, by 453 MiB before it failed;
    // ONNX Runtime's `DynamicTimeWarping` through a column of 4 million ones, by 688 MiB in
    // 0.95 s, answered 200 (16 million: by 1,355 MiB before the deadline of 2 s), from a
    // 282-byte upload; `AffineGrid` of a 168³ grid, by 263 MiB in 0.15 s, answered 200, from
    // 217 bytes.
    let strings_sequences_or_maps = "the model makes strings, sequences or maps";
    let models = [
        ("strings", onnx::doubling_string(27), strings_sequences_or_maps, "(node 'Constant_s0' (Constant))"),
        ("pieces", onnx::sequence_of_empty_tensors(), strings_sequences_or_maps, "(node 'SplitToSequence_pieces'"),
        (
            "regions",
            onnx::roi_align(),
            "the model uses node 'RoiAlign_pooled' (RoiAlign)",
            "grows past it with its inputs",
        ),
        ("nonzero", onnx::nonzero_of_shape(32), "the model uses node 'NonZero_where' (NonZero)", "outside the memory"),
        (
            "bicubic",
            onnx::bicubic_of_shape(),
            "the model uses node 'Resize_rows' (Resize) in cubic mode without antialiasing",
            "outside the memory",
        ),
        (
            "suppression",
            onnx::suppression_of_shape(),
            "the model uses node 'NonMaxSuppression_kept' (NonMaxSuppression)",
            "grows past it with its inputs",
        ),
        (
            "warping",
            onnx::contrib_of_shape("DynamicTimeWarping"),
            "the model uses node 'DynamicTimeWarping_made' (DynamicTimeWarping)",
            "grows past it with its inputs",
        ),
        (
            "grid",
            onnx::affine_grid_of_size(),
            "the model uses node 'AffineGrid_grid' (AffineGrid)",
            "grows past it with its inputs",
        ),
        // ONNX Runtime's own operators not measured are refused too (30 of its 86 on the CPU).
        (
            "branchwise",
            onnx::contrib_of_shape("BranchwiseRMSNorm"),
            "the model uses node 'BranchwiseRMSNorm_made' (com.microsoft BranchwiseRMSNorm), one of ONNX Runtime's own",
            "those measured (the README lists them",
        ),
    ];
    for (name, model, refusal, detail) in models {
        let path = format!("/control/v1/models/{name}");
        let ((code, body), grown) = server.peak_growth(server.send(Method::PUT, &path, EVIL, model.clone())).await;
        assert_eq!(code, 400, "{name}: {body}");
        let message = error_message(&body);
        assert!(message.contains(refusal) && message.contains(detail), "{message}");
        assert!(grown < 50 << 20, "{name}: the server grew by {} MiB", grown >> 20);
        let (code, body) = server.get(&format!("/v2/models/{name}/ready"), Some(EVIL)).await;
        assert_eq!(code, 404, "{name}: {body}");
        // Through a guest's raw load, the same.
        let request = load_bytes_request(&model);
        let (status, body) = server.infer("hostile", EVIL, &request).await;
        assert_eq!(status, 500, "{name}: {body}");
        assert!(error_message(&body).contains(refusal), "{body}");
    }
    victim_served(&server).await;
}

#[tokio::test]
async fn what_a_guest_makes_the_host_hold_counts_against_its_memory() {
    let tenants = tenants("guest_memory_mib = 32");
    let server = Server::start(tenants.path(), &[]);
    for (name, parameters) in [
        // 400 tensors of 1 MiB kept at once: over the 32 MiB the guest may hold.
        ("hold-tensors", json!({ "count": "400", "kib": "1024" })),
        // Tensors with four million dimensions each (16 MB of dimension list apiece).
        ("big-dims", json!({ "count": "50" })),
        // 2,000 failed loads of a 1 MiB model name, every error kept.
        ("error-names", json!({ "count": "2000" })),
    ] {
        let ((status, body), grown) = server.peak_growth(server.infer("hostile", EVIL, &mode(name, parameters))).await;
        assert!([200, 400, 500].contains(&status), "{name}: {status} {body}");
        if name == "hold-tensors" {
            assert_eq!(status, 500, "{body}");
            assert!(error_message(&body).contains("memory limit of 32 MiB"), "{name}: {body}");
        }
        assert!(grown < 200 << 20, "{name}: the server grew by {} MiB", grown >> 20);
    }
    victim_served(&server).await;
}

#[tokio::test]
async fn a_large_json_body_costs_about_its_own_size_to_parse() {
    let tenants = Tenants::new();
    let mut victim = tenant_header("victim", VICTIM, "max_request_bytes = 33554432\nmax_tensor_elements = 16777216");
    victim += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("victim.toml", &victim);
    let server = Server::start(tenants.path(), &[]);
    // 8 million values in 16 MB of JSON (more rows than the model's queue takes at once):
    // parsing them must not cost many times the body.
    let rows = 131_072;
    let data = "0,".repeat(rows * 64 - 1) + "0";
    let body = format!(r#"{{"inputs":[{{"name":"X","shape":[{rows},64],"datatype":"FP32","data":[{data}]}}]}}"#);
    let request = server.post_raw("/v2/models/digits-mlp/infer", Some(VICTIM), body.into_bytes());
    let ((status, _), grown) = server.peak_growth(request).await;
    assert!([200, 400, 500, 503].contains(&status), "{status}");
    assert!(grown < 160 << 20, "parsing 16 MB of JSON took {} MiB", grown >> 20);
}

#[tokio::test]
async fn a_model_call_takes_its_input_tensors_from_the_guests_charge() {
    // wasi:nn `compute` takes its inputs: they must leave what the guest is charged for, or a
    // guest calling a model many times in one request runs out of its memory quota.
    let tenants = Tenants::new();
    let mut evil = tenant_header("evil", EVIL, "guest_memory_mib = 8");
    evil += &model_entry("digits-mlp", &digits_model(), None);
    evil += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("evil.toml", &evil);
    let server = Server::start(tenants.path(), &[]);
    // 1,200 calls of 32 rows (8 KiB of input each): 9.6 MiB given over one request.
    let request = json!({
        "inputs": [{ "name": "X", "shape": [32, 64], "datatype": "FP32", "data": vec![0.5f32; 32 * 64] }],
        "parameters": { "mode": "compute", "model": "digits-mlp", "times": "1200" },
    });
    let (status, body) = server.infer("hostile", EVIL, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "probabilities")["shape"], json!([32, 10]), "{body}");
}

/// A big answer the hostile guest makes: more than the sockets of both ends buffer.
const UNREAD_MIB: &str = "24";
const UNREAD_QUOTAS: &str = "guest_memory_mib = 160\nmax_concurrent_requests = 3\nmax_response_bytes = 67108864";

/// An HTTP request for a big answer on a connection of its own, and the answer's status line
/// and headers, read without the body: what a client that reads no further leaves behind.
async fn big_answer_left_unread(server: &Server) -> (tokio::net::TcpStream, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::to_vec(&json!({
        "inputs": [],
        "parameters": { "mode": "big-output", "mib": UNREAD_MIB, "binary_data_output": true },
    }))
    .expect("json");
    let mut connection = tokio::net::TcpStream::connect(server.http_address()).await.expect("connects");
    let head = format!(
        "POST /v2/models/hostile/infer HTTP/1.1\r\nhost: sluice\r\nauthorization: Bearer {EVIL}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    connection.write_all(&[head.into_bytes(), body].concat()).await.expect("sent");
    let mut answer = Vec::new();
    let mut chunk = [0u8; 512];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(20), connection.read(&mut chunk))
            .await
            .expect("an answer within 20 s")
            .expect("read");
        assert!(read > 0, "closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..read]);
    }
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("found");
    (connection, String::from_utf8_lossy(&answer[..end]).to_string())
}

#[tokio::test]
async fn answers_a_client_leaves_unread_hold_its_own_tenants_quota_and_nothing_more() {
    let tenants = tenants(UNREAD_QUOTAS);
    let server = Server::start(tenants.path(), &[]);
    let rss = server.rss_bytes();
    let mut unread = Vec::new();
    for _ in 0..3 {
        let (connection, head) = big_answer_left_unread(&server).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        unread.push(connection);
    }
    // The three answers are still on their way: the tenant's three places are theirs. Were
    // they given back once the answers were queued, each further connection would make the
    // server hold another 24 MiB, without bound.
    for _ in 0..3 {
        let (_, head) = big_answer_left_unread(&server).await;
        assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    }
    let held = server.rss_bytes().saturating_sub(rss);
    assert!(held < 160 << 20, "the server holds {} MiB for three unread answers", held >> 20);
    victim_served(&server).await;
    // A client that goes away gives its place back.
    drop(unread.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, head) = big_answer_left_unread(&server).await;
        if head.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "the place of a closed connection was not given back: {head}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A raw HTTP/2 connection to the gRPC port with small windows, whose answers the test never
/// reads: they wait in the server.
async fn unread_grpc_connection(
    server: &Server,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let tcp = tokio::net::TcpStream::connect(&server.grpc).await.expect("connects");
    let (sender, connection) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(1 << 20)
        .handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .expect("an HTTP/2 connection");
    tokio::spawn(connection);
    sender
}

/// A gRPC message (with its prefix) asking the hostile guest for a big answer.
fn big_answer_message() -> Vec<u8> {
    use sluice::api::grpc::proto::{InferParameter, infer_parameter};
    let mut request = hostile_grpc_request("big-output");
    let mib =
        InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::StringParam(UNREAD_MIB.into())) };
    request.parameters.insert("mib".into(), mib);
    let message = prost::Message::encode_to_vec(&request);
    [&[0u8][..], &(message.len() as u32).to_be_bytes(), &message].concat()
}

#[tokio::test]
async fn grpc_answers_a_client_leaves_unread_hold_its_own_tenants_quota() {
    let tenants = tenants(UNREAD_QUOTAS);
    let server = Server::start(tenants.path(), &[]);
    let mut sender = unread_grpc_connection(&server).await;
    let framed = bytes::Bytes::from(big_answer_message());
    let mut call = async || {
        let request = http::Request::post("http://sluice/inference.GRPCInferenceService/ModelInfer")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("authorization", format!("Bearer {EVIL}"))
            .body(http_body_util::Full::new(framed.clone()))
            .expect("a request");
        let answer = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request));
        answer.await.expect("headers within 20 s").expect("an answer")
    };
    let mut unread = Vec::new();
    for _ in 0..3 {
        let answer = call().await;
        assert_eq!(answer.headers().get("grpc-status"), None, "answering: {:?}", answer.headers());
        unread.push(answer);
    }
    let refused = call().await;
    let status = refused.headers().get("grpc-status").map(|s| s.to_str().expect("ascii").to_string());
    assert_eq!(status.as_deref(), Some("8"), "RESOURCE_EXHAUSTED: {:?}", refused.headers());
    victim_served(&server).await;
}

#[tokio::test]
async fn a_stream_whose_answers_are_not_read_reads_no_more_requests() {
    let tenants = tenants(UNREAD_QUOTAS);
    let server = Server::start(tenants.path(), &[]);
    let mut sender = unread_grpc_connection(&server).await;
    let framed = big_answer_message();
    // Forty requests for 24 MiB answers on one stream, none of them read.
    let forty = bytes::Bytes::from(framed.repeat(40));
    let call = http::Request::post("http://sluice/inference.GRPCInferenceService/ModelStreamInfer")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {EVIL}"))
        .body(http_body_util::Full::new(forty))
        .expect("a request");
    let answer = tokio::time::timeout(Duration::from_secs(20), sender.send_request(call));
    let _unread = answer.await.expect("headers within 20 s").expect("an answer");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The stream read a request only while it had room for its answer: not forty.
    let served = server.metric("sluice_requests_total{app=\"hostile\",protocol=\"grpc\"").await;
    // Its three places (max_concurrent_requests), and the answers tonic has handed on.
    assert!((3.0..=6.0).contains(&served), "{served} requests ran for an unread stream");
    victim_served(&server).await;
}

/// Two clients for each of the evil tenant's models `heavy-0` .. `heavy-{models - 1}`, calling
/// with `request` in a closed loop until `stop`; each ends with how many calls it was answered.
fn keep_busy(
    server: &std::sync::Arc<Server>,
    models: usize,
    request: &serde_json::Value,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<usize>> {
    let clients = (0..2 * models).map(|client| {
        let (server, stop, request) = (server.clone(), stop.clone(), request.clone());
        tokio::spawn(async move {
            let mut served = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if server.infer(&format!("heavy-{}", client % models), EVIL, &request).await.0 == 200 {
                    served += 1;
                }
            }
            served
        })
    });
    clients.collect()
}

#[tokio::test]
async fn one_tenants_busy_models_take_at_most_the_cores_and_anothers_runs_never_wait_for_them() {
    use crate::metrics::Scrape;
    use sluice::telemetry::metrics::names::{TENANT_ENGINE_RUNS, TENANT_RUN_WAIT};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let tenants = Tenants::new();
    tenants.write("victim.toml", &tenant_header("victim", VICTIM, ""));
    // As many models as a machine with many cores needs (32 by default).
    tenants.write("evil.toml", &tenant_header("evil", EVIL, "guest_deadline_ms = 60000\nmax_models = 1024"));
    let server = Arc::new(Server::start(tenants.path(), &[]));
    // Twice as many heavy models as the host has cores, and two more (each its own copy, runs
    // of a few ms), each kept busy by two clients: each of its runs was a thread on the cores.
    let hogs = 2 * cores + 2;
    for i in 0..hogs {
        let path = format!("/control/v1/models/heavy-{i}");
        let (code, body) = server.send(Method::PUT, &path, EVIL, onnx::slow_compute(192, 5 + i)).await;
        assert_eq!(code, 201, "{body}");
    }
    let (code, body) = server.send(Method::PUT, "/control/v1/models/own", VICTIM, onnx::slow_compute(192, 4)).await;
    assert_eq!(code, 201, "{body}");
    let request = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.001] }] });
    let stop = Arc::new(AtomicBool::new(false));
    let clients = keep_busy(&server, hogs, &request, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The victim calls its own heavy model, one call at a time, while the evil tenant's runs
    // are sampled: never more than the cores, and the victim's runs never wait for a place.
    let mut most = 0.0f64;
    for _ in 0..20 {
        let (code, body) = server.infer("own", VICTIM, &request).await;
        assert_eq!(code, 200, "{body}");
        let scrape = Scrape::of(&server).await;
        most = most.max(scrape.sum(TENANT_ENGINE_RUNS, &[("tenant", "evil")]));
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("a client");
    }
    // The server's places: one run a core (`--backend-threads 1`), and one more.
    let places = sluice::nn::scheduler::places::places_for(cores, 1);
    assert!(most >= 1.0 && most <= places as f64, "the evil tenant ran {most} at once on {cores} cores");
    let scrape = Scrape::of(&server).await;
    assert!(scrape.sum(TENANT_RUN_WAIT, &[("tenant", "evil")]) > 0.0, "its runs over its share waited");
    assert_eq!(scrape.sum(TENANT_RUN_WAIT, &[("tenant", "victim")]), 0.0, "the victim's never did");
    assert_eq!(scrape.sum(TENANT_ENGINE_RUNS, &[]), 0.0, "every place went back");
}

#[tokio::test]
async fn one_tenants_busy_models_on_the_webgpu_adapter_run_one_at_a_time_and_the_server_stays_up() {
    use crate::metrics::Scrape;
    use sluice::telemetry::metrics::names::{TENANT_ENGINE_RUNS, TENANT_RUN_WAIT};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    // ONNX Runtime's WebGPU provider shares one context among its sessions: two runs at once
    // crashed the server (SIGSEGV), every tenant's requests with it.
    let (flags, env) = software_webgpu();
    let tenants = Tenants::new();
    let on_webgpu = |name: &str, steps: usize| {
        let path = tenants.path().join(format!("{name}.onnx"));
        std::fs::write(&path, onnx::slow_compute(64, steps)).expect("a model file");
        model_entry(name, &path, Some("onnxruntime"))
            + &format!("on_missing_device = \"refuse\"\n[[models.{name}.instances]]\nkind = \"webgpu\"\n\n")
    };
    let hogs = 3;
    let mut evil = tenant_header("evil", EVIL, "guest_deadline_ms = 60000");
    for i in 0..hogs {
        evil += &on_webgpu(&format!("heavy-{i}"), 5 + i);
    }
    tenants.write("evil.toml", &evil);
    tenants
        .write("victim.toml", &(tenant_header("victim", VICTIM, "guest_deadline_ms = 60000") + &on_webgpu("own", 4)));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = Arc::new(Server::start_with_env(tenants.path(), &args, &env));

    // Two clients keep each of the evil tenant's models busy.
    let request = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.001] }] });
    let stop = Arc::new(AtomicBool::new(false));
    let clients = keep_busy(&server, hogs, &request, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The victim calls its own model there, one call at a time, while the runs on the adapter
    // are sampled: one at a time, and none of them took a place on the cores.
    let webgpu = |tenant| [("tenant", tenant), ("device", "webgpu")];
    let mut most = 0.0f64;
    for _ in 0..20 {
        let (code, body) = server.infer("own", VICTIM, &request).await;
        assert_eq!(code, 200, "{body}");
        let scrape = Scrape::of(&server).await;
        let runs = scrape.sum(TENANT_ENGINE_RUNS, &[("device", "webgpu")]);
        assert!(runs <= 1.0, "{runs} runs at once on the adapter");
        most = most.max(scrape.sum(TENANT_ENGINE_RUNS, &webgpu("evil")));
        assert_eq!(scrape.sum(TENANT_ENGINE_RUNS, &[("device", "cpu")]), 0.0, "no run took the cores' places");
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        assert!(client.await.expect("a client") > 0, "every model of the evil tenant's was served");
    }
    assert_eq!(most, 1.0, "the evil tenant's runs were seen on the adapter");
    let scrape = Scrape::of(&server).await;
    assert!(scrape.sum(TENANT_RUN_WAIT, &webgpu("evil")) > 0.0, "its runs waited their turns");
    assert_eq!(scrape.sum(TENANT_ENGINE_RUNS, &[]), 0.0, "every place went back");
}

#[tokio::test]
async fn a_grpc_request_of_many_small_messages_is_refused_before_it_is_built() {
    use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
    use sluice::api::grpc::proto::{ModelInferRequest, model_infer_request};
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &[]);
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    // 8 million empty inputs, 16 MB within the default `max_request_bytes`: prost built a
    // struct for each before any check, and the server grew by 2.4 GiB for this one call.
    let request = ModelInferRequest {
        model_name: "hostile".into(),
        inputs: vec![model_infer_request::InferInputTensor::default(); 8_000_000],
        ..Default::default()
    };
    let (answer, grown) = server.peak_growth(grpc.model_infer(authed(request, EVIL))).await;
    let status = answer.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{}", status.message());
    assert!(status.message().contains("send fewer and larger ones"), "{}", status.message());
    assert!(grown < 200 << 20, "the server grew by {} MiB", grown >> 20);
    victim_served(&server).await;
}

#[tokio::test]
async fn a_tenants_graph_loads_on_one_engine_and_never_falls_to_one_without_a_cap() {
    use prost::Message;
    let tenants = tenants("allow_raw_model_load = true");
    let server = Server::start(tenants.path(), &["--run-memory", "64MiB"]);
    // A 150-byte graph summing `Range(0, n)`. Marked with an IR version ONNX Runtime does not
    // know, it refused it, and the build before then loaded it on tract, which bounds nothing:
    // one request for n = 2^28 took the server 2 GiB in 1 s, answered 200 (2^31: 16 GiB).
    let mut unknown_ir = onnx::ModelProto::decode(onnx::sum_of_range().as_slice()).expect("decodes");
    unknown_ir.ir_version = 99;
    let request = json!({ "inputs": [{ "name": "n", "shape": [], "datatype": "INT64", "data": [268_435_456] }] });
    let upload = server.send(Method::PUT, "/control/v1/models/range", EVIL, unknown_ir.encode_to_vec());
    let ((code, body), grown) = server.peak_growth(upload).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("Unsupported model IR version"), "{body}");
    assert!(grown < 50 << 20, "the upload grew the server by {} MiB", grown >> 20);
    assert_eq!(server.infer("range", EVIL, &request).await.0, 404);
    assert!(!server.log().contains("backend=tract"), "another engine was tried:\n{}", server.log());
    // The same graph ONNX Runtime knows serves on it, within the cap.
    let (code, body) = server.send(Method::PUT, "/control/v1/models/range", EVIL, onnx::sum_of_range()).await;
    assert_eq!(code, 201, "{body}");
    let ((status, body), grown) = server.peak_growth(server.infer("range", EVIL, &request)).await;
    assert_eq!(status, 500, "{body}");
    assert!(error_message(&body).contains("more than all model runs on this server may hold (64 MiB)"), "{body}");
    assert!(grown < 200 << 20, "the run grew the server by {} MiB", grown >> 20);
    let small = json!({ "inputs": [{ "name": "n", "shape": [], "datatype": "INT64", "data": [1000] }] });
    let (status, body) = server.infer("range", EVIL, &small).await;
    assert_eq!((status, &output(&body, "total")["data"]), (200, &json!([499_500])), "{body}");
    // A guest's raw load of the unknown IR: refused by ONNX Runtime, tried on nothing else.
    let model = unknown_ir.encode_to_vec();
    let load = load_bytes_request(&model);
    let (status, body) = server.infer("hostile", EVIL, &load).await;
    assert_eq!(status, 500, "{body}");
    assert!(error_message(&body).contains("Unsupported model IR version"), "{body}");
    victim_served(&server).await;
}
