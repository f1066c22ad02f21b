//! The `LockBackend` contract as executable checks, run on every backend (Redis, coordinator).
//! Each check takes a backend (or a way to make one) and panics with the scenario on failure.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use safeguards::testing::{with_recorder, TestRecorder};
use safeguards::{
    Acquisition, DistributedLock, Exclusive, Extension, FencingToken, HoldId, LockBackend, LockError, LockName,
    LockSettings, OwnerToken, Release,
};

/// Long enough for a renewal round trip (a raft write) at ttl / 3 on a busy 2-core machine,
/// short enough that expiry tests take about a second.
pub const TTL: Duration = Duration::from_millis(600);
/// Scheduling slack on top of a deadline the code promises: test threads share 2 cores with
/// Redis or raft.
pub const SLACK: Duration = Duration::from_millis(300);
/// Waiters poll often so contention tests finish quickly.
pub fn settings() -> LockSettings {
    LockSettings { call_timeout: Duration::from_millis(500), retry_pause_max: Duration::from_millis(10) }
}

pub fn lock(backend: Arc<dyn LockBackend>) -> DistributedLock {
    DistributedLock::with_settings(backend, settings()).expect("a lock owner")
}

fn name(scenario: &str) -> LockName {
    LockName::new(format!("suite/{scenario}")).expect("a valid lock name")
}

/// Goal: at most one holder at a time, and fences in acquisition order strictly increase.
/// Method: `tasks` owners each take the lock `iterations` times and, inside, do a non-atomic
/// read-yield-write increment of a shared counter and check that nobody else is inside. A
/// second holder would interleave at the yield and lose an increment.
pub async fn mutual_exclusion_under_contention(backend: Arc<dyn LockBackend>, tasks: usize, iterations: usize) {
    let name = name("exclusion");
    let first = lock(backend);
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let fences: Arc<Mutex<Vec<FencingToken>>> = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..tasks {
        let (lock, name) = (first.sibling().expect("an owner"), name.clone());
        let (counter, inside, fences) = (counter.clone(), inside.clone(), fences.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..iterations {
                let guard = lock
                    .acquire(&name, TTL, Duration::from_secs(60))
                    .await
                    .expect("the backend answers")
                    .expect("the lock within a minute");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                fences.lock().unwrap().push(guard.fence());
                let value = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(value + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                let released = guard.release().await.expect("release answers");
                assert_eq!(released, Release::Released { holds_left: 0 });
            }
        }));
    }
    for worker in workers {
        worker.await.expect("a worker panicked");
    }
    let acquisitions = tasks * iterations;
    assert_eq!(counter.load(Ordering::SeqCst), acquisitions as u64, "an increment was lost: holders overlapped");
    let fences = fences.lock().unwrap();
    assert!(fences.windows(2).all(|pair| pair[0] < pair[1]), "fences out of order: {fences:?}");
    eprintln!("{acquisitions} contended acquisitions by {tasks} owners in {:?}", started.elapsed());
}

/// Goal: a holder that dies stops renewing and its lock frees itself within one ttl; until it
/// died, its watchdog kept the lock past the ttl. Method: a holder on its own runtime takes the
/// lock, lives 2.5 ttl (renewing), then its runtime is dropped without a release, as in a
/// crash; another owner waits for the lock.
pub async fn a_crashed_holders_lock_expires(make_backend: impl Fn() -> Arc<dyn LockBackend>) {
    let name = name("crash");
    let (crashed, survivor) = (lock(make_backend()), lock(make_backend()));
    let held_name = name.clone();
    let (crashed_fence, crashed_at) = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let fence = runtime.block_on(async {
            let guard = crashed.try_acquire(&held_name, TTL).await.expect("answers").expect("a free lock");
            tokio::time::sleep(TTL * 5 / 2).await;
            let fence = guard.fence();
            std::mem::forget(guard);
            fence
        });
        drop(runtime);
        (fence, Instant::now())
    })
    .await
    .expect("the holder's thread");
    let early = survivor.try_acquire(&name, TTL).await.expect("answers");
    assert!(early.is_none(), "the watchdog kept the lock alive past its ttl until the crash");
    let guard = survivor.acquire(&name, TTL, TTL * 5).await.expect("answers").expect("the lock frees itself");
    let waited = crashed_at.elapsed();
    eprintln!("crashed holder's lock taken over {waited:?} after the crash (ttl {TTL:?})");
    assert!(waited <= TTL + SLACK, "the lock outlived its holder by {waited:?}");
    assert!(guard.fence() > crashed_fence, "the next holder's fence is higher");
    guard.release().await.expect("release");
}

/// Goal: nobody but the holder of an acquisition can release or extend it, not even the same
/// owner with an older fence. Method: owner A holds the lock; owner B calls the backend with
/// A's fence and any hold id; then A re-takes the lock and tries its old fence.
pub async fn nobody_can_release_or_extend_another_owners_lock(backend: Arc<dyn LockBackend>) {
    let name = name("foreign");
    let a = lock(backend.clone());
    let b = a.sibling().expect("an owner");
    let guard = a.try_acquire(&name, TTL).await.expect("answers").expect("a free lock");
    for hold in 0..4 {
        let release = backend.release(&name, b.owner(), guard.fence(), HoldId(hold)).await.expect("answers");
        assert_eq!(release, Release::NotHeld, "B released A's lock");
    }
    let extension = backend.extend(&name, b.owner(), guard.fence(), TTL).await.expect("answers");
    assert_eq!(extension, Extension::NotHeld, "B extended A's lock");
    assert!(b.try_acquire(&name, TTL).await.expect("answers").is_none(), "A still holds it");
    assert_eq!(guard.extend(TTL).await.expect("answers"), Extension::Extended, "A can");

    let old = guard.fence();
    assert_eq!(guard.release().await.expect("answers"), Release::Released { holds_left: 0 });
    let again = a.try_acquire(&name, TTL).await.expect("answers").expect("free again");
    assert!(again.fence() > old);
    for hold in 0..4 {
        let release = backend.release(&name, a.owner(), old, HoldId(hold)).await.expect("answers");
        assert_eq!(release, Release::NotHeld, "an old acquisition released the new one");
    }
    assert_eq!(backend.extend(&name, a.owner(), old, TTL).await.expect("answers"), Extension::NotHeld);
    again.release().await.expect("release");
}

/// Goal: re-entry by the holder keeps the fence, and only the last release frees the lock;
/// repeating an acquisition or release (a retry after a lost answer) changes nothing.
pub async fn reentrant_holds_keep_the_fence_and_free_on_the_last_release(backend: Arc<dyn LockBackend>) {
    let name = name("reentry");
    let a = lock(backend.clone());
    let b = a.sibling().expect("an owner");
    let outer = a.try_acquire(&name, TTL).await.expect("answers").expect("a free lock");
    let inner = a.try_acquire(&name, TTL).await.expect("answers").expect("re-entry");
    assert_eq!((outer.holds(), inner.holds()), (1, 2));
    assert_eq!(inner.fence(), outer.fence(), "a re-entry keeps the fence");
    assert_eq!(inner.release().await.expect("answers"), Release::Released { holds_left: 1 });
    assert!(b.try_acquire(&name, TTL).await.expect("answers").is_none(), "one hold still keeps it");
    let outer_fence = outer.fence();
    assert_eq!(outer.release().await.expect("answers"), Release::Released { holds_left: 0 });
    let taken = b.try_acquire(&name, TTL).await.expect("answers").expect("free after the last release");
    assert!(taken.fence() > outer_fence);
    taken.release().await.expect("release");

    // The backend directly: a repeated hold id is the same acquisition.
    let owner = OwnerToken::random().expect("a token");
    let acquire = |hold| backend.try_acquire(&name, &owner, HoldId(hold), TTL);
    let Acquisition::Acquired { fence, holds: 1 } = acquire(7).await.expect("answers") else { panic!("not free") };
    assert_eq!(acquire(7).await.expect("answers"), Acquisition::Acquired { fence, holds: 1 }, "a retried acquisition");
    assert_eq!(acquire(8).await.expect("answers"), Acquisition::Acquired { fence, holds: 2 });
    for _ in 0..2 {
        let release = backend.release(&name, &owner, fence, HoldId(8)).await.expect("answers");
        assert_eq!(release, Release::Released { holds_left: 1 }, "a retried release");
    }
    assert_eq!(
        backend.release(&name, &owner, fence, HoldId(7)).await.expect("answers"),
        Release::Released { holds_left: 0 }
    );
    for hold in 0..safeguards::lock::LOCK_HOLDS_MAX {
        acquire(100 + u64::from(hold)).await.expect("answers");
    }
    match acquire(999).await {
        Err(LockError::Invalid(_)) => {}
        other => panic!("holds past LOCK_HOLDS_MAX must be refused, got {other:?}"),
    }
}

/// Goal: fences strictly increase across owners taking turns.
pub async fn fencing_tokens_strictly_increase_across_owners(backend: Arc<dyn LockBackend>) {
    let name = name("fences");
    let first = lock(backend);
    let owners = [first.sibling().expect("an owner"), first.sibling().expect("an owner"), first];
    let mut last = FencingToken(0);
    for round in 0..12 {
        let guard = owners[round % 3].try_acquire(&name, TTL).await.expect("answers").expect("free");
        assert!(guard.fence() > last, "round {round}: fence {:?} after {last:?}", guard.fence());
        last = guard.fence();
        guard.release().await.expect("release");
    }
}

/// Goal: `run_exclusive` runs the work under the lock and frees it after, and answers `Busy`
/// without running the work when another owner holds the lock for the whole wait.
pub async fn run_exclusive_runs_the_work_once_or_reports_busy(backend: Arc<dyn LockBackend>) {
    let name = name("exclusive");
    let a = lock(backend);
    let b = a.sibling().expect("an owner");
    let guard = a.try_acquire(&name, TTL).await.expect("answers").expect("free");
    let ran = AtomicBool::new(false);
    let busy = b
        .run_exclusive(&name, TTL, Duration::from_millis(300), |_, _| async { ran.store(true, Ordering::SeqCst) })
        .await
        .expect("answers");
    assert_eq!(busy, Exclusive::Busy);
    assert!(!ran.load(Ordering::SeqCst), "the work ran without the lock");
    let held_fence = guard.fence();
    guard.release().await.expect("release");
    let done = b.run_exclusive(&name, TTL, TTL, |fence, _| async move { fence }).await.expect("answers");
    let Exclusive::Done(fence) = done else { panic!("expected the work to run, got {done:?}") };
    assert!(fence > held_fence, "the work saw a newer fence");
    let after = a.try_acquire(&name, TTL).await.expect("answers").expect("run_exclusive released the lock");
    after.release().await.expect("release");
}

/// A backend whose extensions fail on demand, as if the store became unreachable for renewals
/// only. Acquire and release pass through, so the test can check the lock afterwards.
pub struct FailingRenewals {
    pub inner: Arc<dyn LockBackend>,
    pub failing: AtomicBool,
}

#[async_trait::async_trait]
impl LockBackend for FailingRenewals {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        hold: HoldId,
        ttl: Duration,
    ) -> Result<Acquisition, LockError> {
        self.inner.try_acquire(name, owner, hold, ttl).await
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        hold: HoldId,
    ) -> Result<Release, LockError> {
        self.inner.release(name, owner, fence, hold).await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        ttl: Duration,
    ) -> Result<Extension, LockError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(LockError::Unavailable("renewals fail in this test".into()));
        }
        self.inner.extend(name, owner, fence, ttl).await
    }
}

/// Goal: while renewals succeed the work keeps the lock past its ttl; once they fail, the work
/// is cancelled before the ttl runs out, and the events are counted. Method: work that would
/// run forever; after 2 ttl, renewals start failing.
pub async fn renewal_failure_cancels_the_work(backend: Arc<dyn LockBackend>) {
    let name = name("renewal");
    let failing = Arc::new(FailingRenewals { inner: backend, failing: AtomicBool::new(false) });
    let recorder = TestRecorder::default();
    let a = with_recorder(&recorder, || lock(failing.clone()));
    let broke_at: Mutex<Option<Instant>> = Mutex::new(None);
    let (failing_ref, broke_at_ref) = (&failing, &broke_at);
    let outcome = a
        .run_exclusive(&name, TTL, TTL, |_, cancel| async move {
            tokio::time::sleep(TTL * 2).await;
            assert!(!cancel.is_cancelled(), "renewals kept the lock");
            failing_ref.failing.store(true, Ordering::SeqCst);
            *broke_at_ref.lock().unwrap() = Some(Instant::now());
            std::future::pending::<()>().await;
        })
        .await
        .expect("answers");
    let cancelled_after = broke_at.lock().unwrap().expect("the work ran").elapsed();
    assert_eq!(outcome, Exclusive::Lost);
    eprintln!("work cancelled {cancelled_after:?} after renewals started failing (ttl {TTL:?})");
    assert!(cancelled_after <= TTL + SLACK, "cancelled {cancelled_after:?} after renewals broke; ttl {TTL:?}");
    // One failed renewal must not cancel: the lock is still good for 2/3 ttl after it.
    assert!(cancelled_after >= TTL / 6, "cancelled {cancelled_after:?} after the first failed renewal");
    let event = |event| recorder.counter("seckill_lock_events_total", &[("event", event)]);
    assert!(event("renewed") >= 3, "renewed {} times in 2 ttl", event("renewed"));
    assert_eq!((event("acquired"), event("lost")), (1, 1));
    assert!(event("failed") >= 1);
    let b = a.sibling().expect("an owner");
    let after = b.try_acquire(&name, TTL).await.expect("answers").expect("run_exclusive released the lost lock");
    after.release().await.expect("release");
}
