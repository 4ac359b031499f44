//! What one request's store holds: a WASI context with nothing granted (no files, network,
//! environment or inherited stdio), the resource table, the `wasi:nn` context, the limiter,
//! and the guest's log identity. A fresh store serves each request and is dropped after it.

use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::sluice::tenant::log;
use super::limits::GuestLimiter;
use crate::nn::host::NnCtx;

/// Bytes of guest stderr kept, so a panic message can explain a trap.
const STDERR_CAPACITY: usize = 4096;

/// Who a guest's log lines are from.
pub struct GuestLog {
    pub tenant: String,
    pub app: String,
    pub version: String,
}

pub struct StoreState {
    wasi: WasiCtx,
    pub table: ResourceTable,
    pub nn: NnCtx,
    pub limiter: GuestLimiter,
    pub log: GuestLog,
    pub stderr: MemoryOutputPipe,
}

impl StoreState {
    pub fn new(nn: NnCtx, limiter: GuestLimiter, log: GuestLog) -> Self {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let wasi = WasiCtxBuilder::new()
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        Self { wasi, table: ResourceTable::new(), nn, limiter, log, stderr }
    }

    /// The last lines the guest wrote to stderr (a panic message, usually).
    pub fn stderr_tail(&self) -> String {
        let contents = self.stderr.contents();
        let text = String::from_utf8_lossy(&contents);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(2)..].join(" | ")
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// Longest guest log message kept; longer ones are cut.
const MAX_LOG_MESSAGE: usize = 4096;

impl log::Host for GuestLog {
    fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let mut message = message;
        if message.len() > MAX_LOG_MESSAGE {
            let mut cut = MAX_LOG_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let (tenant, app, version) = (&self.tenant, &self.app, &self.version);
        match level {
            log::Level::Trace => {
                tracing::trace!(target: "guest", tenant, app, version, "{message}")
            }
            log::Level::Debug => {
                tracing::debug!(target: "guest", tenant, app, version, "{message}")
            }
            log::Level::Info => tracing::info!(target: "guest", tenant, app, version, "{message}"),
            log::Level::Warn => tracing::warn!(target: "guest", tenant, app, version, "{message}"),
            log::Level::Error => {
                tracing::error!(target: "guest", tenant, app, version, "{message}")
            }
        }
        Ok(())
    }
}
