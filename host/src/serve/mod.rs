//! `sluice serve`: load the registry, start the backends and the runtime, build the
//! serving state and answer OIP over HTTP until asked to stop.

mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

pub use state::{AppState, ServingState, TenantState};

use crate::nn::backend::{self, BackendKind, BackendSettings};
use crate::registry::Registry;
use crate::runtime::{Runtime, RuntimeSettings};

/// Settings of `sluice serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub http: SocketAddr,
    pub tenants_dir: PathBuf,
    pub data_dir: PathBuf,
    pub onnxruntime_library: Option<PathBuf>,
    /// Backend for models that pin none; `None` picks the best available.
    pub default_backend: Option<BackendKind>,
    pub backend_threads: usize,
    pub max_instances: u32,
    pub epoch_tick: Duration,
}

/// Build everything, bind the listener and serve until Ctrl-C / SIGTERM.
pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let state = build_state(&config).await?;
    let listener = TcpListener::bind(config.http)
        .await
        .with_context(|| format!("cannot listen on {}", config.http))?;
    let address = listener.local_addr()?;
    // Tests and scripts read this line to find the port.
    tracing::info!(http = %address, "sluice is serving the Open Inference Protocol over HTTP");
    println!("listening on http://{address}");
    axum::serve(listener, crate::api::http::router(Arc::new(state)))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("HTTP server failed")
}

/// Load the registry and build the serving state.
pub async fn build_state(config: &ServeConfig) -> anyhow::Result<ServingState> {
    let registry = Registry::load(&config.tenants_dir)
        .with_context(|| format!("cannot load tenants from {}", config.tenants_dir.display()))?;

    let backends = backend::available(&BackendSettings {
        onnxruntime_library: config.onnxruntime_library.clone(),
        threads: config.backend_threads,
    });
    for reason in &backends.unavailable {
        tracing::warn!("{reason}");
    }
    if backends.available.is_empty() {
        anyhow::bail!("no model backend is available: {:?}", backends.unavailable);
    }
    if let Some(kind) = config.default_backend
        && backends.get(kind).is_none()
    {
        anyhow::bail!("--backend {kind} was requested but is not available here");
    }

    let max_memory_mib = registry
        .tenants()
        .map(|t| t.quotas.guest_memory_mib)
        .max()
        .unwrap_or(64);
    let runtime = Runtime::new(RuntimeSettings {
        max_instances: config.max_instances,
        max_memory_bytes: usize::try_from(max_memory_mib << 20)
            .context("guest memory quota too large")?,
        epoch_tick: config.epoch_tick,
        cache_dir: config.data_dir.join("compiled"),
    })?;
    ServingState::build(registry, runtime, &backends, config.default_backend).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
}
