//! The circuit breaker on a node's ledger path. With Redis down or hung, every purchase that won
//! a local unit would otherwise wait its whole ledger call timeout before hearing 503, holding a
//! connection, a queue slot and a unit all that time. After `failures_max` consecutive ledger
//! calls that failed for the ledger's own sake (no answer in time, a dropped connection, a write
//! not replicated in time) the breaker **opens**: winners are answered 503 with `Retry-After` at
//! once and their units go straight back to the allotment. After `cool_down` it is **half-open**:
//! one purchase goes through as a probe; its call succeeding closes the breaker, failing opens it
//! again for another cool-down.
//!
//! Business answers (sold out, user limit, an ended epoch, a missing SKU) are the ledger
//! answering, so they count as successes: only reachability trips the breaker.
//!
//! Non-goals: it never decides a sale and never holds a unit. A request refused by it decided
//! nothing, so the buyer's retry with the same key is a fresh attempt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::BreakerSettings;

/// What the breaker does with a purchase that holds a local unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerAdmission {
    /// Closed: go to the ledger.
    Pass,
    /// Half-open: this purchase is the one probe; its ledger call decides the breaker's state.
    Probe,
    /// Open, or a probe is out: answer 503 now, and come back after `retry_after`.
    Refuse { retry_after: Duration },
}

/// The breaker's state as the gauge and `/ready` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probe_sent: Instant },
}

/// One node's breaker, shared by its purchase path (which asks [`Breaker::admit`]) and its
/// confirmers (which [`Breaker::record`] every ledger call's result).
pub struct Breaker {
    settings: BreakerSettings,
    /// std Mutex: held for a few instructions, never across an `.await`.
    phase: Mutex<Phase>,
    /// Whether `phase` is `Closed`, written under its lock: every winner asks [`Breaker::admit`],
    /// and while the ledger answers that is one load instead of a lock all winners share.
    closed: AtomicBool,
    /// `seckill_ledger_breaker_state{node}`: 0 closed, 1 open, 2 half-open.
    gauge: metrics::Gauge,
}

impl Breaker {
    pub fn new(node: &str, settings: BreakerSettings) -> Breaker {
        assert!(settings.failures_max > 0, "a breaker that opens after 0 failures never closes");
        let gauge = metrics::gauge!("seckill_ledger_breaker_state", "node" => node.to_string());
        gauge.set(BreakerState::Closed as u8 as f64);
        Breaker { settings, phase: Mutex::new(Phase::Closed { failures: 0 }), closed: AtomicBool::new(true), gauge }
    }

    /// Whether a purchase holding a local unit may go to the ledger now.
    pub fn admit(&self) -> BreakerAdmission {
        // Acquire pairs with `record`'s Release: a winner that sees "open" sees its deadline.
        if self.closed.load(Ordering::Acquire) {
            return BreakerAdmission::Pass;
        }
        let now = Instant::now();
        let mut phase = self.lock();
        match *phase {
            Phase::Closed { .. } => BreakerAdmission::Pass,
            Phase::Open { until } if now < until => BreakerAdmission::Refuse { retry_after: until - now },
            Phase::HalfOpen { probe_sent } if now < probe_sent + self.settings.cool_down => {
                BreakerAdmission::Refuse { retry_after: probe_sent + self.settings.cool_down - now }
            }
            // Cool-down over, or the last probe never came back: send one (more) probe.
            Phase::Open { .. } | Phase::HalfOpen { .. } => {
                *phase = Phase::HalfOpen { probe_sent: now };
                self.gauge.set(BreakerState::HalfOpen as u8 as f64);
                BreakerAdmission::Probe
            }
        }
    }

    /// Takes in one ledger call's result: `reached` is false when the ledger did not answer (or
    /// did not replicate) in time.
    pub fn record(&self, reached: bool) {
        let mut phase = self.lock();
        let next = match (*phase, reached) {
            (_, true) => Phase::Closed { failures: 0 },
            (Phase::Closed { failures }, false) if failures + 1 < self.settings.failures_max => {
                Phase::Closed { failures: failures + 1 }
            }
            (Phase::Closed { .. } | Phase::HalfOpen { .. }, false) => {
                Phase::Open { until: Instant::now() + self.settings.cool_down }
            }
            // Calls sent before it opened still come back; they do not extend the cool-down.
            (open @ Phase::Open { .. }, false) => open,
        };
        let (was, now) = (state_of(&phase), state_of(&next));
        *phase = next;
        self.closed.store(now == BreakerState::Closed, Ordering::Release);
        if was != now {
            self.gauge.set(now as u8 as f64);
            match now {
                BreakerState::Open => tracing::warn!("ledger circuit breaker opened: failing purchases fast"),
                BreakerState::Closed => tracing::info!("ledger circuit breaker closed: the ledger answers again"),
                BreakerState::HalfOpen => {}
            }
        }
    }

    pub fn state(&self) -> BreakerState {
        state_of(&self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        // A panic while holding it cannot leave a torn `Phase` (it is replaced whole), so a
        // poisoned lock is still a valid state.
        self.phase.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn state_of(phase: &Phase) -> BreakerState {
    match phase {
        Phase::Closed { .. } => BreakerState::Closed,
        Phase::Open { .. } => BreakerState::Open,
        Phase::HalfOpen { .. } => BreakerState::HalfOpen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new("t", BreakerSettings { failures_max: 3, cool_down: Duration::from_secs(1) })
    }

    /// Goal: the breaker opens only after `failures_max` consecutive failures, a success in
    /// between resets the count. Method: paused Tokio time, record results, read `admit`.
    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_only() {
        let breaker = breaker();
        breaker.record(false);
        breaker.record(false);
        breaker.record(true);
        breaker.record(false);
        breaker.record(false);
        assert_eq!(breaker.admit(), BreakerAdmission::Pass);
        breaker.record(false);
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(
            matches!(breaker.admit(), BreakerAdmission::Refuse { retry_after } if retry_after == Duration::from_secs(1))
        );
    }

    /// Goal: after the cool-down exactly one probe goes through; its success closes the breaker,
    /// its failure re-opens it for a full cool-down.
    #[tokio::test(start_paused = true)]
    async fn one_probe_after_the_cool_down_decides() {
        let breaker = breaker();
        for _ in 0..3 {
            breaker.record(false);
        }
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert_eq!(breaker.admit(), BreakerAdmission::Probe);
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert!(matches!(breaker.admit(), BreakerAdmission::Refuse { .. }), "one probe at a time");
        breaker.record(false);
        assert_eq!(breaker.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(
            matches!(breaker.admit(), BreakerAdmission::Refuse { .. }),
            "a failed probe re-opens for a full cool-down"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(breaker.admit(), BreakerAdmission::Probe);
        breaker.record(true);
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(breaker.admit(), BreakerAdmission::Pass);
    }

    /// Goal: a probe that never reports (its request stopped before the ledger) does not hold
    /// the breaker half-open for good: another probe goes after one more cool-down.
    #[tokio::test(start_paused = true)]
    async fn a_lost_probe_is_replaced_after_a_cool_down() {
        let breaker = breaker();
        for _ in 0..3 {
            breaker.record(false);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(breaker.admit(), BreakerAdmission::Probe);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(breaker.admit(), BreakerAdmission::Probe);
    }
}
