//! What requests cost: every answer carries `sluice_cost_us` (HTTP and gRPC), each batch's
//! compute is split over its requests by rows, and the costs add up to the compute the
//! server measured, per tenant in `GET /control/v1/usage` and the tenant compute metric.

use serde_json::{Value, json};
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::*;

use crate::support::*;

const ACME: &str = "cost-acme";
const GLOBEX: &str = "cost-globex";

async fn usage(server: &Server, key: &str) -> Value {
    let (code, body) = server.send(reqwest::Method::GET, "/control/v1/usage", key, Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    body
}

fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() <= 0.05 * b.abs().max(1e-9), "{what}: {a} vs {b}");
}

#[tokio::test]
async fn costs_split_batches_by_rows_and_add_up_to_the_measured_compute() {
    // Both tenants serve the same weights: one copy, one queue, batches across tenants.
    let tenants = Tenants::new();
    let batching = "[models.digits-mlp.batching]\nmax_batch_size = 16\nmax_queue_delay_us = 2000\n";
    for (id, key) in [("acme", ACME), ("globex", GLOBEX)] {
        let manifest = tenant_header(id, key, "") + &model_entry("digits-mlp", &digits_model(), None) + batching;
        tenants.write(&format!("{id}.toml"), &manifest);
    }
    let server = Server::start(tenants.path(), &[]);
    let (pixels, _) = heldout_digits()[0].clone();
    let x: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();

    // Eight clients a tenant, requests of 1 to 4 rows, at once.
    let mut clients = Vec::new();
    for key in [ACME, GLOBEX] {
        for client in 0..8usize {
            let (base, x) = (server.base.clone(), x.clone());
            clients.push(tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut costs = Vec::new();
                for i in 0..25usize {
                    let rows = 1 + (client + i) % 4;
                    let data: Vec<f32> = (0..rows).flat_map(|_| x.clone()).collect();
                    let body =
                        json!({ "inputs": [{ "name": "X", "shape": [rows, 64], "datatype": "FP32", "data": data }] });
                    let response = http
                        .post(format!("{base}/v2/models/digits-mlp/infer"))
                        .bearer_auth(key)
                        .json(&body)
                        .send()
                        .await
                        .expect("a request");
                    assert_eq!(response.status(), 200);
                    let answer: Value = response.json().await.expect("json");
                    costs.push(answer["parameters"]["sluice_cost_us"].as_f64().expect("a cost"));
                }
                (key, costs)
            }));
        }
    }
    let mut sums = std::collections::HashMap::new();
    for client in clients {
        let (key, costs) = client.await.expect("a client");
        assert!(costs.iter().all(|&cost| cost > 0.0), "every answer has a cost: {costs:?}");
        *sums.entry(key).or_insert(0.0) += costs.iter().sum::<f64>();
    }

    // A gRPC answer has its cost too, as a double.
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let response = grpc.model_infer(authed(digits_grpc_request(x.clone()), ACME)).await.expect("infer").into_inner();
    let cost = match response.parameters.get("sluice_cost_us").and_then(|p| p.parameter_choice.clone()) {
        Some(infer_parameter::ParameterChoice::DoubleParam(cost)) => cost,
        other => panic!("no cost: {other:?}"),
    };
    assert!(cost > 0.0);
    *sums.entry(ACME).or_insert(0.0) += cost;

    // Compute charged to the tenants is the compute the server measured; each tenant's
    // answers add up to its usage, and its usage to its compute counter.
    let measured = server.metric("sluice_compute_seconds_sum{backend=\"onnxruntime\",model=\"digits-mlp\"}").await;
    let (acme, globex) = (usage(&server, ACME).await, usage(&server, GLOBEX).await);
    assert_eq!((acme["requests"].as_u64(), globex["requests"].as_u64()), (Some(201), Some(200)));
    let charged = acme["compute_seconds"].as_f64().expect("f64") + globex["compute_seconds"].as_f64().expect("f64");
    assert!(measured > 0.0);
    let batches = server.metric("sluice_batch_rows_count{backend=\"onnxruntime\",model=\"digits-mlp\"}").await;
    assert!(batches < 401.0, "requests shared batches ({batches} batches for 401 requests)");
    close(charged, measured, "compute charged vs measured");
    for (key, usage, tenant) in [(ACME, &acme, "acme"), (GLOBEX, &globex, "globex")] {
        close(sums[key], usage["cost_seconds"].as_f64().expect("f64") * 1e6, &format!("{tenant}: answers vs usage"));
        let series =
            format!("sluice_tenant_compute_seconds_total{{device=\"cpu\",model=\"digits-mlp\",tenant=\"{tenant}\"}}");
        let counter = server.metric(&series).await;
        close(counter, usage["compute_seconds"].as_f64().expect("f64"), &format!("{tenant}: metric vs usage"));
        assert!(usage["cpu_seconds"].as_f64().expect("f64") > 0.0, "{usage}");
    }
    // Each tenant sees its own usage only.
    assert_eq!(acme["tenant"], "acme");
    assert_eq!(globex["tenant"], "globex");
}
