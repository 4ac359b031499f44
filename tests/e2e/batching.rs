//! Cross-tenant batching: requests of several tenants for the same weights share batches,
//! batched outputs equal unbatched ones, and one tenant's bad input never touches another's.

use serde_json::{Value, json};

use sluice::telemetry::metrics::names;

use crate::metrics::Scrape;
use crate::support::*;

const ACME: &str = "test-key-acme";
const GLOBEX: &str = "test-key-globex";

/// Two tenants with the same digits weights (one resident copy, one queue) that waits
/// `delay_ms` for requests to batch.
fn tenants_waiting(delay_ms: u64) -> Tenants {
    let tenants = Tenants::new();
    for (id, key, weight) in [("acme", ACME, 1), ("globex", GLOBEX, 2)] {
        let mut manifest = tenant_header(id, key, &format!("compute_weight = {weight}"));
        manifest += &model_entry("digits-mlp", &digits_model(), None);
        manifest +=
            &format!("[models.digits-mlp.batching]\nmax_batch_size = 64\nmax_queue_delay_us = {}\n\n", delay_ms * 1000);
        tenants.write(&format!("{id}.toml"), &manifest);
    }
    tenants
}

fn tenants() -> Tenants {
    tenants_waiting(50)
}

fn rows(images: &[(Vec<u8>, i64)]) -> Value {
    let scaled: Vec<f32> = images.iter().flat_map(|(p, _)| p.iter().map(|&v| f32::from(v) / 255.0)).collect();
    json!({ "inputs": [{ "name": "X", "shape": [images.len(), 64], "datatype": "FP32", "data": scaled }] })
}

#[tokio::test]
async fn batched_outputs_equal_unbatched_outputs_across_tenants() {
    // Long enough a wait that the eight concurrent requests all reach the queue before it is cut.
    let tenants = tenants_waiting(300);
    let server = Server::start(tenants.path(), &[]);
    let scrape = Scrape::of(&server).await;
    assert_eq!(scrape.sum(names::RESIDENT_MODELS, &[]), 1.0, "one resident copy for both tenants' weights");
    let digits = heldout_digits();
    let requests: Vec<(&str, Value)> =
        (0..8).map(|i| (if i % 2 == 0 { ACME } else { GLOBEX }, rows(&digits[i * 3..i * 3 + 3]))).collect();

    // Alone: one request at a time, each its own batch of three rows.
    let mut alone = Vec::new();
    for (key, body) in &requests {
        let (status, response) = server.infer("digits-mlp", key, body).await;
        assert_eq!(status, 200, "{response}");
        alone.push(f32s(&output(&response, "probabilities")["data"]));
    }
    let before = Scrape::of(&server).await;
    assert_eq!((before.batches_up_to("4"), before.batches_up_to("+Inf")), (8.0, 8.0), "eight batches of three rows");

    // Together: all at once, so they share batches.
    let together =
        futures::future::join_all(requests.iter().map(|(key, body)| server.infer("digits-mlp", key, body))).await;
    for ((status, response), expected) in together.iter().zip(&alone) {
        assert_eq!(*status, 200, "{response}");
        let got = f32s(&output(response, "probabilities")["data"]);
        for (a, b) in got.iter().zip(expected) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-6), "batched {a} vs alone {b}");
        }
    }
    // Each tenant sent 12 rows: a batch of more than 12 holds rows of both.
    let after = Scrape::of(&server).await;
    let over_16 = (after.batches_up_to("+Inf") - after.batches_up_to("16"))
        - (before.batches_up_to("+Inf") - before.batches_up_to("16"));
    assert!(
        over_16 >= 1.0,
        "no batch held rows of both tenants: {:?}",
        (after.batches_up_to("16"), after.batches_up_to("+Inf"))
    );
    assert_eq!(after.sum(names::RESIDENT_MODELS, &[]), 1.0);
}

#[tokio::test]
async fn a_forged_shape_fails_alone_and_leaves_the_shared_batch_intact() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let digits = heldout_digits();
    let honest = rows(&digits[..2]);
    let (_, baseline) = server.infer("digits-mlp", GLOBEX, &honest).await;

    // Declares two rows but carries one row of data.
    let mut forged = rows(&digits[..1]);
    forged["inputs"][0]["shape"] = json!([2, 64]);
    let (forged_answer, honest_answer) =
        tokio::join!(server.infer("digits-mlp", ACME, &forged), server.infer("digits-mlp", GLOBEX, &honest));
    assert_eq!(forged_answer.0, 400, "{}", forged_answer.1);
    assert!(error_message(&forged_answer.1).contains("needs 128 values"), "{}", forged_answer.1);
    assert_eq!(honest_answer.0, 200, "{}", honest_answer.1);
    assert_eq!(output(&honest_answer.1, "probabilities")["data"], output(&baseline, "probabilities")["data"]);
}

#[tokio::test]
async fn a_request_whose_rows_fail_the_engine_fails_alone_and_leaves_the_shared_batch_served() {
    // Both tenants serve the same public weights: one resident copy, whose batches hold both
    // tenants' rows. One tenant sends an index past the weights, which fails any run it is in.
    let models = tempfile::tempdir().expect("a folder");
    let lookup = models.path().join("lookup.onnx");
    std::fs::write(&lookup, crate::onnx::rows_lookup(4)).expect("the model written");
    let tenants = Tenants::new();
    for (id, key) in [("acme", ACME), ("globex", GLOBEX)] {
        let mut manifest = tenant_header(id, key, "");
        manifest += &model_entry("lookup", &lookup, None);
        manifest += "[models.lookup.batching]\nmax_batch_size = 64\nmax_queue_delay_us = 300000\n\n";
        tenants.write(&format!("{id}.toml"), &manifest);
    }
    let server = Server::start(tenants.path(), &[]);
    let rows = |indices: &[i64]| json!({ "inputs": [{ "name": "i", "shape": [indices.len(), 1], "datatype": "INT64", "data": indices }] });
    let (honest, forged) = (rows(&[1, 2, 3, 0]), rows(&[7]));
    let before = Scrape::of(&server).await;
    assert_eq!(before.sum(names::RESIDENT_MODELS, &[]), 1.0, "one resident copy for both tenants' weights");
    for round in 0..3 {
        let ((code, body), (honest_code, honest_body)) =
            tokio::join!(server.infer("lookup", ACME, &forged), server.infer("lookup", GLOBEX, &honest));
        assert_eq!(honest_code, 200, "round {round}: {honest_body}");
        assert_eq!(f32s(&output(&honest_body, "y")["data"]), [10.0, 20.0, 30.0, 0.0]);
        assert_eq!(code, 500, "round {round}: {body}");
        let message = error_message(&body);
        assert!(message.starts_with("model 'lookup' failed:") && message.contains("out of"), "{message}");
    }
    // Four rows and one: each round's requests shared a batch of five.
    let after = Scrape::of(&server).await;
    let shared = (after.batches_up_to("+Inf") - after.batches_up_to("4"))
        - (before.batches_up_to("+Inf") - before.batches_up_to("4"));
    assert_eq!(shared, 3.0, "the two tenants' requests did not share batches");
}

#[tokio::test]
async fn a_tenant_over_its_concurrency_quota_gets_429_while_another_is_served() {
    let tenants = Tenants::new();
    let mut busy = tenant_header("busy", ACME, "max_concurrent_requests = 1\nguest_deadline_ms = 1500");
    busy += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("busy.toml", &busy);
    let mut calm = tenant_header("calm", GLOBEX, "");
    calm += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("calm.toml", &calm);
    let server = Server::start(tenants.path(), &[]);

    let looping = json!({ "inputs": [], "parameters": { "mode": "loop" } });
    let echo = json!({ "inputs": [], "parameters": { "mode": "echo" } });
    let (first, (second, other)) = tokio::join!(server.infer("hostile", ACME, &looping), async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let over_quota = server.infer("hostile", ACME, &echo).await;
        let other = server.infer("digits-mlp", GLOBEX, &rows(&heldout_digits()[..1])).await;
        (over_quota, other)
    });
    assert_eq!(first.0, 504, "{}", first.1);
    assert_eq!(second.0, 429, "{}", second.1);
    assert!(error_message(&second.1).contains("max_concurrent_requests"), "{}", second.1);
    assert_eq!(other.0, 200, "{}", other.1);
}

#[tokio::test]
async fn a_burst_far_above_capacity_is_shed_with_503_and_the_server_keeps_answering() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", ACME, "max_concurrent_requests = 512");
    manifest += &model_entry("magika-v3", &magika_model(), Some("tract"));
    manifest += "[models.magika-v3.batching]\nmax_batch_size = 1\nmax_queue_size = 2\n\n";
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);

    let row: Vec<i32> = (0..2048).map(|i| i * 7 % 256).collect();
    let request = json!({ "inputs": [{ "name": "bytes", "shape": [1, 2048], "datatype": "INT32", "data": row }] });
    let burst = futures::future::join_all((0..64).map(|_| server.infer("magika-v3", ACME, &request))).await;
    let shed: Vec<&(u16, Value)> = burst.iter().filter(|(status, _)| *status == 503).collect();
    assert!(burst.iter().all(|(status, _)| [200, 503].contains(status)), "{burst:?}");
    assert!(!shed.is_empty(), "64 requests on a queue of 2 must shed some");
    assert!(error_message(&shed[0].1).contains("overloaded"), "{}", shed[0].1);
    assert!(burst.iter().any(|(status, _)| *status == 200), "the queue still serves what it admitted");
    assert_eq!(server.get("/v2/health/ready", None).await.0, 200);
}

#[tokio::test]
async fn batches_are_cut_to_the_preferred_batch_size() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", ACME, "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += "[models.digits-mlp.batching]\nmax_batch_size = 64\nmax_queue_delay_us = 2000000\n";
    manifest += "preferred_batch_sizes = [4]\n\n";
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    let (_, config) = server.get("/v2/models/digits-mlp/config", Some(ACME)).await;
    assert_eq!(config["dynamic_batching"]["preferred_batch_size"], json!([4]), "{config}");

    let digits = heldout_digits();
    let requests: Vec<Value> = (0..8).map(|i| rows(&digits[i..=i])).collect();
    // Eight one-row requests with a 2 s delay: each batch leaves as soon as four rows wait.
    let started = std::time::Instant::now();
    let answers = futures::future::join_all(requests.iter().map(|body| server.infer("digits-mlp", ACME, body))).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "no batch waited for the delay");
    for (status, response) in &answers {
        assert_eq!(*status, 200, "{response}");
    }
    let (_, stats) = server.get("/v2/models/digits-mlp/stats", Some(ACME)).await;
    let model = &stats["model_stats"][0];
    assert_eq!((model["inference_count"].as_u64(), model["execution_count"].as_u64()), (Some(8), Some(2)), "{stats}");
}

#[tokio::test]
async fn a_busy_shared_model_serves_tenants_in_proportion_to_their_compute_weight() {
    use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
    use sluice::api::grpc::proto::{ModelInferRequest, model_infer_request};

    // Each request computes for a few hundred microseconds from 256 bytes: the model, not the
    // server's handling or this test's callers, is what the requests wait for (with a real
    // model's 64 KiB requests this machine's callers could not keep up), so both tenants'
    // requests are always queued and the queue decides whose runs next.
    const ROWS: usize = 64;
    let models = tempfile::tempdir().expect("a folder");
    let slow = models.path().join("slow-rows.onnx");
    std::fs::write(&slow, crate::onnx::slow_rows(256, 4)).expect("the model written");
    let tenants = Tenants::new();
    for (id, key, weight) in [("acme", ACME, 1), ("globex", GLOBEX, 3)] {
        let mut manifest = tenant_header(id, key, &format!("compute_weight = {weight}"));
        manifest += &model_entry("slow-rows", &slow, None);
        // One request fills a batch, so every batch is one tenant's and the queue decides whose.
        manifest += &format!("[models.slow-rows.batching]\nmax_batch_size = {ROWS}\nmax_queue_delay_us = 100\n\n");
        tenants.write(&format!("{id}.toml"), &manifest);
    }
    let server = Server::start(tenants.path(), &[]);
    let request = ModelInferRequest {
        model_name: "slow-rows".into(),
        inputs: vec![model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![ROWS as i64, 1],
            ..Default::default()
        }],
        raw_input_contents: vec![vec![0u8; ROWS * 4]],
        ..Default::default()
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    // Eight callers of each tenant keep the queue full.
    let callers = [ACME, GLOBEX].into_iter().flat_map(|key| std::iter::repeat_n(key, 8)).map(|key| {
        let (address, request) = (format!("http://{}", server.grpc), request.clone());
        tokio::spawn(async move {
            let mut client = GrpcInferenceServiceClient::connect(address).await.expect("connects");
            let mut served = 0u32;
            while std::time::Instant::now() < until {
                client.model_infer(authed(request.clone(), key)).await.expect("served");
                served += 1;
            }
            (key, served)
        })
    });
    let (mut acme, mut globex) = (0, 0);
    for caller in futures::future::join_all(callers).await {
        match caller.expect("caller") {
            (ACME, served) => acme += served,
            (_, served) => globex += served,
        }
    }
    let ratio = f64::from(globex) / f64::from(acme.max(1));
    assert!((2.0..=4.5).contains(&ratio), "weights 3:1 served {globex}:{acme} requests ({ratio:.2})");
}

#[tokio::test]
async fn an_urgent_request_goes_before_its_tenants_waiting_ones() {
    // A model that runs one request at a time, for ~90 ms on a 2-core machine: long enough that
    // a scrape of the metrics lands while the queue is long, even beside other tests (at 5 ms a
    // run the window was missed in CI).
    let tenants = Tenants::new();
    tenants.write("acme.toml", &tenant_header("acme", ACME, "guest_deadline_ms = 30000"));
    let server = Server::start(tenants.path(), &[]);
    let (code, body) =
        server.send(reqwest::Method::PUT, "/control/v1/models/slow", ACME, crate::onnx::slow_compute(1024, 8)).await;
    assert_eq!(code, 201, "{body}");
    let request = |parameters: Value| json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5] }], "parameters": parameters });
    assert_eq!(server.infer("slow", ACME, &request(json!({}))).await.0, 200, "warm");

    // Six requests at the default priority queue up; then one asks for priority 1.
    let call = |parameters: Value| {
        let server = &server;
        async move {
            let (status, body) = server.infer("slow", ACME, &request(parameters.clone())).await;
            assert_eq!(status, 200, "{body}");
            (parameters.get("priority").is_some(), std::time::Instant::now())
        }
    };
    let defaults = futures::future::join_all((0..6).map(|_| call(json!({}))));
    // Sent once five of them wait behind the one running (not after a fixed time: how long a
    // run takes is the machine's).
    let urgent = async {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let depth = server.metric("sluice_queue_depth{").await;
            if depth >= 4.0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the six requests never waited in the queue (depth {depth})");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        call(json!({ "priority": 1 })).await
    };
    let (mut finished, urgent) = futures::future::join(defaults, urgent).await;
    finished.push(urgent);
    finished.sort_by_key(|(_, at)| *at);
    let before = finished.iter().position(|(urgent, _)| *urgent).expect("the urgent request");
    assert!(before <= 2, "{before} default requests finished before the urgent one (at most the one running)");

    // A priority that is not a whole number is refused, naming the parameter.
    let (status, body) = server.infer("slow", ACME, &request(json!({ "priority": "soon" }))).await;
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).contains("priority"), "{body}");
}

#[tokio::test]
async fn a_tenant_keeps_its_own_batching_settings_on_weights_another_serves_otherwise() {
    // Acme's queue waits 400 ms for company; globex serves the same weights on the defaults.
    // Acme's manifest loads first, so a shared copy would be made on acme's settings.
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", ACME, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += "[models.digits-mlp.batching]\nmax_batch_size = 64\nmax_queue_delay_us = 400000\nmax_queue_size = 2\n\n";
    tenants.write("acme.toml", &acme);
    let globex = tenant_header("globex", GLOBEX, "") + &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("globex.toml", &globex);
    let server = Server::start(tenants.path(), &[]);
    let scrape = Scrape::of(&server).await;
    assert_eq!(scrape.sum(names::RESIDENT_MODELS, &[]), 2.0, "a copy for each tenant's settings");

    // Each tenant's config is its own.
    for (key, batch, delay) in [(GLOBEX, 32, 0), (ACME, 64, 400_000)] {
        let (code, config) = server.get("/v2/models/digits-mlp/config", Some(key)).await;
        assert_eq!(code, 200, "{config}");
        let found = (&config["max_batch_size"], &config["dynamic_batching"]["max_queue_delay_microseconds"]);
        assert_eq!(found, (&json!(batch), &json!(delay)), "{key}: {config}");
    }

    // Acme's lone call waits its 400 ms for company; globex's does not wait at all.
    let digits = heldout_digits();
    let timed = |key: &'static str| {
        let (server, body) = (&server, rows(&digits[..1]));
        async move {
            let started = std::time::Instant::now();
            let (code, answer) = server.infer("digits-mlp", key, &body).await;
            assert_eq!(code, 200, "{key}: {answer}");
            started.elapsed()
        }
    };
    assert!(timed(ACME).await >= std::time::Duration::from_millis(350), "acme's delay applies to acme");
    let mut globex_fastest = std::time::Duration::MAX;
    for _ in 0..3 {
        globex_fastest = globex_fastest.min(timed(GLOBEX).await);
    }
    assert!(globex_fastest < std::time::Duration::from_millis(200), "globex waited {globex_fastest:?} for company");

    // Acme's queue of two is full with acme's calls; globex's calls are not in it.
    let one = rows(&digits[..1]);
    let acme_calls = futures::future::join_all((0..4).map(|_| server.infer("digits-mlp", ACME, &one)));
    let globex_calls = futures::future::join_all((0..4).map(|_| server.infer("digits-mlp", GLOBEX, &one)));
    let (acme_answers, globex_answers) = tokio::join!(acme_calls, globex_calls);
    assert!(acme_answers.iter().any(|(code, _)| *code == 503), "acme's queue holds two: {acme_answers:?}");
    assert!(globex_answers.iter().all(|(code, _)| *code == 200), "{globex_answers:?}");
}
