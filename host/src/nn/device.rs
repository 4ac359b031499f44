//! Where models run and the memory each place gives them: the host (`cpu`), each CUDA GPU
//! (`cuda:N`) and the WebGPU adapter, each with a budget for resident models' memory
//! (`--model-memory DEVICE=SIZE`; by default half the host's memory, nine tenths of a GPU's).
//! A load reserves its footprint on each device its instances use before it starts and holds
//! it while the model is resident, so models never take more of a device than the operator
//! allowed; what a load took is measured by the device's [`MemoryMeter`]. When a load finds
//! no room, the least recently used idle model of that device leaves memory to make it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

use crate::registry::manifest::BackendKind;
use crate::registry::placement::DeviceId;
use crate::telemetry::metrics::metrics;

/// A place models run, with the memory budget of their resident copies.
pub struct Device {
    id: DeviceId,
    /// `id` as metrics and messages name it.
    name: String,
    budget: u64,
    meter: Box<dyn MemoryMeter>,
    used: AtomicU64,
    /// Resident models that may leave memory to make room for another (not pinned ones).
    evictable: Mutex<Vec<Weak<dyn Evictable>>>,
    /// One load making room at a time, so two never evict for the same free bytes.
    making_room: Mutex<()>,
    /// Engines that have loaded and run here once (see [`Device::prime_once`]).
    primed: Mutex<Vec<BackendKind>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("name", &self.name).field("budget", &self.budget).finish_non_exhaustive()
    }
}

/// How much of a device's memory is in use, read around a load to measure what it took.
pub trait MemoryMeter: Send + Sync {
    fn in_use(&self) -> u64;
}

/// The host's: bytes the process's allocations hold ([`allocated_bytes`]).
struct HostAllocations;

impl MemoryMeter for HostAllocations {
    fn in_use(&self) -> u64 {
        allocated_bytes()
    }
}

/// A model the device may ask to leave memory so that another fits.
pub trait Evictable: Send + Sync {
    /// When it last served, while it holds memory of the budget; `None` while it holds none.
    fn last_used(&self) -> Option<Instant>;
    /// Leave memory now unless a batch runs on it or jobs wait for it; whether it left (its
    /// memory is back in the budget by then). Blocks: call it from a blocking thread.
    fn evict(&self) -> bool;
}

/// A load that does not fit in what is left of the budget, or in the whole of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRoom {
    pub device: String,
    pub needed: u64,
    pub free: u64,
    pub budget: u64,
}

impl NoRoom {
    /// The model needs more than the whole budget: no eviction makes it fit.
    pub fn never_fits(&self) -> bool {
        self.needed > self.budget
    }
}

impl std::fmt::Display for NoRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (device, needed, budget) = (&self.device, mib(self.needed), mib(self.budget));
        if self.never_fits() {
            write!(f, "the model needs {needed} MiB, more than the whole {budget} MiB {device} model memory budget")
        } else {
            let free = mib(self.free);
            write!(
                f,
                "the {device} model memory budget is full: the model needs {needed} MiB and {free} MiB of the \
                 {budget} MiB budget are free (every other resident model is busy or pinned)"
            )
        }
    }
}

impl std::error::Error for NoRoom {}

/// Bytes in MiB for a message: whole, or to one decimal.
pub(super) fn mib(bytes: u64) -> String {
    match bytes % (1 << 20) {
        0 => (bytes >> 20).to_string(),
        _ => format!("{:.1}", bytes as f64 / f64::from(1 << 20)),
    }
}

impl Device {
    /// A device with `budget` bytes for resident models, whose use `meter` reads.
    pub fn new(id: DeviceId, budget: u64, meter: Box<dyn MemoryMeter>) -> Arc<Self> {
        let name = id.to_string();
        metrics().device_memory(&name, Some(budget), 0);
        Arc::new(Self {
            id,
            name,
            budget,
            meter,
            used: AtomicU64::new(0),
            evictable: Mutex::new(Vec::new()),
            making_room: Mutex::new(()),
            primed: Mutex::new(Vec::new()),
        })
    }

    /// The host, with `budget` bytes for resident models.
    pub fn cpu(budget: u64) -> Arc<Self> {
        Self::new(DeviceId::Cpu, budget, Box::new(HostAllocations))
    }

    /// Run `prime` the first time `engine` loads here, before that load is measured: what an
    /// engine allocates once per device (ONNX Runtime's CUDA provider on an H200: the first
    /// model measured 428 MiB, the next ones 2 MiB) belongs to no model, and charged to the
    /// first one it would make that one too big to share the budget (and never come back when
    /// it is evicted). Loads meanwhile wait, so none is measured while the engine sets up.
    pub fn prime_once(&self, engine: BackendKind, prime: impl FnOnce()) {
        let mut primed = self.primed.lock().unwrap_or_else(PoisonError::into_inner);
        if !primed.contains(&engine) {
            prime();
            primed.push(engine);
        }
    }

    pub fn id(&self) -> DeviceId {
        self.id
    }

    /// Memory in use on the device now, as its meter reads it.
    pub fn in_use(&self) -> u64 {
        self.meter.in_use()
    }

    /// Half the machine's memory (8 GiB where /proc/meminfo cannot be read).
    pub fn default_cpu_budget() -> u64 {
        super::inventory::machine_memory().map_or(8 << 30, |bytes| bytes / 2)
    }

    /// A quarter of the machine's memory (4 GiB where /proc/meminfo cannot be read): with the
    /// models' half, what runs and models may hold leaves a quarter to the rest of the server.
    pub fn default_run_memory() -> u64 {
        super::inventory::machine_memory().map_or(4 << 30, |bytes| bytes / 4)
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Take `bytes` of the budget for as long as the reservation lives.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, NoRoom> {
        let fitted = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(bytes).filter(|&after| after <= self.budget)
        });
        match fitted {
            Ok(_) => {
                self.publish();
                Ok(Reservation { device: self.clone(), bytes })
            }
            Err(used) => Err(self.no_room(bytes, used)),
        }
    }

    /// [`Device::reserve`], making room first if needed: the least recently used evictable
    /// model leaves memory, then the next, until the load fits or every one left is busy.
    /// Blocks while models answer: call it from a blocking thread.
    pub fn reserve_evicting(self: &Arc<Self>, bytes: u64) -> Result<Reservation, NoRoom> {
        self.fits_at_all(bytes)?;
        let _one_at_a_time = self.making_room.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let no_room = match self.reserve(bytes) {
                Ok(reservation) => return Ok(reservation),
                Err(no_room) => no_room,
            };
            if !self.evict_least_recently_used() {
                return Err(no_room);
            }
        }
    }

    /// After a load was measured at more than it reserved (a GPU model's arena and workspace
    /// are only known once it ran), the least recently used idle models leave memory until
    /// the device is back within its budget; whether it is. Blocks while models answer: call
    /// it from a blocking thread, before the new model may be evicted itself.
    pub fn settle(&self) -> bool {
        let _one_at_a_time = self.making_room.lock().unwrap_or_else(PoisonError::into_inner);
        while self.used() > self.budget {
            if !self.evict_least_recently_used() {
                return false;
            }
        }
        true
    }

    /// The least recently used resident model that can leave now leaves; whether one did.
    fn evict_least_recently_used(&self) -> bool {
        let mut candidates: Vec<(Instant, Arc<dyn Evictable>)> = {
            let evictable = self.evictable.lock().unwrap_or_else(PoisonError::into_inner);
            evictable.iter().filter_map(Weak::upgrade).filter_map(|m| Some((m.last_used()?, m))).collect()
        };
        candidates.sort_by_key(|(last_used, _)| *last_used);
        candidates.iter().any(|(_, model)| model.evict())
    }

    /// Refuse a footprint larger than the whole budget (it could never be loaded again).
    pub fn fits_at_all(&self, bytes: u64) -> Result<(), NoRoom> {
        let no_room = self.no_room(bytes, self.used());
        if no_room.never_fits() { Err(no_room) } else { Ok(()) }
    }

    /// Let a resident model be asked to leave memory for others (for as long as it lives).
    pub fn register(&self, model: Weak<dyn Evictable>) {
        let mut evictable = self.evictable.lock().unwrap_or_else(PoisonError::into_inner);
        evictable.retain(|model| model.strong_count() > 0);
        evictable.push(model);
    }

    fn no_room(&self, needed: u64, used: u64) -> NoRoom {
        NoRoom { device: self.name.clone(), needed, free: self.budget.saturating_sub(used), budget: self.budget }
    }

    fn publish(&self) {
        metrics().device_memory(&self.name, None, self.used());
    }
}

/// Bytes of a device's budget held for one resident model; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    device: Arc<Device>,
    bytes: u64,
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Hold what the load measured instead of its estimate (more than the budget allows, if
    /// that is what the model took: the budget shows the truth, and later loads wait for room).
    pub fn resize(&mut self, bytes: u64) {
        if bytes >= self.bytes {
            self.device.used.fetch_add(bytes - self.bytes, Ordering::AcqRel);
        } else {
            self.device.used.fetch_sub(self.bytes - bytes, Ordering::AcqRel);
        }
        self.bytes = bytes;
        self.device.publish();
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.device.used.fetch_sub(self.bytes, Ordering::AcqRel);
        self.device.publish();
    }
}

/// Memory the process's allocations hold now: glibc's count of bytes in use (every arena,
/// and blocks it mapped on its own), so a load's footprint is what it allocated and kept,
/// to the byte, whatever pages the allocator keeps.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // mallinfo2(3): returns a struct by value, takes no pointers
pub fn allocated_bytes() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's own statistics.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}

/// Elsewhere, the anonymous resident memory (0 where /proc cannot be read).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn allocated_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    let kib = |field: &str| {
        let line = status.lines().find(|line| line.starts_with(field))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    };
    kib("RssAnon:").or_else(|| kib("VmRSS:")).unwrap_or(0) * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_engine_is_primed_once_per_device_and_loads_wait_for_it() {
        let device = Device::new(DeviceId::Cuda(0), 1 << 30, Box::new(HostAllocations));
        let primes = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    device.prime_once(BackendKind::Onnxruntime, || {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        primes.fetch_add(1, Ordering::SeqCst);
                    });
                    // Whoever returns finds the priming done, never under way.
                    assert_eq!(primes.load(Ordering::SeqCst), 1);
                });
            }
        });
        device.prime_once(BackendKind::Tract, || {
            primes.fetch_add(1, Ordering::SeqCst);
        });
        device.prime_once(BackendKind::Onnxruntime, || panic!("primed twice"));
        assert_eq!(primes.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn reservations_fit_the_budget_and_give_it_back() {
        let device = Device::cpu(10 << 20);
        let first = device.reserve(6 << 20).expect("fits");
        let refused = device.reserve(6 << 20).expect_err("does not fit");
        assert_eq!((refused.needed, refused.free, refused.budget), (6 << 20, 4 << 20, 10 << 20));
        assert!(refused.to_string().contains("needs 6 MiB and 4 MiB of the 10 MiB budget are free"), "{refused}");
        let never = device.reserve(11 << 20).expect_err("larger than the budget");
        assert!(never.never_fits() && !refused.never_fits());
        assert!(never.to_string().contains("needs 11 MiB, more than the whole 10 MiB cpu model memory budget"));
        let mut second = device.reserve(4 << 20).expect("the rest fits");
        second.resize(5 << 20);
        assert_eq!(device.used(), 11 << 20, "a measured footprint may pass the budget");
        drop(first);
        drop(second);
        assert_eq!(device.used(), 0);
    }

    /// A resident model as the device sees it: its reservation, when it last served, and
    /// whether a batch runs on it.
    struct Model {
        memory: Mutex<Option<Reservation>>,
        last_used: Instant,
        busy: bool,
    }

    impl Model {
        /// A 10 MiB model resident on `device`, last used `age_s` before `start`.
        fn resident(device: &Arc<Device>, start: Instant, age_s: u64, busy: bool) -> Arc<Self> {
            let memory = Mutex::new(Some(device.reserve(10 << 20).expect("fits")));
            let model = Arc::new(Model { memory, last_used: start - std::time::Duration::from_secs(age_s), busy });
            device.register(Arc::downgrade(&model) as Weak<dyn Evictable>);
            model
        }
    }

    impl Evictable for Model {
        fn last_used(&self) -> Option<Instant> {
            self.memory.lock().expect("unpoisoned").as_ref().map(|_| self.last_used)
        }

        fn evict(&self) -> bool {
            !self.busy && self.memory.lock().expect("unpoisoned").take().is_some()
        }
    }

    #[test]
    fn a_load_without_room_evicts_the_least_recently_used_idle_model() {
        let device = Device::cpu(30 << 20);
        let start = Instant::now();
        let resident = |age_s, busy| Model::resident(&device, start, age_s, busy);
        // The oldest is busy: the next oldest leaves, the newest stays.
        let (busy_oldest, older, newest) = (resident(30, true), resident(20, false), resident(10, false));
        let reservation = device.reserve_evicting(10 << 20).expect("room made");
        assert!(older.last_used().is_none(), "the least recently used idle model left");
        assert!(busy_oldest.last_used().is_some() && newest.last_used().is_some());
        // Two more needed: only one idle model is left to give them, so nothing more leaves.
        let refused = device.reserve_evicting(20 << 20).expect_err("every other model is busy");
        assert!(refused.to_string().contains("every other resident model is busy or pinned"), "{refused}");
        assert!(busy_oldest.last_used().is_some(), "a busy model never leaves");
        let never = device.reserve_evicting(31 << 20).expect_err("more than the budget");
        assert!(never.never_fits());
        drop(reservation);
    }

    #[test]
    fn a_load_measured_past_the_budget_makes_room_after_it() {
        let device = Device::cpu(40 << 20);
        let start = Instant::now();
        let resident = |age_s, busy| Model::resident(&device, start, age_s, busy);
        let (busy, older, newer) = (resident(30, true), resident(20, false), resident(10, false));
        // It reserved 5 MiB and took 15 once loaded: 45 of 40 MiB until the oldest idle one leaves.
        let mut load = device.reserve(5 << 20).expect("fits");
        load.resize(15 << 20);
        assert!(device.settle());
        assert!(older.last_used().is_none() && newer.last_used().is_some() && busy.last_used().is_some());
        assert_eq!(device.used(), 35 << 20);
        // With nothing idle left to leave, the device stays over its budget and says so.
        load.resize(35 << 20);
        assert!(!device.settle());
        assert!(newer.last_used().is_none() && busy.last_used().is_some());
        assert_eq!(device.used(), 45 << 20);
    }
}
