//! What devices this machine has: the host CPU (cores, memory), CUDA GPUs through the driver
//! API (`cudarc`, loaded at run time, so the server builds and runs without CUDA) and portable
//! GPUs through `wgpu`'s adapter enumeration (Vulkan, its loader opened at run time). Probed at
//! start, where the result is logged once, and again for `GET /admin/v1/devices`. A machine
//! without a driver library or without GPUs has the CPU only, and says why.

use serde::Serialize;

/// The devices found, with why there is no CUDA device where there is none.
#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    pub cpu: CpuInfo,
    pub cuda: Vec<CudaInfo>,
    /// Why `cuda` is empty (no driver library, no device, an error), if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_absent: Option<String>,
    /// Portable GPU adapters (what ONNX Runtime's WebGPU provider may run on).
    pub portable: Vec<PortableInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub portable_absent: Option<String>,
}

/// A portable GPU adapter as `wgpu` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct PortableInfo {
    pub name: String,
    /// The API it is reached through (`vulkan`).
    pub backend: String,
    /// `discrete_gpu`, `integrated_gpu`, `virtual_gpu`, `cpu` (a software rasteriser) or `other`.
    pub device_type: String,
    pub driver: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct CpuInfo {
    /// Cores this process may run on.
    pub cores: usize,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CudaInfo {
    /// The device's ordinal (`cuda:N`).
    pub index: usize,
    pub name: String,
    /// Major and minor, as `"9.0"`.
    pub compute_capability: String,
    /// As `nvidia-smi -L` shows it (`GPU-` and 32 hex digits), the same whatever
    /// `CUDA_VISIBLE_DEVICES` renumbers.
    pub uuid: String,
    pub memory_total_bytes: u64,
    pub memory_free_bytes: u64,
}

impl Inventory {
    /// Look at the machine now.
    pub fn probe() -> Self {
        let cpu = CpuInfo {
            cores: std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            memory_bytes: machine_memory().unwrap_or(0),
        };
        let (cuda, cuda_absent) = match cuda_devices() {
            Ok(devices) if devices.is_empty() => (devices, Some("the CUDA driver reports no device".to_string())),
            Ok(devices) => (devices, None),
            Err(why) => (Vec::new(), Some(why)),
        };
        let (portable, portable_absent) = match portable_adapters() {
            Ok(adapters) if adapters.is_empty() => {
                (adapters, Some("no Vulkan adapter (no Vulkan driver, or no loader libvulkan.so.1)".to_string()))
            }
            Ok(adapters) => (adapters, None),
            Err(why) => (Vec::new(), Some(why)),
        };
        Self { cpu, cuda, cuda_absent, portable, portable_absent }
    }

    /// One log line per device, and one saying why there is no GPU where there is none.
    pub fn log(&self) {
        tracing::info!(cores = self.cpu.cores, memory_mib = self.cpu.memory_bytes >> 20, "device cpu");
        for device in &self.cuda {
            tracing::info!(
                index = device.index,
                name = %device.name,
                compute_capability = %device.compute_capability,
                memory_total_mib = device.memory_total_bytes >> 20,
                memory_free_mib = device.memory_free_bytes >> 20,
                "device cuda"
            );
        }
        if let Some(why) = &self.cuda_absent {
            tracing::info!(reason = %why, "no CUDA device: models run on the CPU");
        }
        for adapter in &self.portable {
            tracing::info!(name = %adapter.name, backend = %adapter.backend, device_type = %adapter.device_type, driver = %adapter.driver, "device portable gpu");
        }
    }
}

/// The machine's memory (`MemTotal` of /proc/meminfo).
pub fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// The CUDA devices, or why there are none. The driver library is looked for before any
/// call: cudarc panics on a call without it.
#[cfg(feature = "cuda")]
fn cuda_devices() -> Result<Vec<CudaInfo>, String> {
    use cudarc::driver::CudaContext;

    // SAFETY: only tries to open the driver library by its usual names (dlopen) and closes it.
    #[allow(unsafe_code)] // dlopen of the CUDA driver library, to see whether it is there
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !present {
        return Err("no CUDA driver library (libcuda.so) on this machine".to_string());
    }
    let failed = |what: &str, err: cudarc::driver::DriverError| format!("the CUDA driver failed to {what}: {err}");
    cudarc::driver::result::init().map_err(|err| failed("initialise", err))?;
    let count = CudaContext::device_count().map_err(|err| failed("count devices", err))?;
    (0..usize::try_from(count).unwrap_or(0))
        .map(|index| {
            let context = CudaContext::new(index).map_err(|err| failed("open a device", err))?;
            let (major, minor) = context.compute_capability().map_err(|err| failed("read a device", err))?;
            let (free, total) = context.mem_get_info().map_err(|err| failed("read a device's memory", err))?;
            let uuid = context.uuid().map_err(|err| failed("read a device's UUID", err))?;
            Ok(CudaInfo {
                index,
                name: context.name().map_err(|err| failed("read a device's name", err))?,
                compute_capability: format!("{major}.{minor}"),
                uuid: uuid_text(&uuid.bytes.map(|byte| byte as u8)),
                memory_total_bytes: total as u64,
                memory_free_bytes: free as u64,
            })
        })
        .collect()
}

/// A device UUID's 16 bytes as NVIDIA's tools write it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
#[cfg(any(feature = "cuda", test))]
fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

#[cfg(not(feature = "cuda"))]
fn cuda_devices() -> Result<Vec<CudaInfo>, String> {
    Err("built without the cuda feature".to_string())
}

/// The portable GPU adapters `wgpu` finds through Vulkan.
#[cfg(feature = "wgpu")]
fn portable_adapters() -> Result<Vec<PortableInfo>, String> {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    // Native enumeration is ready at once; the future is the web's shape of the API.
    let enumerate = std::pin::pin!(instance.enumerate_adapters(backends));
    let Poll::Ready(adapters) = enumerate.poll(&mut Context::from_waker(Waker::noop())) else {
        return Err("wgpu did not list adapters at once".to_string());
    };
    Ok(adapters
        .iter()
        .map(|adapter| {
            let info = adapter.get_info();
            PortableInfo {
                name: info.name,
                backend: info.backend.to_str().to_string(),
                device_type: match info.device_type {
                    wgpu::DeviceType::DiscreteGpu => "discrete_gpu",
                    wgpu::DeviceType::IntegratedGpu => "integrated_gpu",
                    wgpu::DeviceType::VirtualGpu => "virtual_gpu",
                    wgpu::DeviceType::Cpu => "cpu",
                    wgpu::DeviceType::Other => "other",
                }
                .to_string(),
                driver: info.driver,
            }
        })
        .collect())
}

#[cfg(not(feature = "wgpu"))]
fn portable_adapters() -> Result<Vec<PortableInfo>, String> {
    Err("built without the wgpu feature".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_always_there_and_an_absent_gpu_says_why() {
        let inventory = Inventory::probe();
        assert!(inventory.cpu.cores >= 1);
        assert!(inventory.cpu.memory_bytes > 0);
        // Either devices, or the reason there are none; never both, never neither.
        assert_eq!(inventory.cuda.is_empty(), inventory.cuda_absent.is_some(), "{inventory:?}");
        assert_eq!(inventory.portable.is_empty(), inventory.portable_absent.is_some(), "{inventory:?}");
    }

    #[test]
    fn a_uuid_reads_as_nvidia_smi_writes_it() {
        let bytes = [0xb2, 0x27, 0xec, 0xc6, 0xce, 0xf2, 0xe6, 0x69, 0x20, 0x34, 0x96, 0x25, 0x83, 0x2f, 0x17, 0x28];
        assert_eq!(uuid_text(&bytes), "GPU-b227ecc6-cef2-e669-2034-9625832f1728");
    }
}
