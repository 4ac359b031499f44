//! Where a model's execution instances run, as the operator declares it: Triton's instance
//! groups (`[[models.X.instances]] kind = "cpu" | "gpu" | "webgpu", count, devices = [0, 1],
//! cpus = "2-3"`) and what happens when a named device is missing (`on_missing_device`).
//! Expanded here into one [`Placement`] per instance; `nn` checks them against the machine.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// The device kind of an instance group (Triton's `KIND_CPU` / `KIND_GPU`; `webgpu` is a
/// portable GPU through ONNX Runtime's WebGPU execution provider).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceKind {
    Cpu,
    Gpu,
    Webgpu,
}

/// A device instances run on: the host, one CUDA GPU by ordinal, or the WebGPU adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceId {
    Cpu,
    Cuda(u32),
    WebGpu,
}

impl DeviceId {
    pub fn kind(self) -> InstanceKind {
        match self {
            Self::Cpu => InstanceKind::Cpu,
            Self::Cuda(_) => InstanceKind::Gpu,
            Self::WebGpu => InstanceKind::Webgpu,
        }
    }

    /// Parse `cpu`, `cuda:N` or `webgpu` (the names `--model-memory` and metrics use).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "cpu" => Some(Self::Cpu),
            "webgpu" => Some(Self::WebGpu),
            _ => text.strip_prefix("cuda:")?.parse().ok().map(Self::Cuda),
        }
    }
}

impl DeviceId {
    /// Its name as metrics label it: allocated only for a GPU's ordinal (batches on the
    /// CPU label their compute with it on every run).
    pub fn label(self) -> std::borrow::Cow<'static, str> {
        match self {
            Self::Cpu => "cpu".into(),
            Self::Cuda(index) => format!("cuda:{index}").into(),
            Self::WebGpu => "webgpu".into(),
        }
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Host cores, as `"2-3"` or `"0,2,4-5"` (Linux's cpu list format); sorted, each once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CpuList(Vec<usize>);

/// Highest core number a list may name (Linux's default `NR_CPUS` bound).
const MAX_CPU: usize = 8191;

impl CpuList {
    /// These cores, sorted, each once.
    pub fn new(mut cores: Vec<usize>) -> Self {
        cores.sort_unstable();
        cores.dedup();
        Self(cores)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = || format!("invalid cpus '{text}': use core numbers and ranges such as \"2-3\" or \"0,2,4-5\"");
        let mut cores = Vec::new();
        for part in text.split(',') {
            let (first, last) = match part.trim().split_once('-') {
                Some((first, last)) => (first.trim(), last.trim()),
                None => (part.trim(), part.trim()),
            };
            let (first, last): (usize, usize) =
                (first.parse().map_err(|_| invalid())?, last.parse().map_err(|_| invalid())?);
            if first > last || last > MAX_CPU {
                return Err(invalid());
            }
            cores.extend(first..=last);
        }
        Ok(Self::new(cores))
    }

    pub fn cores(&self) -> &[usize] {
        &self.0
    }
}

impl fmt::Display for CpuList {
    /// Ranges folded back: `0,2,4-5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let mut cores = self.0.iter().copied().peekable();
        while let Some(first) = cores.next() {
            let mut last = first;
            while cores.peek() == Some(&(last + 1)) {
                last = cores.next().unwrap_or(last);
            }
            parts.push(if first == last { first.to_string() } else { format!("{first}-{last}") });
        }
        f.write_str(&parts.join(","))
    }
}

impl<'de> Deserialize<'de> for CpuList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// `[[models.X.instances]]`: `count` instances of a kind; for `gpu`, `count` on each of
/// `devices` (default `[0]`); for `cpu`, optionally pinned to `cpus`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InstanceGroup {
    pub kind: InstanceKind,
    #[serde(default = "one")]
    pub count: usize,
    #[serde(default)]
    pub devices: Vec<u32>,
    #[serde(default)]
    pub cpus: Option<CpuList>,
}

fn one() -> usize {
    1
}

/// What a model whose device is missing does: run on the CPU instead (logged, and shown in
/// its config), or refuse to load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMissingDevice {
    #[default]
    Cpu,
    Refuse,
}

/// Where one execution instance runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Placement {
    pub device: DeviceId,
    /// Cores its compute threads are pinned to (CPU instances only); `None`: any.
    pub cpus: Option<CpuList>,
}

impl Placement {
    pub const CPU: Self = Self { device: DeviceId::Cpu, cpus: None };
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cpus {
            Some(cpus) => write!(f, "{} (cores {cpus})", self.device),
            None => write!(f, "{}", self.device),
        }
    }
}

/// Most execution instances one model may have.
pub const MAX_INSTANCES: usize = 64;

/// One placement per instance, in the groups' order; checks what each kind may say.
pub fn expand(groups: &[InstanceGroup]) -> Result<Vec<Placement>, String> {
    let mut placements = Vec::new();
    for group in groups {
        if group.count == 0 {
            return Err("an instance group needs count >= 1".to_string());
        }
        match group.kind {
            InstanceKind::Cpu if !group.devices.is_empty() => {
                return Err("a cpu instance group takes cpus, not devices".to_string());
            }
            InstanceKind::Gpu | InstanceKind::Webgpu if group.cpus.is_some() => {
                return Err("cpus pins cpu instance groups only".to_string());
            }
            InstanceKind::Webgpu if !group.devices.is_empty() => {
                return Err("a webgpu instance group runs on the one WebGPU adapter: drop devices".to_string());
            }
            _ => {}
        }
        if group.cpus.as_ref().is_some_and(|cpus| cpus.cores().is_empty()) {
            return Err("cpus names no core".to_string());
        }
        let devices: Vec<DeviceId> = match group.kind {
            InstanceKind::Cpu => vec![DeviceId::Cpu],
            InstanceKind::Webgpu => vec![DeviceId::WebGpu],
            InstanceKind::Gpu if group.devices.is_empty() => vec![DeviceId::Cuda(0)],
            InstanceKind::Gpu => group.devices.iter().map(|&index| DeviceId::Cuda(index)).collect(),
        };
        for device in devices {
            for _ in 0..group.count {
                placements.push(Placement { device, cpus: group.cpus.clone() });
                if placements.len() > MAX_INSTANCES {
                    return Err(format!("a model may have at most {MAX_INSTANCES} instances"));
                }
            }
        }
    }
    Ok(placements)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_fold_and_refuse_nonsense() {
        let cpus = CpuList::parse("4-5, 0,2,5").expect("valid");
        assert_eq!(cpus.cores(), &[0, 2, 4, 5]);
        assert_eq!(cpus.to_string(), "0,2,4-5");
        for bad in ["", "a", "3-1", "1-", "-1", "9000"] {
            assert!(CpuList::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn groups_expand_to_one_placement_per_instance() {
        let groups: Vec<InstanceGroup> = toml::from_str::<toml::Table>(
            "[[i]]\nkind = \"gpu\"\ncount = 2\ndevices = [0, 1]\n[[i]]\nkind = \"cpu\"\ncpus = \"2-3\"\n",
        )
        .expect("toml")
        .remove("i")
        .expect("groups")
        .try_into()
        .expect("instance groups");
        let placements = expand(&groups).expect("valid");
        let devices: Vec<String> = placements.iter().map(ToString::to_string).collect();
        assert_eq!(devices, ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cpu (cores 2-3)"]);
        let pinned_gpu =
            InstanceGroup { kind: InstanceKind::Gpu, count: 1, devices: vec![], cpus: placements[4].cpus.clone() };
        assert!(expand(&[pinned_gpu]).is_err());
        let too_many = InstanceGroup { kind: InstanceKind::Cpu, count: MAX_INSTANCES + 1, devices: vec![], cpus: None };
        assert!(expand(&[too_many]).is_err());
    }

    #[test]
    fn device_names_round_trip() {
        for device in [DeviceId::Cpu, DeviceId::Cuda(3), DeviceId::WebGpu] {
            assert_eq!(DeviceId::parse(&device.to_string()), Some(device));
        }
        assert_eq!(DeviceId::parse("cuda:x"), None);
    }
}
