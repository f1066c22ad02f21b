//! A node's local allotment of one SKU: the counter every purchase races on.
//!
//! Invariant: the count never goes below zero. `take` is a compare-and-swap loop that checks
//! before it subtracts, so there is no moment, not even a transient one, in which a wrapping
//! `fetch_sub` could show another thread a huge or negative count.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Units this node may still sell of one SKU without asking anyone. Cache-padded: every
/// purchase of the SKU on every core writes it, and sharing its cache line with a neighbour
/// would slow both.
#[derive(Debug, Default)]
pub struct LocalStock {
    units: CachePadded<AtomicU64>,
}

impl LocalStock {
    pub fn new(units: u64) -> Self {
        Self { units: CachePadded::new(AtomicU64::new(units)) }
    }

    /// Takes `qty` units if that many are left; otherwise takes nothing and returns false.
    pub fn take(&self, qty: u64) -> bool {
        debug_assert!(qty > 0, "a take of no units: qty is validated to 1..=qty_max");
        // Relaxed load: only a hint for the first CAS; a stale value just costs one retry.
        let mut current = self.units.load(Ordering::Relaxed);
        loop {
            if current < qty {
                return false;
            }
            // AcqRel on success orders this take with the give-backs that raced it; Relaxed on
            // failure because we only retry with the fresh value. `_weak` may fail spuriously,
            // which the loop absorbs, and is cheaper on LL/SC machines.
            match self.units.compare_exchange_weak(current, current - qty, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    debug_assert!(current >= qty, "the stock never goes below zero");
                    return true;
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Returns units that were taken but not sold (the ledger refused, or could not be reached).
    pub fn give_back(&self, qty: u64) {
        // Adding cannot underflow; it can only overflow if more came back than was ever taken,
        // which is a bug in the caller, so it is checked.
        let before = self.units.fetch_add(qty, Ordering::AcqRel);
        assert!(before.checked_add(qty).is_some(), "local stock overflowed: gave back more than was taken");
    }

    /// Takes every unit above `max` (the coordinator asked this node to hold at most that
    /// many) and returns how many it took; a stock at or below `max` is left as it is.
    pub fn take_above(&self, max: u64) -> u64 {
        // Relaxed load: a hint for the first CAS, as in `take`.
        let mut current = self.units.load(Ordering::Relaxed);
        loop {
            if current <= max {
                return 0;
            }
            // AcqRel on success, Relaxed on failure: see `take`.
            match self.units.compare_exchange_weak(current, max, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return current - max,
                Err(actual) => current = actual,
            }
        }
    }

    /// Empties the stock (the allotment was revoked) and returns what it held.
    pub fn take_all(&self) -> u64 {
        // AcqRel: see `take`.
        self.units.swap(0, Ordering::AcqRel)
    }

    /// Units left right now; stale as soon as it returns.
    pub fn remaining(&self) -> u64 {
        self.units.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn take_never_goes_below_zero() {
        let stock = LocalStock::new(3);
        assert!(stock.take(2));
        assert!(!stock.take(2), "1 left, 2 asked: refused whole");
        assert_eq!(stock.remaining(), 1);
        assert!(stock.take(1));
        assert!(!stock.take(1));
        stock.give_back(2);
        assert_eq!(stock.remaining(), 2);
    }

    #[test]
    fn racing_threads_take_exactly_the_stock() {
        // Goal: under contention, the units handed out equal the initial count, never more.
        // Method: 8 threads each try 10,000 takes of 1 from a stock of 25,000.
        let stock = Arc::new(LocalStock::new(25_000));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let stock = stock.clone();
                std::thread::spawn(move || (0..10_000).filter(|_| stock.take(1)).count() as u64)
            })
            .collect();
        let taken: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(taken, 25_000);
        assert_eq!(stock.remaining(), 0);
    }
}
