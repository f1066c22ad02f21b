//! One SKU's room as seen from one node: the waiters connected here, what each is told, and
//! the round ([`Hub::due`], [`Hub::read`], [`Hub::push`]) the ticker (`super::ticker`) runs
//! every [`TICK`]: name the waiters whose place or heartbeat is due to the ledger (any node's
//! tick admits; the ledger's bucket keeps the fleet-wide rate), then push each waiter's news.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ledger::{Place, RoomCall, RoomFigures, RoomRules, SalesLedger, SkuId, UserId};
use tokio::sync::watch;

use super::fresh_seed;
use super::joins::Joins;
use super::waiter::{Cadence, Known, Need, Told, Waiter, WaiterStatus};
use crate::ticket::TicketKey;

/// How often a node ticks each room it serves: a sold-out reaches its waiters within this plus
/// one ledger call, well inside a second.
pub const TICK: Duration = Duration::from_millis(250);

/// A waiter handle lives this long; a page that outlives it joins again (and keeps its place).
pub const WAITER_TTL: Duration = Duration::from_secs(60 * 60);

/// The admission rate is measured over this span.
const RATE_WINDOW_MS: u64 = 10_000;

/// A join's answer: its place and the room's figures, or why the ledger could not be asked.
pub type JoinAnswer = Result<(Place, Snapshot), String>;

/// The room's figures with the measured admission rate, for the status route and estimates.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub figures: RoomFigures,
    /// Admissions per second over the last few seconds; `None` before two samples.
    pub rate: Option<f64>,
}

pub struct Hub {
    sku: SkuId,
    rules: RoomRules,
    cadence: Cadence,
    starts_at_ms: Option<u64>,
    ends_at_ms: Option<u64>,
    key: TicketKey,
    /// Waiters with a stream open here (or just joined), each with its latest status.
    waiters: Mutex<HashMap<UserId, Waiter>>,
    /// (ledger ms, admissions ever) samples, oldest first.
    samples: Mutex<VecDeque<(u64, u64)>>,
    latest: Mutex<Option<Snapshot>>,
    joins: Joins<JoinAnswer>,
    ledger: Arc<dyn SalesLedger>,
}

impl Hub {
    pub fn new(
        sku: SkuId,
        rules: RoomRules,
        window: (Option<u64>, Option<u64>),
        key: TicketKey,
        ledger: Arc<dyn SalesLedger>,
    ) -> Hub {
        Hub {
            sku,
            cadence: Cadence::of(&rules),
            rules,
            starts_at_ms: window.0,
            ends_at_ms: window.1,
            key,
            waiters: Mutex::new(HashMap::new()),
            samples: Mutex::new(VecDeque::new()),
            latest: Mutex::new(None),
            joins: Joins::default(),
            ledger,
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

    pub(super) fn ledger(&self) -> &Arc<dyn SalesLedger> {
        &self.ledger
    }

    /// Places `user` in the room (with whoever else joins here meanwhile, [`Joins`]): its place
    /// and the room's figures, or why the ledger could not be asked.
    pub async fn join(self: &Arc<Self>, user: UserId) -> JoinAnswer {
        match self.joins.enqueue(user) {
            Some((receiver, lead)) => {
                if lead {
                    // Its own task: the join that started it is answered with its batch, not
                    // after the batches that arrive behind it.
                    tokio::spawn(self.clone().call_joins_until_empty());
                }
                receiver.await.unwrap_or_else(|_| Err("the room's join was dropped".into()))
            }
            None => Err("the room's joins are unavailable".into()),
        }
    }

    async fn call_joins_until_empty(self: Arc<Self>) {
        while let Some(batch) = self.joins.next_batch() {
            let users: Vec<UserId> = batch.iter().map(|(user, _)| user.clone()).collect();
            let seed = fresh_seed();
            match self.ledger.room_join(&self.sku, self.call(&seed), &users).await {
                Ok(view) => {
                    let snapshot = self.observe(&view.figures);
                    let mut places = view.places.into_iter();
                    for (_, answer) in batch {
                        let place = places.next().unwrap_or(Place::Absent);
                        let _ = answer.send(Ok((place, snapshot.clone())));
                    }
                }
                Err(e) => {
                    let reason = e.to_string();
                    for (_, answer) in batch {
                        let _ = answer.send(Err(reason.clone()));
                    }
                }
            }
        }
    }

    /// `ended` (past the sale's end, or closed) or `sold_out` at `now_ms` under `figures`;
    /// `None` while the room may still let buyers through.
    pub fn shut_state(&self, figures: &RoomFigures, now_ms: u64) -> Option<&'static str> {
        if self.ends_at_ms.is_some_and(|end| now_ms >= end) || figures.closed {
            Some("ended")
        } else if figures.remaining == 0 {
            Some("sold_out")
        } else {
            None
        }
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

    /// What `user` is told of `place` under `snapshot`, with a freshly signed waiter handle.
    pub fn status(&self, user: &UserId, place: &Place, snapshot: &Snapshot) -> WaiterStatus {
        self.status_with(user, place, snapshot, None)
    }

    /// [`Self::status`], keeping `handle` if given: one signed at the join stays good for an
    /// hour, so a push needs no new MAC.
    fn status_with(&self, user: &UserId, place: &Place, snapshot: &Snapshot, handle: Option<String>) -> WaiterStatus {
        let figures = &snapshot.figures;
        let expires = figures.now_ms.saturating_add(millis(WAITER_TTL));
        let mut status = WaiterStatus {
            sku: self.sku.clone(),
            state: "left",
            waiter: handle.unwrap_or_else(|| self.key.waiter(self.sku.as_str(), user.as_str(), expires)),
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
        status.state = if let Some(shut) = self.shut_state(figures, figures.now_ms) {
            shut
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

    /// The stream of `user`'s statuses, starting from a fresh read at the next tick: whatever
    /// this node knew before may be older than what the waiter heard since (a join answered by
    /// another node, say), and a count ahead must never grow. A stream of the same waiter
    /// already open here (another tab) hears nothing new until that read.
    pub fn subscribe(&self, user: &UserId) -> Option<watch::Receiver<Option<WaiterStatus>>> {
        let mut waiters = self.waiters.lock().ok()?;
        let waiter = waiters.entry(user.clone()).or_insert_with(Waiter::default);
        waiter.sender.send_replace(None);
        waiter.known = Known::Unknown;
        waiter.told = None;
        Some(waiter.sender.subscribe())
    }

    /// Records where a join just placed `user` (under `figures`) and what it was told: a
    /// stream of it open here hears it, and the join was its heartbeat. A tick that read the
    /// waiter later than the join did keeps its word: the join's answer is older news.
    pub fn joined(&self, user: &UserId, place: &Place, figures: &RoomFigures, status: WaiterStatus, now: Instant) {
        if let Ok(mut waiters) = self.waiters.lock() {
            let waiter = waiters.entry(user.clone()).or_insert_with(Waiter::default);
            if waiter.read_at_ms > figures.now_ms {
                return;
            }
            waiter.sender.send_replace(Some(status));
            waiter.known = Known::read(place, figures.admitted);
            waiter.read_at_ms = figures.now_ms;
            waiter.named_at = Some(now);
            waiter.told = None;
        }
    }

    /// The waiters to name to the ledger in the tick at `now`, most urgent first, at most
    /// `max`. A waiter whose streams here all closed gets one last beat and is forgotten.
    pub fn due(&self, now: Instant, max: usize) -> Vec<UserId> {
        let figures = self.snapshot().map(|snapshot| snapshot.figures);
        let Ok(mut waiters) = self.waiters.lock() else { return Vec::new() };
        let mut due: Vec<(Need, Option<Instant>, UserId)> = waiters
            .iter()
            .filter_map(|(user, waiter)| {
                let need = waiter.need(figures.as_ref(), &self.cadence, now)?;
                Some((need, waiter.named_at, user.clone()))
            })
            .collect();
        waiters.retain(|_, waiter| waiter.sender.receiver_count() > 0);
        // The longest unbeaten first among equals: a tick that cannot name them all names the
        // rest next time.
        due.sort_unstable_by_key(|(need, named_at, _)| (*need, *named_at));
        due.truncate(max);
        due.into_iter().map(|(_, _, user)| user).collect()
    }

    /// Takes in what the ledger said of `users` (named in one call at `now`).
    pub fn read(&self, users: &[UserId], places: &[Place], figures: &RoomFigures, now: Instant) {
        let Ok(mut waiters) = self.waiters.lock() else { return };
        for (user, place) in users.iter().zip(places) {
            if let Some(waiter) = waiters.get_mut(user) {
                waiter.known = Known::read(place, figures.admitted);
                waiter.read_at_ms = figures.now_ms;
                waiter.named_at = Some(now);
            }
        }
    }

    /// Pushes each waiter's news under `snapshot`: its place as last read, in line fewer ahead
    /// by the admissions since ([`Known::estimate`]). A sell-out reaches everyone at once; a
    /// change of the counts alone about once a second ([`super::waiter::COUNTS_PUSH_EVERY`]).
    pub fn push(&self, snapshot: &Snapshot, now: Instant) {
        let Ok(mut waiters) = self.waiters.lock() else { return };
        for (user, waiter) in waiters.iter_mut() {
            let Some(place) = waiter.known.estimate(snapshot.figures.admitted) else { continue };
            let told = self.told(&place, &snapshot.figures);
            if !waiter.worth_pushing(&told, now) {
                continue;
            }
            waiter.told = Some(told);
            waiter.pushed_at = Some(now);
            waiter.sender.send_modify(|current| {
                let handle = current.take().map(|current| current.waiter);
                *current = Some(self.status_with(user, &place, snapshot, handle));
            });
        }
    }

    /// The part of a status that is news to a buyer.
    fn told(&self, place: &Place, figures: &RoomFigures) -> Told {
        let shut = self.shut_state(figures, figures.now_ms).is_some();
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

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> Hub {
        let ledger: Arc<dyn SalesLedger> = Arc::new(ledger::EmbeddedLedger::new(Duration::from_secs(60)));
        let sku = SkuId::new("phone").expect("a SKU id");
        Hub::new(sku, RoomRules::default(), (None, None), TicketKey::random(), ledger)
    }

    fn figures(now_ms: u64, admitted: u64) -> RoomFigures {
        RoomFigures { now_ms, remaining: 5, closed: false, draw: None, waiting: 70, admitted, live: 0, head: Some(1) }
    }

    fn ahead(hub: &Hub, user: &UserId) -> Option<u64> {
        match hub.waiters.lock().expect("waiters")[user].known {
            Known::Waiting { ahead, .. } => Some(ahead),
            _ => None,
        }
    }

    /// The seed-31 nemesis run: a join answered by one node, a later one by another, and a
    /// stream opened on the first showed the older, larger count ahead.
    #[test]
    fn a_stream_starts_from_a_fresh_read_and_an_older_join_never_overwrites_a_newer_read() {
        let hub = hub();
        let user = UserId::new("w8").expect("a user id");
        let now = Instant::now();
        let joined_at = figures(1_000, 10);
        let place = Place::Waiting { position: 127, ahead: 65 };
        let status = hub.status(&user, &place, &hub.observe(&joined_at));
        hub.joined(&user, &place, &joined_at, status.clone(), now);
        let stream = hub.subscribe(&user).expect("a stream");
        assert_eq!(*stream.borrow(), None, "nothing from before the stream: the next tick reads it");
        assert_eq!(hub.due(now, 10), vec![user.clone()], "and the next tick names it");

        hub.read(std::slice::from_ref(&user), &[Place::Waiting { position: 127, ahead: 63 }], &figures(2_000, 12), now);
        hub.joined(&user, &place, &joined_at, status, now);
        assert_eq!(ahead(&hub, &user), Some(63), "the join read before the tick: older news");
    }
}
