//! The lock suite on the in-process backend, which single-process runs (`demo`, `up` on the
//! embedded ledger) give their sweepers: the same contract as Redis and the coordinator.

use std::sync::Arc;

use safeguards::{LocalLockBackend, LockBackend};

use crate::lock_suite;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_lock_keeps_the_lock_contract() {
    let backend = Arc::new(LocalLockBackend::new());
    lock_suite::mutual_exclusion_under_contention(backend.clone(), 16, 20).await;
    lock_suite::a_crashed_holders_lock_expires(|| backend.clone() as Arc<dyn LockBackend>).await;
    lock_suite::nobody_can_release_or_extend_another_owners_lock(backend.clone()).await;
    lock_suite::reentrant_holds_keep_the_fence_and_free_on_the_last_release(backend.clone()).await;
    lock_suite::fencing_tokens_strictly_increase_across_owners(backend.clone()).await;
    lock_suite::run_exclusive_runs_the_work_once_or_reports_busy(backend).await;
}
