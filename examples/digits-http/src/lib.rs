//! The `digits` app as an HTTP app: a `wasi:http/proxy` component that imports `wasi:nn`,
//! written as for `wasmtime serve` (no Sluice SDK), so the same component runs there and on
//! Sluice, where its model calls are batched with every other tenant's.
//!
//! `POST /classify` with a body of raw 8×8 grayscale images, 64 bytes each (0 background to
//! 255 ink), answers JSON: per image its `label` and its `top3` labels with probabilities,
//! computed as the OIP `digits` component computes them (pixels scaled to [0, 1], the
//! tenant's `digits-mlp` model called once for the whole batch). `GET /` says how to call it.

use wasip2::exports::http::incoming_handler::Guest;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingRequest, Method, OutgoingBody, OutgoingResponse, ResponseOutparam,
};
use wasip2::io::streams::StreamError;

mod nn {
    wit_bindgen::generate!({
        path: "../../wit/deps/wasi-nn",
        world: "wasi:nn/ml",
    });
    pub use self::wasi::nn::*;
}

use nn::{errors, graph, tensor};

const PIXELS: usize = 64;
const CLASSES: usize = 10;
const TOP: usize = 3;
/// The largest body read: 1,024 images.
const MAX_BODY: usize = 1024 * PIXELS;
const MODEL: &str = "digits-mlp";

struct DigitsHttp;

impl Guest for DigitsHttp {
    fn handle(request: IncomingRequest, response_out: ResponseOutparam) {
        let (status, content_type, body) = answer(&request);
        respond(response_out, status, content_type, body.as_bytes());
    }
}

wasip2::http::proxy::export!(DigitsHttp);

/// Status, content type and body of the answer to `request`.
fn answer(request: &IncomingRequest) -> (u16, &'static str, String) {
    let path = request.path_with_query().unwrap_or_default();
    let path = path.split('?').next().unwrap_or_default();
    match (request.method(), path) {
        (Method::Get, "/") => (200, "text/plain", usage()),
        (Method::Post, "/classify") => match read_body(request).and_then(|images| classify(&images)) {
            Ok(json) => (200, "application/json", json),
            Err((status, message)) => (status, "application/json", error_json(&message)),
        },
        (_, "/" | "/classify") => (405, "application/json", error_json("method not allowed; see GET /")),
        _ => (404, "application/json", error_json("no such path; see GET /")),
    }
}

fn usage() -> String {
    "POST /classify with raw 8x8 grayscale images, 64 bytes each (0 background to 255 ink); \
     the answer is JSON with each image's label and top-3 labels with probabilities.\n"
        .to_string()
}

type Failure = (u16, String);

fn read_body(request: &IncomingRequest) -> Result<Vec<u8>, Failure> {
    let unreadable = |_| (400, "the request body could not be read".to_string());
    let body = request.consume().map_err(unreadable)?;
    let stream = body.stream().map_err(unreadable)?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(_)) => return Err(unreadable(())),
        }
        if bytes.len() > MAX_BODY {
            return Err((413, format!("at most {} images ({MAX_BODY} bytes) per request", MAX_BODY / PIXELS)));
        }
    }
    drop(stream);
    IncomingBody::finish(body);
    Ok(bytes)
}

/// Classify the images in `pixels`, 64 bytes each; the answer as JSON.
fn classify(pixels: &[u8]) -> Result<String, Failure> {
    if pixels.is_empty() || !pixels.len().is_multiple_of(PIXELS) {
        return Err((
            400,
            format!("the body has {} bytes; expected a multiple of {PIXELS} (8x8 grayscale per image)", pixels.len()),
        ));
    }
    let count = pixels.len() / PIXELS;
    let scaled: Vec<u8> = pixels.iter().flat_map(|&p| (f32::from(p) / 255.0).to_le_bytes()).collect();

    let model_failed = |error: errors::Error| (500, format!("model '{MODEL}': {}", error.data()));
    let graph = graph::load_by_name(MODEL).map_err(model_failed)?;
    let context = graph.init_execution_context().map_err(model_failed)?;
    let input = tensor::Tensor::new(&[count as u32, PIXELS as u32], tensor::TensorType::Fp32, &scaled);
    let outputs = context.compute(vec![("X".to_string(), input)]).map_err(model_failed)?;
    let output = |name: &str, ty: tensor::TensorType| {
        outputs
            .iter()
            .find(|(n, t)| n == name && t.ty() == ty)
            .map(|(_, t)| t.data())
            .ok_or_else(|| (500, format!("model '{MODEL}' has no {ty:?} output '{name}'")))
    };
    let labels: Vec<i64> = output("label", tensor::TensorType::I64)?
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()))
        .collect();
    let probabilities: Vec<f32> = output("probabilities", tensor::TensorType::Fp32)?
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap_or_default()))
        .collect();
    if labels.len() != count || probabilities.len() != count * CLASSES {
        return Err((500, format!("model '{MODEL}' returned an unexpected output size")));
    }

    let predictions: Vec<String> = labels
        .iter()
        .zip(probabilities.chunks_exact(CLASSES))
        .map(|(label, row)| {
            let mut order: Vec<usize> = (0..CLASSES).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            let top: Vec<String> = order[..TOP]
                .iter()
                .map(|&class| format!("{{\"label\":{class},\"probability\":{}}}", row[class]))
                .collect();
            format!("{{\"label\":{label},\"top3\":[{}]}}", top.join(","))
        })
        .collect();
    Ok(format!("{{\"predictions\":[{}]}}\n", predictions.join(",")))
}

fn error_json(message: &str) -> String {
    let escaped: String = message
        .chars()
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c if c.is_control() => format!("\\u{:04x}", c as u32).chars().collect(),
            c => vec![c],
        })
        .collect();
    format!("{{\"error\":\"{escaped}\"}}\n")
}

fn respond(out: ResponseOutparam, status: u16, content_type: &str, body: &[u8]) {
    let headers = Fields::from_list(&[("content-type".to_string(), content_type.as_bytes().to_vec())]);
    let Ok(headers) = headers else {
        ResponseOutparam::set(out, Err(ErrorCode::InternalError(Some("bad response headers".to_string()))));
        return;
    };
    let response = OutgoingResponse::new(headers);
    let _ = response.set_status_code(status);
    let Ok(outgoing) = response.body() else { return };
    ResponseOutparam::set(out, Ok(response));
    let Ok(stream) = outgoing.write() else { return };
    // A write takes at most 4096 bytes.
    for chunk in body.chunks(4096) {
        if stream.blocking_write_and_flush(chunk).is_err() {
            return;
        }
    }
    drop(stream);
    let _ = OutgoingBody::finish(outgoing, None);
}
