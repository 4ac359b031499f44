//! The devices models may run on here, each with its memory budget, and where a model's
//! instances go: each placement its manifest asks for is checked against the machine (the
//! device exists, an engine here runs on it, pinned cores are ones this process may use).
//! A missing device is replaced by the CPU or refuses the model, as `on_missing_device` says.
//! A model's memory is reserved, measured and given back per device ([`estimates`],
//! [`reserve_all`], [`measured`], [`scale_up_room`]), so each device's budget, and its least
//! recently used models, are its own.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::device::{Device, MemoryMeter, NoRoom, Reservation};
use super::inventory::Inventory;
use super::pinning::allowed_cores;
use crate::registry::placement::{CpuList, DeviceId, OnMissingDevice, Placement};

/// The machine's devices with their budgets.
pub struct Devices {
    cpu: Arc<Device>,
    gpus: BTreeMap<DeviceId, Arc<Device>>,
    /// Why there is no CUDA device, and why no WebGPU adapter, where there is none.
    cuda_absent: String,
    webgpu_absent: String,
    /// Cores this process may run on (pinned instances must name some of these).
    cores: Option<CpuList>,
}

impl std::fmt::Debug for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Devices").field("gpus", &self.gpus.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

/// A model's instances as placed here, and why some are not where its manifest asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub placements: Vec<Placement>,
    /// Set when missing devices were replaced by the CPU (`on_missing_device = "cpu"`).
    pub fallback: Option<String>,
}

/// Why a model cannot run where its manifest asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("it asks for device {device}, which is missing here: {reason} (on_missing_device = \"refuse\")")]
    Missing { device: DeviceId, reason: String },
    #[error("cpus {cpus} names cores this process may not run on (it may run on {allowed})")]
    Cores { cpus: CpuList, allowed: CpuList },
}

/// A GPU's default budget: nine tenths of its memory (the rest for the engine's workspace
/// and the driver).
fn default_gpu_budget(total: u64) -> u64 {
    total / 10 * 9
}

impl Devices {
    /// These devices and `gpu` (a simulated one, in tests of the memory manager).
    #[cfg(test)]
    pub(crate) fn with_gpu(mut self, gpu: Arc<Device>) -> Self {
        self.gpus.insert(gpu.id(), gpu);
        self
    }

    /// The host alone, with `budget` bytes for resident models.
    pub fn cpu_only(budget: u64) -> Self {
        Self {
            cpu: Device::cpu(budget),
            gpus: BTreeMap::new(),
            cuda_absent: "no CUDA device is in use".to_string(),
            webgpu_absent: "no WebGPU adapter is in use".to_string(),
            cores: allowed_cores(),
        }
    }

    /// The inventory's devices with budgets (`budgets` where the operator set them), plus the
    /// WebGPU adapter where an engine found one (`Err`: why not).
    pub fn new(
        inventory: &Inventory,
        budgets: &BTreeMap<DeviceId, u64>,
        webgpu: Result<(), String>,
    ) -> Result<Self, String> {
        let cpu_budget = budgets.get(&DeviceId::Cpu).copied().unwrap_or_else(Device::default_cpu_budget);
        let mut devices = Self::cpu_only(cpu_budget);
        for gpu in &inventory.cuda {
            let id = DeviceId::Cuda(u32::try_from(gpu.index).unwrap_or(u32::MAX));
            let budget = budgets.get(&id).copied().unwrap_or_else(|| default_gpu_budget(gpu.memory_total_bytes));
            devices.gpus.insert(id, Device::new(id, budget, cuda_meter(gpu.index)));
        }
        if let Some(why) = &inventory.cuda_absent {
            devices.cuda_absent = why.clone();
        }
        match webgpu {
            Ok(()) => {
                // Adapters do not report their memory here: the budget holds estimates only.
                let budget = budgets.get(&DeviceId::WebGpu).copied().unwrap_or_else(Device::default_cpu_budget);
                devices.gpus.insert(DeviceId::WebGpu, Device::new(DeviceId::WebGpu, budget, Box::new(Unmetered)));
            }
            Err(why) => devices.webgpu_absent = why,
        }
        if let Some(unknown) = budgets.keys().find(|&&id| id != DeviceId::Cpu && !devices.gpus.contains_key(&id)) {
            return Err(format!("--model-memory names {unknown}, which this machine does not have"));
        }
        Ok(devices)
    }

    pub fn cpu(&self) -> &Arc<Device> {
        &self.cpu
    }

    /// Every device, the host first.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Device>> {
        std::iter::once(&self.cpu).chain(self.gpus.values())
    }

    /// A device by id, or why it is missing.
    pub fn get(&self, id: DeviceId) -> Result<&Arc<Device>, String> {
        match id {
            DeviceId::Cpu => Ok(&self.cpu),
            DeviceId::Cuda(_) => {
                self.gpus.get(&id).ok_or_else(|| match self.gpus.keys().any(|d| d.kind() == id.kind()) {
                    true => format!("this machine has no {id}"),
                    false => self.cuda_absent.clone(),
                })
            }
            DeviceId::WebGpu => self.gpus.get(&id).ok_or_else(|| self.webgpu_absent.clone()),
        }
    }

    /// Where a model's instances go here. `runs_on` says whether an engine can run on a
    /// device (or why not): a device no engine runs on is as missing as one not there.
    pub fn place(
        &self,
        asked: &[Placement],
        policy: OnMissingDevice,
        runs_on: impl Fn(DeviceId) -> Result<(), String>,
    ) -> Result<Placed, PlacementError> {
        let mut placements = Vec::with_capacity(asked.len());
        let mut missing: BTreeMap<DeviceId, String> = BTreeMap::new();
        for placement in asked {
            if let (Some(cpus), Some(allowed)) = (&placement.cpus, &self.cores)
                && !cpus.cores().iter().all(|core| allowed.cores().contains(core))
            {
                return Err(PlacementError::Cores { cpus: cpus.clone(), allowed: allowed.clone() });
            }
            match self.get(placement.device).map(drop).and_then(|()| runs_on(placement.device)) {
                Ok(()) => placements.push(placement.clone()),
                Err(reason) if policy == OnMissingDevice::Refuse => {
                    return Err(PlacementError::Missing { device: placement.device, reason });
                }
                Err(reason) => {
                    missing.entry(placement.device).or_insert(reason);
                    placements.push(Placement::CPU);
                }
            }
        }
        let fallback = (!missing.is_empty()).then(|| {
            let reasons: Vec<String> =
                missing.iter().map(|(device, why)| format!("{device} is missing: {why}")).collect();
            format!("{}; its instances there run on the cpu (on_missing_device = \"cpu\")", reasons.join("; "))
        });
        Ok(Placed { placements, fallback })
    }
}

/// Bytes of one model on each of its devices (what it needs, or holds).
pub type Footprints = Vec<(Arc<Device>, u64)>;

/// Each device the placements use, with the bytes its instances' weights need at least
/// (the weights once per instance there).
pub fn estimates(devices: &Devices, placements: &[Placement], weights: u64) -> Result<Footprints, String> {
    let mut estimates: Footprints = Vec::new();
    for placement in placements {
        let device = devices.get(placement.device)?;
        match estimates.iter_mut().find(|(known, _)| Arc::ptr_eq(known, device)) {
            Some((_, bytes)) => *bytes += weights,
            None => estimates.push((device.clone(), weights)),
        }
    }
    Ok(estimates)
}

/// Reserve each device's bytes, all or none (what was taken goes back on a refusal).
pub fn reserve_all(
    wanted: &[(Arc<Device>, u64)],
    reserve: impl Fn(&Arc<Device>, u64) -> Result<Reservation, NoRoom>,
) -> Result<Vec<Reservation>, NoRoom> {
    wanted.iter().map(|(device, bytes)| reserve(device, *bytes)).collect()
}

/// Where an instance the autoscaler adds goes: the first of the model's placements whose
/// device has room now, without evicting anything, for one instance's share of what the
/// model holds there (`footprints`).
pub fn scale_up_room(
    placements: &[Placement],
    footprints: &[(Arc<Device>, u64)],
) -> Result<(Placement, Reservation), NoRoom> {
    let mut refused = None;
    let mut tried: Vec<&Placement> = Vec::new();
    for placement in placements {
        if tried.contains(&placement) {
            continue;
        }
        tried.push(placement);
        let Some((device, footprint)) = footprints.iter().find(|(device, _)| device.id() == placement.device) else {
            continue;
        };
        let on_device = placements.iter().filter(|p| p.device == placement.device).count().max(1) as u64;
        match device.reserve(footprint / on_device) {
            Ok(reservation) => return Ok((placement.clone(), reservation)),
            Err(no_room) => refused = Some(no_room),
        }
    }
    Err(refused.unwrap_or(NoRoom { device: "none of the model's devices".to_string(), needed: 0, free: 0, budget: 0 }))
}

/// Run a load and say how much each device's memory in use grew meanwhile, by its meter (its
/// footprint there; other work on the device may add to it or take from it).
pub fn measured<T>(devices: &[Arc<Device>], load: impl FnOnce() -> T) -> (T, Vec<u64>) {
    let before: Vec<u64> = devices.iter().map(|device| device.in_use()).collect();
    let loaded = load();
    let grown = devices.iter().zip(before).map(|(device, before)| device.in_use().saturating_sub(before)).collect();
    (loaded, grown)
}

/// A device whose memory in use cannot be read: footprints are the loads' estimates.
struct Unmetered;

impl MemoryMeter for Unmetered {
    fn in_use(&self) -> u64 {
        0
    }
}

/// A CUDA device's memory in use (total less free, from the driver), as a load changes it.
#[cfg(feature = "cuda")]
fn cuda_meter(index: usize) -> Box<dyn MemoryMeter> {
    struct CudaMemory(Option<Arc<cudarc::driver::CudaContext>>);

    impl MemoryMeter for CudaMemory {
        fn in_use(&self) -> u64 {
            let info = self.0.as_ref().and_then(|context| context.mem_get_info().ok());
            info.map_or(0, |(free, total)| total.saturating_sub(free) as u64)
        }
    }
    // The inventory found this device through the driver, so the library is present.
    Box::new(CudaMemory(cudarc::driver::CudaContext::new(index).ok()))
}

#[cfg(not(feature = "cuda"))]
fn cuda_meter(_index: usize) -> Box<dyn MemoryMeter> {
    Box::new(Unmetered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_gpu() -> Devices {
        let mut devices = Devices::cpu_only(1 << 30);
        devices.gpus.insert(DeviceId::Cuda(0), Device::new(DeviceId::Cuda(0), 1 << 30, Box::new(Unmetered)));
        devices
    }

    #[test]
    fn a_missing_device_falls_back_to_the_cpu_or_refuses_naming_it() {
        let devices = with_gpu();
        let asked = vec![
            Placement { device: DeviceId::Cuda(0), cpus: None },
            Placement { device: DeviceId::Cuda(1), cpus: None },
        ];
        let anywhere = |_| Ok(());
        let placed = devices.place(&asked, OnMissingDevice::Cpu, anywhere).expect("falls back");
        assert_eq!(placed.placements, vec![asked[0].clone(), Placement::CPU]);
        assert!(
            placed.fallback.as_deref().is_some_and(|why| why.contains("cuda:1 is missing: this machine has no cuda:1"))
        );
        let refused = devices.place(&asked, OnMissingDevice::Refuse, anywhere).expect_err("refused");
        assert_eq!(
            refused.to_string(),
            "it asks for device cuda:1, which is missing here: this machine has no cuda:1 \
                                         (on_missing_device = \"refuse\")"
        );
        // A device no engine runs on is missing too, with the engine's reason.
        let cpu_engines = |device: DeviceId| match device {
            DeviceId::Cpu => Ok(()),
            other => Err(format!("no engine runs on {other}")),
        };
        let refused = devices.place(&asked[..1], OnMissingDevice::Refuse, cpu_engines).expect_err("no engine");
        assert!(refused.to_string().contains("no engine runs on cuda:0"), "{refused}");
        let webgpu = Placement { device: DeviceId::WebGpu, cpus: None };
        let refused = devices.place(&[webgpu], OnMissingDevice::Refuse, anywhere).expect_err("no adapter");
        assert!(refused.to_string().contains("no WebGPU adapter"), "{refused}");
    }

    /// A GPU as the manager sees it: memory in use that loads move, no CUDA call.
    struct SimulatedMemory(std::sync::atomic::AtomicU64);

    impl MemoryMeter for Arc<SimulatedMemory> {
        fn in_use(&self) -> u64 {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    /// A resident model on one device, asked to leave by that device's budget.
    struct Resident {
        memory: std::sync::Mutex<Option<Reservation>>,
        last_used: std::time::Instant,
    }

    impl super::super::device::Evictable for Resident {
        fn last_used(&self) -> Option<std::time::Instant> {
            self.memory.lock().expect("unpoisoned").as_ref().map(|_| self.last_used)
        }

        fn evict(&self) -> bool {
            self.memory.lock().expect("unpoisoned").take().is_some()
        }
    }

    #[test]
    fn gpu_memory_is_measured_reserved_and_evicted_per_device() {
        let gpu_memory = Arc::new(SimulatedMemory(std::sync::atomic::AtomicU64::new(500 << 20)));
        let mut devices = Devices::cpu_only(1 << 30);
        let gpu = Device::new(DeviceId::Cuda(0), 100 << 20, Box::new(gpu_memory.clone()));
        devices.gpus.insert(DeviceId::Cuda(0), gpu.clone());
        let on_gpu = Placement { device: DeviceId::Cuda(0), cpus: None };

        // Two instances on the GPU and one on the CPU: each device is asked for its weights.
        let placements = [on_gpu.clone(), on_gpu.clone(), Placement::CPU];
        let wanted = estimates(&devices, &placements, 10 << 20).expect("devices present");
        let wanted: Vec<(String, u64)> = wanted.iter().map(|(d, bytes)| (d.id().to_string(), *bytes)).collect();
        assert_eq!(wanted, [("cuda:0".to_string(), 20 << 20), ("cpu".to_string(), 10 << 20)]);

        // A load's footprint is what the device's meter saw it take (the driver's free memory).
        let (_, grown) = measured(std::slice::from_ref(&gpu), || {
            gpu_memory.0.fetch_add(30 << 20, std::sync::atomic::Ordering::SeqCst)
        });
        assert_eq!(grown, [30 << 20]);

        // A load on the GPU that does not fit evicts the GPU's least recently used idle model,
        // never the CPU's older one: budgets and their LRU are per device.
        let now = std::time::Instant::now();
        let resident = |device: &Arc<Device>, bytes: u64, age_s: u64| {
            let memory = std::sync::Mutex::new(Some(device.reserve(bytes).expect("fits")));
            let model = Arc::new(Resident { memory, last_used: now - std::time::Duration::from_secs(age_s) });
            device.register(Arc::downgrade(&model) as std::sync::Weak<dyn super::super::device::Evictable>);
            model
        };
        let old_on_cpu = resident(devices.cpu(), 10 << 20, 60);
        let (older_on_gpu, newer_on_gpu) = (resident(&gpu, 40 << 20, 30), resident(&gpu, 40 << 20, 10));
        let held = reserve_all(&[(gpu.clone(), 50 << 20)], Device::reserve_evicting).expect("room made on the GPU");
        assert!(older_on_gpu.memory.lock().expect("unpoisoned").is_none(), "the GPU's LRU model left");
        assert!(newer_on_gpu.memory.lock().expect("unpoisoned").is_some());
        assert!(old_on_cpu.memory.lock().expect("unpoisoned").is_some(), "the CPU's models are not the GPU's to evict");
        assert_eq!(gpu.used(), 90 << 20);

        // An added instance takes its share on the first device of the model with room.
        let footprints = [(gpu.clone(), 40 << 20), (devices.cpu().clone(), 10 << 20)];
        let (placement, reservation) = scale_up_room(&placements, &footprints).expect("room on the cpu");
        assert_eq!((placement, reservation.bytes()), (Placement::CPU, 10 << 20), "the GPU had 10 MiB left of 100");
        drop((held, reservation));
        let (placement, _) = scale_up_room(&placements, &footprints).expect("room on the GPU now");
        assert_eq!(placement, on_gpu);
    }

    #[test]
    fn pinned_cores_must_be_the_processes() {
        let devices = Devices::cpu_only(1 << 30);
        let allowed = devices.cores.clone().expect("this process's cores");
        let fine = Placement { device: DeviceId::Cpu, cpus: Some(allowed.clone()) };
        assert!(devices.place(&[fine], OnMissingDevice::Refuse, |_| Ok(())).is_ok());
        let beyond = CpuList::parse("4000").expect("a list");
        let refused = devices
            .place(&[Placement { device: DeviceId::Cpu, cpus: Some(beyond) }], OnMissingDevice::Cpu, |_| Ok(()))
            .expect_err("not this process's core");
        assert!(refused.to_string().starts_with("cpus 4000 names cores this process may not run on"), "{refused}");
    }
}
