//! One waiter connected to this node: its statuses' channel, what the ledger last said of its
//! place, and when it was last named to the ledger (its heartbeat) and last pushed.
//!
//! **Why a node does not ask for every waiter's place on every tick.** A place moves in one
//! way only while its waiter stays in line: every admission takes the line's head, one of those
//! ahead of it. So a node that read a place once can tell how many are still ahead from the
//! room's count of admissions since, and the ledger's line head tells it when the waiter itself
//! was let through (its position fell below the head). The node asks the ledger again only for
//! a waiter whose place it does not know, one close enough to the head to be let through next,
//! one the head has passed, and, for the heartbeat, each waiter every [`Cadence::beat`]. The
//! room's cost then follows admissions and arrivals, not the crowd: a crowd of 100,000 would
//! otherwise cost 400,000 place lookups a second in the ledger's one Redis core.

use std::time::{Duration, Instant};

use ledger::{Place, RoomFigures, RoomRules, SkuId, SubmitToken};
use serde::Serialize;
use tokio::sync::watch;

/// Most time between two heartbeats of one waiter; never more than a quarter of `abandon_s`,
/// so a lost call or two does not let the ledger take a waiter for gone.
const BEAT_MAX: Duration = Duration::from_secs(2);

/// A waiter this close to the head (in admissions of the room at its rate) is asked about on
/// every tick, so its admission is pushed at once.
const NEAR_HEAD: Duration = Duration::from_secs(1);

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

/// Changes of the counts alone (places ahead, units left) reach a waiter at most this often,
/// plus up to [`COUNTS_PUSH_SPREAD`]: news worth a glance, not a push on every tick to every
/// waiter of the crowd.
pub const COUNTS_PUSH_EVERY: Duration = Duration::from_secs(1);
/// Waiters that joined together would otherwise all take their counts on the same tick, a
/// burst that a sell-out notice then queues behind; each gets its own share of a second more.
pub const COUNTS_PUSH_SPREAD: Duration = Duration::from_secs(1);

/// What this node last learned of a waiter's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// Not read here yet (its stream just opened here), or to be read again.
    Unknown,
    PreQueue,
    /// In line with `ahead` before it when the room had made `admitted` admissions.
    Waiting {
        position: u64,
        ahead: u64,
        admitted: u64,
    },
    Admitted {
        token: SubmitToken,
        expires_at_ms: u64,
    },
    Absent,
}

impl Known {
    /// What `place` says, read when the room had made `admitted` admissions.
    pub fn read(place: &Place, admitted: u64) -> Known {
        match place {
            Place::Absent => Known::Absent,
            Place::PreQueue => Known::PreQueue,
            Place::Waiting { position, ahead } => Known::Waiting { position: *position, ahead: *ahead, admitted },
            Place::Admitted { token, expires_at_ms } => {
                Known::Admitted { token: token.clone(), expires_at_ms: *expires_at_ms }
            }
        }
    }

    /// The place to show now that the room made `admitted` admissions: as read, or, in line,
    /// fewer ahead by the admissions since. Never fewer than are truly ahead: one ahead that
    /// left shows only at the next read. `None` before any read.
    pub fn estimate(&self, admitted: u64) -> Option<Place> {
        Some(match self {
            Known::Unknown => return None,
            Known::PreQueue => Place::PreQueue,
            Known::Waiting { position, ahead, admitted: then } => {
                Place::Waiting { position: *position, ahead: ahead.saturating_sub(admitted.saturating_sub(*then)) }
            }
            Known::Admitted { token, expires_at_ms } => {
                Place::Admitted { token: token.clone(), expires_at_ms: *expires_at_ms }
            }
            Known::Absent => Place::Absent,
        })
    }
}

/// How often a room's waiters are named to the ledger.
#[derive(Debug, Clone, Copy)]
pub struct Cadence {
    /// Each waiter is named at least this often: its heartbeat.
    pub beat: Duration,
    /// Waiters this many places from the head (or fewer) are named on every tick.
    pub near_head: u64,
}

impl Cadence {
    pub fn of(rules: &RoomRules) -> Cadence {
        let beat = BEAT_MAX.min(rules.abandon_after() / 4);
        let near_head = (f64::from(rules.admit_per_s) * NEAR_HEAD.as_secs_f64()).ceil() as u64 + 1;
        Cadence { beat, near_head }
    }
}

/// Why a waiter is named in this tick, the more urgent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// Its place may have changed in a way the waiter must hear of now.
    Place,
    /// Its heartbeat is due (or its last stream here closed: one last beat).
    Beat,
}

/// One waiter connected here.
pub struct Waiter {
    pub sender: watch::Sender<Option<WaiterStatus>>,
    pub told: Option<Told>,
    pub known: Known,
    /// The ledger's clock (Unix ms) when `known` was read.
    pub read_at_ms: u64,
    /// When this node last named it to the ledger.
    pub named_at: Option<Instant>,
    pub pushed_at: Option<Instant>,
    /// Its interval between two pushes of counts alone.
    counts_every: Duration,
}

impl Default for Waiter {
    fn default() -> Waiter {
        Waiter {
            sender: watch::channel(None).0,
            told: None,
            known: Known::Unknown,
            read_at_ms: 0,
            named_at: None,
            pushed_at: None,
            counts_every: COUNTS_PUSH_EVERY + COUNTS_PUSH_SPREAD.mul_f64(fastrand::f64()),
        }
    }
}

impl Waiter {
    /// Whether to name it to the ledger in the tick at `now`, given the room as last read.
    pub fn need(&self, figures: Option<&RoomFigures>, cadence: &Cadence, now: Instant) -> Option<Need> {
        let urgent = match (figures, &self.known) {
            (None, _) | (_, Known::Unknown) => true,
            (Some(figures), Known::PreQueue) => figures.draw.is_some(),
            (Some(figures), known @ Known::Waiting { position, .. }) => {
                let passed = figures.head.is_none_or(|head| *position < head);
                let close = matches!(known.estimate(figures.admitted), Some(Place::Waiting { ahead, .. }) if ahead <= cadence.near_head);
                passed || close
            }
            (Some(figures), Known::Admitted { expires_at_ms, .. }) => *expires_at_ms <= figures.now_ms,
            (Some(_), Known::Absent) => false,
        };
        let beat_due = self.named_at.is_none_or(|at| now.saturating_duration_since(at) >= cadence.beat);
        if urgent {
            Some(Need::Place)
        } else if beat_due || self.sender.receiver_count() == 0 {
            Some(Need::Beat)
        } else {
            None
        }
    }

    /// Whether `told` is worth a push at `now`: anything but a change of the counts alone, and
    /// that at most every [`COUNTS_PUSH_EVERY`] and its share of [`COUNTS_PUSH_SPREAD`].
    pub fn worth_pushing(&self, told: &Told, now: Instant) -> bool {
        match &self.told {
            None => true,
            Some(old) if old == told => false,
            Some(old) if old.same_but_counts(told) => {
                self.pushed_at.is_none_or(|at| now.saturating_duration_since(at) >= self.counts_every)
            }
            Some(_) => true,
        }
    }
}

/// What makes a status news: compared before any signing.
#[derive(Debug, Clone, PartialEq)]
pub struct Told {
    pub shut: bool,
    pub place: std::mem::Discriminant<Place>,
    pub position: Option<u64>,
    pub ahead: Option<u64>,
    pub token: Option<String>,
    pub remaining: u64,
}

impl Told {
    fn same_but_counts(&self, other: &Told) -> bool {
        (self.shut, self.place, self.position, &self.token) == (other.shut, other.place, other.position, &other.token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(admitted: u64, head: Option<u64>) -> RoomFigures {
        RoomFigures {
            now_ms: 1_000,
            remaining: 10,
            closed: false,
            draw: Some(ledger::Draw { seed: "s".into(), at_ms: 1, placed: 0 }),
            waiting: 100,
            admitted,
            live: 0,
            head,
        }
    }

    fn waiting(position: u64, ahead: u64, admitted: u64) -> Waiter {
        Waiter { known: Known::Waiting { position, ahead, admitted }, ..Waiter::default() }
    }

    #[test]
    fn the_places_ahead_fall_by_the_admissions_since_the_read_and_never_below_zero() {
        let known = Known::Waiting { position: 50, ahead: 30, admitted: 100 };
        assert_eq!(known.estimate(110), Some(Place::Waiting { position: 50, ahead: 20 }));
        assert_eq!(known.estimate(200), Some(Place::Waiting { position: 50, ahead: 0 }));
        assert_eq!(known.estimate(90), Some(Place::Waiting { position: 50, ahead: 30 }), "a count never grows back");
        assert_eq!(Known::Unknown.estimate(5), None);
    }

    #[test]
    fn only_the_unknown_the_near_and_the_passed_are_read_on_every_tick() {
        let cadence = Cadence { beat: Duration::from_secs(2), near_head: 10 };
        let now = Instant::now();
        let mut far = waiting(500, 400, 0);
        far.named_at = Some(now);
        let _stream = far.sender.subscribe();
        assert_eq!(far.need(Some(&figures(0, Some(100))), &cadence, now), None, "far back, just beaten");
        assert_eq!(far.need(Some(&figures(395, Some(495))), &cadence, now), Some(Need::Place), "near the head now");
        assert_eq!(far.need(Some(&figures(0, Some(501))), &cadence, now), Some(Need::Place), "the head passed it");
        assert_eq!(far.need(Some(&figures(0, None)), &cadence, now), Some(Need::Place), "the line emptied");
        let later = now + Duration::from_secs(2);
        assert_eq!(far.need(Some(&figures(0, Some(100))), &cadence, later), Some(Need::Beat), "its heartbeat");
        assert_eq!(Waiter::default().need(Some(&figures(0, Some(1))), &cadence, now), Some(Need::Place), "unknown");
        drop(_stream);
        assert_eq!(far.need(Some(&figures(0, Some(100))), &cadence, now), Some(Need::Beat), "its stream closed");
    }

    #[test]
    fn counts_alone_are_pushed_at_most_every_second_and_anything_else_at_once() {
        let now = Instant::now();
        let told = |ahead: u64, token: Option<&str>| Told {
            shut: false,
            place: std::mem::discriminant(&Place::Absent),
            position: Some(9),
            ahead: Some(ahead),
            token: token.map(str::to_string),
            remaining: 5,
        };
        let mut waiter = Waiter::default();
        assert!(waiter.worth_pushing(&told(5, None), now), "the first status");
        waiter.told = Some(told(5, None));
        waiter.pushed_at = Some(now);
        assert!(!waiter.worth_pushing(&told(5, None), now), "nothing new");
        assert!(!waiter.worth_pushing(&told(4, None), now + COUNTS_PUSH_EVERY / 2), "a count, too soon");
        let later = now + COUNTS_PUSH_EVERY + COUNTS_PUSH_SPREAD;
        assert!(waiter.worth_pushing(&told(4, None), later), "a count, a second or two later");
        assert!(waiter.worth_pushing(&told(4, Some("t")), now + Duration::from_millis(1)), "a ticket: at once");
    }

    #[test]
    fn the_heartbeat_comes_four_times_within_abandon_s_and_at_most_every_two_seconds() {
        let rules = |abandon_s: u64| RoomRules { abandon_s, admit_per_s: 100, ..RoomRules::default() };
        assert_eq!(Cadence::of(&rules(4)).beat, Duration::from_secs(1));
        assert_eq!(Cadence::of(&rules(60)).beat, BEAT_MAX);
        assert_eq!(Cadence::of(&rules(60)).near_head, 101);
    }
}
