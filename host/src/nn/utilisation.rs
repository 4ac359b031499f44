//! CUDA devices' utilisation, read from the driver's management library (NVML, loaded at run
//! time as `libnvidia-ml.so.1`) every [`SAMPLE_PERIOD`] into
//! `sluice_device_utilisation_ratio{device="cuda:N"}`: the fraction of the driver's last
//! sample period in which a kernel ran on the device, whoever ran it (Triton's
//! `nv_gpu_utilization`). Devices are matched by UUID, since NVML numbers every GPU of the
//! machine and CUDA only those `CUDA_VISIBLE_DEVICES` shows. Without the library, no gauge and
//! one log line.

use std::time::Duration;

use super::inventory::CudaInfo;
use crate::telemetry::metrics::metrics;

/// How often the gauges are refreshed (Triton's default metrics interval is 2 s too).
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(2);

/// Where utilisation comes from: NVML, or a test's figures.
pub trait UtilisationSource: Send + 'static {
    /// Each device's name (`cuda:N`) and its utilisation, 0 to 1; devices that cannot be read
    /// now are left out.
    fn sample(&mut self) -> Vec<(String, f64)>;
}

/// Refresh the gauges from `source` now, then every [`SAMPLE_PERIOD`] on a thread of its own
/// (NVML's calls block).
pub fn start_sampling(mut source: impl UtilisationSource) -> std::io::Result<()> {
    record(&mut source);
    std::thread::Builder::new().name("sluice-nvml".to_string()).spawn(move || {
        loop {
            std::thread::sleep(SAMPLE_PERIOD);
            record(&mut source);
        }
    })?;
    Ok(())
}

/// Start sampling the inventory's CUDA devices through NVML, once per process (servers built
/// again in one process, as tests do, share the one sampler); why not, where NVML is absent.
pub fn sample_cuda_devices(devices: &[CudaInfo]) -> Result<(), String> {
    static STARTED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    STARTED
        .get_or_init(|| {
            let source = nvml(devices)?;
            start_sampling(source).map_err(|err| format!("the NVML sampler could not start: {err}"))
        })
        .clone()
}

fn record(source: &mut impl UtilisationSource) {
    for (device, ratio) in source.sample() {
        metrics().device_utilisation(&device, ratio);
    }
}

/// NVML's view of the inventory's CUDA devices, or why there is none.
#[cfg(feature = "cuda")]
pub fn nvml(devices: &[CudaInfo]) -> Result<impl UtilisationSource, String> {
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init()
        .map_err(|err| format!("NVML (libnvidia-ml.so.1) could not start: {err}"))?;
    let devices = devices.iter().map(|device| (format!("cuda:{}", device.index), device.uuid.clone())).collect();
    Ok(Nvml { nvml, devices })
}

#[cfg(not(feature = "cuda"))]
pub fn nvml(_devices: &[CudaInfo]) -> Result<NoSource, String> {
    Err("built without the cuda feature".to_string())
}

#[cfg(feature = "cuda")]
struct Nvml {
    nvml: nvml_wrapper::Nvml,
    /// Each device's name and UUID.
    devices: Vec<(String, String)>,
}

#[cfg(feature = "cuda")]
impl UtilisationSource for Nvml {
    fn sample(&mut self) -> Vec<(String, f64)> {
        let read = |uuid: &str| self.nvml.device_by_uuid(uuid).and_then(|device| device.utilization_rates());
        self.devices
            .iter()
            .filter_map(|(name, uuid)| {
                read(uuid).ok().map(|rates| (name.clone(), f64::from(rates.gpu.min(100)) / 100.0))
            })
            .collect()
    }
}

/// What a build without CUDA samples: nothing.
#[cfg(not(feature = "cuda"))]
pub struct NoSource;

#[cfg(not(feature = "cuda"))]
impl UtilisationSource for NoSource {
    fn sample(&mut self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Figures(Vec<(String, f64)>);

    impl UtilisationSource for Figures {
        fn sample(&mut self) -> Vec<(String, f64)> {
            self.0.clone()
        }
    }

    #[test]
    fn samples_become_gauges_at_once() {
        start_sampling(Figures(vec![("cuda:7".to_string(), 0.42)])).expect("a sampling thread");
        let text = metrics().render();
        assert!(text.contains(r#"sluice_device_utilisation_ratio{device="cuda:7"} 0.42"#), "{text}");
    }

    #[test]
    fn without_a_driver_nvml_says_why() {
        // These machines have no NVIDIA driver; where one is, this reads its devices instead.
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            return;
        }
        let why = nvml(&[]).err().expect("no NVML here");
        assert!(why.contains("libnvidia-ml.so.1") || why.contains("cuda feature"), "{why}");
    }
}
