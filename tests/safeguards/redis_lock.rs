//! The lock suite on a private Redis, and what only Redis can do to a lock: lose the key, or
//! freeze.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{RedisConnection, RedisLedgerConfig};
use safeguards::{Exclusive, LockBackend, LockName, RedisLockBackend};
use testkit::redis::RedisServer;

use crate::lock_suite::{self, lock, SLACK, TTL};

fn start_redis() -> RedisServer {
    RedisServer::start().expect("a private redis-server (scripts/test installs it)")
}

/// The lock backend on the same kind of connection the ledger uses.
fn backend(redis: &RedisServer) -> Arc<RedisLockBackend<RedisConnection>> {
    let connection = RedisConnection::open(&RedisLedgerConfig::new(redis.url())).expect("a Redis connection");
    Arc::new(RedisLockBackend::new(connection, "seckill", Duration::from_millis(500)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_mutual_exclusion_under_contention() {
    let redis = start_redis();
    lock_suite::mutual_exclusion_under_contention(backend(&redis), 16, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_of_a_crashed_holder_expires() {
    let redis = start_redis();
    lock_suite::a_crashed_holders_lock_expires(|| backend(&redis) as Arc<dyn LockBackend>).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_cannot_be_released_or_extended_by_another_owner() {
    let redis = start_redis();
    lock_suite::nobody_can_release_or_extend_another_owners_lock(backend(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_reentry_keeps_the_fence() {
    let redis = start_redis();
    lock_suite::reentrant_holds_keep_the_fence_and_free_on_the_last_release(backend(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_fences_strictly_increase() {
    let redis = start_redis();
    lock_suite::fencing_tokens_strictly_increase_across_owners(backend(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_run_exclusive_runs_once_or_reports_busy() {
    let redis = start_redis();
    lock_suite::run_exclusive_runs_the_work_once_or_reports_busy(backend(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_renewal_failure_cancels_the_work() {
    let redis = start_redis();
    lock_suite::renewal_failure_cancels_the_work(backend(&redis)).await;
}

/// Goal: the lock and its fencing counter share one hash tag (one cluster slot), the lock key
/// carries the ttl, and the counter outlives the lock. Method: read the raw keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_keys_share_a_hash_tag_and_the_fence_counter_outlives_the_lock() {
    let redis = start_redis();
    let backend = backend(&redis);
    let name = LockName::new("sweeper").unwrap();
    let (lock_key, fence_key) = backend.keys(&name);
    assert_eq!((lock_key.as_str(), fence_key.as_str()), ("seckill:lock:{sweeper}", "seckill:lock:{sweeper}:fence"));
    let guard = lock(backend.clone()).try_acquire(&name, TTL).await.unwrap().expect("free");
    let pttl: i64 = redis.query(redis::cmd("PTTL").arg(&lock_key)).unwrap();
    assert!(pttl > 0 && pttl <= TTL.as_millis() as i64, "pttl {pttl}");
    let owner: String = redis.query(redis::cmd("HGET").arg(&lock_key).arg("owner")).unwrap();
    assert_eq!(owner.len(), 32, "a 128-bit owner token in hex");
    let fence = guard.fence();
    guard.release().await.unwrap();
    let exists: bool = redis.query(redis::cmd("EXISTS").arg(&lock_key)).unwrap();
    let counter: u64 = redis.query(redis::cmd("GET").arg(&fence_key)).unwrap();
    assert!(!exists, "the last release deletes the lock");
    assert_eq!(counter, fence.0, "the fence counter stays");
    let fence_ttl: i64 = redis.query(redis::cmd("PTTL").arg(&fence_key)).unwrap();
    assert_eq!(fence_ttl, -1, "the fence counter never expires");
}

/// Goal: when the lock disappears under its holder (an operator deleted it, Redis evicted it),
/// the next renewal finds it gone and the work is cancelled. Method: delete the key while
/// `run_exclusive` runs work that would never end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_deleted_under_the_holder_cancels_the_work() {
    let redis = start_redis();
    let backend = backend(&redis);
    let name = LockName::new("deleted").unwrap();
    let (lock_key, _) = backend.keys(&name);
    let mut deleted_at = None;
    let outcome = lock(backend)
        .run_exclusive(&name, TTL, TTL, |_, _| async {
            let _: i64 = redis.query(redis::cmd("DEL").arg(&lock_key)).unwrap();
            deleted_at = Some(Instant::now());
            std::future::pending::<()>().await;
        })
        .await
        .unwrap();
    assert_eq!(outcome, Exclusive::Lost);
    let after = deleted_at.expect("the work ran").elapsed();
    eprintln!("deleted lock noticed after {after:?}");
    assert!(after <= TTL / 3 + SLACK, "noticed {after:?} after the delete; renewals run every {:?}", TTL / 3);
}

/// Goal: a frozen Redis (SIGSTOP: connections stay open, nothing answers) cancels the work
/// before the lock's ttl runs out, so a holder never works past its lock. Method: freeze Redis
/// while `run_exclusive` runs work that would never end, note when its cancel token fires;
/// thaw Redis after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_frozen_redis_cancels_the_work_within_the_ttl() {
    let redis = start_redis();
    let name = LockName::new("frozen").unwrap();
    let mut frozen_at = None;
    let mut cancelled = None;
    let outcome = lock(backend(&redis))
        .run_exclusive(&name, TTL, TTL, |_, cancel| async {
            cancelled = Some(tokio::spawn(async move {
                cancel.cancelled().await;
                Instant::now()
            }));
            tokio::time::sleep(TTL / 2).await;
            redis.signal("-STOP").expect("SIGSTOP redis");
            frozen_at = Some(Instant::now());
            std::future::pending::<()>().await;
        })
        .await;
    let returned_at = Instant::now();
    redis.signal("-CONT").expect("SIGCONT redis");
    assert_eq!(outcome.unwrap(), Exclusive::Lost);
    let frozen_at = frozen_at.expect("the work ran");
    let cancelled_at = cancelled.expect("the work ran").await.unwrap();
    let after = cancelled_at - frozen_at;
    eprintln!("work cancelled {after:?} after Redis froze (ttl {TTL:?})");
    assert!(after <= TTL + SLACK, "cancelled {after:?} after the freeze; ttl {TTL:?}");
    // The release at the end waits out its call timeout on the frozen Redis.
    let returned = returned_at - frozen_at;
    assert!(
        returned <= after + Duration::from_millis(500) + SLACK,
        "run_exclusive returned {returned:?} after the freeze"
    );
}
