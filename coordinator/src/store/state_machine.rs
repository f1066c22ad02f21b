//! The state machine side of the store: [`ClusterState`] in memory, snapshots on disk. The log
//! is the source of truth between snapshots; after a restart raft re-applies the committed
//! entries that follow the last snapshot.

use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::file;
use crate::state::{ClusterState, Outcome};
use crate::TypeConfig;

/// What a snapshot holds and what readers see.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    pub last_applied: Option<LogId<u64>>,
    pub membership: StoredMembership<u64, BasicNode>,
    pub state: ClusterState,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, BasicNode>,
    data: Vec<u8>,
}

/// The state machine; clones share it. Readers (the control loop, the API) take the std
/// `RwLock` briefly and never across an `.await`.
#[derive(Clone)]
pub struct StateMachineStore {
    applied: Arc<RwLock<Applied>>,
    snapshot: Arc<RwLock<Option<StoredSnapshot>>>,
    path: PathBuf,
}

fn write_error(e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::write_state_machine(AnyError::new(&e)).into()
}

fn read_error(e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::read_state_machine(AnyError::new(&e)).into()
}

fn poisoned() -> StorageError<u64> {
    write_error(io::Error::other("state machine lock poisoned"))
}

impl StateMachineStore {
    pub fn open(dir: &Path) -> io::Result<StateMachineStore> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("snapshot.json");
        let (applied, snapshot) = match std::fs::read(&path) {
            Ok(bytes) => {
                let stored: StoredSnapshot = serde_json::from_slice(&bytes).map_err(io::Error::other)?;
                let applied: Applied = serde_json::from_slice(&stored.data).map_err(io::Error::other)?;
                (applied, Some(stored))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => (Applied::default(), None),
            Err(e) => return Err(e),
        };
        Ok(StateMachineStore {
            applied: Arc::new(RwLock::new(applied)),
            snapshot: Arc::new(RwLock::new(snapshot)),
            path,
        })
    }

    /// A copy of the applied state: stale by however far this member lags the leader.
    pub fn read(&self) -> Applied {
        self.applied.read().map(|a| a.clone()).unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Runs `look` on the applied state without copying it, under the read lock (so `look` must
    /// be short and must not block): for answers that need one record, not the whole state.
    pub fn inspect<R>(&self, look: impl FnOnce(&Applied) -> R) -> R {
        match self.applied.read() {
            Ok(applied) => look(&applied),
            Err(poisoned) => look(&poisoned.into_inner()),
        }
    }

    fn persist(&self, stored: StoredSnapshot) -> Result<(), StorageError<u64>> {
        let bytes = serde_json::to_vec(&stored).map_err(write_error)?;
        file::replace(&self.path, &bytes).map_err(write_error)?;
        *self.snapshot.write().map_err(|_| poisoned())? = Some(stored);
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let applied = self.read();
        let data = serde_json::to_vec(&applied).map_err(read_error)?;
        let snapshot_id = match applied.last_applied {
            Some(log_id) => format!("{}-{}-{}", log_id.leader_id, log_id.index, data.len()),
            None => format!("empty-{}", data.len()),
        };
        let meta = SnapshotMeta { last_log_id: applied.last_applied, last_membership: applied.membership, snapshot_id };
        self.persist(StoredSnapshot { meta: meta.clone(), data: data.clone() })?;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let applied = self.applied.read().map_err(|_| poisoned())?;
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let mut applied = self.applied.write().map_err(|_| poisoned())?;
        let mut outcomes = Vec::new();
        for entry in entries {
            applied.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => Outcome::Nothing,
                EntryPayload::Normal(command) => applied.state.apply(command),
                EntryPayload::Membership(membership) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Outcome::Nothing
                }
            };
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        let installed: Applied = serde_json::from_slice(&data).map_err(read_error)?;
        self.persist(StoredSnapshot { meta: meta.clone(), data })?;
        *self.applied.write().map_err(|_| poisoned())? = installed;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let snapshot = self.snapshot.read().map_err(|_| poisoned())?;
        Ok(snapshot
            .as_ref()
            .map(|stored| Snapshot { meta: stored.meta.clone(), snapshot: Box::new(Cursor::new(stored.data.clone())) }))
    }
}
