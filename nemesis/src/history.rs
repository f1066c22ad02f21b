//! What a schedule recorded: every purchase request the buyers sent (key, user, node, answer,
//! times) and the fault timeline (what the nemesis did, when). The checker judges these, and
//! `--out` writes them as JSON lines, so a violation can be read request by request.
//!
//! Times are milliseconds since the schedule's clock started ([`Clock`]), the same clock for
//! requests, faults and the monitor's samples.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Most requests one schedule records. The workload is bounded well below this; a history that
/// reaches it is marked truncated and the checker says so instead of judging half a run.
pub const REQUESTS_MAX: usize = 500_000;

/// Most timeline events one schedule records (a handful per fault).
pub const EVENTS_MAX: usize = 10_000;

/// The schedule's clock: milliseconds since it started, and the wall-clock time it started at,
/// to place the ledger's times (Unix ms by Redis' clock, on this machine) on it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    started: Instant,
    origin_unix_ms: u64,
}

impl Clock {
    pub fn start() -> Self {
        let origin_unix_ms = orders::unix_ms();
        Self { started: Instant::now(), origin_unix_ms }
    }

    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn instant_at(&self, ms: u64) -> Instant {
        self.started + std::time::Duration::from_millis(ms)
    }

    /// Unix ms when the clock read 0.
    pub fn origin_unix_ms(&self) -> u64 {
        self.origin_unix_ms
    }
}

/// Outcomes that are decisions: the ledger's (stored) or a node's from memory. Everything else
/// (503, 502, 504, 429, 408, `in_progress`, a timeout or a connection error) decided nothing,
/// and the buyer retries it with the same key. A list of decisions, not of retries, so a 503
/// with a code this list never heard of is a retry too: `stripe_empty` (the buyer's stripe of a
/// striped SKU is dry while another still holds units) is one.
pub const DECISIONS: [&str; 6] = ["purchased", "sold_out", "user_limit", "ended", "token_invalid", "key_reused"];

/// One purchase request and what came back.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    /// The SKU it bought; empty in histories written before a run could sell two.
    #[serde(default)]
    pub sku: String,
    /// The Idempotency-Key: one purchase attempt, the same on every retry.
    pub key: String,
    /// 0 for the key's first use; 1 when a buyer reused the key after the idempotency TTL (a
    /// new purchase by the documented meaning).
    #[serde(default)]
    pub reuse: u32,
    pub user: String,
    /// The node it was sent to.
    pub node: String,
    /// 0 for the first send of the key, then one more per retry or repeat.
    pub attempt: u32,
    /// HTTP status; none for a timeout or a connection error.
    pub status: Option<u16>,
    /// `purchased`, the `error` code of a refusal, `bad_gateway`, `gateway_timeout`, `timeout`
    /// or `connection_error`.
    pub outcome: String,
    pub order_id: Option<String>,
    /// The answer carried `Idempotent-Replayed: true`: a stored decision, not a fresh one.
    pub replayed: bool,
    pub sent_ms: u64,
    pub answered_ms: u64,
}

impl Request {
    /// Whether the answer is a decision (see [`DECISIONS`]).
    pub fn is_decision(&self) -> bool {
        DECISIONS.contains(&self.outcome.as_str())
    }

    pub fn is_purchase(&self) -> bool {
        self.outcome == "purchased"
    }

    /// One line for a person: what was sent where, and what came back when.
    pub fn line(&self) -> String {
        let status = self.status.map_or("---".to_string(), |s| s.to_string());
        let order = self.order_id.as_deref().map(|id| format!(" order {id}")).unwrap_or_default();
        let replayed = if self.replayed { " (replayed)" } else { "" };
        let reuse = if self.reuse > 0 { format!(" (reuse {})", self.reuse) } else { String::new() };
        format!(
            "{:>7} ms → {:>7} ms  {} key {}{reuse} user {} → {} attempt {}: {status} {}{replayed}{order}",
            self.sent_ms, self.answered_ms, self.sku, self.key, self.user, self.node, self.attempt, self.outcome
        )
    }
}

/// One step of the fault timeline.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    pub at_ms: u64,
    /// The planned fault it belongs to, if any.
    pub fault: Option<usize>,
    pub what: String,
}

impl Event {
    pub fn line(&self) -> String {
        match self.fault {
            Some(id) => format!("{:>7} ms  [fault {id}] {}", self.at_ms, self.what),
            None => format!("{:>7} ms  {}", self.at_ms, self.what),
        }
    }
}

/// Shared, bounded recorders; a std `Mutex`, as no guard is held across an `.await`.
#[derive(Clone)]
pub struct History {
    clock: Clock,
    requests: Arc<Mutex<Vec<Request>>>,
    events: Arc<Mutex<Vec<Event>>>,
    truncated: Arc<std::sync::atomic::AtomicBool>,
}

impl History {
    pub fn new(clock: Clock) -> Self {
        Self {
            clock,
            requests: Arc::new(Mutex::new(Vec::new())),
            events: Arc::new(Mutex::new(Vec::new())),
            truncated: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    pub fn record(&self, request: Request) {
        let mut requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        if requests.len() < REQUESTS_MAX {
            requests.push(request);
        } else {
            // Relaxed: read once, after every buyer has finished.
            self.truncated.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Notes a step of the timeline, now.
    pub fn event(&self, fault: Option<usize>, what: impl Into<String>) {
        let event = Event { at_ms: self.clock.now_ms(), fault, what: what.into() };
        tracing::debug!("{}", event.line());
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if events.len() < EVENTS_MAX {
            events.push(event);
        }
    }

    /// Requests sent so far (buyers may still be adding).
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn truncated(&self) -> bool {
        // Relaxed: see `record`.
        self.truncated.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16, outcome: &str) -> Request {
        Request {
            sku: "s".into(),
            key: "k".into(),
            reuse: 0,
            user: "u".into(),
            node: "n1".into(),
            attempt: 0,
            status: Some(status),
            outcome: outcome.into(),
            order_id: None,
            replayed: false,
            sent_ms: 0,
            answered_ms: 1,
        }
    }

    #[test]
    fn a_dry_stripe_or_any_other_503_is_retried_not_decided() {
        for code in ["stripe_empty", "unavailable", "a_code_from_a_newer_node"] {
            assert!(!answered(503, code).is_decision(), "{code}");
        }
        assert!(answered(409, "sold_out").is_decision());
    }
}
