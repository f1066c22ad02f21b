//! The classic lock-out rule: more than `hits` requests within `window` and the key is refused
//! for `block`, whatever it does meanwhile. Coarser than GCRA, and meant to be: it stops a bot
//! that paces itself just under the rate limit from probing forever.

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

use dashmap::DashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockoutRule {
    pub hits: u32,
    pub window: Duration,
    pub block: Duration,
}

/// What one hit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hit {
    Within,
    /// This hit crossed the line; the key is locked out for the rule's block time.
    LockedNow(Duration),
    /// Still locked out for this long.
    Locked(Duration),
}

impl Hit {
    /// How long the key is locked out, if it is.
    pub fn locked_for(self) -> Option<Duration> {
        match self {
            Hit::Within => None,
            Hit::LockedNow(wait) | Hit::Locked(wait) => Some(wait),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Tally {
    window_start_ns: u64,
    hits: u32,
    blocked_until_ns: u64,
}

/// Fixed windows per key: a window opens at a key's first request, so one counter per key is
/// enough; a burst straddling two windows can reach 2 × hits before it is caught, which the
/// rule's coarse purpose tolerates.
pub struct Lockout<K: Hash + Eq> {
    rule: LockoutRule,
    tallies: DashMap<K, Tally>,
}

impl<K: Hash + Eq> Lockout<K> {
    pub fn new(rule: LockoutRule) -> Self {
        Self { rule, tallies: DashMap::new() }
    }

    /// Counts one request and says whether the key is locked out (and for how long).
    pub fn hit<Q>(&self, key: &Q, now_ns: u64) -> Hit
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let window = self.rule.window.as_nanos() as u64;
        let mut tally = match self.tallies.get_mut(key) {
            Some(tally) => tally,
            None => self.tallies.entry(key.to_owned()).or_insert(Tally {
                window_start_ns: now_ns,
                hits: 0,
                blocked_until_ns: 0,
            }),
        };
        if tally.blocked_until_ns > now_ns {
            return Hit::Locked(Duration::from_nanos(tally.blocked_until_ns - now_ns));
        }
        if now_ns.saturating_sub(tally.window_start_ns) >= window {
            tally.window_start_ns = now_ns;
            tally.hits = 0;
        }
        tally.hits += 1;
        if tally.hits > self.rule.hits {
            tally.blocked_until_ns = now_ns.saturating_add(self.rule.block.as_nanos() as u64);
            return Hit::LockedNow(self.rule.block);
        }
        Hit::Within
    }

    /// Forgets keys whose window and block are both over.
    pub fn prune(&self, now_ns: u64) -> usize {
        let window = self.rule.window.as_nanos() as u64;
        let before = self.tallies.len();
        self.tallies.retain(|_, t| t.blocked_until_ns > now_ns || now_ns.saturating_sub(t.window_start_ns) < window);
        before - self.tallies.len()
    }

    pub fn keys(&self) -> usize {
        self.tallies.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn more_than_n_hits_in_the_window_blocks_for_the_block_time() {
        let lockout = Lockout::<String>::new(LockoutRule {
            hits: 3,
            window: Duration::from_secs(10),
            block: Duration::from_secs(60),
        });
        for at in 0..3 {
            assert_eq!(lockout.hit("u", at * S), Hit::Within);
        }
        assert_eq!(
            lockout.hit("u", 4 * S),
            Hit::LockedNow(Duration::from_secs(60)),
            "the fourth hit in 10 s locks out"
        );
        assert_eq!(lockout.hit("u", 30 * S), Hit::Locked(Duration::from_secs(34)), "blocked whatever it does");
        assert_eq!(lockout.hit("u", 64 * S), Hit::Within, "free again after the block");
        assert_eq!(lockout.hit("v", 4 * S), Hit::Within, "keys are independent");
    }

    #[test]
    fn a_new_window_starts_the_count_again() {
        let lockout = Lockout::<String>::new(LockoutRule {
            hits: 2,
            window: Duration::from_secs(1),
            block: Duration::from_secs(5),
        });
        assert_eq!(lockout.hit("u", 0), Hit::Within);
        assert_eq!(lockout.hit("u", S / 2), Hit::Within);
        assert_eq!(lockout.hit("u", S), Hit::Within, "the window rolled over");
        assert_eq!(lockout.prune(10 * S), 1);
    }
}
