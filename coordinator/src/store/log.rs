//! The raft log on disk: every append, truncation and purge is a journal frame, fsynced before
//! raft hears it is done. The vote and the committed id live in a small file replaced
//! atomically. On start the journal is replayed into memory.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use serde::{Deserialize, Serialize};

use super::file::{self, Journal};
use crate::TypeConfig;

type NodeIdOf = u64;

/// Rewrite the journal without purged entries once it grows past this; purges are frequent
/// (after every snapshot) and entries small, so this keeps the file and start-up replay short.
const COMPACT_AT_BYTES: u64 = 8 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
enum Op {
    Append(Entry<TypeConfig>),
    /// Delete entries from this index on.
    Truncate(u64),
    /// Delete entries up to and including this id.
    Purge(LogId<NodeIdOf>),
}

#[derive(Default, Serialize, Deserialize)]
struct Meta {
    vote: Option<Vote<NodeIdOf>>,
    committed: Option<LogId<NodeIdOf>>,
}

struct Inner {
    journal: Journal,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    last_purged: Option<LogId<NodeIdOf>>,
    meta: Meta,
    meta_path: PathBuf,
}

/// The log store; clones share it (the log reader is a clone). A std `Mutex`: every operation
/// is a short in-memory change plus one fsync, with no `.await` while it is held.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    fsyncs: Arc<AtomicU64>,
}

fn io_error(e: impl std::error::Error + 'static) -> StorageError<NodeIdOf> {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

impl LogStore {
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let (journal, frames) = Journal::open(&dir.join("raft.log"))?;
        let mut entries = BTreeMap::new();
        let mut last_purged = None;
        for frame in frames {
            match serde_json::from_slice::<Op>(&frame).map_err(io::Error::other)? {
                Op::Append(entry) => {
                    entries.insert(entry.log_id.index, entry);
                }
                Op::Truncate(from) => {
                    entries.split_off(&from);
                }
                Op::Purge(upto) => {
                    entries = entries.split_off(&(upto.index + 1));
                    last_purged = Some(upto);
                }
            }
        }
        let meta_path = dir.join("vote.json");
        let meta = match std::fs::read(&meta_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(io::Error::other)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::default(),
            Err(e) => return Err(e),
        };
        let inner = Inner { journal, entries, last_purged, meta, meta_path };
        Ok(LogStore { inner: Arc::new(Mutex::new(inner)), fsyncs: Arc::new(AtomicU64::new(0)) })
    }

    /// How many times the log or the vote was fsynced, for the coordinator's cost metrics.
    pub fn fsyncs(&self) -> Arc<AtomicU64> {
        self.fsyncs.clone()
    }

    fn synced(&self) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StorageError<NodeIdOf>> {
        self.inner.lock().map_err(|_| io_error(io::Error::other("log store lock poisoned")))
    }

    /// True if this member has never voted or logged: a brand-new member.
    pub fn is_empty(&self) -> bool {
        self.inner.lock().map(|inner| inner.meta.vote.is_none() && inner.entries.is_empty()).unwrap_or(false)
    }
}

impl Inner {
    fn write(&mut self, ops: &[Op]) -> Result<(), StorageError<NodeIdOf>> {
        let frames = ops.iter().map(serde_json::to_vec).collect::<Result<Vec<_>, _>>().map_err(io_error)?;
        self.journal.append(frames.iter().map(Vec::as_slice)).map_err(io_error)
    }

    fn save_meta(&self) -> Result<(), StorageError<NodeIdOf>> {
        let bytes = serde_json::to_vec(&self.meta).map_err(io_error)?;
        file::replace(&self.meta_path, &bytes).map_err(|e| StorageIOError::write_vote(AnyError::new(&e)).into())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeIdOf>> {
        let inner = self.lock()?;
        Ok(inner.entries.range(range).map(|(_, entry)| entry.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeIdOf>> {
        let inner = self.lock()?;
        let last = inner.entries.values().next_back().map(|entry| entry.log_id).or(inner.last_purged);
        Ok(LogState { last_purged_log_id: inner.last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeIdOf>) -> Result<(), StorageError<NodeIdOf>> {
        let mut inner = self.lock()?;
        inner.meta.vote = Some(*vote);
        self.synced();
        inner.save_meta()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeIdOf>>, StorageError<NodeIdOf>> {
        Ok(self.lock()?.meta.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeIdOf>>) -> Result<(), StorageError<NodeIdOf>> {
        let mut inner = self.lock()?;
        inner.meta.committed = committed;
        self.synced();
        inner.save_meta()
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeIdOf>>, StorageError<NodeIdOf>> {
        Ok(self.lock()?.meta.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeIdOf>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock()?;
        let ops: Vec<Op> = entries.into_iter().map(Op::Append).collect();
        let written = inner.write(&ops);
        self.synced();
        if written.is_ok() {
            for op in ops {
                if let Op::Append(entry) = op {
                    inner.entries.insert(entry.log_id.index, entry);
                }
            }
        }
        // Raft learns the entries are durable only after the fsync above.
        callback.log_io_completed(written.clone().map_err(|e| io::Error::other(e.to_string())));
        written
    }

    async fn truncate(&mut self, log_id: LogId<NodeIdOf>) -> Result<(), StorageError<NodeIdOf>> {
        let mut inner = self.lock()?;
        self.synced();
        inner.write(&[Op::Truncate(log_id.index)])?;
        inner.entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeIdOf>) -> Result<(), StorageError<NodeIdOf>> {
        let mut inner = self.lock()?;
        self.synced();
        inner.write(&[Op::Purge(log_id)])?;
        inner.entries = inner.entries.split_off(&(log_id.index + 1));
        inner.last_purged = Some(log_id);
        if inner.journal.bytes() > COMPACT_AT_BYTES {
            let mut ops: Vec<Op> = vec![Op::Purge(log_id)];
            ops.extend(inner.entries.values().cloned().map(Op::Append));
            let frames = ops.iter().map(serde_json::to_vec).collect::<Result<Vec<_>, _>>().map_err(io_error)?;
            inner.journal.rewrite(frames.iter().map(Vec::as_slice)).map_err(io_error)?;
        }
        Ok(())
    }
}
