//! The buffers a model's large batches are stacked into, kept for its next batches. A new
//! buffer of tens of MB is a new mapping whose every page faults as it is first written
//! (glibc maps allocations above 32 MiB afresh and unmaps them when freed): stacking 128
//! images (77 MB) took ~30 ms into a new buffer and ~4.5 ms into a kept one. Kept only while
//! batches keep coming: a buffer unused for [`KEEP_FOR`] goes back to the system. What is kept
//! shows in `sluice_batch_buffer_bytes`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus::IntGauge;

/// How long a buffer no batch has used is kept.
pub const KEEP_FOR: Duration = Duration::from_secs(1);

/// Buffers smaller than this are not kept: the allocator reuses its own memory for them.
const KEPT_FROM: usize = 1 << 20;

/// A model's kept buffers, shared by its queue, its instances' threads and the threads that
/// stack batches for them.
pub struct StackBuffers {
    kept: Mutex<Kept>,
    /// Whether any is kept, read without the lock: the queue asks on each of its turns, and
    /// most models never have a large batch.
    any_kept: AtomicBool,
    /// The bytes kept, as the model's gauge (changed by deltas: copies of different weights
    /// may share a model's name).
    gauge: IntGauge,
}

#[derive(Default)]
struct Kept {
    buffers: Vec<(Vec<u8>, Instant)>,
    /// What the gauge was last told.
    reported: i64,
}

impl StackBuffers {
    pub fn new(gauge: IntGauge) -> Self {
        Self { kept: Mutex::default(), any_kept: AtomicBool::new(false), gauge }
    }

    /// An empty buffer with room for `len` bytes: the smallest kept one with that room, else
    /// a new one. What a kept buffer held is cleared, never read again.
    pub fn take(&self, len: usize) -> Vec<u8> {
        if len < KEPT_FROM {
            return Vec::with_capacity(len);
        }
        let mut kept = self.lock();
        let fitting = kept
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, (buffer, _))| buffer.capacity() >= len)
            .min_by_key(|(_, (buffer, _))| buffer.capacity())
            .map(|(index, _)| index);
        match fitting {
            Some(index) => {
                let (mut buffer, _) = kept.buffers.swap_remove(index);
                self.changed(&mut kept);
                buffer.clear();
                buffer
            }
            None => Vec::with_capacity(len),
        }
    }

    /// Keep a run's buffers for the next batches, at most `limit` buffers in all: the largest,
    /// which fit any batch a smaller one would.
    pub fn keep(&self, buffers: impl IntoIterator<Item = Vec<u8>>, limit: usize, now: Instant) {
        let mut returned = buffers.into_iter().filter(|b| b.capacity() >= KEPT_FROM).peekable();
        if returned.peek().is_none() {
            return;
        }
        let mut kept = self.lock();
        kept.buffers.extend(returned.map(|buffer| (buffer, now)));
        if kept.buffers.len() > limit {
            kept.buffers.sort_unstable_by_key(|(buffer, _)| std::cmp::Reverse(buffer.capacity()));
            kept.buffers.truncate(limit);
        }
        self.changed(&mut kept);
    }

    /// When the buffer unused longest is due to go (`None` while none is kept).
    pub fn release_due(&self) -> Option<Instant> {
        if !self.any_kept.load(Ordering::Relaxed) {
            return None;
        }
        self.lock().buffers.iter().map(|(_, since)| *since + KEEP_FOR).min()
    }

    /// Let go of the buffers no batch has used for [`KEEP_FOR`] before `now`.
    pub fn release_unused(&self, now: Instant) {
        let mut kept = self.lock();
        kept.buffers.retain(|(_, since)| now.saturating_duration_since(*since) < KEEP_FOR);
        self.changed(&mut kept);
    }

    /// Let go of every kept buffer (the model left memory).
    pub fn clear(&self) {
        let mut kept = self.lock();
        kept.buffers.clear();
        self.changed(&mut kept);
    }

    /// Bytes held in kept buffers.
    #[cfg(test)]
    pub fn held_bytes(&self) -> usize {
        self.lock().reported as usize
    }

    /// What is kept changed: tell the flag and the gauge.
    fn changed(&self, kept: &mut Kept) {
        self.any_kept.store(!kept.buffers.is_empty(), Ordering::Relaxed);
        let bytes: usize = kept.buffers.iter().map(|(buffer, _)| buffer.capacity()).sum();
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        self.gauge.add(bytes - kept.reported);
        kept.reported = bytes;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for StackBuffers {
    fn drop(&mut self) {
        let kept = self.kept.get_mut().unwrap_or_else(PoisonError::into_inner);
        self.gauge.sub(kept.reported);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn buffers() -> StackBuffers {
        StackBuffers::new(IntGauge::new("kept", "kept").expect("a gauge"))
    }

    fn filled(len: usize, byte: u8) -> Vec<u8> {
        vec![byte; len]
    }

    #[test]
    fn a_kept_buffer_is_reused_empty_by_the_next_batch_that_fits() {
        let buffers = buffers();
        let now = Instant::now();
        let large = filled(4 * MIB, 0xAB);
        let address = large.as_ptr();
        buffers.keep([large], 4, now);
        let reused = buffers.take(3 * MIB);
        assert_eq!(reused.as_ptr(), address, "the kept buffer's memory is used again");
        assert!(reused.is_empty(), "nothing of the batch before is left readable");
        assert!(reused.capacity() >= 3 * MIB);
        assert_eq!(buffers.held_bytes(), 0, "a taken buffer is no longer kept");
        // None fits: a new one, and the kept one stays for later.
        buffers.keep([reused], 4, now);
        assert!(buffers.take(8 * MIB).capacity() >= 8 * MIB);
        assert!(buffers.held_bytes() >= 4 * MIB);
    }

    #[test]
    fn the_smallest_fitting_buffer_is_taken_and_small_ones_are_not_kept() {
        let buffers = buffers();
        let now = Instant::now();
        let (two, eight) = (filled(2 * MIB, 1), filled(8 * MIB, 2));
        let two_at = two.as_ptr();
        buffers.keep([eight, two, filled(4096, 3)], 8, now);
        assert_eq!(buffers.lock().buffers.len(), 2, "a buffer under 1 MiB is the allocator's to reuse");
        let taken = buffers.take(MIB + 1);
        assert_eq!(taken.as_ptr(), two_at);
        let small = buffers.take(4096);
        assert!(small.capacity() >= 4096 && small.is_empty());
        assert_eq!(buffers.lock().buffers.len(), 1, "a small batch takes no kept buffer");
    }

    #[test]
    fn at_most_the_limit_is_kept_the_largest_first() {
        let buffers = buffers();
        let now = Instant::now();
        buffers.keep((1..=5).map(|mib| filled(mib * MIB, 0)), 2, now);
        let mut capacities: Vec<usize> = buffers.lock().buffers.iter().map(|(b, _)| b.capacity() / MIB).collect();
        capacities.sort_unstable();
        assert_eq!(capacities, vec![4, 5]);
    }

    #[test]
    fn buffers_unused_for_a_while_go_back() {
        let buffers = buffers();
        let start = Instant::now();
        assert_eq!(buffers.release_due(), None);
        buffers.keep([filled(2 * MIB, 0)], 4, start);
        buffers.keep([filled(3 * MIB, 0)], 4, start + KEEP_FOR / 2);
        assert_eq!(buffers.gauge.get(), 5 * MIB as i64, "the gauge shows what is kept");
        assert_eq!(buffers.release_due(), Some(start + KEEP_FOR));
        buffers.release_unused(start + KEEP_FOR);
        assert_eq!(buffers.held_bytes() / MIB, 3, "the buffer used since stays");
        assert_eq!(buffers.gauge.get(), 3 * MIB as i64);
        assert_eq!(buffers.release_due(), Some(start + KEEP_FOR / 2 + KEEP_FOR));
        buffers.clear();
        assert_eq!((buffers.held_bytes(), buffers.release_due(), buffers.gauge.get()), (0, None, 0));
    }

    #[test]
    fn the_gauge_is_shared_with_other_copies_of_the_model_and_forgets_a_copy_that_ends() {
        let gauge = IntGauge::new("kept", "kept").expect("a gauge");
        let (one, other) = (StackBuffers::new(gauge.clone()), StackBuffers::new(gauge.clone()));
        one.keep([filled(2 * MIB, 0)], 4, Instant::now());
        other.keep([filled(3 * MIB, 0)], 4, Instant::now());
        assert_eq!(gauge.get(), 5 * MIB as i64);
        drop(one.take(MIB));
        assert_eq!(gauge.get(), 3 * MIB as i64, "a taken buffer is no longer counted");
        drop(other);
        assert_eq!(gauge.get(), 0, "an ended copy's buffers go with it");
    }
}
