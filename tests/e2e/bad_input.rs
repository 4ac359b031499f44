//! Bad inputs: each named case gets its precise status and message, and the server keeps
//! serving afterwards.

use serde_json::json;

use crate::support::*;

const KEY: &str = "test-key-acme";
const MAX_REQUEST_BYTES: usize = 64 * 1024;
const MAX_ELEMENTS: usize = 10_000;

struct Case {
    name: &'static str,
    path: &'static str,
    body: Vec<u8>,
    status: u16,
    message: &'static str,
}

fn case(name: &'static str, path: &'static str, body: serde_json::Value, status: u16, message: &'static str) -> Case {
    Case { name, path, body: serde_json::to_vec(&body).expect("json"), status, message }
}

fn x(shape: &[usize], datatype: &str, data: serde_json::Value) -> serde_json::Value {
    json!({ "inputs": [{ "name": "X", "shape": shape, "datatype": datatype, "data": data }] })
}

#[tokio::test]
async fn each_bad_input_gets_its_status_and_message() {
    let tenants = Tenants::new();
    let quotas = format!("max_request_bytes = {MAX_REQUEST_BYTES}\nmax_tensor_elements = {MAX_ELEMENTS}");
    let mut manifest = tenant_header("acme", KEY, &quotas);
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);

    let sixty_four = json!(vec![0.5f32; 64]);
    let cases = [
        Case {
            name: "malformed JSON",
            path: "/v2/models/digits-mlp/infer",
            body: b"{\"inputs\": [".to_vec(),
            status: 400,
            message: "malformed JSON request",
        },
        case(
            "wrong datatype for the model",
            "/v2/models/digits-mlp/infer",
            x(&[1, 64], "INT32", json!(vec![1; 64])),
            400,
            "input 'X' must be FP32, got INT32",
        ),
        case(
            "unknown datatype",
            "/v2/models/digits-mlp/infer",
            x(&[1, 64], "FLOAT32", sixty_four.clone()),
            400,
            "unknown datatype 'FLOAT32'",
        ),
        case(
            "shape and data length disagree",
            "/v2/models/digits-mlp/infer",
            x(&[1, 64], "FP32", json!([1.0, 2.0])),
            400,
            "needs 64 values",
        ),
        case(
            "shape the model cannot take",
            "/v2/models/digits-mlp/infer",
            x(&[1, 2], "FP32", json!([1.0, 2.0])),
            400,
            "input 'X' must have shape [-1, 64]",
        ),
        case("missing model input", "/v2/models/digits-mlp/infer", json!({ "inputs": [] }), 400, "missing input 'X'"),
        case(
            "element count over quota",
            "/v2/models/digits-mlp/infer",
            x(&[200, 64], "FP32", json!([])),
            400,
            "max_tensor_elements",
        ),
        Case {
            name: "body over the limit",
            path: "/v2/models/digits-mlp/infer",
            body: vec![b' '; MAX_REQUEST_BYTES + 1],
            status: 413,
            message: "max_request_bytes",
        },
        case(
            "unknown model",
            "/v2/models/nope/infer",
            x(&[1, 64], "FP32", sixty_four.clone()),
            404,
            "model 'nope' not found",
        ),
        case(
            "unknown app version",
            "/v2/models/digits/versions/7/infer",
            x(&[1, 64], "FP32", sixty_four.clone()),
            404,
            "version '7' of model 'digits' not found",
        ),
        case(
            "unknown plain model version",
            "/v2/models/digits-mlp/versions/2/infer",
            x(&[1, 64], "FP32", sixty_four.clone()),
            404,
            "version '2' of model 'digits-mlp' not found",
        ),
        case(
            "wrong datatype for the component",
            "/v2/models/digits/infer",
            json!({ "inputs": [{ "name": "image", "shape": [64], "datatype": "FP32", "data": sixty_four }] }),
            400,
            "expected UINT8",
        ),
        case(
            "image of the wrong size",
            "/v2/models/digits/infer",
            image_request(&[1; 10], &[10]),
            400,
            "expected a multiple of 64",
        ),
        case(
            "missing component input",
            "/v2/models/digits/infer",
            json!({ "inputs": [] }),
            400,
            "missing input 'image'",
        ),
    ];
    for case in cases {
        let (status, body) = server.post_raw(case.path, Some(KEY), case.body).await;
        assert_eq!(status, case.status, "{}: {body}", case.name);
        assert!(error_message(&body).contains(case.message), "{}: expected '{}' in {body}", case.name, case.message);
    }

    let (pixels, label) = &heldout_digits()[3];
    let (status, body) = server.infer("digits", KEY, &image_request(pixels, &[1, 64])).await;
    assert_eq!(status, 200, "still serving after bad inputs: {body}");
    assert_eq!(i64s(&output(&body, "label")["data"]), vec![*label]);
}
