//! The two protocols `sluice perf` speaks, behind one small client.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tonic::transport::Channel;

use super::PerfConfig;
use super::report::Outcome;
use crate::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use crate::api::grpc::proto::model_infer_request::InferInputTensor;
use crate::api::grpc::proto::{ModelInferRequest, ModelMetadataRequest};
use crate::api::json::parse_infer_request;
use crate::oip::types::TensorLimits;

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
    Http { path: String, host: HeaderValue, content_type: &'static str, body: Bytes },
    Grpc(ModelInferRequest),
}

impl PreparedRequest {
    /// From an OIP JSON infer request body, or an HTTP app's body (`config.http_app`).
    pub fn new(config: &PerfConfig, body: Vec<u8>) -> anyhow::Result<Self> {
        Ok(match config.protocol {
            Protocol::Http if config.http_app.is_some() => {
                let below = config.http_app.as_deref().unwrap_or_default();
                let separator = if below.starts_with('/') { "" } else { "/" };
                let path = format!("/v2/apps/{}/http{separator}{below}", config.model);
                let host = HeaderValue::from_str(&config.address).context("the address is not a valid Host header")?;
                Self::Http { path, host, content_type: "application/octet-stream", body: body.into() }
            }
            Protocol::Http => {
                let version = config.version.as_ref().map(|v| format!("/versions/{v}")).unwrap_or_default();
                let path = format!("/v2/models/{}{version}/infer", config.model);
                let host = HeaderValue::from_str(&config.address).context("the address is not a valid Host header")?;
                Self::Http { path, host, content_type: "application/json", body: body.into() }
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
                    request.raw_input_contents.push(crate::oip::raw::encode(input.payload));
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
    Http(Arc<HttpPool>),
    Grpc(GrpcInferenceServiceClient<Channel>),
}

impl Client {
    pub async fn connect(config: &PerfConfig) -> anyhow::Result<Self> {
        Ok(match config.protocol {
            Protocol::Http => {
                Self::Http(Arc::new(HttpPool { address: config.address.clone(), idle: Mutex::default() }))
            }
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
            (Self::Http(pool), PreparedRequest::Http { path, host, content_type, body }) => {
                let mut call =
                    Request::post(path.as_str()).header(HOST, host.clone()).header(CONTENT_TYPE, *content_type);
                if let Some(value) = key.and_then(|k| HeaderValue::from_str(&format!("Bearer {k}")).ok()) {
                    call = call.header(AUTHORIZATION, value);
                }
                match call.body(Full::new(body.clone())) {
                    Ok(call) => match pool.send(call).await {
                        Ok(status) if status.is_success() => None,
                        Ok(status) => Some(status.as_u16().to_string()),
                        Err(label) => Some(label.to_string()),
                    },
                    Err(_) => Some("request".to_string()),
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

/// HTTP/1.1 keep-alive connections to one server, opened when none is idle and reused.
/// Open-loop load holds one per request in flight, so this is the load generator's hot path:
/// hyper's connections directly cost about half the CPU per request of reqwest's client.
pub struct HttpPool {
    address: String,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl HttpPool {
    /// Send one request and read its whole answer; the error is a short label.
    async fn send(&self, request: Request<Full<Bytes>>) -> Result<http::StatusCode, &'static str> {
        let idle = self.take_idle();
        let mut sender = match idle {
            Some(sender) => sender,
            None => self.connect().await?,
        };
        if sender.ready().await.is_err() {
            // The server closed it while idle (its keep-alive timeout): a fresh one.
            sender = self.connect().await?;
        }
        let response = sender.send_request(request).await.map_err(|_| "connection")?;
        let status = response.status();
        response.into_body().collect().await.map_err(|_| "body")?;
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(sender);
        Ok(status)
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, &'static str> {
        let stream = TcpStream::connect(&self.address).await.map_err(|_| "connection")?;
        // Small requests must leave at once, not wait on Nagle's algorithm for an ACK.
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|_| "connection")?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
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
    let inputs: Vec<WireInput> = inputs
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
            WireInput { name, shape, datatype, data }
        })
        .collect();
    Ok(serde_json::to_vec(&json!({ "inputs": inputs }))?)
}

/// An input as Triton's clients write it: name, shape and datatype before the data (the
/// server reads the data straight into the tensor when it knows them first).
#[derive(Serialize)]
struct WireInput {
    name: String,
    shape: Vec<u64>,
    datatype: String,
    data: Vec<Value>,
}
