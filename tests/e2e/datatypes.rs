//! Every datatype through ONNX Runtime as it was sent: an Identity model per type answers
//! each caller its own values, alone or stacked with other callers' into one batch (the
//! engine reads a batch's bytes in place, a large batch is stacked off the runtime, and large
//! outputs are split from the engine's memory).

use serde_json::{Value, json};

use crate::onnx::{self, GraphProto};
use crate::support::*;

const KEY: &str = "test-key-types";

/// Each OIP datatype with its ONNX element type.
const TYPES: [(&str, i32); 13] = [
    ("FP32", 1),
    ("UINT8", 2),
    ("INT8", 3),
    ("UINT16", 4),
    ("INT16", 5),
    ("INT32", 6),
    ("INT64", 7),
    ("BOOL", 9),
    ("FP16", 10),
    ("FP64", 11),
    ("UINT32", 12),
    ("UINT64", 13),
    ("BF16", 16),
];

/// `y` = `x`, both [N, `width`] of `elem_type`.
fn identity(elem_type: i32, width: i64) -> Vec<u8> {
    onnx::model(GraphProto {
        node: vec![onnx::node("Identity", &["x"], &["y"], Vec::new())],
        name: "identity".into(),
        initializer: Vec::new(),
        input: vec![onnx::value("x", elem_type, &[None, Some(width)])],
        output: vec![onnx::value("y", elem_type, &[None, Some(width)])],
        ..Default::default()
    })
}

/// A model's batching: batches of `rows` callers each, whatever the timing.
fn batches_of(model: &str, rows: usize) -> String {
    format!(
        "[models.{model}.batching]\nmax_batch_size = {rows}\nmax_queue_delay_us = 5000000\npreferred_batch_sizes = [{rows}]\n\n"
    )
}

/// Caller `caller`'s row of three values, exact in every datatype.
fn row(datatype: &str, caller: usize) -> Value {
    let base = (caller % 40) as i64;
    match datatype {
        "BOOL" => json!([caller.is_multiple_of(2), caller.is_multiple_of(3), true]),
        "FP32" | "FP64" | "FP16" | "BF16" => json!([base as f64 + 0.5, -(base as f64) - 0.25, 2.0]),
        "INT8" | "INT16" | "INT32" | "INT64" => json!([base, -base, 7]),
        _ => json!([base, base + 1, 7]),
    }
}

fn same_values(sent: &Value, answered: &Value) -> bool {
    let (Some(sent), Some(answered)) = (sent.as_array(), answered.as_array()) else { return false };
    sent.len() == answered.len()
        && sent.iter().zip(answered).all(|(a, b)| match (a.as_bool(), b.as_bool()) {
            (Some(a), Some(b)) => a == b,
            _ => a.as_f64().is_some() && a.as_f64() == b.as_f64(),
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_datatype_comes_back_as_sent_alone_or_stacked_with_other_callers() {
    each_caller_gets_its_own_values(|_| 3, 24).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wide_outputs_of_every_datatype_are_split_from_the_engines_memory_to_their_callers() {
    // 32 KiB a caller, batches of four (128 KiB): outputs from 64 KiB up stay in ONNX Runtime's
    // memory until each caller's rows are copied out of it.
    each_caller_gets_its_own_values(|datatype| 32 * 1024 / size_of(datatype), 8).await;
}

/// `callers` callers of each datatype's Identity model, whose rows are `width(datatype)` wide,
/// in batches of four: each is answered its own values.
async fn each_caller_gets_its_own_values(width: fn(&str) -> usize, callers: usize) {
    let models = tempfile::tempdir().expect("tmp");
    let tenants = Tenants::new();
    // The callers all arrive at once, beside the other tests on a 2-core machine: with the default
    // 2 s deadline, admission may rightly refuse some as too late to finish.
    let mut manifest = tenant_header("types", KEY, "max_concurrent_requests = 1000\nguest_deadline_ms = 30000");
    for (datatype, elem_type) in TYPES {
        let path = models.path().join(format!("{datatype}.onnx"));
        std::fs::write(&path, identity(elem_type, width(datatype) as i64)).expect("model");
        let name = datatype.to_lowercase();
        manifest += &model_entry(&name, &path, Some("onnxruntime"));
        manifest += &batches_of(&name, 4);
    }
    tenants.write("types.toml", &manifest);
    let server = std::sync::Arc::new(Server::start(tenants.path(), &[]));
    let mut calls = Vec::new();
    for (datatype, _) in TYPES {
        for caller in 0..callers {
            let server = server.clone();
            calls.push(tokio::spawn(async move {
                let values = row(datatype, caller);
                let values = values.as_array().expect("a row");
                let sent = Value::Array(values.iter().cycle().take(width(datatype)).cloned().collect());
                let shape = json!([1, width(datatype)]);
                let body = json!({ "inputs": [{ "name": "x", "shape": shape, "datatype": datatype, "data": sent }] });
                let (code, answer) = server.infer(&datatype.to_lowercase(), KEY, &body).await;
                assert_eq!(code, 200, "{datatype}, caller {caller}: {answer}");
                let y = output(&answer, "y");
                assert_eq!((&y["datatype"], &y["shape"]), (&json!(datatype), &shape), "{datatype}, caller {caller}");
                assert!(same_values(&sent, &y["data"]), "{datatype}, caller {caller}: not its own values");
            }));
        }
    }
    for call in calls {
        call.await.expect("a caller");
    }
    for (datatype, _) in TYPES {
        let (_, stats) = server.get(&format!("/v2/models/{}/stats", datatype.to_lowercase()), Some(KEY)).await;
        let model = &stats["model_stats"][0];
        let counts = (model["inference_count"].as_u64(), model["execution_count"].as_u64());
        assert_eq!(counts, (Some(callers as u64), Some(callers as u64 / 4)), "{datatype}: {stats}");
    }
}

/// Bytes an element of an OIP datatype takes.
fn size_of(datatype: &str) -> usize {
    match datatype {
        "BOOL" | "UINT8" | "INT8" => 1,
        "UINT16" | "INT16" | "FP16" | "BF16" => 2,
        "UINT32" | "INT32" | "FP32" => 4,
        _ => 8,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_of_large_rows_each_get_their_own_rows_back_batch_after_batch() {
    // 256 KB a row, and batches of eight callers (2 MiB): past the 1 MiB above which batches
    // are stacked off the runtime, into buffers kept for the next batch.
    const WIDTH: usize = 65536;
    let models = tempfile::tempdir().expect("tmp");
    let path = models.path().join("wide.onnx");
    std::fs::write(&path, identity(1, WIDTH as i64)).expect("model");
    let tenants = Tenants::new();
    let manifest =
        tenant_header("types", KEY, "") + &model_entry("wide", &path, Some("onnxruntime")) + &batches_of("wide", 8);
    tenants.write("types.toml", &manifest);
    let server = std::sync::Arc::new(Server::start(tenants.path(), &[]));
    for round in 0..3 {
        let callers: Vec<_> = (0..16)
            .map(|caller| {
                let server = server.clone();
                tokio::spawn(async move {
                    let mark = (round * 100 + caller) as f32;
                    let values: Vec<f32> = (0..WIDTH).map(|i| mark + (i % 7) as f32 / 8.0).collect();
                    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let header = json!({ "inputs": [{ "name": "x", "shape": [1, WIDTH], "datatype": "FP32",
                                                     "parameters": { "binary_data_size": raw.len() } }],
                                         "parameters": { "binary_data_output": true } });
                    let (answer, answered) = binary_both_ways(&server, "wide", &header, &raw).await;
                    assert_eq!(output(&answer, "y")["parameters"]["binary_data_size"], raw.len());
                    assert!(answered == raw, "round {round}, caller {caller}: another's rows");
                })
            })
            .collect();
        for caller in callers {
            caller.await.expect("a caller");
        }
    }
    let (_, stats) = server.get("/v2/models/wide/stats", Some(KEY)).await;
    let model = &stats["model_stats"][0];
    assert_eq!((model["inference_count"].as_u64(), model["execution_count"].as_u64()), (Some(48), Some(6)), "{stats}");
    // The last batch's buffer is kept for the next, in sight of the operator, then let go.
    let kept = server.metric("sluice_batch_buffer_bytes{").await;
    assert!(kept >= (8 * WIDTH * 4) as f64, "kept {kept} bytes");
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(server.metric("sluice_batch_buffer_bytes{").await, 0.0, "released a second after the last batch");
}

/// An infer call of binary inputs that asks for binary outputs: the answer's JSON and the bytes
/// after it, where its headers say (its length, and the JSON's).
async fn binary_both_ways(server: &Server, model: &str, header: &Value, raw: &[u8]) -> (Value, Vec<u8>) {
    let json = serde_json::to_vec(header).expect("json");
    let response = reqwest::Client::new()
        .post(format!("{}/v2/models/{model}/infer", server.base))
        .bearer_auth(KEY)
        .header("Inference-Header-Content-Length", json.len())
        .body([json.as_slice(), raw].concat())
        .send()
        .await
        .expect("POST reaches the server");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/octet-stream");
    let number = |name: &str| -> usize {
        let value = response.headers().get(name).unwrap_or_else(|| panic!("no {name}"));
        value.to_str().ok().and_then(|value| value.parse().ok()).unwrap_or_else(|| panic!("{name}: {value:?}"))
    };
    let (length, json_length) = (number("content-length"), number("inference-header-content-length"));
    let body = response.bytes().await.expect("the body");
    assert_eq!(body.len(), length, "the body is as long as its Content-Length");
    let answer = serde_json::from_slice(&body[..json_length]).expect("the JSON first");
    (answer, body[json_length..].to_vec())
}
