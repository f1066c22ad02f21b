//! Changing who is in the coordinator group: replacing a member that lost its disk without
//! losing the group's state.
//!
//! A member restarted on an empty data directory forgot its vote and its log. Letting it vote
//! again under its old id could elect two leaders in one term, so it is never simply "let back
//! in". The procedure (each step a raft membership change on the leader, `PUT
//! /admin/members/{name}`):
//! 1. `remove`: the member leaves the voters and the group (the others keep a quorum: with 3
//!    members, 2 of 2);
//! 2. restart it on its empty directory: it does not initialize a group of its own (see
//!    `Member::start`), it waits to be contacted;
//! 3. `add_learner`: the leader replicates the whole state to it (snapshot, then log) and the
//!    call returns once it has caught up; a learner never votes;
//! 4. `promote`: it becomes a voter again.
//!
//! Every step is idempotent: repeating one that already happened changes nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use serde::{Deserialize, Serialize};

use crate::context::Context;

/// Longest a learner may take to catch up before `add_learner` answers; the state is small, so
/// anything longer means the member is not reachable.
const CATCH_UP_MAX: Duration = Duration::from_secs(30);

/// One membership change, `PUT /admin/members/{name}` with `{"op": …}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum MemberChange {
    Remove,
    AddLearner,
    Promote,
}

/// The group's membership after a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Membership {
    pub voters: BTreeSet<String>,
    pub learners: BTreeSet<String>,
}

/// Why a change did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error("{0} is not in [coordinator] members")]
    UnknownMember(String),
    #[error("not the leader")]
    NotLeader(Option<String>),
    #[error("{0}")]
    Refused(String),
    #[error("the change did not complete: {0}")]
    Unavailable(String),
}

pub async fn change(member: &Context, name: &str, change: MemberChange) -> Result<Membership, ChangeError> {
    let (at, known) = member
        .members()
        .iter()
        .enumerate()
        .find(|(_, m)| m.name == name)
        .ok_or_else(|| ChangeError::UnknownMember(name.to_string()))?;
    let (id, addr) = (at as u64 + 1, known.addr.clone());
    if !member.is_leader() {
        return Err(ChangeError::NotLeader(member.leader_addr()));
    }
    if change == MemberChange::Remove && id == member.id() {
        return Err(ChangeError::Refused(
            "the leader cannot remove itself; send the change after another member leads".into(),
        ));
    }
    let (voters, learners) = current(member);
    let result = match change {
        MemberChange::Remove if !voters.contains(&id) && !learners.contains(&id) => Ok(()),
        MemberChange::Remove => {
            member.raft().change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await.map(drop)
        }
        MemberChange::AddLearner if voters.contains(&id) => {
            return Err(ChangeError::Refused(format!("{name} is a voter; remove it first")));
        }
        MemberChange::AddLearner => {
            let added = tokio::time::timeout(CATCH_UP_MAX, member.raft().add_learner(id, BasicNode { addr }, true));
            match added.await {
                Ok(result) => result.map(drop),
                Err(_) => return Err(ChangeError::Unavailable(format!("{name} did not catch up in {CATCH_UP_MAX:?}"))),
            }
        }
        MemberChange::Promote if voters.contains(&id) => Ok(()),
        MemberChange::Promote if !learners.contains(&id) => {
            return Err(ChangeError::Refused(format!("{name} is not a learner; add_learner first")));
        }
        MemberChange::Promote => {
            member.raft().change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true).await.map(drop)
        }
    };
    result.map_err(|e| match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            ChangeError::NotLeader(forward.leader_node.map(|node| node.addr))
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(refused)) => refusal(refused),
        other => ChangeError::Unavailable(other.to_string()),
    })?;
    Ok(view(member))
}

fn refusal(error: ChangeMembershipError<u64>) -> ChangeError {
    ChangeError::Refused(error.to_string())
}

/// Voter and learner ids in the latest membership config this member knows.
fn current(member: &Context) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let metrics = member.raft().metrics().borrow().clone();
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let learners: BTreeSet<u64> = membership.learner_ids().collect();
    (voters, learners)
}

/// The membership by member name.
pub fn view(member: &Context) -> Membership {
    let (voters, learners) = current(member);
    let name = |id: &u64| {
        member.members().get((*id as usize).wrapping_sub(1)).map(|m| m.name.clone()).unwrap_or_else(|| id.to_string())
    };
    Membership { voters: voters.iter().map(name).collect(), learners: learners.iter().map(name).collect() }
}
