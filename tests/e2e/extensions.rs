//! Triton's model configuration and statistics extensions over HTTP and gRPC.

use serde_json::json;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::{DataType, ModelConfigRequest, ModelStatisticsRequest, ServerMetadataRequest};

use crate::support::*;

const KEY: &str = "test-key-acme";

#[tokio::test]
async fn config_and_statistics_describe_batching_count_requests_and_are_listed_as_extensions() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += "[models.digits-mlp.batching]\nmax_batch_size = 16\nmax_queue_delay_us = 200\ninstances = 2\n\n";
    manifest += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);

    let (status, config) = server.get("/v2/models/digits-mlp/config", Some(KEY)).await;
    assert_eq!(status, 200, "{config}");
    assert_eq!(config["max_batch_size"], 16);
    assert_eq!(config["input"], json!([{ "name": "X", "data_type": "TYPE_FP32", "dims": [64] }]));
    assert_eq!(config["output"][1], json!({ "name": "probabilities", "data_type": "TYPE_FP32", "dims": [10] }));
    assert_eq!(config["dynamic_batching"]["max_queue_delay_microseconds"], 200);
    assert_eq!(config["instance_group"][0]["count"], 2, "two execution instances");
    let (_, app_config) = server.get("/v2/models/digits/config", Some(KEY)).await;
    assert_eq!(
        (app_config["platform"].as_str(), app_config["max_batch_size"].as_i64()),
        (Some("sluice_wasm"), Some(0))
    );

    let two_rows =
        json!({ "inputs": [{ "name": "X", "shape": [2, 64], "datatype": "FP32", "data": vec![0.5f32; 128] }] });
    for _ in 0..3 {
        assert_eq!(server.infer("digits-mlp", KEY, &two_rows).await.0, 200);
    }
    let wrong = json!({ "inputs": [{ "name": "X", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.5] }] });
    assert_eq!(server.infer("digits-mlp", KEY, &wrong).await.0, 400);

    let (status, stats) = server.get("/v2/models/digits-mlp/stats", Some(KEY)).await;
    assert_eq!(status, 200, "{stats}");
    let model = &stats["model_stats"][0];
    assert_eq!((model["name"].as_str(), model["version"].as_str()), (Some("digits-mlp"), Some("1")));
    assert_eq!(model["inference_count"], 6, "3 requests of 2 rows");
    assert_eq!(model["execution_count"], 3);
    let counts = &model["inference_stats"];
    for (field, expected) in [("success", 3), ("fail", 1), ("queue", 3), ("compute_infer", 3)] {
        assert_eq!(counts[field]["count"], expected, "{field}: {counts}");
    }
    assert!(counts["compute_infer"]["ns"].as_u64().expect("ns") > 0);

    // The same over gRPC.
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let mut request = tonic::Request::new(ModelConfigRequest { name: "digits-mlp".into(), version: String::new() });
    request.metadata_mut().insert("authorization", format!("Bearer {KEY}").parse().expect("ascii"));
    let config = grpc.model_config(request).await.expect("config").into_inner().config.expect("config");
    assert_eq!((config.max_batch_size, config.input[0].data_type), (16, DataType::TypeFp32 as i32));
    assert_eq!(config.dynamic_batching.expect("dynamic batching").max_queue_delay_microseconds, 200);

    let mut request = tonic::Request::new(ModelStatisticsRequest { name: "digits-mlp".into(), version: String::new() });
    request.metadata_mut().insert("authorization", format!("Bearer {KEY}").parse().expect("ascii"));
    let stats = grpc.model_statistics(request).await.expect("statistics").into_inner();
    let model = &stats.model_stats[0];
    let inference = model.inference_stats.as_ref().expect("inference stats");
    assert_eq!((model.inference_count, model.execution_count), (6, 3));
    assert_eq!((inference.success.expect("success").count, inference.fail.expect("fail").count), (3, 1));

    let mut request = tonic::Request::new(ModelStatisticsRequest { name: "digits-mlp".into(), version: String::new() });
    request.metadata_mut().insert("authorization", "Bearer wrong".parse().expect("ascii"));
    assert_eq!(grpc.model_statistics(request).await.expect_err("bad key").code(), tonic::Code::Unauthenticated);

    // Server metadata names these extensions, the same over both protocols.
    let (_, metadata) = server.get("/v2", None).await;
    let listed: Vec<String> = serde_json::from_value(metadata["extensions"].clone()).expect("a list of names");
    for extension in ["model_configuration", "statistics", "model_repository", "binary_tensor_data", "schedule_policy"]
    {
        assert!(listed.iter().any(|name| name == extension), "{extension} not in {listed:?}");
    }
    let over_grpc = grpc.server_metadata(ServerMetadataRequest {}).await.expect("metadata").into_inner();
    assert_eq!(over_grpc.extensions, listed);

    // An app's statistics in the same shape (perf_analyzer finds the version whose queue
    // count rose): each request queued once and run once. Last: its guest calls digits-mlp.
    let image =
        json!({ "inputs": [{ "name": "image", "shape": [1, 64], "datatype": "UINT8", "data": vec![3u8; 64] }] });
    for _ in 0..2 {
        assert_eq!(server.infer("digits", KEY, &image).await.0, 200);
    }
    let (_, stats) = server.get("/v2/models/digits/stats", Some(KEY)).await;
    let app = &stats["model_stats"][0];
    assert_eq!((app["inference_count"].as_u64(), app["execution_count"].as_u64()), (Some(2), Some(2)), "{stats}");
    let counts = &app["inference_stats"];
    for field in ["success", "queue", "compute_input", "compute_infer", "compute_output"] {
        assert_eq!(counts[field]["count"], 2, "{field}: {counts}");
    }
    let ns = |field: &str| counts[field]["ns"].as_u64().expect("ns");
    assert!(ns("compute_infer") > 0 && ns("success") >= ns("queue") + ns("compute_infer"), "{counts}");
}
