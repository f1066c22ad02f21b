//! One log line when the store stops answering and one when it answers again, with the count
//! of requests answered 503 between: an outage is one story to an operator, not a warning per
//! request (issue 35: a 10 s freeze wrote 388 lines).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

pub struct OutageLog {
    what: &'static str,
    /// Set while an outage is open; read on every success, so kept apart from the details.
    open: AtomicBool,
    details: Mutex<Option<Outage>>,
}

struct Outage {
    since: Instant,
    failures: u64,
}

impl OutageLog {
    pub const fn new(what: &'static str) -> Self {
        OutageLog { what, open: AtomicBool::new(false), details: Mutex::new(None) }
    }

    /// A request failed for `reason`: the first failure of an outage is logged, the rest counted.
    pub fn failed(&self, reason: &dyn std::fmt::Display) {
        let mut details = self.details.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match details.as_mut() {
            Some(outage) => outage.failures += 1,
            None => {
                tracing::warn!("{} unavailable, answering 503 until it is back: {reason}", self.what);
                *details = Some(Outage { since: Instant::now(), failures: 1 });
                self.open.store(true, Ordering::Release);
            }
        }
    }

    /// A request got its answer: an open outage ends, logged with its length and count.
    pub fn answered(&self) {
        if !self.open.load(Ordering::Acquire) {
            return;
        }
        let mut details = self.details.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(outage) = details.take() {
            self.open.store(false, Ordering::Release);
            tracing::warn!(
                "{} back after {:.1} s; {} requests were answered 503 meanwhile",
                self.what,
                outage.since.elapsed().as_secs_f64(),
                outage.failures
            );
        }
    }

    #[cfg(test)]
    fn failures(&self) -> Option<u64> {
        self.details.lock().ok()?.as_ref().map(|outage| outage.failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: failures are counted within one outage, and an answer closes it.
    #[test]
    fn an_outage_counts_its_failures_until_an_answer() {
        let log = OutageLog::new("test store");
        log.answered();
        assert_eq!(log.failures(), None);
        for _ in 0..3 {
            log.failed(&"timed out");
        }
        assert_eq!(log.failures(), Some(3));
        log.answered();
        assert_eq!(log.failures(), None);
        log.failed(&"again");
        assert_eq!(log.failures(), Some(1), "a new outage starts its own count");
    }
}
