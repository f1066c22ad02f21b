//! Proof that this member still leads, shared by every caller that waits for it.
//!
//! A lease the leader renews in its memory (not through raft) may be renewed only if no other
//! member can have become leader before the heartbeat arrived: a deposed leader that cannot reach
//! the others must not renew leases its successor is about to expire. openraft's
//! `ensure_linearizable` runs one round of raft heartbeats and returns once a quorum acknowledged
//! it (no log write, no fsync). A round that *started* at `R` proves more than leadership at `R`:
//! each member that acknowledged it refuses to vote for anyone else, and to stand itself, for
//! openraft's leader lease (`election_timeout_max`) after it heard the round, and every possible
//! new quorum includes one of them. So no successor can be elected before `R +
//! election_timeout_max`, and the round serves every heartbeat that arrives before `R + reuse`,
//! with `reuse` half that lease (the other half absorbs the members' clocks running at different
//! rates). One round every `reuse` at most, however many nodes renew: a fleet of 1,000 nodes costs
//! the same few rounds a second as a fleet of ten.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Raft;

/// Why leadership could not be confirmed.
#[derive(Debug, thiserror::Error)]
#[error("leadership not confirmed: {0}")]
pub struct NotConfirmed(String);

pub struct QuorumCheck {
    /// How long after its start an acknowledged round still proves leadership.
    reuse: Duration,
    /// The start of the latest round a quorum acknowledged.
    confirmed: Mutex<Option<Instant>>,
    /// Held while a round is in flight, so callers share one instead of starting their own.
    round: tokio::sync::Mutex<()>,
}

impl QuorumCheck {
    /// `election_timeout_max`: the leader lease openraft's followers keep.
    pub fn new(election_timeout_max: Duration) -> QuorumCheck {
        QuorumCheck { reuse: election_timeout_max / 2, confirmed: Mutex::new(None), round: tokio::sync::Mutex::new(()) }
    }

    fn covers(&self, arrived: Instant) -> bool {
        let confirmed = *self.confirmed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        confirmed.is_some_and(|started| arrived <= started + self.reuse)
    }

    /// Returns once a round a quorum acknowledged proves that no other member led before
    /// `arrived`.
    pub async fn confirm_since(&self, raft: &Raft, arrived: Instant) -> Result<(), NotConfirmed> {
        if self.covers(arrived) {
            return Ok(());
        }
        let _round = self.round.lock().await;
        // The round this caller waited behind may cover it.
        if self.covers(arrived) {
            return Ok(());
        }
        let started = Instant::now();
        raft.ensure_linearizable().await.map_err(|e| NotConfirmed(e.to_string()))?;
        *self.confirmed.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(started);
        Ok(())
    }
}
