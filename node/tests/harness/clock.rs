//! The wall clock a script moves: the machine's time when the script starts (order events carry
//! the ledger's real time, and a node compares its own against them), plus every `tick` since.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use node::{Clock, SystemClock};

pub struct ScriptClock {
    start_ms: u64,
    /// Milliseconds the script has ticked.
    ticked_ms: AtomicU64,
}

impl ScriptClock {
    pub fn new() -> Self {
        Self { start_ms: SystemClock.now_unix_ms(), ticked_ms: AtomicU64::new(0) }
    }

    /// Unix ms `offset` from now (by this clock): where a script puts a sale window's edges.
    pub fn in_ms_from_now(&self, offset: Duration) -> u64 {
        self.now_unix_ms() + offset.as_millis() as u64
    }

    pub fn advance(&self, by: Duration) {
        self.ticked_ms.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ScriptClock {
    fn now_unix_ms(&self) -> u64 {
        self.start_ms + self.ticked_ms.load(Ordering::SeqCst)
    }
}
