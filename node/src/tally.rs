//! A count that every request bumps, kept in per-thread slots: request threads on many cores
//! would otherwise take turns owning one cache line for a figure only operators read. A read
//! sums the slots; it may miss bumps made while it reads, never count one twice.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

/// Enough slots that the runtime's worker threads rarely share one.
const SLOTS: usize = 16;

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT: Cell<Option<usize>> = const { Cell::new(None) };
}

fn slot() -> usize {
    SLOT.with(|slot| match slot.get() {
        Some(at) => at,
        None => {
            let at = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SLOTS;
            slot.set(Some(at));
            at
        }
    })
}

pub struct Tally {
    slots: [CachePadded<AtomicU64>; SLOTS],
}

impl Default for Tally {
    fn default() -> Self {
        Tally { slots: std::array::from_fn(|_| CachePadded::new(AtomicU64::new(0))) }
    }
}

impl Tally {
    pub fn bump(&self) {
        self.slots[slot()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn sum(&self) -> u64 {
        self.slots.iter().map(|slot| slot.load(Ordering::Relaxed)).fold(0, u64::wrapping_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn bumps_from_many_threads_all_count() {
        let tally = Arc::new(Tally::default());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let tally = tally.clone();
                std::thread::spawn(move || (0..1000).for_each(|_| tally.bump()))
            })
            .collect();
        threads.into_iter().for_each(|thread| thread.join().expect("a bumping thread"));
        assert_eq!(tally.sum(), 8000);
    }
}
