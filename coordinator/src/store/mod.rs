//! Durable raft storage in one directory per member: `raft.log` (the log journal), `vote.json`
//! (vote and committed id) and `snapshot.json`. Plain files rather than an embedded database:
//! the coordinator's log is tiny (registrations, heartbeats, grants), a journal with checksummed
//! frames and fsync is a hundred lines we can read in full, and it adds no dependency to build.

// openraft's storage traits return its `StorageError` by value; our helpers return the same
// type so errors pass through unchanged. It is large, but storage errors stop the member anyway.
#![allow(clippy::result_large_err)]

mod file;
mod log;
mod state_machine;

pub use self::log::LogStore;
pub use self::state_machine::{Applied, StateMachineStore};

#[cfg(test)]
mod tests {
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::StorageError;

    use super::*;
    use crate::TypeConfig;

    struct TempStore;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, std::path::PathBuf> for TempStore {
        async fn build(&self) -> Result<(std::path::PathBuf, LogStore, StateMachineStore), StorageError<u64>> {
            use std::sync::atomic::{AtomicU64, Ordering};
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "seckill-raft-suite-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            let log = LogStore::open(&dir).expect("open log");
            let state_machine = StateMachineStore::open(&dir).expect("open state machine");
            Ok((dir, log, state_machine))
        }
    }

    /// openraft's own storage suite, on the real on-disk store.
    #[test]
    fn openraft_storage_suite_passes() {
        Suite::test_all(TempStore).expect("openraft storage suite");
    }

    /// Goal: a member restarted on its directory comes back with its log, vote and snapshot.
    #[tokio::test]
    async fn a_reopened_store_has_its_log_and_vote() {
        use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
        use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftSnapshotBuilder, Vote};
        let (dir, mut log, mut state_machine) = TempStore.build().await.unwrap();
        log.save_vote(&Vote::new(3, 1)).await.unwrap();
        let entries: Vec<Entry<TypeConfig>> = (1..=3)
            .map(|index| Entry {
                log_id: LogId::new(CommittedLeaderId::new(3, 1), index),
                payload: EntryPayload::Blank,
            })
            .collect();
        log.blocking_append(entries.clone()).await.unwrap();
        state_machine.apply(entries).await.unwrap();
        state_machine.build_snapshot().await.unwrap();
        drop((log, state_machine));

        let mut log = LogStore::open(&dir).unwrap();
        let mut state_machine = StateMachineStore::open(&dir).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 1)));
        assert_eq!(log.get_log_state().await.unwrap().last_log_id.map(|id| id.index), Some(3));
        let (applied, _) = state_machine.applied_state().await.unwrap();
        assert_eq!(applied.map(|id| id.index), Some(3), "the snapshot brings the applied state back");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
