//! Per-request guest limits: linear memory, tables and instance counts, enforced by
//! wasmtime through [`ResourceLimiter`]. Records when memory growth was refused so the
//! resulting trap is reported as the guest exceeding its memory limit.

use wasmtime::ResourceLimiter;

#[derive(Debug)]
pub struct GuestLimiter {
    pub memory_bytes: usize,
    pub table_elements: usize,
    pub instances: usize,
    pub tables: usize,
    pub memories: usize,
    /// Set when the guest tried to grow memory past `memory_bytes`.
    pub memory_refused: bool,
}

impl GuestLimiter {
    pub fn new(memory_bytes: usize) -> Self {
        Self { memory_bytes, table_elements: 100_000, instances: 32, tables: 32, memories: 4, memory_refused: false }
    }
}

impl ResourceLimiter for GuestLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.memory_refused = true;
            wasmtime::bail!(
                "guest memory limit of {} MiB reached (growing from {current} to {desired} bytes)",
                self.memory_bytes >> 20
            );
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.table_elements {
            wasmtime::bail!("guest table limit of {} elements reached", self.table_elements);
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.tables
    }

    fn memories(&self) -> usize {
        self.memories
    }
}
