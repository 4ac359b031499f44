//! The two protocols `sluice perf` speaks, behind one small client.

use std::fmt;
use std::time::Instant;

use anyhow::Context;
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::PerfConfig;
use super::report::Outcome;
use crate::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use crate::api::grpc::proto::model_infer_request::InferInputTensor;
use crate::api::grpc::proto::{ModelInferRequest, ModelMetadataRequest};
use crate::api::json::parse_infer_request;
use crate::api::types::TensorLimits;

/// Which protocol to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Http => "HTTP",
            Self::Grpc => "gRPC",
        })
    }
}

/// The request every call sends, encoded once.
pub enum PreparedRequest {
    Http { url: String, body: Vec<u8> },
    Grpc(ModelInferRequest),
}

impl PreparedRequest {
    /// From an OIP JSON infer request body.
    pub fn new(config: &PerfConfig, body: Vec<u8>) -> anyhow::Result<Self> {
        Ok(match config.protocol {
            Protocol::Http => {
                let version = config.version.as_ref().map(|v| format!("/versions/{v}")).unwrap_or_default();
                let url = format!("http://{}/v2/models/{}{version}/infer", config.address, config.model);
                Self::Http { url, body }
            }
            Protocol::Grpc => {
                let parsed = parse_infer_request(&body, None, TensorLimits { max_elements: u64::MAX })
                    .map_err(|e| anyhow::anyhow!("the request file is not a valid OIP request: {e}"))?;
                let mut request = ModelInferRequest {
                    model_name: config.model.clone(),
                    model_version: config.version.clone().unwrap_or_default(),
                    ..Default::default()
                };
                for input in parsed.request.inputs {
                    request.raw_input_contents.push(crate::api::raw::encode(&input.payload));
                    request.inputs.push(InferInputTensor {
                        name: input.name,
                        datatype: input.datatype.name().to_string(),
                        shape: input.shape.iter().map(|&d| d as i64).collect(),
                        parameters: Default::default(),
                        contents: None,
                    });
                }
                Self::Grpc(request)
            }
        })
    }
}

/// A connected client (cheap to clone; clones share connections).
#[derive(Clone)]
pub enum Client {
    Http(reqwest::Client),
    Grpc(GrpcInferenceServiceClient<Channel>),
}

impl Client {
    pub async fn connect(config: &PerfConfig) -> anyhow::Result<Self> {
        Ok(match config.protocol {
            Protocol::Http => Self::Http(reqwest::Client::new()),
            Protocol::Grpc => Self::Grpc(
                GrpcInferenceServiceClient::connect(format!("http://{}", config.address))
                    .await
                    .with_context(|| format!("cannot connect to gRPC at {}", config.address))?
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
            ),
        })
    }

    /// Send one request and time it.
    pub async fn infer(&self, request: &PreparedRequest, key: Option<&str>) -> Outcome {
        let started = Instant::now();
        let error = match (self, request) {
            (Self::Http(client), PreparedRequest::Http { url, body }) => {
                let mut call = client.post(url).body(body.clone());
                if let Some(key) = key {
                    call = call.bearer_auth(key);
                }
                match call.send().await {
                    Ok(response) if response.status().is_success() => {
                        response.bytes().await.err().map(|_| "body".into())
                    }
                    Ok(response) => Some(response.status().as_u16().to_string()),
                    Err(_) => Some("connection".to_string()),
                }
            }
            (Self::Grpc(client), PreparedRequest::Grpc(message)) => {
                let mut call = tonic::Request::new(message.clone());
                if let Some(value) = key.and_then(|k| format!("Bearer {k}").parse().ok()) {
                    call.metadata_mut().insert("authorization", value);
                }
                client.clone().model_infer(call).await.err().map(|status| format!("{:?}", status.code()))
            }
            _ => Some("protocol mismatch".to_string()),
        };
        Outcome { started, latency: started.elapsed(), error }
    }
}

/// An OIP JSON request generated from the model's metadata: dynamic dimensions become 1,
/// numbers cycle through small values, BYTES elements are short strings.
pub async fn generated_request(config: &PerfConfig, key: Option<&str>) -> anyhow::Result<Vec<u8>> {
    let inputs: Vec<(String, String, Vec<i64>)> = match config.protocol {
        Protocol::Http => {
            let mut call = reqwest::Client::new().get(format!("http://{}/v2/models/{}", config.address, config.model));
            if let Some(key) = key {
                call = call.bearer_auth(key);
            }
            let metadata: Value = call.send().await?.error_for_status()?.json().await?;
            metadata["inputs"]
                .as_array()
                .context("model metadata has no inputs")?
                .iter()
                .map(|input| {
                    let shape = input["shape"].as_array().map(|s| s.iter().filter_map(Value::as_i64).collect());
                    (
                        input["name"].as_str().unwrap_or_default().to_string(),
                        input["datatype"].as_str().unwrap_or_default().to_string(),
                        shape.unwrap_or_default(),
                    )
                })
                .collect()
        }
        Protocol::Grpc => {
            let Client::Grpc(mut client) = Client::connect(config).await? else { unreachable!("gRPC client") };
            let mut call = tonic::Request::new(ModelMetadataRequest {
                name: config.model.clone(),
                version: config.version.clone().unwrap_or_default(),
            });
            if let Some(value) = key.and_then(|k| format!("Bearer {k}").parse().ok()) {
                call.metadata_mut().insert("authorization", value);
            }
            let metadata = client.model_metadata(call).await?.into_inner();
            metadata.inputs.into_iter().map(|i| (i.name, i.datatype, i.shape)).collect()
        }
    };
    let inputs: Vec<Value> = inputs
        .into_iter()
        .map(|(name, datatype, shape)| {
            let shape: Vec<u64> = shape.iter().map(|&d| if d < 0 { 1 } else { d as u64 }).collect();
            let count = shape.iter().product::<u64>() as usize;
            let data: Vec<Value> = (0..count)
                .map(|i| match datatype.as_str() {
                    "BYTES" => json!("sluice perf"),
                    "BOOL" => json!(i % 2 == 0),
                    "FP16" | "BF16" | "FP32" | "FP64" => json!((i % 7) as f64 / 7.0),
                    _ => json!(i % 7),
                })
                .collect();
            json!({ "name": name, "datatype": datatype, "shape": shape, "data": data })
        })
        .collect();
    Ok(serde_json::to_vec(&json!({ "inputs": inputs }))?)
}
