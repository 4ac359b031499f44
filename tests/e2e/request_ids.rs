//! Request ids: the client's `x-request-id` (or a made-up one) comes back on every answer,
//! errors included, over HTTP and gRPC, and names every log line the request causes.

use serde_json::{Value, json};
use sluice::api::grpc::proto::ModelInferRequest;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;

use crate::support::*;

const KEY: &str = "test-key-acme";

fn echo() -> Value {
    json!({ "inputs": [{ "name": "x", "shape": [1], "datatype": "INT32", "data": [7] }], "parameters": { "mode": "echo" } })
}

fn start(extra: &[&str]) -> (Tenants, Server) {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &(tenant_header("acme", KEY, "") + &app_entry("hostile", &guest("hostile_guest"))));
    let server = Server::start(tenants.path(), extra);
    (tenants, server)
}

async fn post(server: &Server, model: &str, id: Option<&str>) -> reqwest::Response {
    let mut request =
        reqwest::Client::new().post(format!("{}/v2/models/{model}/infer", server.base)).bearer_auth(KEY).json(&echo());
    if let Some(id) = id {
        request = request.header("x-request-id", id);
    }
    request.send().await.expect("POST reaches the server")
}

fn returned_id(response: &reqwest::Response) -> String {
    response.headers()["x-request-id"].to_str().expect("ascii").to_string()
}

#[tokio::test]
async fn ids_come_back_on_answers_and_errors_and_name_the_guests_log_lines() {
    let (_tenants, server) = start(&[]);
    let answered = post(&server, "hostile", Some("trace-7f3a-1")).await;
    assert_eq!((answered.status().as_u16(), returned_id(&answered)), (200, "trace-7f3a-1".to_string()));
    let log = server.log();
    let line = log.lines().find(|l| l.contains("echoing 1 inputs")).unwrap_or_else(|| panic!("no guest line:\n{log}"));
    assert!(line.contains("trace-7f3a-1"), "{line}");

    let made_up = returned_id(&post(&server, "hostile", None).await);
    assert!(made_up.len() == 32 && made_up.bytes().all(|b| b.is_ascii_hexdigit()), "{made_up}");
    let not_found = post(&server, "nope", Some("trace-404")).await;
    assert_eq!((not_found.status().as_u16(), returned_id(&not_found)), (404, "trace-404".to_string()));
    let unsafe_id = returned_id(&post(&server, "hostile", Some(&"x".repeat(200))).await);
    assert_eq!(unsafe_id.len(), 32, "an overlong id is replaced");

    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("gRPC connects");
    let call = |model: &str| {
        let mut request = tonic::Request::new(ModelInferRequest { model_name: model.into(), ..Default::default() });
        request.metadata_mut().insert("authorization", format!("Bearer {KEY}").parse().expect("ascii"));
        request.metadata_mut().insert("x-request-id", "grpc-trace-9".parse().expect("ascii"));
        request
    };
    let failed = grpc.model_infer(call("nope")).await.expect_err("unknown model");
    assert_eq!(failed.metadata().get("x-request-id").and_then(|v| v.to_str().ok()), Some("grpc-trace-9"));
}

#[tokio::test]
async fn json_logs_carry_the_id_as_a_field() {
    let (_tenants, server) = start(&["--log-json"]);
    assert_eq!(post(&server, "hostile", Some("trace-json-1")).await.status(), 200);
    let log = server.log();
    let line = log.lines().find(|l| l.contains("echoing 1 inputs")).unwrap_or_else(|| panic!("no guest line:\n{log}"));
    let line: Value = serde_json::from_str(line).expect("a JSON log line");
    assert_eq!(line["span"]["request_id"], "trace-json-1", "{line}");
}
