//! The control API client: the tenant's key on every call, uploads with a progress bar,
//! and errors turned into what the user should do.

use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use super::{Connection, Output};

/// Bytes per upload chunk (one progress step).
const CHUNK: usize = 64 << 10;

pub struct ControlClient {
    http: reqwest::Client,
    server: String,
    key: String,
}

impl ControlClient {
    pub fn new(connection: &Connection) -> anyhow::Result<Self> {
        let key = connection.key.clone().context("no API key: pass --key or set SLUICE_KEY to your tenant's key")?;
        Self::with_token(&connection.server, key)
    }

    /// A client sending `token` as the bearer token (a tenant key or the admin token).
    pub fn with_token(server: &str, token: String) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).build()?;
        Ok(Self { http, server: server.trim_end_matches('/').to_string(), key: token })
    }

    /// Call `method path` with an optional JSON body; the JSON answer.
    pub async fn send(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let method = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut request = self.http.request(method, format!("{}{path}", self.server)).bearer_auth(&self.key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        self.answer(request).await
    }

    /// PUT `bytes` to `path`, showing progress on a terminal.
    pub async fn upload(&self, path: &str, bytes: Vec<u8>, output: Output) -> anyhow::Result<Value> {
        let bar = indicatif::ProgressBar::new(bytes.len() as u64);
        if output == Output::Json {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} [{bar:30}] {bytes_per_sec}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let length = bytes.len();
        let chunks: Vec<bytes::Bytes> = bytes.chunks(CHUNK).map(bytes::Bytes::copy_from_slice).collect();
        let progress = bar.clone();
        let stream = futures::stream::iter(chunks.into_iter().map(move |chunk| {
            progress.inc(chunk.len() as u64);
            Ok::<_, std::io::Error>(chunk)
        }));
        let request = self
            .http
            .put(format!("{}{path}", self.server))
            .bearer_auth(&self.key)
            .header(reqwest::header::CONTENT_LENGTH, length)
            .body(reqwest::Body::wrap_stream(stream));
        let answer = self.answer(request).await;
        bar.finish_and_clear();
        answer
    }

    async fn answer(&self, request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let response = request.send().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot reach {}: {e}; is `sluice serve` running there? (pass --server or set SLUICE_SERVER)",
                self.server
            )
        })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(body);
        }
        let message = body["error"].as_str().map_or_else(|| body.to_string(), str::to_string);
        let hint = match status.as_u16() {
            401 => " (check --key / SLUICE_KEY, or --admin-token for admin commands)",
            404 => " (check the app name: `sluice status APP` lists what exists)",
            409 => " (versions and model names are immutable: push under a new name)",
            413 => " (the file is over your tenant's upload quota)",
            _ => "",
        };
        anyhow::bail!("{status}: {message}{hint}")
    }
}
