//! What one request's store holds: a WASI context with nothing granted (no files, network,
//! environment or inherited stdio, clocks to the millisecond), the resource table, the
//! `wasi:nn` context, the limiter, the guest's log identity, and for HTTP apps the
//! `wasi:http` context with the outgoing hosts its tenant is granted (none by default). A
//! fresh store serves each request and is dropped after it, unless its tenant opted into
//! serial reuse ([`super::warm`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::sluice::tenant::log;
use super::limits::GuestLimiter;
use super::outgoing::OutgoingHttp;
use crate::nn::host::NnCtx;
use crate::telemetry::rate::TokenBucket;
use crate::telemetry::text::{cut, escape_controls};

/// Resources (WASI streams the guest keeps open) a reused instance may hold.
const MAX_TABLE_ENTRIES_KEPT: usize = 16;

/// Resources an HTTP app's call may hold at once (requests, responses, header maps, bodies,
/// streams, pollables, `wasi:nn` handles).
pub const MAX_HTTP_RESOURCES: usize = 512;
/// In-memory bytes of one `wasi:http` header map an HTTP app builds (wasmtime's default is
/// 128 KiB, which times the resources above would let one call hold 64 MiB of host memory).
pub const MAX_HTTP_FIELDS_BYTES: usize = 16 << 10;

/// Bytes of guest stderr kept, so a panic message can explain a trap.
const STDERR_CAPACITY: usize = 4096;

/// What a guest's clocks resolve: enough to time its own work, too coarse to time another
/// tenant's batch or a cache miss on the shared host (browsers cut their timers the same way
/// against timing side channels).
const CLOCK_RESOLUTION: Duration = Duration::from_millis(1);

fn coarse(time: Duration) -> Duration {
    let step = CLOCK_RESOLUTION.as_nanos();
    Duration::from_nanos((time.as_nanos() - time.as_nanos() % step) as u64)
}

/// The monotonic clock a guest reads: time since its request's store was made, in whole
/// milliseconds (it also hides how long the host has been up).
struct CoarseMonotonic {
    start: Instant,
}

impl HostMonotonicClock for CoarseMonotonic {
    fn resolution(&self) -> u64 {
        CLOCK_RESOLUTION.as_nanos() as u64
    }

    fn now(&self) -> u64 {
        coarse(self.start.elapsed()).as_nanos() as u64
    }
}

/// The wall clock a guest reads, in whole milliseconds.
struct CoarseWall;

impl HostWallClock for CoarseWall {
    fn resolution(&self) -> Duration {
        CLOCK_RESOLUTION
    }

    fn now(&self) -> Duration {
        coarse(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default())
    }
}

/// Who a guest's log lines are from, and what it may still log: at most `budget` bytes in
/// this request and what the tenant's per-second allowance (shared by its requests) holds.
pub struct GuestLog {
    pub tenant: String,
    pub app: String,
    pub version: String,
    pub budget: usize,
    pub allowance: Arc<TokenBucket>,
    dropped: u64,
}

impl GuestLog {
    pub fn new(tenant: String, app: String, version: String, budget: usize, allowance: Arc<TokenBucket>) -> Self {
        Self { tenant, app, version, budget, allowance, dropped: 0 }
    }
}

pub struct StoreState {
    wasi: WasiCtx,
    pub table: ResourceTable,
    pub nn: NnCtx,
    pub limiter: GuestLimiter,
    pub log: GuestLog,
    pub stderr: MemoryOutputPipe,
    http: WasiHttpCtx,
    pub outgoing: OutgoingHttp,
}

impl StoreState {
    pub fn new(nn: NnCtx, limiter: GuestLimiter, log: GuestLog) -> Self {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let wasi = WasiCtxBuilder::new()
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .monotonic_clock(CoarseMonotonic { start: Instant::now() })
            .wall_clock(CoarseWall)
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            nn,
            limiter,
            log,
            stderr,
            http: WasiHttpCtx::new(),
            outgoing: OutgoingHttp::denied(),
        }
    }

    /// Make this the store of an HTTP app's call: its outgoing grant, and caps on what
    /// `wasi:http` keeps in host memory for it (header maps: at most
    /// [`MAX_HTTP_RESOURCES`] resources of at most [`MAX_HTTP_FIELDS_BYTES`] each).
    pub(super) fn serve_http(&mut self, outgoing: OutgoingHttp) {
        self.outgoing = outgoing;
        self.table.set_max_capacity(MAX_HTTP_RESOURCES);
        self.http.set_field_size_limit(MAX_HTTP_FIELDS_BYTES);
    }

    /// Ready a parked instance's store for the next request of the same tenant and app
    /// version: its context, limits and log identity.
    pub(super) fn renew(&mut self, nn: NnCtx, limiter: GuestLimiter, log: GuestLog) {
        (self.nn, self.limiter, self.log) = (nn, limiter, log);
    }

    /// End the request: drop its context (and CPU turn) and its log; whether what is left
    /// may serve another request (see [`super::warm`]).
    pub(super) fn finish_for_reuse(&mut self) -> bool {
        let parked = self.nn.parked();
        let log = GuestLog::new(
            self.log.tenant.clone(),
            self.log.app.clone(),
            self.log.version.clone(),
            0,
            self.log.allowance.clone(),
        );
        let clean = self.nn.queue_failure.is_none()
            && !self.limiter.memory_refused
            && self.stderr.contents().is_empty()
            && !crate::nn::host::holds_resources(&mut self.table)
            && self.table.iter_mut().count() <= MAX_TABLE_ENTRIES_KEPT;
        self.renew(parked, GuestLimiter::new(self.limiter.memory_bytes), log);
        clean
    }

    /// At an epoch tick: end the guest's time slice when others wait for the CPU, returning
    /// the wait for its turn to come back.
    pub fn end_slice(&mut self) -> Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> {
        self.nn.end_slice()
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

impl WasiHttpView for StoreState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.outgoing }
    }
}

/// Longest guest log message kept; longer ones are cut.
const MAX_LOG_MESSAGE: usize = 4096;
/// What the server's log adds to a guest's line, charged to its log budgets.
const LOG_LINE_OVERHEAD: usize = 128;

impl log::Host for GuestLog {
    fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let message = cut(&message, MAX_LOG_MESSAGE);
        // A line costs its text and what the log adds to it (time, level, tenant, app).
        let cost = message.len() + LOG_LINE_OVERHEAD;
        if cost > self.budget || self.allowance.take(cost as f64, Instant::now()).is_err() {
            self.dropped += 1;
            return Ok(());
        }
        self.budget -= cost;
        // Control characters are escaped: a guest's text cannot start a line of its own.
        let message = escape_controls(message);
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

impl Drop for GuestLog {
    fn drop(&mut self) {
        if self.dropped > 0 {
            let (tenant, app, version, dropped) = (&self.tenant, &self.app, &self.version, self.dropped);
            tracing::warn!(
                target: "guest",
                tenant,
                app,
                version,
                dropped,
                "guest log lines dropped: over max_log_bytes_per_request or max_log_bytes_per_second"
            );
        }
    }
}
