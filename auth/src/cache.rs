//! Verified JWTs, remembered so that a buyer's next request costs a SHA-256, not a signature
//! check (an ES256 check is two orders of magnitude dearer than the hash).
//!
//! Keyed by the token's digest, so the map never holds a usable credential. Only successes are
//! stored, each with the window it is valid in (`nbf`/`exp` widened by the leeway) and the key
//! generation it was verified under: a rotation that drops a key makes every entry of older
//! generations a miss. Bounded: past `capacity` entries the expired ones go, and if that is not
//! enough, all of them (a refill costs one verification per live buyer).

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use protocol::UserId;
use sha2::{Digest, Sha256};

pub(crate) struct VerifiedCache {
    entries: DashMap<[u8; 32], Entry>,
    capacity: usize,
    /// Bumped when the keys change; entries of older generations are never answered.
    generation: AtomicU64,
}

#[derive(Clone)]
struct Entry {
    user: UserId,
    valid_from_s: u64,
    valid_until_s: u64,
    generation: u64,
}

/// The token's digest: the cache key.
pub(crate) fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl VerifiedCache {
    pub(crate) fn new(capacity: usize) -> VerifiedCache {
        VerifiedCache { entries: DashMap::new(), capacity, generation: AtomicU64::new(0) }
    }

    /// The user a token verified as, if it did under the current keys and is in its window now.
    pub(crate) fn get(&self, digest: &[u8; 32], now_s: u64) -> Option<UserId> {
        let entry = self.entries.get(digest)?;
        let current = entry.generation == self.generation.load(Ordering::Acquire)
            && (entry.valid_from_s..entry.valid_until_s).contains(&now_s);
        current.then(|| entry.user.clone())
    }

    pub(crate) fn insert(&self, digest: [u8; 32], user: UserId, valid_from_s: u64, valid_until_s: u64, now_s: u64) {
        // The verifier only caches a token it just accepted: one inside its window.
        debug_assert!((valid_from_s..valid_until_s).contains(&now_s), "only a token valid now is cached");
        if self.entries.len() >= self.capacity {
            self.entries.retain(|_, entry| entry.valid_until_s > now_s);
            if self.entries.len() >= self.capacity {
                self.entries.clear();
            }
        }
        let generation = self.generation.load(Ordering::Acquire);
        self.entries.insert(digest, Entry { user, valid_from_s, valid_until_s, generation });
    }

    /// Forgets every verification: the keys changed.
    pub(crate) fn new_generation(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.entries.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserId {
        UserId::new(name).unwrap()
    }

    #[test]
    fn answers_only_inside_the_window_and_the_generation() {
        let cache = VerifiedCache::new(10);
        let key = digest("a.b.c");
        cache.insert(key, user("ann"), 100, 200, 150);
        assert_eq!(cache.get(&key, 150), Some(user("ann")));
        assert_eq!(cache.get(&key, 99), None, "before nbf");
        assert_eq!(cache.get(&key, 200), None, "at exp");
        cache.new_generation();
        assert_eq!(cache.get(&key, 150), None, "verified under keys since rotated");
    }

    #[test]
    fn stays_within_its_capacity() {
        let cache = VerifiedCache::new(4);
        for i in 0..4 {
            cache.insert(digest(&format!("expired{i}")), user("ann"), 0, 10, 5);
        }
        cache.insert(digest("fresh"), user("bob"), 0, 100, 50);
        assert_eq!(cache.len(), 1, "the expired entries made room");
        for i in 0..10 {
            cache.insert(digest(&format!("live{i}")), user("ann"), 0, 100, 50);
            assert!(cache.len() <= 4);
        }
    }
}
