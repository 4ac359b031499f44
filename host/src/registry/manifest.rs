//! The tenant manifest schema (`tenants/*.toml`): what a platform admin declares for a
//! tenant. Parsing rejects unknown keys and invalid ids, naming the file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ids::{AppName, ModelName, ModelVersion, TenantId, VersionName};
use super::placement::{InstanceGroup, OnMissingDevice};

/// Which backend serves a model (a manifest may pin one; the engines are `nn::backend`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Onnxruntime,
    Tract,
}

impl BackendKind {
    pub const ALL: [Self; 2] = [Self::Onnxruntime, Self::Tract];
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Onnxruntime => "onnxruntime",
            Self::Tract => "tract",
        })
    }
}

/// The manifest schema version this build reads.
pub const SCHEMA_VERSION: u32 = 1;

/// One tenant's manifest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantManifest {
    /// Schema version; must be [`SCHEMA_VERSION`].
    pub version: u32,
    pub id: TenantId,
    /// SHA-256 (hex) of each API key; keys themselves are never stored.
    #[serde(default)]
    pub api_key_sha256: Vec<String>,
    #[serde(default)]
    pub quotas: Quotas,
    #[serde(default)]
    pub models: BTreeMap<ModelName, ModelManifest>,
    #[serde(default)]
    pub apps: BTreeMap<AppName, AppManifest>,
}

/// The platform manifest (`platform.toml`): models every tenant may load by name.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformManifest {
    pub version: u32,
    #[serde(default)]
    pub shared_models: BTreeMap<ModelName, ModelManifest>,
}

/// A tenant's limits.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Quotas {
    /// Linear memory a guest instance may use.
    pub guest_memory_mib: u64,
    /// Wall-clock time a request may take, guest and model calls together.
    pub guest_deadline_ms: u64,
    /// Largest request body.
    pub max_request_bytes: u64,
    /// Largest answer: bytes of output tensors a model or component may return to a client.
    pub max_response_bytes: u64,
    /// Largest element count of one tensor.
    pub max_tensor_elements: u64,
    /// Requests of this tenant in flight at once.
    pub max_concurrent_requests: u32,
    /// Requests a second the tenant may start (a token bucket with a second's worth of
    /// burst); 0: no rate limit.
    pub max_requests_per_second: u32,
    /// Whether guests may load models from raw bytes (`wasi:nn` `load`).
    pub allow_raw_model_load: bool,
    /// Largest model a guest may load from raw bytes.
    pub max_raw_model_bytes: u64,
    /// The tenant's share of shared model queues relative to other tenants (fair share).
    pub compute_weight: u32,
    /// Largest component the tenant may upload through the control API.
    pub max_component_bytes: u64,
    /// Largest model (ONNX weights) the tenant may upload through the control API.
    pub max_model_bytes: u64,
    /// Bytes of uploaded models and components the tenant may keep stored.
    pub max_stored_bytes: u64,
    /// Device memory the tenant's resident models may hold (each model's measured footprint,
    /// in full for each tenant serving it); past it, the tenant's own least recently used
    /// idle model leaves before another of its models loads.
    pub max_resident_model_mib: u64,
    /// Models the tenant may have (its manifest's and its uploads), each version counted.
    pub max_models: u32,
    /// Apps the tenant may have.
    pub max_apps: u32,
    /// Versions one app may have.
    pub max_versions_per_app: u32,
    /// Guest log bytes one request may write; past it, lines are dropped (and counted).
    pub max_log_bytes_per_request: u64,
    /// Guest log bytes a second over all the tenant's requests (bursts up to one second's worth).
    pub max_log_bytes_per_second: u64,
    /// Whether a component instance may serve more than one of the tenant's requests:
    /// `"fresh"` (the default: a new instance per request) or `"serial"` (after a clean call
    /// it may serve the tenant's next request of the same app version, so its memory carries
    /// over between the tenant's own requests; README's "Instance reuse").
    pub instance_reuse: InstanceReuse,
    /// Bytes of answers the tenant's response cache keeps for its models and apps that
    /// enable it (least recently used first out); 0: none kept.
    pub response_cache_mib: u64,
    /// Memory the drift statistics of all the tenant's models may hold: each feature's
    /// reference and sliding windows in full; features past it are not kept (and reported).
    pub drift_mib: u64,
    /// Hosts the tenant's HTTP apps may send requests to (`wasi:http/outgoing-handler`):
    /// `host` (any port) or `host:port`; none by default. A granted host is reached from the
    /// server's network, so grant only what the tenant may reach from there.
    pub outgoing_http_hosts: Vec<String>,
}

/// [`Quotas::instance_reuse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceReuse {
    #[default]
    Fresh,
    Serial,
}

impl Quotas {
    /// `max_resident_model_mib` in bytes.
    pub fn resident_model_bytes(&self) -> u64 {
        self.max_resident_model_mib.saturating_mul(1 << 20)
    }

    /// `drift_mib` in bytes.
    pub fn drift_bytes(&self) -> u64 {
        self.drift_mib.saturating_mul(1 << 20)
    }

    /// Check what no quota source may set (a manifest or the admin API alike).
    pub fn validate(&self) -> Result<(), String> {
        if self.max_concurrent_requests == 0
            || self.compute_weight == 0
            || self.guest_deadline_ms == 0
            || self.max_resident_model_mib == 0
        {
            return Err("max_concurrent_requests, compute_weight, guest_deadline_ms and max_resident_model_mib must \
                        be at least 1"
                .to_string());
        }
        if let Some(bad) = self.outgoing_http_hosts.iter().find(|entry| !is_host_entry(entry)) {
            return Err(format!(
                "outgoing_http_hosts entry '{}' is not a host or host:port (no scheme, path or user)",
                bad.chars().take(128).collect::<String>()
            ));
        }
        Ok(())
    }
}

/// A host name or address, with an optional port, and nothing else.
fn is_host_entry(entry: &str) -> bool {
    match entry.parse::<http::uri::Authority>() {
        Ok(authority) => !entry.is_empty() && !entry.contains('@') && authority.as_str() == entry,
        Err(_) => false,
    }
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            guest_memory_mib: 64,
            guest_deadline_ms: 2_000,
            max_request_bytes: 16 << 20,
            max_response_bytes: 16 << 20,
            max_tensor_elements: 4 << 20,
            max_concurrent_requests: 64,
            max_requests_per_second: 0,
            allow_raw_model_load: false,
            max_raw_model_bytes: 32 << 20,
            compute_weight: 1,
            max_component_bytes: 64 << 20,
            max_model_bytes: 256 << 20,
            max_stored_bytes: 1 << 30,
            max_resident_model_mib: 1024,
            max_models: 32,
            max_apps: 32,
            max_versions_per_app: 32,
            max_log_bytes_per_request: 64 << 10,
            max_log_bytes_per_second: 256 << 10,
            instance_reuse: InstanceReuse::Fresh,
            response_cache_mib: 16,
            drift_mib: 64,
            outgoing_http_hosts: Vec::new(),
        }
    }
}

/// A model: ONNX weights with their expected digest and serving settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelManifest {
    /// Path of the `.onnx` file (its version 1), relative to the manifest.
    pub path: PathBuf,
    /// Expected SHA-256 (hex) of the file; a mismatch refuses to start.
    pub sha256: String,
    /// `[models.X.versions.N]`: further versions' weights under the same name (N from 2),
    /// served with the same settings.
    #[serde(default)]
    pub versions: BTreeMap<ModelVersion, ModelWeights>,
    /// Which versions are served (Triton's `version_policy`); by default the newest.
    #[serde(default)]
    pub version_policy: VersionPolicy,
    /// Pin a backend; by default onnxruntime when its library is present, else tract.
    #[serde(default)]
    pub backend: Option<BackendKind>,
    #[serde(default)]
    pub batching: Batching,
    #[serde(default)]
    pub drift: Drift,
    #[serde(default)]
    pub breaker: BreakerSettings,
    /// Seconds without a call after which the model leaves memory (the next call loads it
    /// again); 0: never. Unset: the server's `--idle-unload-s`.
    #[serde(default)]
    pub idle_unload_s: Option<u64>,
    #[serde(default)]
    pub warmup: Warmup,
    /// `"always"`: pinned, never evicted to make room nor unloaded when idle (a tenant's
    /// explicit unload still applies). Default `"auto"`.
    #[serde(default)]
    pub resident: Resident,
    #[serde(default)]
    pub autoscale: Option<Autoscale>,
    /// `[[models.X.instances]]`: where its execution instances run (Triton's instance groups);
    /// none: `batching.instances` instances on the CPU.
    #[serde(default)]
    pub instances: Vec<InstanceGroup>,
    /// What happens when a device it names is missing: `"cpu"` (the default) runs those
    /// instances on the CPU, `"refuse"` refuses to load the model.
    #[serde(default)]
    pub on_missing_device: OnMissingDevice,
    /// Keep its answers in the tenant's response cache (Triton's `response_cache`).
    #[serde(default)]
    pub response_cache: bool,
}

/// One version's weights.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelWeights {
    /// Path of the `.onnx` file, relative to the manifest.
    pub path: PathBuf,
    /// Expected SHA-256 (hex) of the file; a mismatch refuses to start.
    pub sha256: String,
}

/// Which of a model's declared versions are loaded and served, as Triton's `version_policy`:
/// `{ latest = N }` (the newest N; the default is the newest one), `"all"`, or
/// `{ specific = [1, 3] }`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum VersionPolicy {
    /// The newest N.
    Latest(u32),
    All,
    Specific(Vec<ModelVersion>),
}

impl Default for VersionPolicy {
    fn default() -> Self {
        Self::Latest(1)
    }
}

impl VersionPolicy {
    /// The versions it serves out of those declared (ascending).
    pub fn select(&self, declared: &[ModelVersion]) -> Result<Vec<ModelVersion>, String> {
        let mut declared = declared.to_vec();
        declared.sort();
        match self {
            Self::Latest(0) => Err("version_policy latest needs at least 1 version".into()),
            Self::Latest(count) => {
                let count = usize::try_from(*count).unwrap_or(usize::MAX);
                Ok(declared.split_off(declared.len().saturating_sub(count)))
            }
            Self::All => Ok(declared),
            Self::Specific(wanted) if wanted.is_empty() => Err("version_policy specific names no version".into()),
            Self::Specific(wanted) => match wanted.iter().find(|v| !declared.contains(v)) {
                Some(missing) => Err(format!("version_policy names version {missing}, which is not declared")),
                None => Ok(declared.into_iter().filter(|v| wanted.contains(v)).collect()),
            },
        }
    }
}

/// `[models.X.autoscale]`: execution instances grow from `min_instances` to `max_instances`
/// while requests keep waiting longer than the target, and shrink back when mostly idle.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Autoscale {
    pub min_instances: usize,
    pub max_instances: usize,
    /// Add an instance when the oldest waiting request has waited longer than this through a
    /// whole window.
    #[serde(default = "default_target_queue_wait_ms")]
    pub target_queue_wait_ms: u64,
    /// How long a condition must hold before a change, and between changes.
    #[serde(default = "default_window_ms")]
    pub window_ms: u64,
    /// Remove an instance when they were busy less than this share of a window.
    #[serde(default = "default_scale_down_utilisation")]
    pub scale_down_utilisation: f64,
}

fn default_target_queue_wait_ms() -> u64 {
    10
}

fn default_window_ms() -> u64 {
    5_000
}

fn default_scale_down_utilisation() -> f64 {
    0.3
}

impl Autoscale {
    /// Check its bounds; `instances` is the model's `[batching]` count, which it replaces.
    pub fn validate(&self, instances: usize) -> Result<(), String> {
        if self.min_instances == 0 || self.min_instances > self.max_instances || self.max_instances > 64 {
            return Err("autoscale needs 1 <= min_instances <= max_instances <= 64".to_string());
        }
        if instances != 1 && instances != self.min_instances {
            return Err("autoscale starts at min_instances: drop batching.instances".to_string());
        }
        if !(100..=3_600_000).contains(&self.window_ms) || self.target_queue_wait_ms == 0 {
            return Err("autoscale needs window_ms between 100 and 3600000 and target_queue_wait_ms >= 1".to_string());
        }
        if !(self.scale_down_utilisation > 0.0 && self.scale_down_utilisation < 1.0) {
            return Err("autoscale needs scale_down_utilisation between 0 and 1".to_string());
        }
        Ok(())
    }
}

/// Whether a model may leave memory on its own.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Resident {
    /// Leaves when idle past its `idle_unload_s`, or to make room for another model.
    #[default]
    Auto,
    Always,
}

/// `[models.X.warmup]`: each loaded instance runs once per batch size on zeros shaped by its
/// signature before it serves, so the first request finds its plans built; `[]`: none.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Warmup {
    pub batch_sizes: Vec<usize>,
}

impl Default for Warmup {
    fn default() -> Self {
        Self { batch_sizes: vec![1] }
    }
}

/// `[models.X.breaker]`: after `failures` consecutive calls of one tenant that failed in the
/// model or timed out because of it (it answered nobody meanwhile, or ran over twice its usual
/// time), its calls are refused (503) for `cooldown_ms`, then one probe decides.
/// `failures = 0` turns it off.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSettings {
    pub failures: u32,
    pub cooldown_ms: u64,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self { failures: 5, cooldown_ms: 5_000 }
    }
}

/// `[models.X.drift]`: a `sample_rate` share of compute calls, at most `max_samples_per_second`
/// of them, feed the drift statistics (so a busy model costs no more than a quiet one); the
/// first `reference_rows` rows are the reference, the latest `window_rows` are compared with it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Drift {
    pub sample_rate: f64,
    pub max_samples_per_second: u32,
    pub reference_rows: usize,
    pub window_rows: usize,
    /// PSI from which drift is moderate.
    pub psi_moderate: f64,
    /// PSI from which drift is significant.
    pub psi_significant: f64,
}

impl Default for Drift {
    fn default() -> Self {
        Self {
            sample_rate: 1.0,
            max_samples_per_second: 100,
            reference_rows: 1000,
            window_rows: 1000,
            psi_moderate: 0.1,
            psi_significant: 0.25,
        }
    }
}

impl Drift {
    /// A rate from 0 (off) to 1, at least one sample a second, windows of 1 to 100,000 rows,
    /// 0 < moderate <= significant.
    pub fn is_valid(&self) -> bool {
        let rows = 1..=100_000;
        (0.0..=1.0).contains(&self.sample_rate)
            && self.max_samples_per_second >= 1
            && rows.contains(&self.reference_rows)
            && rows.contains(&self.window_rows)
            && self.psi_moderate > 0.0
            && self.psi_moderate <= self.psi_significant
    }

    /// The drift level of a PSI.
    pub fn level(&self, psi: f64) -> &'static str {
        if psi >= self.psi_significant {
            "significant"
        } else if psi >= self.psi_moderate {
            "moderate"
        } else {
            "none"
        }
    }

    /// Whether one call is sampled.
    pub fn sample(&self) -> bool {
        self.sample_rate >= 1.0 || (self.sample_rate > 0.0 && fastrand::f64() < self.sample_rate)
    }
}

/// Batching settings of a model's queue.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Batching {
    /// Most rows in one batch.
    pub max_batch_size: usize,
    /// Longest a request waits for others to join its batch (0: run with whatever is
    /// queued when the model is free; requests arriving during a run form the next batch).
    pub max_queue_delay_us: u64,
    /// Requests waiting before new ones are refused as overload.
    pub max_queue_size: usize,
    /// Execution instances: loaded copies of the model that run batches at once.
    pub instances: usize,
    /// Batch sizes the model runs best at (as Triton's `preferred_batch_size`): a batch is
    /// cut to the largest of them the waiting rows fill, and formed as soon as the largest
    /// fills; when none fills, as many rows as wait (up to `max_batch_size`) run.
    pub preferred_batch_sizes: Vec<usize>,
    /// Lets requests whose inputs differ along one axis share a batch (see `Padding`).
    pub padding: Option<Padding>,
}

/// A padding rule: the named inputs may differ in length along `axis` and are padded with
/// `value` to the longest in a batch; the named outputs are cut back to each request's
/// length. Declare it only for models that ignore padded positions (an attention mask).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Padding {
    /// The padded dimension; 1 or more (0 is the batch).
    pub axis: usize,
    /// What padded positions hold.
    #[serde(default)]
    pub value: f64,
    /// Inputs padded along `axis`.
    pub inputs: Vec<String>,
    /// Outputs cut back along `axis` to each request's length.
    #[serde(default)]
    pub outputs: Vec<String>,
}

impl Default for Batching {
    fn default() -> Self {
        Self {
            max_batch_size: 32,
            max_queue_delay_us: 0,
            max_queue_size: 1024,
            instances: 1,
            preferred_batch_sizes: Vec::new(),
            padding: None,
        }
    }
}

/// An app: a component with versions, one of them stable.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppManifest {
    /// The version that serves unpinned requests.
    pub stable: VersionName,
    pub versions: BTreeMap<VersionName, AppVersionManifest>,
    /// Declared inputs, reported by model metadata.
    #[serde(default)]
    pub inputs: Vec<TensorMetadata>,
    /// Declared outputs, reported by model metadata.
    #[serde(default)]
    pub outputs: Vec<TensorMetadata>,
    /// Canary and shadow traffic beside the stable version.
    #[serde(default)]
    pub traffic: TrafficManifest,
    /// How a canary is judged, promoted and rolled back.
    #[serde(default)]
    pub analysis: Analysis,
    /// Service-level objectives; none by default.
    #[serde(default)]
    pub slo: Option<SloManifest>,
    /// Another app or model of the tenant that answers instead while this app's model calls
    /// are refused (an open circuit, an overloaded queue, too little deadline left); its
    /// answer carries the response parameter `degraded`.
    #[serde(default)]
    pub fallback: Option<String>,
    /// Keep its answers in the tenant's response cache (Triton's `response_cache`).
    #[serde(default)]
    pub response_cache: bool,
}

/// `[apps.X.slo]`: availability (requests not failing with a server error) and, with
/// `latency_ms`, latency (answers within it) targets over a window of days.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SloManifest {
    /// Target fraction, e.g. 0.999.
    pub availability: f64,
    /// Latency threshold; without it there is no latency objective.
    pub latency_ms: Option<u64>,
    /// Target fraction of answers within `latency_ms`.
    pub latency_target: f64,
    pub window_days: u32,
}

impl Default for SloManifest {
    fn default() -> Self {
        Self { availability: 0.999, latency_ms: None, latency_target: 0.99, window_days: 30 }
    }
}

impl SloManifest {
    /// Targets strictly between 0 and 1 and a window of 1 to 90 days.
    pub fn is_valid(&self) -> bool {
        let target = |t: f64| t > 0.0 && t < 1.0;
        target(self.availability) && target(self.latency_target) && (1..=90).contains(&self.window_days)
    }

    /// Minutes the window spans.
    pub fn window_minutes(&self) -> u32 {
        self.window_days.saturating_mul(24 * 60)
    }
}

/// `[apps.X.analysis]`: every `interval_ms`, the canary's window is compared with stable's.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Analysis {
    pub interval_ms: u64,
    /// Canary requests a window needs before it can promote.
    pub min_requests: u64,
    /// How far the canary's error rate may exceed stable's (a fraction: 0.01 = one point).
    pub max_error_rate_increase: f64,
    /// How many times stable's p99 the canary's p99 may be.
    pub max_p99_ratio: f64,
    /// Canary weights (percent) to climb through; past the last, the canary becomes stable.
    pub steps: Vec<f64>,
}

impl Default for Analysis {
    fn default() -> Self {
        Self {
            interval_ms: 60_000,
            min_requests: 100,
            max_error_rate_increase: 0.01,
            max_p99_ratio: 1.5,
            steps: vec![10.0, 25.0, 50.0, 100.0],
        }
    }
}

impl Analysis {
    pub fn interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.interval_ms.max(1))
    }
}

/// `[apps.X.traffic]`: a canary taking `weight` percent of unpinned requests, a shadow
/// mirroring a `sample` fraction of them, and a header whose value keeps a caller on one
/// side of the split.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficManifest {
    pub canary: Option<CanaryManifest>,
    pub shadow: Option<ShadowManifest>,
    pub sticky_header: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryManifest {
    pub version: VersionName,
    /// Percent of unpinned requests, 0 to 100.
    pub weight: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowManifest {
    pub version: VersionName,
    /// Fraction of unpinned requests mirrored, 0 to 1.
    pub sample: f64,
}

/// One version of an app.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppVersionManifest {
    /// Path of the component `.wasm`, relative to the manifest.
    pub component: PathBuf,
    /// Model versions its `load-by-name` calls get (`models = { "digits-mlp" = 2 }`); a
    /// model it does not name: the newest version served.
    #[serde(default)]
    pub models: BTreeMap<ModelName, ModelVersion>,
}

/// A tensor as OIP metadata describes it.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TensorMetadata {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any text is a manifest or a parse error naming why; never a panic.
        #[test]
        fn any_text_parses_or_is_refused(text in "\\PC{0,300}") {
            let _ = toml::from_str::<TenantManifest>(&text);
        }

        /// Manifest-shaped text with random quota values: parsed exactly or refused.
        #[test]
        fn quotas_parse_exactly(memory in 0u64..1_000_000, rate in 0u32..100_000) {
            let text = format!("guest_memory_mib = {memory}\nmax_requests_per_second = {rate}\n");
            let quotas: Quotas = toml::from_str(&text).expect("valid quotas");
            prop_assert_eq!((quotas.guest_memory_mib, quotas.max_requests_per_second), (memory, rate));
        }
    }

    #[test]
    fn outgoing_hosts_are_hosts_with_an_optional_port_and_nothing_else() {
        let with = |hosts: &[&str]| Quotas {
            outgoing_http_hosts: hosts.iter().map(ToString::to_string).collect(),
            ..Quotas::default()
        };
        assert_eq!(with(&["api.example.com", "127.0.0.1:8080", "[::1]:9000"]).validate(), Ok(()));
        for bad in ["http://api.example.com", "api.example.com/path", "user@api.example.com", "", "a b"] {
            let refused = with(&[bad]).validate().expect_err(bad);
            assert!(refused.contains("outgoing_http_hosts"), "{refused}");
        }
    }
}
