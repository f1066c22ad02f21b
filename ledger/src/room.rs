//! A SKU's waiting room, kept by the ledger beside the stock it admits against (`lua/room.lua`
//! on Redis; the same rules in process for the embedded ledger).
//!
//! Why here and not in the coordinator: a room takes a write per arrival and a heartbeat per
//! waiter, which raft would put through consensus for nothing, and its one hard rule, "never
//! more live tickets than `admit_factor` × the units left", needs the units left at the instant
//! of admission, which only the ledger has. On Redis the room's keys share the SKU's hash slot,
//! so an admission reads `remaining` and writes the tickets in one atomic script, and the room
//! survives any node's death, as the stock does.
//!
//! **The line.** Before the sale starts, arrivals join a pre-queue (a set: no order). The first
//! call after the start draws it: each member's place is the SHA-1 of `<seed>:<user>`, sorted,
//! with a seed the caller drew at random and the ledger records ([`Draw`]), so anyone can
//! recompute the order and see it was not chosen. Later arrivals take the next position.
//! **Admission** pops the line's head, at most `admit_per_s` per second (a bucket holding a
//! quarter of a second's worth, one node tick, so any one second admits at most 1.25 × the rate,
//! plus one) and
//! never past `live_cap(remaining)` live tickets. A ticket is a submit token issued to the buyer
//! with the ticket's TTL, so `confirm` spends it with the sale: single use is the ledger's.
//! **Heartbeats**: a waiter named in a tick is seen; one not seen for `abandon_s` leaves.

use std::time::Duration;

use crate::{RoomRules, SubmitToken};

/// Where one buyer stands in a room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Not in the room: never joined, left (abandoned), or used or outlived its ticket.
    Absent,
    /// Joined before the start; placed by the draw.
    PreQueue,
    /// In line: `position` is its number (admission goes in that order), `ahead` how many still
    /// wait before it.
    Waiting { position: u64, ahead: u64 },
    /// Let through: buy with this token before `expires_at_ms` (Unix ms, the ledger's clock).
    Admitted { token: SubmitToken, expires_at_ms: u64 },
}

/// The draw of the pre-queue, recorded so it can be audited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    pub seed: String,
    pub at_ms: u64,
    /// Buyers it placed: positions 1 to `placed`.
    pub placed: u64,
}

/// The room's figures at one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomFigures {
    /// The ledger's clock (Unix ms) at the call: the time every room rule is judged by.
    pub now_ms: u64,
    /// The SKU's units left at the ledger.
    pub remaining: u64,
    /// Closed by an operator: nobody is admitted again.
    pub closed: bool,
    pub draw: Option<Draw>,
    /// Waiting: the pre-queue before the draw, the line after it.
    pub waiting: u64,
    /// Admissions ever made.
    pub admitted: u64,
    /// Tickets neither used nor expired.
    pub live: u64,
    /// The lowest position still in line (`None`: nobody in line). Every admission takes it,
    /// so a waiter placed below it is no longer waiting: let through, or gone.
    pub head: Option<u64>,
}

impl RoomFigures {
    /// Sold out or closed: nobody is let through now (units may come back to a sold-out SKU).
    pub fn shut(&self) -> bool {
        self.closed || self.remaining == 0
    }
}

/// What one room call answers: the figures, and the place of each buyer it named, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomView {
    pub figures: RoomFigures,
    pub places: Vec<Place>,
}

/// One admission, as the room's log keeps it for audits (the nemesis checks every rule on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// 1, 2, …: the order of admissions.
    pub seq: u64,
    /// The line position it was admitted from.
    pub position: u64,
    pub user: String,
    pub at_ms: u64,
    /// Units left, and live tickets including this one, at the admission.
    pub remaining: u64,
    pub live: u64,
}

/// What every room call carries: the SKU's rules and start, and a fresh random seed (used if the
/// call draws the pre-queue, and to make the tokens of the tickets it issues unguessable).
#[derive(Debug, Clone, Copy)]
pub struct RoomCall<'a> {
    pub rules: &'a RoomRules,
    pub starts_at_ms: Option<u64>,
    pub seed: &'a str,
}

/// Most buyers one tick names, and most admissions it makes: bounds the script's run time.
pub const ROOM_TICK_USERS_MAX: usize = 1000;
pub const ROOM_ADMITS_PER_CALL_MAX: u64 = 1000;

/// The admission bucket holds one node tick's worth of admissions (`node::room`'s 250 ms): a
/// smaller one would cap each tick below the rate, a larger one allow bigger bursts.
pub const ROOM_BUCKET_SECONDS: f64 = 0.25;

/// How long a room's keys outlive its last call: long after every sale of the SKU.
pub const ROOM_KEYS_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The place of each pre-queue member after a draw with `seed`, first to last: the order
/// `lua/room.lua` gives them (its SHA-1 hex digests sorted; a tie, impossible in practice, by
/// user id).
pub fn drawn_order<'a>(seed: &str, users: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut keyed: Vec<(String, &str)> = users
        .into_iter()
        .map(|user| (sha1_smol::Sha1::from(format!("{seed}:{user}")).digest().to_string(), user))
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, user)| user).collect()
}
