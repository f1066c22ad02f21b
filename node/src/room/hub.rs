//! One SKU's room as seen from one node: the waiters connected here, and the ticker that tells
//! the ledger they are still there (their heartbeat), lets the line through (any node's tick
//! admits; the ledger's bucket keeps the fleet-wide rate) and pushes each waiter's new place.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ledger::room::ROOM_TICK_USERS_MAX;
use ledger::{Place, RoomCall, RoomFigures, RoomRules, SkuId, UserId};
use serde::Serialize;
use tokio::sync::watch;

use crate::ticket::TicketKey;

/// How often a node ticks each room it serves: a sold-out reaches its waiters within this plus
/// one ledger call, well inside the second the issue allows.
pub const TICK: Duration = Duration::from_millis(250);

/// A waiter handle lives this long; a page that outlives it joins again (and keeps its place).
pub const WAITER_TTL: Duration = Duration::from_secs(60 * 60);

/// The admission rate is measured over this span.
const RATE_WINDOW_MS: u64 = 10_000;

/// What a waiter's page is told, on the event stream and in answer to a join.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WaiterStatus {
    pub sku: SkuId,
    /// `pre_queue`, `waiting`, `admitted`, `sold_out`, `ended`, or `left` (not in the room:
    /// join again).
    pub state: &'static str,
    pub waiter: String,
    pub position: Option<u64>,
    pub ahead: Option<u64>,
    /// Estimated seconds until admission, from the measured admission rate.
    pub wait_s: Option<f64>,
    pub ticket: Option<String>,
    pub ticket_expires_at_ms: Option<u64>,
    pub starts_at_ms: Option<u64>,
    pub server_ms: u64,
    pub remaining: u64,
}

/// The room's figures with the measured admission rate, for the status route and estimates.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub figures: RoomFigures,
    /// Admissions per second over the last few seconds; `None` before two samples.
    pub rate: Option<f64>,
}

/// One waiter connected here: its statuses' channel, and what its last status told.
struct Waiter {
    sender: watch::Sender<Option<WaiterStatus>>,
    told: Option<Told>,
}

impl Waiter {
    fn new() -> Waiter {
        Waiter { sender: watch::channel(None).0, told: None }
    }
}

pub struct Hub {
    sku: SkuId,
    rules: RoomRules,
    starts_at_ms: Option<u64>,
    ends_at_ms: Option<u64>,
    key: TicketKey,
    /// Waiters with a stream open here (or just joined), each with its latest status.
    waiters: Mutex<HashMap<UserId, Waiter>>,
    /// (ledger ms, admissions ever) samples, oldest first.
    samples: Mutex<VecDeque<(u64, u64)>>,
    latest: Mutex<Option<Snapshot>>,
}

impl Hub {
    pub fn new(sku: SkuId, rules: RoomRules, window: (Option<u64>, Option<u64>), key: TicketKey) -> Hub {
        Hub {
            sku,
            rules,
            starts_at_ms: window.0,
            ends_at_ms: window.1,
            key,
            waiters: Mutex::new(HashMap::new()),
            samples: Mutex::new(VecDeque::new()),
            latest: Mutex::new(None),
        }
    }

    pub fn sku(&self) -> &SkuId {
        &self.sku
    }

    pub fn rules(&self) -> &RoomRules {
        &self.rules
    }

    pub fn starts_at_ms(&self) -> Option<u64> {
        self.starts_at_ms
    }

    pub fn ends_at_ms(&self) -> Option<u64> {
        self.ends_at_ms
    }

    pub fn key(&self) -> &TicketKey {
        &self.key
    }

    pub fn call<'a>(&'a self, seed: &'a str) -> RoomCall<'a> {
        RoomCall { rules: &self.rules, starts_at_ms: self.starts_at_ms, seed }
    }

    pub fn snapshot(&self) -> Option<Snapshot> {
        self.latest.lock().ok().and_then(|latest| latest.clone())
    }

    /// Takes in a ledger answer: the rate sample and the figures.
    pub fn observe(&self, figures: &RoomFigures) -> Snapshot {
        let rate = match self.samples.lock() {
            Ok(mut samples) => {
                samples.push_back((figures.now_ms, figures.admitted));
                while samples.front().is_some_and(|(at, _)| at + RATE_WINDOW_MS < figures.now_ms) {
                    samples.pop_front();
                }
                match (samples.front(), samples.back()) {
                    (Some((t0, a0)), Some((t1, a1))) if t1 > t0 => {
                        Some(a1.saturating_sub(*a0) as f64 * 1000.0 / (t1 - t0) as f64)
                    }
                    _ => None,
                }
            }
            Err(_) => None,
        };
        let snapshot = Snapshot { figures: figures.clone(), rate };
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some(snapshot.clone());
        }
        snapshot
    }

    /// What `user` is told of `place` under `snapshot`.
    pub fn status(&self, user: &UserId, place: &Place, snapshot: &Snapshot) -> WaiterStatus {
        let figures = &snapshot.figures;
        let expires = figures.now_ms.saturating_add(millis(WAITER_TTL));
        let mut status = WaiterStatus {
            sku: self.sku.clone(),
            state: "left",
            waiter: self.key.waiter(self.sku.as_str(), user.as_str(), expires),
            position: None,
            ahead: None,
            wait_s: None,
            ticket: None,
            ticket_expires_at_ms: None,
            starts_at_ms: self.starts_at_ms,
            server_ms: figures.now_ms,
            remaining: figures.remaining,
        };
        if let Place::Waiting { position, ahead } = place {
            status.position = Some(*position);
            status.ahead = Some(*ahead);
            let rate = snapshot.rate.filter(|rate| *rate > 0.0).unwrap_or(f64::from(self.rules.admit_per_s));
            status.wait_s = Some((*ahead as f64 / rate * 10.0).round() / 10.0);
        }
        status.state = if self.ends_at_ms.is_some_and(|end| figures.now_ms >= end) || figures.closed {
            "ended"
        } else if figures.remaining == 0 {
            "sold_out"
        } else {
            match place {
                Place::Absent => "left",
                Place::PreQueue => "pre_queue",
                Place::Waiting { .. } => "waiting",
                Place::Admitted { token, expires_at_ms } => {
                    status.ticket =
                        Some(self.key.ticket(self.sku.as_str(), user.as_str(), token.as_str(), *expires_at_ms));
                    status.ticket_expires_at_ms = Some(*expires_at_ms);
                    "admitted"
                }
            }
        };
        status
    }

    /// The stream of `user`'s statuses, seeded with `status` when the caller has one.
    pub fn subscribe(
        &self,
        user: &UserId,
        status: Option<WaiterStatus>,
    ) -> Option<watch::Receiver<Option<WaiterStatus>>> {
        let mut waiters = self.waiters.lock().ok()?;
        let waiter = waiters.entry(user.clone()).or_insert_with(Waiter::new);
        if let Some(status) = status {
            waiter.sender.send_replace(Some(status));
            waiter.told = None;
        }
        Some(waiter.sender.subscribe())
    }

    /// Records `status` for a waiter that just joined, so the stream it opens next starts with it
    /// (and the next ticks beat for it until the stream is open).
    pub fn joined(&self, user: &UserId, status: WaiterStatus) {
        if let Ok(mut waiters) = self.waiters.lock() {
            let waiter = waiters.entry(user.clone()).or_insert_with(Waiter::new);
            waiter.sender.send_replace(Some(status));
            waiter.told = None;
        }
    }

    /// The waiters to beat for: those with a stream open, and those joined since the last tick
    /// (no stream yet). Waiters whose streams all closed are dropped after one more beat.
    fn present(&self) -> Vec<UserId> {
        let Ok(mut waiters) = self.waiters.lock() else { return Vec::new() };
        let present: Vec<UserId> = waiters.keys().cloned().collect();
        waiters.retain(|_, waiter| waiter.sender.receiver_count() > 0);
        present
    }

    /// Pushes each named waiter's new place. What a waiter would be told is compared first in
    /// its cheap form (no signing): most ticks change nothing for most waiters.
    fn push(&self, users: &[UserId], places: &[Place], snapshot: &Snapshot) {
        let Ok(mut waiters) = self.waiters.lock() else { return };
        for (user, place) in users.iter().zip(places) {
            let Some(waiter) = waiters.get_mut(user) else { continue };
            let told = self.told(place, &snapshot.figures);
            if waiter.told.as_ref() == Some(&told) {
                continue;
            }
            waiter.told = Some(told);
            waiter.sender.send_modify(|current| {
                let handle = current.as_ref().map(|current| current.waiter.clone());
                let mut status = self.status(user, place, snapshot);
                // The handle signed at the join stays good for an hour: no new MAC per push.
                if let Some(handle) = handle {
                    status.waiter = handle;
                }
                *current = Some(status);
            });
        }
    }

    /// Tells every waiter here that the SKU sold out (or closed) at once, without waiting for
    /// each one's place from the ledger: that answer is the same for all of them.
    fn push_shut(&self, snapshot: &Snapshot) {
        let Ok(waiters) = self.waiters.lock() else { return };
        for waiter in waiters.values() {
            waiter.sender.send_if_modified(|current| match current {
                Some(status) if !matches!(status.state, "sold_out" | "ended") => {
                    status.state = if snapshot.figures.closed { "ended" } else { "sold_out" };
                    status.ticket = None;
                    status.ticket_expires_at_ms = None;
                    status.wait_s = None;
                    status.remaining = snapshot.figures.remaining;
                    status.server_ms = snapshot.figures.now_ms;
                    true
                }
                _ => false,
            });
        }
    }

    /// The part of a status that is news to a buyer, as [`WaiterStatus::told`] reads it.
    fn told(&self, place: &Place, figures: &RoomFigures) -> Told {
        let shut = self.ends_at_ms.is_some_and(|end| figures.now_ms >= end) || figures.closed || figures.remaining == 0;
        let (position, ahead) = match place {
            Place::Waiting { position, ahead } => (Some(*position), Some(*ahead)),
            _ => (None, None),
        };
        let token = match place {
            Place::Admitted { token, .. } if !shut => Some(token.as_str().to_owned()),
            _ => None,
        };
        Told { shut, place: std::mem::discriminant(place), position, ahead, token, remaining: figures.remaining }
    }
}

/// What makes a status news: compared before any signing.
#[derive(PartialEq)]
struct Told {
    shut: bool,
    place: std::mem::Discriminant<Place>,
    position: Option<u64>,
    ahead: Option<u64>,
    token: Option<String>,
    remaining: u64,
}

/// Ticks `hub` until the node stops or drops it: heartbeats for its waiters, admissions, and
/// each waiter's place pushed.
pub async fn run(hub: Weak<Hub>, ledger: Arc<dyn ledger::SalesLedger>, mut stop: impl FnMut() -> bool) {
    // Nodes' rooms start on the same crowd's first joins; a random phase spreads their ticks
    // over the period instead of emptying the admission bucket all at once.
    tokio::time::sleep(TICK.mul_f64(fastrand::f64())).await;
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(hub) = hub.upgrade() else { return };
        if stop() {
            return;
        }
        let seed = super::fresh_seed();
        let present = hub.present();
        let chunks: Vec<&[UserId]> =
            if present.is_empty() { vec![&[]] } else { present.chunks(ROOM_TICK_USERS_MAX).collect() };
        for users in chunks {
            match ledger.room_tick(&hub.sku, hub.call(&seed), users).await {
                Ok(view) => {
                    let snapshot = hub.observe(&view.figures);
                    if view.figures.shut() {
                        hub.push_shut(&snapshot);
                    }
                    hub.push(users, &view.places, &snapshot);
                }
                Err(e) => {
                    tracing::debug!(sku = %hub.sku, "room tick failed: {e}");
                    break;
                }
            }
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
