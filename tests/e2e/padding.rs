//! Padding rules: requests with sequences of different lengths share one batch when the
//! model's manifest declares a padding rule, and each gets exactly its unbatched answer.

use std::path::{Path, PathBuf};

use prost::Message;
use serde_json::{Value, json};
use tract_onnx::pb;

use crate::metrics::Scrape;
use crate::support::*;

const KEY: &str = "test-key-acme";
const OTHER_KEY: &str = "test-key-globex";
const FLOAT: i32 = 1;

fn tensor_info(name: &str, dims: &[&str]) -> pb::ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| pb::tensor_shape_proto::Dimension {
            value: Some(pb::tensor_shape_proto::dimension::Value::DimParam(d.to_string())),
            ..Default::default()
        })
        .collect();
    let tensor = pb::type_proto::Tensor { elem_type: FLOAT, shape: Some(pb::TensorShapeProto { dim }) };
    pb::ValueInfoProto {
        name: name.to_string(),
        r#type: Some(pb::TypeProto { value: Some(pb::type_proto::Value::TensorType(tensor)), ..Default::default() }),
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str, attribute: Vec<pb::AttributeProto>) -> pb::NodeProto {
    pb::NodeProto {
        op_type: op.to_string(),
        input: inputs.iter().map(|i| i.to_string()).collect(),
        output: vec![output.to_string()],
        name: output.to_string(),
        attribute,
        ..Default::default()
    }
}

/// A sequence model written here: `total` = Σ tokens·mask over the sequence (so padded
/// positions with mask 0 change nothing), `doubled` = tokens + tokens (one value per
/// position, cut back to each request's length).
fn sequence_model(dir: &Path) -> PathBuf {
    let ints = |name: &str, values: Vec<i64>| pb::AttributeProto {
        name: name.to_string(),
        r#type: pb::attribute_proto::AttributeType::Ints as i32,
        ints: values,
        ..Default::default()
    };
    let int = |name: &str, value: i64| pb::AttributeProto {
        name: name.to_string(),
        r#type: pb::attribute_proto::AttributeType::Int as i32,
        i: value,
        ..Default::default()
    };
    let graph = pb::GraphProto {
        name: "sequence".to_string(),
        node: vec![
            node("Mul", &["tokens", "mask"], "masked", vec![]),
            node("ReduceSum", &["masked"], "total", vec![ints("axes", vec![1]), int("keepdims", 0)]),
            node("Add", &["tokens", "tokens"], "doubled", vec![]),
        ],
        input: vec![tensor_info("tokens", &["N", "L"]), tensor_info("mask", &["N", "L"])],
        output: vec![tensor_info("total", &["N"]), tensor_info("doubled", &["N", "L"])],
        ..Default::default()
    };
    let model = pb::ModelProto {
        ir_version: 7,
        opset_import: vec![pb::OperatorSetIdProto { domain: String::new(), version: 11 }],
        producer_name: "sluice-tests".to_string(),
        graph: Some(graph),
        ..Default::default()
    };
    let path = dir.join("sequence.onnx");
    std::fs::write(&path, model.encode_to_vec()).expect("model written");
    path
}

fn request(rows: &[Vec<f32>]) -> Value {
    let length = rows[0].len();
    let tokens: Vec<f32> = rows.concat();
    json!({ "inputs": [
        { "name": "tokens", "shape": [rows.len(), length], "datatype": "FP32", "data": tokens },
        { "name": "mask", "shape": [rows.len(), length], "datatype": "FP32", "data": vec![1.0f32; tokens.len()] },
    ] })
}

#[tokio::test]
async fn sequences_of_different_lengths_share_a_batch_and_get_their_unbatched_answers() {
    let tenants = Tenants::new();
    let model = sequence_model(tenants.path());
    let mut manifest = tenant_header("acme", KEY, "");
    manifest += &model_entry("sequence", &model, None);
    manifest += "[models.sequence.batching]\nmax_batch_size = 16\nmax_queue_delay_us = 300000\n\n";
    manifest += "[models.sequence.batching.padding]\naxis = 1\nvalue = 0\ninputs = [\"tokens\", \"mask\"]\n";
    manifest += "outputs = [\"doubled\"]\n\n";
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);

    let short = request(&[vec![1.5, 2.0, 3.25]]);
    let long = request(&[vec![0.5, 1.0, 2.0, 4.0], vec![-1.0, 1.0, -1.0, 0.125]]);
    let mut alone = Vec::new();
    for body in [&short, &long] {
        let (status, response) = server.infer("sequence", KEY, body).await;
        assert_eq!(status, 200, "{response}");
        alone.push(response);
    }
    assert_eq!(f32s(&output(&alone[0], "total")["data"]), vec![6.75]);
    assert_eq!(output(&alone[1], "doubled")["shape"], json!([2, 4]));

    let (_, before) = server.get("/v2/models/sequence/stats", Some(KEY)).await;
    let (short_answer, long_answer) =
        tokio::join!(server.infer("sequence", KEY, &short), server.infer("sequence", KEY, &long));
    let (_, after) = server.get("/v2/models/sequence/stats", Some(KEY)).await;
    let executions = |stats: &Value| stats["model_stats"][0]["execution_count"].as_u64().expect("count");
    assert_eq!(executions(&after) - executions(&before), 1, "lengths 3 and 4 ran as one padded batch");
    for ((status, together), alone) in [short_answer, long_answer].iter().zip(&alone) {
        assert_eq!(*status, 200, "{together}");
        for name in ["total", "doubled"] {
            assert_eq!(output(together, name)["shape"], output(alone, name)["shape"], "{name} cut back");
            assert_eq!(f32s(&output(together, name)["data"]), f32s(&output(alone, name)["data"]), "{name}");
        }
    }
}

#[tokio::test]
async fn a_long_sequence_is_not_padded_into_the_batch_of_another_tenants_short_ones() {
    // Two tenants serve the same weights with the same rule: one copy, one queue. Padded to
    // one tenant's sequence of 100,000, the other's rows of 3 would each take 33,000 times
    // their memory and compute.
    let tenants = Tenants::new();
    let model = sequence_model(tenants.path());
    for (id, key) in [("acme", KEY), ("globex", OTHER_KEY)] {
        let mut manifest = tenant_header(id, key, "");
        manifest += &model_entry("sequence", &model, None);
        manifest += "[models.sequence.batching]\nmax_batch_size = 16\nmax_queue_delay_us = 300000\n\n";
        manifest += "[models.sequence.batching.padding]\naxis = 1\nvalue = 0\ninputs = [\"tokens\", \"mask\"]\n";
        manifest += "outputs = [\"doubled\"]\n\n";
        tenants.write(&format!("{id}.toml"), &manifest);
    }
    let server = Server::start(tenants.path(), &[]);
    let short = request(&[vec![1.5, 2.0, 3.25], vec![1.0, 1.0, 1.0], vec![0.0, 2.0, 4.0], vec![8.0, 0.0, 0.5]]);
    let long = request(&[vec![0.25; 100_000]]);
    let before = Scrape::of(&server).await;
    let ((short_code, short_body), (long_code, long_body)) =
        tokio::join!(server.infer("sequence", OTHER_KEY, &short), server.infer("sequence", KEY, &long));
    assert_eq!((short_code, long_code), (200, 200), "{short_body} {long_body}");
    assert_eq!(f32s(&output(&short_body, "total")["data"]), [6.75, 3.0, 6.0, 8.5]);
    assert_eq!(f32s(&output(&long_body, "total")["data"]), [25_000.0]);
    // Four rows and one, in two batches: none of five rows.
    let after = Scrape::of(&server).await;
    let (all, up_to_four) = (
        after.batches_up_to("+Inf") - before.batches_up_to("+Inf"),
        after.batches_up_to("4") - before.batches_up_to("4"),
    );
    assert_eq!((all, up_to_four), (2.0, 2.0), "the long sequence shared the short ones' batch");
}

/// The log of a server that refused to start on the digits model with `padding` (the body of
/// its `[models.digits-mlp.batching.padding]` table).
fn refused_start_with(padding: &str) -> String {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &format!("[models.digits-mlp.batching.padding]\n{padding}\n");
    tenants.write("acme.toml", &manifest);
    let data = tempfile::tempdir().expect("tmp");
    Server::start_in(tenants.path(), data.path(), &[]).err().expect("the server must refuse to start")
}

#[test]
fn a_padding_rule_naming_a_fixed_dimension_refuses_to_start() {
    let log = refused_start_with("axis = 1\ninputs = [\"X\"]\n");
    assert!(log.contains("padding axis 1 of input 'X' is not a dynamic dimension"), "{log}");
}

#[test]
fn a_padding_value_that_is_not_a_number_refuses_to_start() {
    let log = refused_start_with("axis = 1\nvalue = nan\ninputs = [\"X\"]\n");
    assert!(
        log.contains("a padding rule needs axis 1 or more (0 is the batch), its inputs and a finite value"),
        "{log}"
    );
}
