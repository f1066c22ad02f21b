//! GCRA (the generic cell rate algorithm) per key, in memory: one `u64` per key (the theoretical
//! arrival time), updated by compare-and-swap, so a check costs a map lookup and an atomic.
//!
//! Hand-written rather than `governor`'s keyed limiter: time comes in as an argument, so tests
//! drive it with a fake clock and the node feeds the same monotonic clock to every safeguard,
//! and idle keys can be pruned by the same rule that makes them idle (TAT in the past).

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;

/// A sustained rate with a burst allowance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Requests per second, sustained.
    pub per_s: f64,
    /// Requests that may arrive at once after a quiet spell (at least 1).
    pub burst: u32,
}

impl Rate {
    /// Nanoseconds between two requests at the sustained rate.
    fn interval_ns(self) -> u64 {
        (1e9 / self.per_s.max(1e-9)).round().clamp(1.0, u64::MAX as f64) as u64
    }
}

/// Per-key GCRA. Keys are whatever the caller limits on (a user id, an address).
pub struct KeyedGcra<K: Hash + Eq> {
    interval_ns: u64,
    /// How far ahead of now the TAT may run: `burst` intervals.
    tolerance_ns: u64,
    /// Key → theoretical arrival time of the next conforming request, ns on the caller's clock.
    tat: DashMap<K, AtomicU64>,
}

impl<K: Hash + Eq> KeyedGcra<K> {
    pub fn new(rate: Rate) -> Self {
        let interval_ns = rate.interval_ns();
        Self {
            interval_ns,
            tolerance_ns: interval_ns.saturating_mul(u64::from(rate.burst.max(1))),
            tat: DashMap::new(),
        }
    }

    /// Admits one request for `key` at `now_ns` (a monotonic clock), or says how long to wait.
    pub fn check<Q>(&self, key: &Q, now_ns: u64) -> Result<(), Duration>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(tat) = self.tat.get(key) {
            return self.advance(&tat, now_ns);
        }
        // First sight of the key (or pruned): the entry API takes the shard's write lock and
        // allocates the key, but only once per active key.
        let entry = self.tat.entry(key.to_owned()).or_insert_with(|| AtomicU64::new(0));
        self.advance(&entry, now_ns)
    }

    fn advance(&self, tat: &AtomicU64, now_ns: u64) -> Result<(), Duration> {
        // Relaxed: the TAT is the only state, and the CAS orders updates to it.
        let mut current = tat.load(Ordering::Relaxed);
        loop {
            let next = current.max(now_ns).saturating_add(self.interval_ns);
            let ahead = next - now_ns.min(next);
            if ahead > self.tolerance_ns {
                return Err(Duration::from_nanos(ahead - self.tolerance_ns));
            }
            match tat.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(seen) => current = seen,
            }
        }
    }

    /// Forgets keys whose TAT has passed: such a key behaves exactly like an unseen one, so
    /// dropping it changes no answer and keeps memory bounded by the keys active within one
    /// burst's worth of time.
    pub fn prune(&self, now_ns: u64) -> usize {
        let before = self.tat.len();
        self.tat.retain(|_, tat| tat.load(Ordering::Relaxed) > now_ns);
        before - self.tat.len()
    }

    pub fn keys(&self) -> usize {
        self.tat.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn allows_the_burst_then_the_sustained_rate() {
        let gcra = KeyedGcra::<String>::new(Rate { per_s: 10.0, burst: 3 });
        for _ in 0..3 {
            assert!(gcra.check("u", 0).is_ok(), "the burst passes at once");
        }
        let wait = gcra.check("u", 0).expect_err("the fourth at once is refused");
        assert_eq!(wait, Duration::from_millis(100), "one interval until the next conforming request");
        assert!(gcra.check("u", 99 * MS).is_err());
        assert!(gcra.check("u", 100 * MS).is_ok());
        assert!(gcra.check("other", 0).is_ok(), "keys are independent");
    }

    #[test]
    fn a_refused_request_does_not_push_the_key_further_back() {
        let gcra = KeyedGcra::<String>::new(Rate { per_s: 1.0, burst: 1 });
        assert!(gcra.check("u", 0).is_ok());
        for _ in 0..100 {
            assert!(gcra.check("u", 10 * MS).is_err());
        }
        assert!(gcra.check("u", 1_000 * MS).is_ok(), "hammering while refused costs nothing extra");
    }

    #[test]
    fn pruning_drops_only_idle_keys() {
        let gcra = KeyedGcra::<String>::new(Rate { per_s: 1.0, burst: 2 });
        gcra.check("idle", 0).unwrap();
        gcra.check("busy", 5_000 * MS).unwrap();
        assert_eq!(gcra.prune(5_000 * MS), 1);
        assert_eq!(gcra.keys(), 1);
        gcra.check("busy", 5_000 * MS).unwrap();
        assert!(gcra.check("busy", 5_000 * MS).is_err(), "the busy key kept its state");
    }

    #[test]
    fn concurrent_checks_admit_exactly_the_burst() {
        let gcra = std::sync::Arc::new(KeyedGcra::<String>::new(Rate { per_s: 0.001, burst: 50 }));
        let admitted: usize = (0..8)
            .map(|_| {
                let gcra = gcra.clone();
                std::thread::spawn(move || (0..100).filter(|_| gcra.check("u", 0).is_ok()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(admitted, 50);
    }
}
