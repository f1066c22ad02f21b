//! Distributed locks for jobs that must run at most once across the fleet at a time (the order
//! timeout sweeper, a nightly reconciliation).
//!
//! **Shape.** [`LockBackend`] is the contract a store implements: one atomic attempt to take,
//! give back or extend a lock. [`RedisLockBackend`] implements it with three Lua scripts;
//! [`CoordinatorLockBackend`] through the coordinator group's raft log, for when a Redis failover must not break
//! mutual exclusion. [`DistributedLock`] is what jobs use, on either backend: waiting, a
//! watchdog that renews the lock and cancels the work when it cannot, and [`run_exclusive`](DistributedLock::run_exclusive).
//!
//! **Guarantees.**
//! - While a lock is held (not expired), no other owner can take it, extend it or release it.
//! - Every acquisition that is not a re-entry returns a [`FencingToken`] strictly greater than
//!   every token handed out for that name before; re-entries return the holder's token.
//! - A holder that dies stops renewing; its lock frees itself after `ttl`.
//! - The watchdog renews every `ttl / 3`. When a renewal says the lock is gone, or renewals fail
//!   until the next one could not land before `ttl` runs out, the guard's `lost` token fires,
//!   between 2/3 ttl and ttl after the last successful renewal; [`run_exclusive`](DistributedLock::run_exclusive) then drops
//!   the work.
//!
//! **The fencing rule.** A lock with a ttl cannot stop a holder that was paused past it (GC,
//! SIGSTOP, a slow disk) from doing one more write after another owner took over. Whatever the
//! guarded work writes must carry the fencing token, and the store it writes to must refuse a
//! token lower than the highest it has seen. That, not the lock, is what keeps the data safe.
//!
//! **Owners and reentrancy.** One [`DistributedLock`] is one owner, with a random 128-bit
//! token. Acquiring a lock the same owner already holds succeeds again (a hold more, the same
//! fence); the lock frees when every hold is released. Tasks that must exclude each other need
//! their own owners: [`DistributedLock::sibling`].
//!
//! **Non-goals.** No fairness or queueing: waiters poll with jitter. On Redis, mutual exclusion
//! and fence order hold as long as Redis keeps its writes: a failover to a replica that missed
//! the last writes can hand a lock out twice or repeat a fence (use the coordinator backend
//! where that matters). Lock names are few and long-lived; this is not a per-request lock.

mod coordinator;
mod local;
mod redis;

pub use self::coordinator::CoordinatorLockBackend;
pub use self::local::LocalLockBackend;
pub use self::redis::RedisLockBackend;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics::Counter;
use tokio::time::Instant;
pub use tokio_util::sync::CancellationToken;

/// Longest lock name, bytes. Names are job names, not user input.
pub const LOCK_NAME_BYTES_MAX: usize = 128;
/// Shortest ttl: the watchdog renews every ttl / 3, and a renewal is a network round trip (a
/// raft write on the coordinator backend).
pub const LOCK_TTL_MIN: Duration = Duration::from_millis(100);
/// Longest ttl: a dead holder blocks the job this long.
pub const LOCK_TTL_MAX: Duration = Duration::from_secs(3600);
/// Holds one owner may stack on one lock. Nesting is shallow in practice; a runaway loop that
/// re-enters must fail instead of growing the lock record.
pub const LOCK_HOLDS_MAX: u32 = 64;
/// Default deadline of one backend call.
pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_millis(500);
/// Default cap on one pause between attempts while waiting for a lock.
pub const RETRY_PAUSE_MAX_DEFAULT: Duration = Duration::from_millis(100);

const _: () = assert!(LOCK_TTL_MIN.as_millis() < LOCK_TTL_MAX.as_millis());

/// The name of a lock: 1..=128 bytes of ASCII letters, digits and `-_.:/`. No braces, so the
/// name can sit inside a Redis Cluster hash tag.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockName(String);

impl LockName {
    pub fn new(name: impl Into<String>) -> Result<LockName, LockError> {
        let name = name.into();
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.:/".contains(c);
        if name.is_empty() || name.len() > LOCK_NAME_BYTES_MAX || !name.chars().all(allowed) {
            return Err(LockError::Invalid("a lock name is 1..=128 of [A-Za-z0-9-_.:/]"));
        }
        Ok(LockName(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for LockName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who holds a lock: 128 random bits from the OS, as 32 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken(String);

impl OwnerToken {
    pub fn random() -> Result<OwnerToken, LockError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| LockError::Unavailable(format!("no OS randomness: {e}")))?;
        Ok(OwnerToken(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Strictly increasing per lock name across owners and acquisitions; equal across re-entries.
/// Pass it with every write the guarded work makes (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

/// One acquisition by an owner; re-sending the same hold id is the same acquisition, so a call
/// whose answer was lost can be repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HoldId(pub u64);

/// The answer to one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquisition {
    /// The caller holds the lock; `holds` counts its holds, this one included.
    Acquired { fence: FencingToken, holds: u32 },
    /// Another owner holds it, for about `retry_after` more unless renewed.
    Held { retry_after: Duration },
}

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The hold is gone; the lock is free when `holds_left` is 0.
    Released { holds_left: u32 },
    /// The lock is not this acquisition's: it expired, or another owner took it.
    NotHeld,
}

/// The answer to an extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extension {
    Extended,
    /// The lock is not this acquisition's any more; the work must stop.
    NotHeld,
}

/// Why a lock call did not answer. Business answers (held by another, not ours) are values.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LockError {
    /// A bad name, ttl or setting: a programming error; fix the caller.
    #[error("invalid lock request: {0}")]
    Invalid(&'static str),
    /// The backend did not answer in time or failed; the outcome is unknown. Retry (the same
    /// hold id makes it safe), or let the lock expire.
    #[error("lock backend unavailable: {0}")]
    Unavailable(String),
    /// The backend answered something that breaks the contract.
    #[error("lock backend answered nonsense: {0}")]
    Corrupt(String),
}

impl LockError {
    /// The refusal every backend gives an owner already holding the lock [`LOCK_HOLDS_MAX`] times.
    pub fn holds_max() -> LockError {
        LockError::Invalid("this owner already holds the lock LOCK_HOLDS_MAX times")
    }
}

/// A store that keeps locks. Every call is one atomic step on the store.
///
/// Contract, for one lock name:
/// - `try_acquire` on a free or expired lock makes `owner` its holder with a new fence, strictly
///   above every fence this name ever had, one hold (`hold`), expiring `ttl` from now. On a lock
///   `owner` holds, it adds `hold` (repeating a hold adds nothing), keeps the fence and resets
///   the expiry to `ttl`; at [`LOCK_HOLDS_MAX`] holds it fails. On another owner's lock it
///   changes nothing and says how long that lock has left.
/// - `release` removes `hold` if `owner` holds the lock under `fence`; the lock is free once no
///   hold is left. Anyone else's release changes nothing and returns `NotHeld`.
/// - `extend` resets the expiry to `ttl` if `owner` holds the lock under `fence`; else `NotHeld`.
/// - Expiry is the store's clock: an expired lock is free for everyone, its old owner included.
#[async_trait::async_trait]
pub trait LockBackend: Send + Sync {
    /// A short label for metrics and logs: `redis`, `coordinator`.
    fn kind(&self) -> &'static str;

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        hold: HoldId,
        ttl: Duration,
    ) -> Result<Acquisition, LockError>;

    async fn release(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        hold: HoldId,
    ) -> Result<Release, LockError>;

    async fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        ttl: Duration,
    ) -> Result<Extension, LockError>;
}

/// Checks a ttl against [`LOCK_TTL_MIN`]..=[`LOCK_TTL_MAX`]; backends call it too.
pub fn check_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl < LOCK_TTL_MIN || ttl > LOCK_TTL_MAX {
        return Err(LockError::Invalid("a lock ttl is between 100 ms and 1 h"));
    }
    Ok(())
}

/// How a [`DistributedLock`] talks to its backend.
#[derive(Debug, Clone)]
pub struct LockSettings {
    /// Deadline of one backend call; a renewal gets at most ttl / 3.
    pub call_timeout: Duration,
    /// Cap on one pause between attempts while waiting for a held lock; the pause is the
    /// lock's remaining ttl if shorter, with jitter so waiters do not arrive together.
    pub retry_pause_max: Duration,
}

impl Default for LockSettings {
    fn default() -> Self {
        Self { call_timeout: CALL_TIMEOUT_DEFAULT, retry_pause_max: RETRY_PAUSE_MAX_DEFAULT }
    }
}

/// What a [`run_exclusive`](DistributedLock::run_exclusive)(DistributedLock::run_exclusive) came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Exclusive<T> {
    /// The work ran to the end under the lock.
    Done(T),
    /// Another owner held the lock for the whole wait; the work did not run.
    Busy,
    /// The lock was lost while the work ran; the work was dropped at its next `.await`.
    Lost,
}

/// Counter handles per backend, registered once.
struct LockMetrics {
    acquired: Counter,
    reentered: Counter,
    contended: Counter,
    released: Counter,
    renewed: Counter,
    lost: Counter,
    failed: Counter,
}

impl LockMetrics {
    fn register(backend: &'static str) -> Self {
        let event = |event: &'static str| metrics::counter!("seckill_lock_events_total", "backend" => backend, "event" => event);
        Self {
            acquired: event("acquired"),
            reentered: event("reentered"),
            contended: event("contended"),
            released: event("released"),
            renewed: event("renewed"),
            lost: event("lost"),
            failed: event("failed"),
        }
    }
}

/// What an owner's guards and watchdogs share.
struct Owner {
    backend: Arc<dyn LockBackend>,
    token: OwnerToken,
    settings: LockSettings,
    /// Hold ids only need to be unique within this owner. Relaxed: only uniqueness matters.
    next_hold: AtomicU64,
    metrics: Arc<LockMetrics>,
}

impl Owner {
    /// One backend call under `limit`.
    async fn call<T>(&self, limit: Duration, call: impl Future<Output = Result<T, LockError>>) -> Result<T, LockError> {
        let result = tokio::time::timeout(limit, call)
            .await
            .unwrap_or_else(|_| Err(LockError::Unavailable(format!("no answer within {limit:?}"))));
        if result.is_err() {
            self.metrics.failed.increment(1);
        }
        result
    }
}

/// One owner of locks on one backend. Cheap; make one per job (see the module doc).
pub struct DistributedLock {
    owner: Arc<Owner>,
}

impl DistributedLock {
    pub fn new(backend: Arc<dyn LockBackend>) -> Result<DistributedLock, LockError> {
        Self::with_settings(backend, LockSettings::default())
    }

    pub fn with_settings(backend: Arc<dyn LockBackend>, settings: LockSettings) -> Result<DistributedLock, LockError> {
        if settings.call_timeout.is_zero() || settings.retry_pause_max.is_zero() {
            return Err(LockError::Invalid("call_timeout and retry_pause_max must be above zero"));
        }
        let metrics = Arc::new(LockMetrics::register(backend.kind()));
        Self::build(backend, settings, metrics)
    }

    fn build(
        backend: Arc<dyn LockBackend>,
        settings: LockSettings,
        metrics: Arc<LockMetrics>,
    ) -> Result<DistributedLock, LockError> {
        let owner = Owner { backend, token: OwnerToken::random()?, settings, next_hold: AtomicU64::new(1), metrics };
        Ok(DistributedLock { owner: Arc::new(owner) })
    }

    /// Another owner on the same backend, with the same settings: it excludes this one.
    pub fn sibling(&self) -> Result<DistributedLock, LockError> {
        let owner = &self.owner;
        Self::build(owner.backend.clone(), owner.settings.clone(), owner.metrics.clone())
    }

    pub fn owner(&self) -> &OwnerToken {
        &self.owner.token
    }

    /// One attempt: the guard if this owner holds the lock now, `None` if another owner does.
    pub async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Option<LockGuard>, LockError> {
        check_ttl(ttl)?;
        Ok(self.attempt(name, ttl).await?.ok())
    }

    /// Waits up to `wait_max` for the lock; `None` if another owner held it all along. A backend
    /// error ends the wait: the caller decides whether to try again later.
    pub async fn acquire(
        &self,
        name: &LockName,
        ttl: Duration,
        wait_max: Duration,
    ) -> Result<Option<LockGuard>, LockError> {
        check_ttl(ttl)?;
        let deadline = Instant::now() + wait_max;
        loop {
            let retry_after = match self.attempt(name, ttl).await? {
                Ok(guard) => return Ok(Some(guard)),
                Err(retry_after) => retry_after,
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let pause = retry_after.min(self.owner.settings.retry_pause_max).min(deadline - now);
            // Between half and all of the pause, and at least 1 ms, so waiters spread out.
            let pause = pause.mul_f64(0.5 + fastrand::f64() / 2.0).max(Duration::from_millis(1));
            tokio::time::sleep(pause).await;
        }
    }

    /// Runs `work` under the lock: waits up to `wait_max` for it, renews it while the work
    /// runs, drops the work if the lock is lost, and releases it at the end. The work gets the
    /// fence to pass on with its writes and the `lost` token to check between steps.
    pub async fn run_exclusive<F, Fut, T>(
        &self,
        name: &LockName,
        ttl: Duration,
        wait_max: Duration,
        work: F,
    ) -> Result<Exclusive<T>, LockError>
    where
        F: FnOnce(FencingToken, CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let Some(guard) = self.acquire(name, ttl, wait_max).await? else { return Ok(Exclusive::Busy) };
        let lost = guard.lost();
        let outcome = tokio::select! {
            // Biased: once the lock is lost, the work must not be polled again.
            biased;
            () = lost.cancelled() => Exclusive::Lost,
            value = work(guard.fence(), lost.clone()) => Exclusive::Done(value),
        };
        if let Err(e) = guard.release().await {
            // The lock frees itself at ttl; the work's result stands.
            tracing::warn!(lock = %name, "release failed, the lock will expire: {e}");
        }
        Ok(outcome)
    }

    /// One call; `Err(retry_after)` when another owner holds the lock.
    async fn attempt(&self, name: &LockName, ttl: Duration) -> Result<Result<LockGuard, Duration>, LockError> {
        let owner = &self.owner;
        let hold = HoldId(owner.next_hold.fetch_add(1, Ordering::Relaxed));
        let sent = Instant::now();
        let call = owner.backend.try_acquire(name, &owner.token, hold, ttl);
        match owner.call(owner.settings.call_timeout, call).await? {
            Acquisition::Acquired { fence, holds } => {
                if holds > 1 {
                    owner.metrics.reentered.increment(1);
                } else {
                    owner.metrics.acquired.increment(1);
                }
                Ok(Ok(LockGuard::start(owner.clone(), name.clone(), fence, hold, holds, ttl, sent)))
            }
            Acquisition::Held { retry_after } => {
                owner.metrics.contended.increment(1);
                Ok(Err(retry_after))
            }
        }
    }
}

/// One hold of a lock. Renewed by a watchdog task until released or dropped; dropping it
/// releases in the background (best effort: the lock expires anyway).
pub struct LockGuard {
    owner: Arc<Owner>,
    name: LockName,
    fence: FencingToken,
    hold: HoldId,
    holds: u32,
    /// Fires when the lock may be gone.
    lost: CancellationToken,
    /// Stops the watchdog.
    stop: CancellationToken,
    released: bool,
}

impl LockGuard {
    fn start(
        owner: Arc<Owner>,
        name: LockName,
        fence: FencingToken,
        hold: HoldId,
        holds: u32,
        ttl: Duration,
        sent: Instant,
    ) -> LockGuard {
        let guard = LockGuard {
            owner,
            name,
            fence,
            hold,
            holds,
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            released: false,
        };
        tokio::spawn(watchdog(
            guard.owner.clone(),
            guard.name.clone(),
            fence,
            ttl,
            sent + ttl,
            guard.lost.clone(),
            guard.stop.clone(),
        ));
        guard
    }

    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The fencing token of this acquisition; pass it with every write the work makes.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// This owner's holds on the lock when this one was taken, this one included.
    pub fn holds(&self) -> u32 {
        self.holds
    }

    /// A token that fires when the lock may be gone; the work must stop when it does.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Extends the lock to `ttl` from now, beside the watchdog's renewals.
    pub async fn extend(&self, ttl: Duration) -> Result<Extension, LockError> {
        check_ttl(ttl)?;
        let owner = &self.owner;
        let call = owner.backend.extend(&self.name, &owner.token, self.fence, ttl);
        let extension = owner.call(owner.settings.call_timeout, call).await?;
        if extension == Extension::NotHeld {
            owner.metrics.lost.increment(1);
            self.lost.cancel();
        }
        Ok(extension)
    }

    /// Stops renewing and gives this hold back.
    pub async fn release(mut self) -> Result<Release, LockError> {
        self.released = true;
        self.stop.cancel();
        release(&self.owner, &self.name, self.fence, self.hold).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop.cancel();
        if self.released {
            return;
        }
        // Without a runtime (it is shutting down) there is nobody to send it: the lock expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (owner, name, fence, hold) = (self.owner.clone(), self.name.clone(), self.fence, self.hold);
            runtime.spawn(async move {
                if let Err(e) = release(&owner, &name, fence, hold).await {
                    tracing::debug!(lock = %name, "background release failed, the lock will expire: {e}");
                }
            });
        }
    }
}

async fn release(owner: &Owner, name: &LockName, fence: FencingToken, hold: HoldId) -> Result<Release, LockError> {
    let call = owner.backend.release(name, &owner.token, fence, hold);
    let release = owner.call(owner.settings.call_timeout, call).await?;
    owner.metrics.released.increment(1);
    Ok(release)
}

/// Renews the lock every ttl / 3 until stopped. `valid_until` is when the lock runs out if no
/// renewal lands: the send time of the last successful call plus ttl (the store started its
/// ttl no earlier than we sent). Fires `lost` when the lock is gone, or when the next attempt
/// could not land before `valid_until`.
async fn watchdog(
    owner: Arc<Owner>,
    name: LockName,
    fence: FencingToken,
    ttl: Duration,
    mut valid_until: Instant,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let period = ttl / 3;
    let attempt_max = owner.settings.call_timeout.min(period);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        let sent = Instant::now();
        let call = owner.backend.extend(&name, &owner.token, fence, ttl);
        let answer = tokio::select! {
            () = stop.cancelled() => return,
            answer = owner.call(attempt_max, call) => answer,
        };
        match answer {
            Ok(Extension::Extended) => {
                owner.metrics.renewed.increment(1);
                valid_until = sent + ttl;
            }
            Ok(Extension::NotHeld) => {
                tracing::warn!(lock = %name, fence = fence.0, "lock lost: another owner holds it or it expired");
                owner.metrics.lost.increment(1);
                lost.cancel();
                return;
            }
            Err(e) => {
                if Instant::now() + period >= valid_until {
                    tracing::warn!(lock = %name, fence = fence.0, "lock lost: renewals failed until its ttl ({e})");
                    owner.metrics.lost.increment(1);
                    lost.cancel();
                    return;
                }
                tracing::debug!(lock = %name, "renewal failed, retrying: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_fit_a_hash_tag_and_stay_short() {
        assert!(LockName::new("order-timeout-sweeper/v1").is_ok());
        for bad in ["", "a{b}", "with space", "é", &"x".repeat(LOCK_NAME_BYTES_MAX + 1)] {
            assert!(LockName::new(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn owner_tokens_are_128_random_bits_in_hex() {
        let (a, b) = (OwnerToken::random().unwrap(), OwnerToken::random().unwrap());
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn ttls_outside_the_bounds_are_refused() {
        assert!(check_ttl(LOCK_TTL_MIN).is_ok() && check_ttl(LOCK_TTL_MAX).is_ok());
        assert!(check_ttl(LOCK_TTL_MIN - Duration::from_millis(1)).is_err());
        assert!(check_ttl(LOCK_TTL_MAX + Duration::from_millis(1)).is_err());
    }
}
