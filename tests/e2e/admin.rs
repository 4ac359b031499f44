//! The platform admin API: tenants created, keys issued and revoked, quotas set while
//! serving, all effective at once and restored after a restart.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

const ADMIN: &str = "admin-secret";
const ACME: &str = "test-key-acme";

async fn admin(server: &Server, method: Method, path: &str, body: Value) -> (u16, Value) {
    let body = if body.is_null() { Vec::new() } else { body.to_string().into_bytes() };
    server.send(method, path, ADMIN, body).await
}

fn tenants() -> Tenants {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", ACME, "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("acme.toml", &manifest);
    tenants
}

fn digits_request() -> Value {
    let (pixels, _) = &heldout_digits()[0];
    let scaled: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": scaled }] })
}

#[tokio::test]
async fn tenants_keys_and_quotas_change_while_serving_and_survive_a_restart() {
    let tenants = tenants();
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &["--admin-token", ADMIN]).expect("starts");

    let (code, _) = server.send(Method::GET, "/admin/v1/tenants", ACME, Vec::new()).await;
    assert_eq!(code, 401, "a tenant key is not the admin token");
    let (code, body) = admin(&server, Method::POST, "/admin/v1/tenants", json!({ "id": "initech" })).await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = admin(&server, Method::POST, "/admin/v1/tenants", json!({ "id": "initech" })).await;
    assert_eq!(code, 409, "{body}");
    let (code, body) = admin(&server, Method::POST, "/admin/v1/tenants", json!({ "id": "Bad Id" })).await;
    assert_eq!(code, 400, "{body}");
    let too_big = json!({ "id": "huge", "quotas": { "guest_memory_mib": 1_000_000 } });
    let (code, body) = admin(&server, Method::POST, "/admin/v1/tenants", too_big).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("guest_memory_mib"), "{body}");

    let (code, issued) = admin(&server, Method::POST, "/admin/v1/tenants/initech/keys", Value::Null).await;
    assert_eq!(code, 201, "{issued}");
    let key = issued["key"].as_str().expect("key").to_string();
    let weights = std::fs::read(digits_model()).expect("weights");
    let (code, body) = server.send(Method::PUT, "/control/v1/models/digits", &key, weights).await;
    assert_eq!(code, 201, "the new tenant uploads with its new key: {body}");
    let (code, answer) = server.infer("digits", &key, &digits_request()).await;
    assert_eq!(code, 200, "{answer}");
    let (code, _) = server.infer("digits", ACME, &digits_request()).await;
    assert_eq!(code, 404, "another tenant does not see initech's model");

    let quotas = json!({ "max_concurrent_requests": 3, "compute_weight": 2 });
    let (code, body) = admin(&server, Method::PUT, "/admin/v1/tenants/initech/quotas", quotas).await;
    assert_eq!((code, &body["quotas"]["compute_weight"]), (200, &json!(2)), "{body}");
    // PATCH changes the quotas it names and keeps the others; a bad one changes nothing.
    let patch = json!({ "max_requests_per_second": 500 });
    let (code, body) = admin(&server, Method::PATCH, "/admin/v1/tenants/initech/quotas", patch).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (&body["quotas"]["max_requests_per_second"], &body["quotas"]["compute_weight"]),
        (&json!(500), &json!(2))
    );
    for bad in [json!({ "no_such_quota": 1 }), json!({ "compute_weight": "heavy" }), json!([1])] {
        let (code, body) = admin(&server, Method::PATCH, "/admin/v1/tenants/initech/quotas", bad.clone()).await;
        assert_eq!(code, 400, "{bad}: {body}");
    }
    let (code, _) = admin(&server, Method::PATCH, "/admin/v1/tenants/nobody/quotas", json!({})).await;
    assert_eq!(code, 404);
    let (_, listed) = admin(&server, Method::GET, "/admin/v1/tenants", Value::Null).await;
    let initech = listed.as_array().expect("tenants").iter().find(|t| t["id"] == "initech").expect("initech").clone();
    assert_eq!(
        (&initech["quotas"]["compute_weight"], &initech["quotas"]["max_requests_per_second"]),
        (&json!(2), &json!(500))
    );

    // Revoke acme's manifest key: it stops working at once.
    let (_, listed) = admin(&server, Method::GET, "/admin/v1/tenants", Value::Null).await;
    let acme = listed.as_array().expect("tenants").iter().find(|t| t["id"] == "acme").expect("acme").clone();
    let acme_key_id = acme["keys"][0].as_str().expect("a key id").to_string();
    let (code, body) =
        admin(&server, Method::DELETE, &format!("/admin/v1/tenants/acme/keys/{acme_key_id}"), Value::Null).await;
    assert_eq!(code, 200, "{body}");
    let (code, _) = server.infer("digits-mlp", ACME, &digits_request()).await;
    assert_eq!(code, 401, "a revoked key is refused");
    let (code, _) = admin(&server, Method::DELETE, "/admin/v1/tenants/acme/keys/0123456789abcdef", Value::Null).await;
    assert_eq!(code, 404);

    drop(server);
    let server = Server::start_in(tenants.path(), data.path(), &["--admin-token", ADMIN]).expect("restarts");
    let (code, answer) = server.infer("digits", &key, &digits_request()).await;
    assert_eq!(code, 200, "the created tenant, its key and its model are restored: {answer}");
    let (code, _) = server.infer("digits-mlp", ACME, &digits_request()).await;
    assert_eq!(code, 401, "the revoked manifest key stays revoked");
    let (_, listed) = admin(&server, Method::GET, "/admin/v1/tenants", Value::Null).await;
    let initech = listed.as_array().expect("tenants").iter().find(|t| t["id"] == "initech").expect("initech").clone();
    assert_eq!(initech["quotas"]["max_concurrent_requests"], 3, "{initech}");
}

#[tokio::test]
async fn without_an_admin_token_there_is_no_admin_api() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let (code, body) = admin(&server, Method::GET, "/admin/v1/tenants", Value::Null).await;
    assert_eq!(code, 404, "{body}");
    assert!(error_message(&body).contains("--admin-token"), "{body}");
}

#[tokio::test]
async fn allowing_raw_model_loads_takes_effect_at_once_both_ways_and_after_a_restart() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", ACME, "");
    manifest += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("acme.toml", &manifest);
    let data = tempfile::tempdir().expect("tmp");
    let args = ["--admin-token", ADMIN];
    let server = Server::start_in(tenants.path(), data.path(), &args).expect("starts");
    let load_bytes = json!({ "inputs": [], "parameters": { "mode": "load-bytes" } });
    let refused = |body: &Value| error_message(body).contains("not allowed for this tenant");
    let (code, body) = server.infer("hostile", ACME, &load_bytes).await;
    assert!(code == 500 && refused(&body), "the manifest does not allow raw loads: {body}");

    let allow = json!({ "allow_raw_model_load": true });
    let (code, body) = admin(&server, Method::PUT, "/admin/v1/tenants/acme/quotas", allow).await;
    assert_eq!(code, 200, "{body}");
    let (_, body) = server.infer("hostile", ACME, &load_bytes).await;
    // Allowed now; sixteen zero bytes are no ONNX graph: a model error, not a refusal.
    assert!(!refused(&body) && error_message(&body).contains("not an ONNX model"), "allowed at once: {body}");

    drop(server);
    let server = Server::start_in(tenants.path(), data.path(), &args).expect("restarts");
    let (_, body) = server.infer("hostile", ACME, &load_bytes).await;
    assert!(!refused(&body), "still allowed after a restart: {body}");

    let revoke = json!({ "allow_raw_model_load": false });
    let (code, body) = admin(&server, Method::PUT, "/admin/v1/tenants/acme/quotas", revoke).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = server.infer("hostile", ACME, &load_bytes).await;
    assert!(code == 500 && refused(&body), "revoked at once: {body}");
}

#[tokio::test]
async fn a_revoked_key_stops_the_requests_of_a_stream_it_opened() {
    use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
    let tenants = tenants();
    let server = Server::start(tenants.path(), &["--admin-token", ADMIN]);
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let (pixels, _) = &heldout_digits()[0];
    let request = || digits_grpc_request(pixels.iter().map(|&p| f32::from(p) / 255.0).collect());
    let (sender, requests) = futures::channel::mpsc::unbounded();
    sender.unbounded_send(request()).expect("queued");
    let mut answers = grpc.model_stream_infer(authed(requests, ACME)).await.expect("a stream").into_inner();
    let first = answers.message().await.expect("an answer").expect("not the end");
    assert_eq!(first.error_message, "", "served while the key is valid");

    let (_, listed) = admin(&server, Method::GET, "/admin/v1/tenants", Value::Null).await;
    let acme = listed.as_array().expect("tenants").iter().find(|t| t["id"] == "acme").expect("acme").clone();
    let key_id = acme["keys"][0].as_str().expect("a key id").to_string();
    let (code, body) =
        admin(&server, Method::DELETE, &format!("/admin/v1/tenants/acme/keys/{key_id}"), Value::Null).await;
    assert_eq!(code, 200, "{body}");
    // The stream was opened with the key; each request on it is checked as a call would be.
    sender.unbounded_send(request()).expect("queued");
    let after = answers.message().await.expect("an answer").expect("not the end");
    assert!(after.error_message.contains("key"), "a revoked key's stream is refused: {after:?}");
}

/// Guest memory slots are sized at start from the saved quotas of admin-managed tenants too,
/// not only from the manifests: a tenant given 128 MiB while a manifest tenant asked for as
/// much kept its quota after that manifest went, but its slots shrank to the manifests' 64 MiB.
/// On the build before, its component that starts with 100 MiB no longer served (before that
/// build, the server did not start), and no change to its quotas passed ("exceeds this server's
/// guest memory slots").
#[tokio::test]
async fn a_tenant_given_more_memory_than_the_manifests_ask_keeps_it_after_a_restart() {
    let data = tempfile::tempdir().expect("tmp");
    let big = with_memory_of(&std::fs::read(guest("echo_guest")).expect("component"), 100);
    let x = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0] }] });
    let roomy = Tenants::new();
    roomy.write("acme.toml", &tenant_header("acme", ACME, "guest_memory_mib = 128"));
    let key = {
        let server = Server::start_in(roomy.path(), data.path(), &["--admin-token", ADMIN]).expect("starts");
        let quotas = json!({ "guest_memory_mib": 128, "max_component_bytes": 100_000_000 });
        let (code, body) =
            admin(&server, Method::POST, "/admin/v1/tenants", json!({ "id": "initech", "quotas": quotas })).await;
        assert_eq!(code, 201, "{body}");
        let (code, issued) = admin(&server, Method::POST, "/admin/v1/tenants/initech/keys", Value::Null).await;
        assert_eq!(code, 201, "{issued}");
        let key = issued["key"].as_str().expect("key").to_string();
        let (code, body) = server.send(Method::PUT, "/control/v1/apps/big/versions/1", &key, big.clone()).await;
        assert_eq!(code, 201, "{body}");
        assert_eq!(server.infer("big", &key, &x).await.0, 200);
        key
    };
    // The manifest tenant that asked for 128 MiB now asks for the default.
    let plain = Tenants::new();
    plain.write("acme.toml", &tenant_header("acme", ACME, ""));
    let server = Server::start_in(plain.path(), data.path(), &["--admin-token", ADMIN]).expect("starts");
    let (code, body) = server.infer("big", &key, &x).await;
    assert_eq!(code, 200, "its component serves in the memory its quota gives: {body}");
    let patch = json!({ "max_requests_per_second": 100 });
    let (code, body) = admin(&server, Method::PATCH, "/admin/v1/tenants/initech/quotas", patch).await;
    assert_eq!(code, 200, "{body}");
}
