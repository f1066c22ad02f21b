//! The rules of a SKU's waiting room: how fast buyers are let through to buy, and how many may
//! hold a ticket at once. The room itself (its line, draw and tickets) lives in the ledger, next
//! to the stock it admits against; these are the numbers every process agrees on.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most admissions per second one room may be set to: past it the room shapes nothing a node
/// could not take directly.
pub const ADMIT_PER_S_MAX: u32 = 100_000;
/// The widest over-admission: buyers admitted beyond the units left only wait at the ledger.
pub const ADMIT_FACTOR_MAX: f64 = 100.0;
/// Bounds of the two times, in seconds: a ticket must outlive a page's purchase round trip, and
/// an hour is longer than any buyer keeps a tab on a sale.
pub const ROOM_SECONDS_MIN: u64 = 2;
pub const ROOM_SECONDS_MAX: u64 = 3600;

/// `[waiting_room]` (fleet-wide) or a SKU's own `waiting_room = { … }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoomRules {
    /// Buyers let through per second, fleet-wide, for this SKU.
    pub admit_per_s: u32,
    /// Never more live tickets than this many times the units the ledger has left: at 1.0 each
    /// admitted buyer finds a unit unless another admitted buyer's purchase took it first.
    pub admit_factor: f64,
    /// How long an admission's ticket stays usable.
    pub ticket_ttl_s: u64,
    /// A waiter whose page stops heart-beating this long leaves the line.
    pub abandon_s: u64,
}

// `admit_factor` is checked finite by `validate`, so equality is reflexive for valid rules.
impl Eq for RoomRules {}

impl Default for RoomRules {
    fn default() -> Self {
        Self { admit_per_s: 500, admit_factor: 1.5, ticket_ttl_s: 30, abandon_s: 20 }
    }
}

/// A rule the room settings break: the field, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidRoom {
    pub field: &'static str,
    pub reason: &'static str,
}

impl RoomRules {
    pub fn validate(&self) -> Result<(), InvalidRoom> {
        let invalid = |field, reason| Err(InvalidRoom { field, reason });
        if self.admit_per_s == 0 || self.admit_per_s > ADMIT_PER_S_MAX {
            return invalid("admit_per_s", "must be between 1 and 100000");
        }
        if !self.admit_factor.is_finite() || !(1.0..=ADMIT_FACTOR_MAX).contains(&self.admit_factor) {
            return invalid(
                "admit_factor",
                "must be between 1.0 and 100.0: below 1 the last units could never be admitted",
            );
        }
        if !(ROOM_SECONDS_MIN..=ROOM_SECONDS_MAX).contains(&self.ticket_ttl_s) {
            return invalid("ticket_ttl_s", "must be between 2 and 3600");
        }
        if !(ROOM_SECONDS_MIN..=ROOM_SECONDS_MAX).contains(&self.abandon_s) {
            return invalid("abandon_s", "must be between 2 and 3600");
        }
        Ok(())
    }

    pub fn ticket_ttl(&self) -> Duration {
        Duration::from_secs(self.ticket_ttl_s)
    }

    pub fn abandon_after(&self) -> Duration {
        Duration::from_secs(self.abandon_s)
    }

    /// Most tickets live at once when `remaining` units are left.
    pub fn live_cap(&self, remaining: u64) -> u64 {
        // Exact for the totals the ledger allows (below 2^53).
        (self.admit_factor * remaining as f64).floor() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_each_bound_is_checked() {
        assert_eq!(RoomRules::default().validate(), Ok(()));
        let field = |rules: RoomRules| rules.validate().err().map(|e| e.field);
        assert_eq!(field(RoomRules { admit_per_s: 0, ..Default::default() }), Some("admit_per_s"));
        assert_eq!(field(RoomRules { admit_per_s: ADMIT_PER_S_MAX, ..Default::default() }), None);
        assert_eq!(field(RoomRules { admit_factor: 0.99, ..Default::default() }), Some("admit_factor"));
        assert_eq!(field(RoomRules { admit_factor: f64::NAN, ..Default::default() }), Some("admit_factor"));
        assert_eq!(field(RoomRules { admit_factor: 1.0, ..Default::default() }), None);
        assert_eq!(field(RoomRules { ticket_ttl_s: 1, ..Default::default() }), Some("ticket_ttl_s"));
        assert_eq!(field(RoomRules { abandon_s: 3601, ..Default::default() }), Some("abandon_s"));
    }

    #[test]
    fn the_live_cap_rounds_down() {
        let rules = RoomRules { admit_factor: 1.5, ..Default::default() };
        assert_eq!((rules.live_cap(0), rules.live_cap(1), rules.live_cap(3)), (0, 1, 4));
    }
}
