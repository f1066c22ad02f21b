//! Wall-clock time, injected so that tests can stand before or after a sale window.

use std::time::{SystemTime, UNIX_EPOCH};

/// The time of day, in Unix milliseconds. Only sale windows read it; durations and deadlines use
/// the monotonic clock.
pub trait Clock: Send + Sync + 'static {
    fn now_unix_ms(&self) -> u64;
}

/// The machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        // A clock before 1970 is a broken machine; treating it as the epoch keeps every sale
        // window closed ("not started"), the safe side.
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    }
}
