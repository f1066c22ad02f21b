//! The one wall clock every seckill process reads: [`Clock`], its real [`SystemClock`], and
//! [`unix_ms`] for code that has no clock injected.
//!
//! Wall-clock time is Unix milliseconds. It stamps things (order times, lease stamps, sale
//! windows, id timestamps, signature windows); durations and deadlines inside a process use the
//! monotonic clock instead. A machine whose clock reads before 1970 reads as the epoch: every
//! sale window stays closed ("not started"), the safe side.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Longest single sleep [`SystemClock::wait_past`] takes, whatever it is asked: a caller waiting
/// longer re-reads the clock and asks again. One second is the id generator's largest tolerated
/// rollback, the only wait anyone asks for.
pub const WAIT_PAST_SLEEP_MAX: Duration = Duration::from_secs(1);

/// Wall-clock time, injected so that tests can stand before or after a sale window, step back,
/// or stand still.
///
/// Contract for implementors: [`Clock::now_unix_ms`] may go backwards (a stepped system clock
/// does); every caller that cares guards against it. A plain `Fn() -> u64` closure is a clock
/// too, for tests and benchmarks that pin the time.
pub trait Clock: Send + Sync + 'static {
    /// Unix milliseconds now.
    fn now_unix_ms(&self) -> u64;

    /// Blocks the calling thread until [`Clock::now_unix_ms`] is probably above `unix_ms`. May
    /// return early (callers re-read the clock); only waits of a few ms are asked for. The
    /// default sleeps one millisecond, enough for a clock that moves on its own.
    fn wait_past(&self, unix_ms: u64) {
        let _ = unix_ms;
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl<F: Fn() -> u64 + Send + Sync + 'static> Clock for F {
    fn now_unix_ms(&self) -> u64 {
        self()
    }
}

/// The machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        unix_ms()
    }

    fn wait_past(&self, unix_ms: u64) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let target = Duration::from_millis(unix_ms + 1);
        // Sleep for the rest of the ms, to the µs: the kernel wakes us within ~50–100 µs.
        if let Some(remaining) = target.checked_sub(now) {
            std::thread::sleep(remaining.min(WAIT_PAST_SLEEP_MAX));
        }
    }
}

/// Wall-clock Unix ms, for code without an injected [`Clock`].
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closure_is_a_clock_and_the_system_clock_reads_after_2020() {
        let pinned = || 42u64;
        assert_eq!(pinned.now_unix_ms(), 42);
        const JANUARY_2020_MS: u64 = 1_577_836_800_000;
        assert!(SystemClock.now_unix_ms() > JANUARY_2020_MS);
        assert!(unix_ms() > JANUARY_2020_MS);
    }
}
