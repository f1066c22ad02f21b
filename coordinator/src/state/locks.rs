//! The fleet's coordinator-backed locks (`safeguards::lock`): who holds each, until when (leader
//! time), and one fencing counter for all of them.
//!
//! Invariants (asserted on every change):
//! - a lock record has 1..=`LOCK_HOLDS_MAX` holds and a fence no greater than the counter;
//! - the counter only grows, so each name's fences strictly increase.

use std::collections::{BTreeMap, BTreeSet};

use protocol::locks::LockAnswer;
use serde::{Deserialize, Serialize};

/// Holds one owner may stack on one lock; the same bound as the Redis backend.
const LOCK_HOLDS_MAX: usize = safeguards::lock::LOCK_HOLDS_MAX as usize;

/// A lock held through the coordinator. The holder is an owner token; each acquisition by it is
/// a hold id, so a retried acquisition or release (its answer was lost) changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord {
    pub owner: String,
    pub fence: u64,
    pub holds: BTreeSet<u64>,
    /// Leader wall-clock ms at which the lock frees itself unless extended.
    pub expires_at_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Locks {
    /// Live locks by name (expired ones are dropped on the next acquisition).
    pub held: BTreeMap<String, LockRecord>,
    /// The last fencing token handed out, to any lock. One counter for all names: it only grows,
    /// so each name's fences strictly increase, and a freed lock leaves no record behind.
    pub fence: u64,
}

impl Locks {
    /// Takes a free (or expired) lock with a new fence, or adds a hold for the owner holding it.
    pub fn acquire(&mut self, name: String, owner: String, hold: u64, ttl_ms: u64, now_ms: u64) -> LockAnswer {
        let fence_before = self.fence;
        // An expired lock is free for everyone; dropping them all here keeps the map to live
        // locks. Deterministic: `now_ms` is in the command.
        self.held.retain(|_, lock| lock.expires_at_ms > now_ms);
        let answer = match self.held.get_mut(&name) {
            Some(lock) if lock.owner == owner => {
                if !lock.holds.contains(&hold) && lock.holds.len() >= LOCK_HOLDS_MAX {
                    return LockAnswer::LockHoldsMax;
                }
                lock.holds.insert(hold);
                lock.expires_at_ms = now_ms + ttl_ms;
                LockAnswer::LockAcquired { fence: lock.fence, holds: lock.holds.len() as u32 }
            }
            Some(lock) => LockAnswer::LockHeld { retry_after_ms: lock.expires_at_ms - now_ms },
            None => {
                self.fence += 1;
                let fence = self.fence;
                let lock = LockRecord { owner, fence, holds: BTreeSet::from([hold]), expires_at_ms: now_ms + ttl_ms };
                self.held.insert(name.clone(), lock);
                LockAnswer::LockAcquired { fence, holds: 1 }
            }
        };
        assert!(self.fence >= fence_before, "the lock fence went back");
        self.check(&name);
        answer
    }

    /// Drops a hold, if the owner holds the lock under that fence; the last hold frees it.
    pub fn release(&mut self, name: &str, owner: &str, fence: u64, hold: u64) -> LockAnswer {
        match self.held.get_mut(name) {
            Some(lock) if lock.owner == owner && lock.fence == fence => {
                lock.holds.remove(&hold);
                let holds_left = lock.holds.len() as u32;
                if holds_left == 0 {
                    self.held.remove(name);
                }
                self.check(name);
                LockAnswer::LockReleased { holds_left }
            }
            _ => LockAnswer::LockNotHeld,
        }
    }

    /// Moves the expiry to `now_ms + ttl_ms`, if the owner holds the live lock under that fence.
    pub fn extend(&mut self, name: &str, owner: &str, fence: u64, ttl_ms: u64, now_ms: u64) -> LockAnswer {
        match self.held.get_mut(name) {
            Some(lock) if lock.owner == owner && lock.fence == fence && lock.expires_at_ms > now_ms => {
                lock.expires_at_ms = now_ms + ttl_ms;
                LockAnswer::LockExtended
            }
            _ => LockAnswer::LockNotHeld,
        }
    }

    fn check(&self, name: &str) {
        if let Some(lock) = self.held.get(name) {
            assert!(!lock.holds.is_empty(), "lock {name} is held with no hold");
            assert!(lock.holds.len() <= LOCK_HOLDS_MAX, "lock {name} has more than LOCK_HOLDS_MAX holds");
            assert!(lock.fence <= self.fence, "lock {name} has a fence above the counter");
        }
    }
}
