//! Model lifecycle: Triton's repository extension (index, load, unload) scoped to the
//! caller's tenant over HTTP and gRPC, readiness that follows it, models that leave memory
//! when idle and come back on the next request (a burst of them loading it once), and a
//! memory budget that evicts the least recently used idle model to make room, never a busy
//! or pinned one.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::*;
use tonic::Code;

use crate::onnx;
use crate::support::*;

const ACME: &str = "lifecycle-acme";
const GLOBEX: &str = "lifecycle-globex";

fn row() -> Value {
    json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }] })
}

/// A log without its terminal colours.
fn plain(log: &str) -> String {
    let mut text = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            text.push(c);
        }
    }
    text
}

/// Wait until the resident-model gauge reads `expected` (an unload finishes in the model's
/// own task, after the answer).
async fn resident_becomes(server: &Server, expected: f64) {
    let started = Instant::now();
    loop {
        let now = server.metric("sluice_resident_models ").await;
        if now == expected {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "sluice_resident_models stayed {now}, not {expected}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn index(server: &Server, key: &str) -> Vec<Value> {
    let (code, body) = server.post_raw("/v2/repository/index", Some(key), Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    body.as_array().expect("an array").clone()
}

fn state_of<'a>(index: &'a [Value], name: &str) -> (&'a str, &'a str) {
    let row = index.iter().find(|row| row["name"] == name).unwrap_or_else(|| panic!("{name} in {index:?}"));
    (row["state"].as_str().expect("state"), row["reason"].as_str().expect("reason"))
}

#[tokio::test]
async fn tenants_unload_and_load_their_own_models_and_nobody_elses() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", ACME, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += &model_entry("small", &digits_small_model(), None);
    acme += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &acme);
    // Globex serves the same weights as acme's digits-mlp: one copy for both.
    tenants.write("globex.toml", &(tenant_header("globex", GLOBEX, "") + &model_entry("mlp", &digits_model(), None)));
    let server = Server::start(tenants.path(), &[]);
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    resident_becomes(&server, 2.0).await;

    let acme_index = index(&server, ACME).await;
    let names: Vec<&str> = acme_index.iter().filter_map(|row| row["name"].as_str()).collect();
    assert_eq!(names, ["digits", "digits-mlp", "small"], "the caller's apps and models only");
    assert_eq!(state_of(&acme_index, "small"), ("READY", ""));

    // Unload over HTTP: not ready, refused with 503 over both protocols, out of memory.
    let (code, body) = server.post_raw("/v2/repository/models/small/unload", Some(ACME), Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = server.get("/v2/models/small/ready", Some(ACME)).await;
    assert_eq!((code, &body["ready"]), (400, &json!(false)), "{body}");
    let ready = grpc.model_ready(authed(ModelReadyRequest { name: "small".into(), version: String::new() }, ACME));
    assert!(!ready.await.expect("answers").into_inner().ready);
    let (code, body) = server.infer("small", ACME, &row()).await;
    assert_eq!(code, 503, "{body}");
    assert!(error_message(&body).contains("'small' is unloaded"), "{body}");
    let request = ModelInferRequest { model_name: "small".into(), ..Default::default() };
    let status = grpc.model_infer(authed(request, ACME)).await.expect_err("refused");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(state_of(&index(&server, ACME).await, "small"), ("UNAVAILABLE", "unloaded"));
    resident_becomes(&server, 1.0).await;

    // Another tenant can neither see nor touch acme's names.
    let (code, body) = server.post_raw("/v2/repository/models/small/load", Some(GLOBEX), Vec::new()).await;
    assert_eq!(code, 404, "{body}");
    let (code, body) = server.post_raw("/v2/repository/models/small/unload", Some(GLOBEX), Vec::new()).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(index(&server, GLOBEX).await.len(), 1);

    // Acme unloading weights globex serves too leaves globex's copy resident and warm.
    let (code, _) = server.post_raw("/v2/repository/models/digits-mlp/unload", Some(ACME), Vec::new()).await;
    assert_eq!(code, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.metric("sluice_resident_models ").await, 1.0, "globex's copy stays");
    assert_eq!(state_of(&index(&server, GLOBEX).await, "mlp"), ("READY", ""));
    let (code, body) = server.infer("mlp", GLOBEX, &row()).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(server.metric("sluice_model_load_seconds_count{backend=\"onnxruntime\",reason=\"demand\"}").await, 0.0);

    // Load over gRPC: answered once ready; serves again, loaded once on request.
    let load = RepositoryModelLoadRequest { model_name: "small".into(), ..Default::default() };
    grpc.repository_model_load(authed(load, ACME)).await.expect("loads");
    let (code, body) = server.get("/v2/models/small/ready", Some(ACME)).await;
    assert_eq!((code, &body["ready"]), (200, &json!(true)), "{body}");
    let (code, body) = server.infer("small", ACME, &row()).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(server.metric("sluice_model_load_seconds_count{backend=\"onnxruntime\",reason=\"request\"}").await, 1.0);
    resident_becomes(&server, 2.0).await;
    let index = grpc.repository_index(authed(RepositoryIndexRequest { ready: true, ..Default::default() }, ACME));
    let ready: Vec<String> = index.await.expect("answers").into_inner().models.into_iter().map(|m| m.name).collect();
    assert_eq!(ready, ["digits", "small"], "ready only: digits-mlp is still unloaded");

    // What Sluice cannot do is refused, saying why.
    let with_config = serde_json::to_vec(&json!({ "parameters": { "config": "{}" } })).expect("json");
    let (code, body) = server.post_raw("/v2/repository/models/small/load", Some(ACME), with_config).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("'config'"), "{body}");
    let (code, body) = server.post_raw("/v2/repository/models/digits/unload", Some(ACME), Vec::new()).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("is an app"), "{body}");
    let unload = RepositoryModelUnloadRequest { model_name: "digits".into(), ..Default::default() };
    let status = grpc.repository_model_unload(authed(unload, ACME)).await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let (code, _) = server.post_raw("/v2/repository/index", None, Vec::new()).await;
    assert_eq!(code, 401, "the repository is a tenant's");
}

#[tokio::test]
async fn an_idle_model_leaves_memory_and_a_burst_of_requests_loads_it_once() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &(tenant_header("acme", ACME, "") + &model_entry("digits-mlp", &digits_model(), None)));
    let server = Server::start(tenants.path(), &["--idle-unload-s", "1"]);
    resident_becomes(&server, 0.0).await;
    let rows = index(&server, ACME).await;
    let (state, reason) = state_of(&rows, "digits-mlp");
    assert_eq!(state, "READY", "a request is still served");
    assert!(reason.contains("not resident"), "{reason}");
    let (code, _) = server.get("/v2/models/digits-mlp/ready", Some(ACME)).await;
    assert_eq!(code, 200);

    let digits = heldout_digits();
    let requests = (0..50).map(|i| {
        // The first eight the model classifies right (the tritonclient check relies on them too).
        let (pixels, label) = digits[i % 8].clone();
        let x: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
        let body = json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": x }] });
        let server = &server;
        async move { (server.infer("digits-mlp", ACME, &body).await, label) }
    });
    for ((code, body), label) in futures::future::join_all(requests).await {
        assert_eq!(code, 200, "every request is held for the load, none fails: {body}");
        assert_eq!(i64s(&output(&body, "label")["data"]), [label]);
    }
    let loads = "sluice_model_load_seconds_count{backend=\"onnxruntime\",reason=\"demand\"}";
    assert_eq!(server.metric(loads).await, 1.0, "one load for the burst");
    assert_eq!(server.metric("sluice_queue_depth{").await, 0.0, "nothing left waiting");
    // The requests waiting for the load on demand were its first run: no warm-up on zeros
    // made them wait longer.
    let warmed = |log: &str| log.match_indices("model warmed up").map(|(at, _)| at).collect::<Vec<_>>();
    assert_eq!(warmed(&plain(&server.log())).len(), 1, "at start only:\n{}", server.log());
    // And idle again, it leaves again; a load asked for, with nobody waiting, warms it up
    // before it answers.
    resident_becomes(&server, 0.0).await;
    let (code, body) = server.post_raw("/v2/repository/models/digits-mlp/load", Some(ACME), Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    let log = plain(&server.log());
    let loaded = log.find("reason=\"request\"").expect("the requested load's line");
    assert_eq!(warmed(&log).len(), 2, "at start and on request:\n{log}");
    assert!(warmed(&log)[1] < loaded, "warmed up before it was reported loaded:\n{log}");
}

#[tokio::test]
async fn warm_up_sizes_are_checked_and_run() {
    let with_warmup = |sizes: &str| {
        let tenants = Tenants::new();
        let mut acme = tenant_header("acme", ACME, "");
        acme += &model_entry("digits-mlp", &digits_model(), None);
        acme += &format!("[models.digits-mlp.warmup]\nbatch_sizes = {sizes}\n");
        tenants.write("acme.toml", &acme);
        tenants
    };
    let data = tempfile::tempdir().expect("tmp");
    let log = Server::start_in(with_warmup("[1, 64]").path(), data.path(), &[]).err().expect("refused at start");
    assert!(log.contains("warmup takes at most 8 batch sizes, each between 1 and max_batch_size (32)"), "{log}");

    let tenants = with_warmup("[1, 4, 32]");
    let server = Server::start(tenants.path(), &[]);
    assert!(plain(&server.log()).contains("batch_sizes=[1, 4, 32]"), "{}", server.log());
    let tenants = with_warmup("[]");
    let server = Server::start(tenants.path(), &[]);
    assert!(!server.log().contains("model warmed up"), "{}", server.log());
}

/// When each `model loaded` line of `reason` says its load began and ended, in seconds of
/// the day (the line's time, less its `load_ms`).
fn load_intervals(log: &str, reason: &str) -> Vec<(f64, f64)> {
    plain(log)
        .lines()
        .filter(|line| {
            line.contains("model loaded")
                && (line.contains(&format!("reason={reason} ")) || line.contains(&format!("reason=\"{reason}\"")))
        })
        .map(|line| {
            let time = line.split('T').nth(1).and_then(|rest| rest.split('Z').next()).expect("a timestamp");
            let seconds = time.split(':').fold(0.0, |total, part| total * 60.0 + part.parse::<f64>().expect("time"));
            let load_ms: f64 = line.rsplit("load_ms=").next().and_then(|v| v.trim().parse().ok()).expect("load_ms");
            (seconds - load_ms / 1000.0, seconds)
        })
        .collect()
}

#[tokio::test]
async fn repository_calls_are_the_tenants_requests_and_its_loads_run_one_at_a_time() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", ACME, "");
    acme += &model_entry("a", &digits_model(), None);
    acme += &model_entry("b", &digits_small_model(), None);
    acme += &model_entry("c", &magika_model(), None);
    tenants.write("acme.toml", &acme);
    let limited = tenant_header("globex", GLOBEX, "max_requests_per_second = 2");
    tenants.write("globex.toml", &limited);
    let server = Server::start(tenants.path(), &[]);

    // Over its rate, a tenant's unloads and loads are refused like its inference.
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(server.post_raw("/v2/repository/models/m/unload", Some(GLOBEX), Vec::new()).await.0);
    }
    assert_eq!(codes.iter().filter(|&&code| code == 404).count(), 2, "two within the rate: {codes:?}");
    assert!(codes.contains(&429), "{codes:?}");

    // Three loads asked for at once run one after the other.
    for model in ["a", "b", "c"] {
        let (code, _) = server.post_raw(&format!("/v2/repository/models/{model}/unload"), Some(ACME), Vec::new()).await;
        assert_eq!(code, 200);
    }
    resident_becomes(&server, 0.0).await;
    let server = &server;
    let loads = ["a", "b", "c"].map(|model| async move {
        server.post_raw(&format!("/v2/repository/models/{model}/load"), Some(ACME), Vec::new()).await
    });
    for (code, body) in futures::future::join_all(loads).await {
        assert_eq!(code, 200, "{body}");
    }
    let mut intervals = load_intervals(&server.log(), "request");
    assert_eq!(intervals.len(), 3, "{}", server.log());
    intervals.sort_by(|x, y| x.0.total_cmp(&y.0));
    for pair in intervals.windows(2) {
        // Load times are whole milliseconds: allow one of rounding.
        assert!(pair[1].0 >= pair[0].1 - 0.001, "loads overlapped: {intervals:?}");
    }
}

#[tokio::test]
async fn models_are_held_to_the_memory_budget() {
    let tenants = Tenants::new();
    let quotas = "max_model_bytes = 10000000";
    tenants
        .write("acme.toml", &(tenant_header("acme", ACME, quotas) + &model_entry("digits-mlp", &digits_model(), None)));
    let server = Server::start(tenants.path(), &["--model-memory", "cpu=2MiB"]);
    let weights = std::fs::metadata(digits_model()).expect("weights").len() as f64;
    assert_eq!(server.metric("sluice_device_memory_budget_bytes{device=\"cpu\"}").await, 2.0 * 1024.0 * 1024.0);
    let model = server.metric("sluice_model_memory_bytes{backend=\"onnxruntime\",model=\"digits-mlp\"}").await;
    assert!(model >= weights, "at least its weights: {model}");
    assert_eq!(server.metric("sluice_device_memory_used_bytes{device=\"cpu\"}").await, model);

    // Weights larger than the whole budget (with what the engine holds for each node) are
    // refused before anything is loaded or evicted.
    let magika = std::fs::read(magika_model()).expect("magika");
    let (code, body) = server.send(reqwest::Method::PUT, "/control/v1/models/magika", ACME, magika).await;
    assert_eq!(code, 413, "{body}");
    assert!(
        error_message(&body).contains("needs 3.4 MiB, more than the whole 2 MiB cpu model memory budget"),
        "{body}"
    );
    assert_eq!(server.metric("sluice_model_evictions_total").await, 0.0, "nothing left for it");
    let (code, _) = server.infer("digits-mlp", ACME, &row()).await;
    assert_eq!(code, 200, "what is resident keeps serving");

    // A manifest's model past the budget stops the start; a budget of another device is refused.
    let big = Tenants::new();
    big.write("acme.toml", &(tenant_header("acme", ACME, "") + &model_entry("magika", &magika_model(), None)));
    let data = tempfile::tempdir().expect("tmp");
    let log = Server::start_in(big.path(), data.path(), &["--model-memory", "cpu=1MiB"]).err().expect("refused");
    assert!(plain(&log).contains("more than the whole 1 MiB cpu model memory budget"), "{log}");
    let log = Server::start_in(big.path(), data.path(), &["--model-memory", "gpu=1GiB"]).err().expect("refused");
    assert!(log.contains("'gpu' is not a device: cpu, cuda:N or webgpu"), "{log}");
    let log =
        Server::start_in(big.path(), data.path(), &["--model-memory", "cpu=1GiB,cuda:63=1GiB"]).err().expect("refused");
    assert!(log.contains("--model-memory names cuda:63, which this machine does not have"), "{log}");
}

/// Weights of each lookup model: 4 Mi floats (16 MiB).
const LOOKUP_WEIGHTS: usize = 4 << 20;

/// Room for two lookup models, not three.
const BUDGET_FOR_TWO: &str = "cpu=44MiB";

/// Write each model beside the manifest; its manifest entry, with `extra` lines in its table.
fn entries(tenants: &Tenants, models: &[(&str, Vec<u8>, &str)]) -> String {
    models
        .iter()
        .map(|(name, bytes, extra)| {
            let path = tenants.path().join(format!("{name}.onnx"));
            std::fs::write(&path, bytes).expect("writing a model");
            model_entry(name, &path, None) + extra
        })
        .collect()
}

fn lookup_request() -> Value {
    json!({ "inputs": [{ "name": "i", "shape": [1], "datatype": "INT64", "data": [0] }] })
}

/// Ask model `name` for its first weight; the answer says which model served.
async fn lookup(server: &Server, name: &str) -> f32 {
    let (code, body) = server.infer(name, ACME, &lookup_request()).await;
    assert_eq!(code, 200, "{name}: {body}");
    f32s(&output(&body, "y")["data"])[0]
}

async fn evictions(server: &Server, model: &str) -> f64 {
    server.metric(&format!("sluice_model_evictions_total{{backend=\"onnxruntime\",model=\"{model}\"}}")).await
}

#[tokio::test]
async fn three_models_over_a_budget_for_two_take_turns_and_every_request_succeeds() {
    for pinned in [false, true] {
        let tenants = Tenants::new();
        let models: Vec<(String, Vec<u8>, &str)> = (0..3)
            .map(|i| {
                let extra = if pinned && i == 0 { "resident = \"always\"\n" } else { "" };
                (format!("m{i}"), onnx::weights_lookup(i as f32 + 1.0, LOOKUP_WEIGHTS), extra)
            })
            .collect();
        let models: Vec<(&str, Vec<u8>, &str)> = models.iter().map(|(n, b, e)| (n.as_str(), b.clone(), *e)).collect();
        tenants.write("acme.toml", &(tenant_header("acme", ACME, "") + &entries(&tenants, &models)));
        if pinned {
            // A pinned model never unloads, so an idle TTL beside it is a mistake, said at start.
            let contradiction = Tenants::new();
            let mut acme = tenant_header("acme", ACME, "") + &entries(&contradiction, &models[..1]);
            acme += "idle_unload_s = 5\n";
            contradiction.write("acme.toml", &acme);
            let data = tempfile::tempdir().expect("tmp");
            let log = Server::start_in(contradiction.path(), data.path(), &[]).err().expect("refused");
            assert!(log.contains("resident = \"always\" never unloads; drop idle_unload_s"), "{log}");
        }
        let server = Server::start(tenants.path(), &["--model-memory", BUDGET_FOR_TWO]);
        // The third model made room at start: two are resident.
        resident_becomes(&server, 2.0).await;
        for round in 0..4 {
            for (i, model) in ["m0", "m1", "m2"].into_iter().enumerate() {
                assert_eq!(lookup(&server, model).await, i as f32 + 1.0, "round {round}: {model} answered");
            }
        }
        let budget = server.metric("sluice_device_memory_budget_bytes{device=\"cpu\"}").await;
        assert!(server.metric("sluice_device_memory_used_bytes{device=\"cpu\"}").await <= budget);
        resident_becomes(&server, 2.0).await;
        let evicted = [evictions(&server, "m0").await, evictions(&server, "m1").await, evictions(&server, "m2").await];
        if pinned {
            // m0 stays; m1 and m2 take turns in the room left: one eviction at start, then
            // two a round.
            assert_eq!(evicted, [0.0, 5.0, 4.0], "evictions of m0, m1, m2");
        } else {
            // Round robin over three in room for two: every request evicts the least
            // recently used (m0 at start, then each in turn).
            assert_eq!(evicted, [5.0, 4.0, 4.0], "evictions of m0, m1, m2");
        }
    }
}

/// Send a request to the slow model `a` (not resident) and return once it has loaded for it
/// and its batch runs; the request's status, answer and when it came.
async fn slow_request_loading_a(server: &Server) -> tokio::task::JoinHandle<(u16, Value, Instant)> {
    let request = json!({ "inputs": [
        { "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0] },
        { "name": "i", "shape": [1], "datatype": "INT64", "data": [0] },
    ] });
    let (base, started) = (server.base.clone(), Instant::now());
    let in_flight = tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(format!("{base}/v2/models/a/infer"))
            .bearer_auth(ACME)
            .json(&request)
            .send()
            .await
            .expect("the slow request");
        (response.status().as_u16(), response.json::<Value>().await.expect("json"), Instant::now())
    });
    while !plain(&server.log()).contains("model loaded model=a") {
        assert!(started.elapsed() < Duration::from_secs(30), "a never loaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    in_flight
}

#[tokio::test]
async fn a_batch_in_flight_survives_an_eviction_attempt() {
    let tenants = Tenants::new();
    let slow = onnx::slow_weights_lookup(1.0, LOOKUP_WEIGHTS, 512, 400);
    let models = [
        ("a", slow, "[models.a.warmup]\nbatch_sizes = []\n"),
        ("b", onnx::weights_lookup(2.0, LOOKUP_WEIGHTS), ""),
        ("c", onnx::weights_lookup(3.0, LOOKUP_WEIGHTS), ""),
    ];
    let quotas = "guest_deadline_ms = 120000";
    tenants.write("acme.toml", &(tenant_header("acme", ACME, quotas) + &entries(&tenants, &models)));
    let server = Server::start(tenants.path(), &["--model-memory", BUDGET_FOR_TWO]);
    assert_eq!(evictions(&server, "a").await, 1.0, "c made room at start");

    // Manifest models load in name order, so c evicted a at start. a, slow, loads on demand
    // (evicting b) and computes for seconds.
    let started = Instant::now();
    let in_flight = slow_request_loading_a(&server).await;
    // c is used after a's batch began, so a is the least recently used when b needs room:
    // busy, it stays, and c leaves instead.
    assert_eq!(lookup(&server, "c").await, 3.0);
    assert_eq!(lookup(&server, "b").await, 2.0);
    assert!(!in_flight.is_finished(), "the slow batch ran while b made room ({:?})", started.elapsed());
    let (code, body, _) = in_flight.await.expect("the slow request's task");
    assert_eq!(code, 200, "{body}");
    assert_eq!(f32s(&output(&body, "y")["data"]), [1.0]);
    assert_eq!(evictions(&server, "a").await, 1.0, "never evicted while its batch ran");
    assert_eq!(evictions(&server, "c").await, 1.0);
}

#[tokio::test]
async fn reloads_take_the_optimised_form_unless_it_changed_on_disk() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &(tenant_header("acme", ACME, "") + &model_entry("digits-mlp", &digits_model(), None)));
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &["--idle-unload-s", "1"]).expect("starts");
    let optimized: Vec<_> = std::fs::read_dir(data.path().join("optimized"))
        .expect("the optimised models")
        .map(|e| e.expect("entry").path())
        .collect();
    let expected = format!("onnxruntime-{}.onnx", sha256_file(&digits_model()));
    assert_eq!(optimized.len(), 1, "{optimized:?}");
    assert!(optimized[0].ends_with(&expected), "{optimized:?}");

    let (pixels, label) = heldout_digits()[0].clone();
    let x: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    let body = json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": x }] });
    for tampered in [false, true] {
        if tampered {
            std::fs::write(&optimized[0], b"not the model that was optimised").expect("overwriting it");
        }
        resident_becomes(&server, 0.0).await;
        let (code, answer) = server.infer("digits-mlp", ACME, &body).await;
        assert_eq!(code, 200, "{answer}");
        assert_eq!(i64s(&output(&answer, "label")["data"]), [label], "the same answer either way");
    }
    let log = plain(&server.log());
    assert_eq!(log.matches("optimised model changed on disk since it was written").count(), 1, "{log}");
}

#[tokio::test]
async fn a_tenant_cycling_its_models_evicts_only_its_own_within_its_cap() {
    // acme may hold one lookup model resident (16 MiB of a 20 MiB cap) and has three;
    // globex has one; the device has room for two.
    let tenants = Tenants::new();
    let acme_models: Vec<(&str, Vec<u8>, &str)> =
        (0..3).map(|i| (["m0", "m1", "m2"][i], onnx::weights_lookup(i as f32 + 1.0, LOOKUP_WEIGHTS), "")).collect();
    let acme = tenant_header("acme", ACME, "max_resident_model_mib = 20") + &entries(&tenants, &acme_models);
    tenants.write("acme.toml", &acme);
    let victim = [("victim", onnx::weights_lookup(9.0, LOOKUP_WEIGHTS), "")];
    tenants.write("globex.toml", &(tenant_header("globex", GLOBEX, "") + &entries(&tenants, &victim)));
    let admin = "lifecycle-admin";
    let server = Server::start(tenants.path(), &["--model-memory", BUDGET_FOR_TWO, "--admin-token", admin]);
    resident_becomes(&server, 2.0).await;

    // Every request of the cycling tenant succeeds; each makes room by evicting its own
    // previous model, so globex's idle model stays resident throughout.
    for round in 0..4 {
        for (i, model) in ["m0", "m1", "m2"].into_iter().enumerate() {
            assert_eq!(lookup(&server, model).await, i as f32 + 1.0, "round {round}: {model} answered");
        }
    }
    let (code, answer) = server.infer("victim", GLOBEX, &lookup_request()).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(f32s(&output(&answer, "y")["data"]), [9.0]);
    assert_eq!(evictions(&server, "victim").await, 0.0, "the other tenant's model never left");
    assert_eq!(state_of(&index(&server, GLOBEX).await, "victim"), ("READY", ""));
    // At start m1 and m2 each made room for themselves; then every request evicted the one before.
    let evicted = [evictions(&server, "m0").await, evictions(&server, "m1").await, evictions(&server, "m2").await];
    assert_eq!(evicted, [5.0, 5.0, 4.0], "evictions of m0, m1, m2");

    // A load the tenant asks for is held to the cap the same way.
    let (code, body) = server.post_raw("/v2/repository/models/m0/load", Some(ACME), Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    let acme_index = index(&server, ACME).await;
    assert_eq!(state_of(&acme_index, "m0"), ("READY", ""));
    assert_eq!(state_of(&acme_index, "m2"), ("READY", "not resident; the next request loads it"));
    assert_eq!(evictions(&server, "victim").await, 0.0);

    // Weights larger than the whole cap are refused at upload, before anything loads.
    let big = onnx::weights_lookup(4.0, 6 << 20);
    let (code, body) = server.send(reqwest::Method::PUT, "/control/v1/models/big", ACME, big).await;
    assert_eq!(code, 413, "{body}");
    let message = error_message(&body);
    assert!(
        message.contains("more than the tenant's whole 20 MiB of resident model memory (quota max_resident_model_mib)"),
        "{message}"
    );
    // And no admin lowers the cap below what one of the tenant's models takes.
    let quotas = json!({ "max_resident_model_mib": 8 }).to_string().into_bytes();
    let (code, body) = server.send(reqwest::Method::PUT, "/admin/v1/tenants/acme/quotas", admin, quotas).await;
    assert_eq!(code, 400, "{body}");
    let message = error_message(&body);
    assert!(message.contains("max_resident_model_mib = 8 is less than model 'm"), "{message}");
    assert!(message.contains("takes resident (16.0 MiB)"), "{message}");
    assert_eq!(evictions(&server, "victim").await, 0.0);
}

#[tokio::test]
async fn a_load_waits_for_the_tenants_busy_model_instead_of_evicting_it() {
    // Room in acme's cap for one of its two models; the slow one computes for seconds.
    let tenants = Tenants::new();
    let models = [
        ("a", onnx::slow_weights_lookup(1.0, LOOKUP_WEIGHTS, 512, 400), "[models.a.warmup]\nbatch_sizes = []\n"),
        ("b", onnx::weights_lookup(2.0, LOOKUP_WEIGHTS), ""),
    ];
    let quotas = "guest_deadline_ms = 120000\nmax_resident_model_mib = 20";
    tenants.write("acme.toml", &(tenant_header("acme", ACME, quotas) + &entries(&tenants, &models)));
    let server = Server::start(tenants.path(), &[]);
    let in_flight = slow_request_loading_a(&server).await;
    // b waits for a's batch to end, then a leaves for it: both answer.
    assert_eq!(lookup(&server, "b").await, 2.0);
    let b_answered = Instant::now();
    let (code, body, a_answered) = in_flight.await.expect("the slow request's task");
    assert_eq!(code, 200, "{body}");
    assert!(a_answered <= b_answered, "b was loaded only once a's batch ended");
    assert_eq!(evictions(&server, "a").await, 2.0, "at start for b, then for b again once idle");
}

async fn model_status(server: &Server, model: &str) -> Value {
    let (code, body) =
        server.send(reqwest::Method::GET, &format!("/control/v1/models/{model}"), ACME, Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    body
}

/// Poll the model's status until `done` holds (within 15 s).
async fn status_becomes(server: &Server, model: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let status = model_status(server, model).await;
        if done(&status) {
            return status;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "{model} never {what}: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_autoscaler_adds_an_instance_under_sustained_load_and_drops_it_when_idle() {
    let tenants = Tenants::new();
    let autoscale = "[models.busy.autoscale]\nmin_instances = 1\nmax_instances = 2\ntarget_queue_wait_ms = 5\n\
                     window_ms = 500\n";
    let models = [("busy", onnx::slow_compute(256, 20), autoscale)];
    tenants.write("acme.toml", &(tenant_header("acme", ACME, "") + &entries(&tenants, &models)));
    let server = Server::start(tenants.path(), &[]);
    assert_eq!(model_status(&server, "busy").await["instances"], 1, "it starts at min_instances");

    // Eight clients back to back keep one instance's queue from draining.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let request = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5] }] });
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (base, stop, request) = (server.base.clone(), stop.clone(), request.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut failures = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let url = format!("{base}/v2/models/busy/infer");
                    let response = client.post(url).bearer_auth(ACME).json(&request).send().await.expect("a request");
                    if response.status() != 200 {
                        failures.push(response.text().await.unwrap_or_default());
                    }
                }
                failures
            })
        })
        .collect();
    let scaled = status_becomes(&server, "busy", "scaled up", |status| status["instances"] == 2).await;
    let up = &scaled["events"][0];
    assert_eq!(
        (up["action"].as_str(), &up["instances_before"], &up["instances_after"]),
        (Some("scale_up"), &json!(1), &json!(2))
    );
    assert!(up["reason"].as_str().expect("a reason").contains("more than the 5 ms target"), "{up}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for client in clients {
        assert_eq!(client.await.expect("a client"), Vec::<String>::new(), "every request answered 200");
    }

    // Idle, it goes back to the minimum, and stays resident.
    let idle = status_becomes(&server, "busy", "scaled down", |status| status["instances"] == 1).await;
    let down = idle["events"].as_array().expect("events").last().expect("an event").clone();
    assert_eq!(down["action"], "scale_down", "{idle}");
    assert!(down["reason"].as_str().expect("a reason").contains("below 30%"), "{down}");
    assert_eq!(idle["state"], "READY");
    let scalings = "sluice_model_scalings_total{backend=\"onnxruntime\",direction=";
    assert_eq!(server.metric(&format!("{scalings}\"up\",model=\"busy\"}}")).await, 1.0);
    assert_eq!(server.metric(&format!("{scalings}\"down\",model=\"busy\"}}")).await, 1.0);
    assert_eq!(server.metric("sluice_model_instances{backend=\"onnxruntime\",model=\"busy\"}").await, 1.0);
    assert!(server.metric("sluice_model_load_seconds_count{backend=\"onnxruntime\",reason=\"scale-up\"}").await >= 1.0);

    // Bounds are checked at start.
    let bad = Tenants::new();
    let wrong = "[models.busy.autoscale]\nmin_instances = 3\nmax_instances = 2\n";
    bad.write(
        "acme.toml",
        &(tenant_header("acme", ACME, "") + &entries(&bad, &[("busy", onnx::slow_compute(8, 1), wrong)])),
    );
    let data = tempfile::tempdir().expect("tmp");
    let log = Server::start_in(bad.path(), data.path(), &[]).err().expect("refused");
    assert!(log.contains("autoscale needs 1 <= min_instances <= max_instances <= 64"), "{log}");
}
