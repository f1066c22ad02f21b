//! The lock backend of a single process (`seckill demo`, `seckill up` on the embedded ledger):
//! the same contract as the Redis and coordinator backends, kept in memory, for jobs whose
//! contenders all live in this process (two sweepers of one order service). It protects
//! nothing across processes; a fleet uses Redis or the coordinator.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::*;

struct Held {
    owner: OwnerToken,
    fence: u64,
    holds: BTreeSet<HoldId>,
    expires_at: Instant,
}

#[derive(Default)]
pub struct LocalLockBackend {
    /// Per name: the current holder (if any) and the last fence handed out, which never drops.
    locks: Mutex<HashMap<LockName, (Option<Held>, u64)>>,
}

impl LocalLockBackend {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_lock<T>(&self, name: &LockName, f: impl FnOnce(&mut Option<Held>, &mut u64) -> T) -> Result<T, LockError> {
        let mut locks = self.locks.lock().map_err(|_| LockError::Corrupt("local lock table poisoned".into()))?;
        let (held, last_fence) = locks.entry(name.clone()).or_insert((None, 0));
        if held.as_ref().is_some_and(|held| held.expires_at <= Instant::now()) {
            *held = None;
        }
        Ok(f(held, last_fence))
    }
}

#[async_trait::async_trait]
impl LockBackend for LocalLockBackend {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        hold: HoldId,
        ttl: Duration,
    ) -> Result<Acquisition, LockError> {
        check_ttl(ttl)?;
        let now = Instant::now();
        self.with_lock(name, |held, last_fence| match held {
            Some(current) if current.owner != *owner => {
                Ok(Acquisition::Held { retry_after: current.expires_at.saturating_duration_since(now) })
            }
            Some(current) => {
                if !current.holds.contains(&hold) && current.holds.len() as u32 >= LOCK_HOLDS_MAX {
                    return Err(LockError::holds_max());
                }
                current.holds.insert(hold);
                current.expires_at = now + ttl;
                Ok(Acquisition::Acquired { fence: FencingToken(current.fence), holds: current.holds.len() as u32 })
            }
            None => {
                *last_fence += 1;
                let holds = BTreeSet::from([hold]);
                *held = Some(Held { owner: owner.clone(), fence: *last_fence, holds, expires_at: now + ttl });
                Ok(Acquisition::Acquired { fence: FencingToken(*last_fence), holds: 1 })
            }
        })?
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        hold: HoldId,
    ) -> Result<Release, LockError> {
        self.with_lock(name, |held, _| match held {
            Some(current) if current.owner == *owner && current.fence == fence.0 => {
                current.holds.remove(&hold);
                let holds_left = current.holds.len() as u32;
                if holds_left == 0 {
                    *held = None;
                }
                Release::Released { holds_left }
            }
            _ => Release::NotHeld,
        })
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        ttl: Duration,
    ) -> Result<Extension, LockError> {
        check_ttl(ttl)?;
        self.with_lock(name, |held, _| match held {
            Some(current) if current.owner == *owner && current.fence == fence.0 => {
                current.expires_at = Instant::now() + ttl;
                Extension::Extended
            }
            _ => Extension::NotHeld,
        })
    }
}
