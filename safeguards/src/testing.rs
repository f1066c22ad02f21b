//! A metrics recorder for tests: counts what this crate's counters record, so a test can assert
//! that a refusal or a lock event was counted. Install it with [`with_recorder`] around the
//! constructor ([`crate::IdGenerator::open`], [`crate::DistributedLock::new`]): both
//! register their handles there, and the handles keep counting into it afterwards, from any
//! thread or task.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Runs `build` with `recorder` as this thread's recorder; handles registered inside keep
/// counting into it.
pub fn with_recorder<T>(recorder: &TestRecorder, build: impl FnOnce() -> T) -> T {
    metrics::with_local_recorder(recorder, build)
}

/// Counters by name and labels. Gauges and histograms are dropped: this crate has none.
#[derive(Default)]
pub struct TestRecorder {
    /// A std `Mutex`: only registration takes it, never across an `.await`.
    counters: Mutex<BTreeMap<Key, Arc<AtomicU64>>>,
}

impl TestRecorder {
    /// The sum of every counter named `name` whose labels include all of `labels`.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        counters
            .iter()
            .filter(|(key, _)| key.name() == name)
            .filter(|(key, _)| {
                labels.iter().all(|(label, value)| key.labels().any(|l| l.key() == *label && l.value() == *value))
            })
            // Relaxed: a test reads the count after the work that made it has been joined.
            .map(|(_, value)| value.load(Ordering::Relaxed))
            .sum()
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        Counter::from_arc(counters.entry(key.clone()).or_default().clone())
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
