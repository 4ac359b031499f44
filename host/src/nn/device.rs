//! Where models run and the memory each place gives them: for now the host (`cpu`), with a
//! budget for resident models' memory (`--model-memory cpu=SIZE`, by default half the
//! machine's). A load reserves its footprint before it starts and holds it while the model
//! is resident, so models never take more of the machine than the operator allowed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::telemetry::metrics::metrics;

/// A place models run, with the memory budget of their resident copies.
#[derive(Debug)]
pub struct Device {
    name: &'static str,
    budget: u64,
    used: AtomicU64,
}

/// A load that does not fit in what is left of the budget.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the {device} model memory budget is full: the model needs {needed_mib} MiB and {free_mib} MiB of the \
     {budget_mib} MiB budget are free"
)]
pub struct NoRoom {
    pub device: &'static str,
    pub needed_mib: u64,
    pub free_mib: u64,
    pub budget_mib: u64,
}

impl Device {
    /// The host, with `budget` bytes for resident models.
    pub fn cpu(budget: u64) -> Arc<Self> {
        metrics().device_memory("cpu", Some(budget), 0);
        Arc::new(Self { name: "cpu", budget, used: AtomicU64::new(0) })
    }

    /// Half the machine's memory (8 GiB where /proc/meminfo cannot be read).
    pub fn default_cpu_budget() -> u64 {
        let total_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
            let line = text.lines().find(|line| line.starts_with("MemTotal:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        });
        total_kib.map_or(8 << 30, |kib| kib * 1024 / 2)
    }

    pub fn name(&self) -> &'static str {
        self.name
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

    fn no_room(&self, needed: u64, used: u64) -> NoRoom {
        let mib = |bytes: u64| bytes.div_ceil(1 << 20);
        NoRoom {
            device: self.name,
            needed_mib: mib(needed),
            free_mib: self.budget.saturating_sub(used) >> 20,
            budget_mib: self.budget >> 20,
        }
    }

    fn publish(&self) {
        metrics().device_memory(self.name, None, self.used());
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

/// The process's resident memory now (0 where /proc cannot be read).
pub fn resident_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|kib| kib.parse::<u64>().ok()).unwrap_or(0) * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_the_budget_and_give_it_back() {
        let device = Device::cpu(10 << 20);
        let first = device.reserve(6 << 20).expect("fits");
        let refused = device.reserve(6 << 20).expect_err("does not fit");
        assert_eq!((refused.needed_mib, refused.free_mib, refused.budget_mib), (6, 4, 10));
        assert!(refused.to_string().contains("needs 6 MiB and 4 MiB of the 10 MiB budget are free"), "{refused}");
        let mut second = device.reserve(4 << 20).expect("the rest fits");
        second.resize(5 << 20);
        assert_eq!(device.used(), 11 << 20, "a measured footprint may pass the budget");
        drop(first);
        drop(second);
        assert_eq!(device.used(), 0);
    }
}
