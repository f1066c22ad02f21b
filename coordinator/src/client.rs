//! What a node uses to talk to the coordinator group: register, heartbeat, leave, and locks
//! (the client is a `safeguards::LockBackend`). Calls go to the last known leader first; a
//! follower answers 421 with the leader's address and the call goes there (one hop); while an
//! election runs the call is retried a few times. Retried lock calls are safe: each acquisition
//! carries a hold id, so repeating one changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use ledger::{NodeId, SkuId};
use safeguards::lock::check_ttl;
use safeguards::{Acquisition, Extension, FencingToken, HoldId, LockBackend, LockError, LockName, OwnerToken, Release};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::network::Connection;
use crate::state::{Outcome, SkuReport};

/// Rounds over all members before a call gives up; an election takes a few hundred ms.
pub const RETRIES_MAX: usize = 3;
/// Pause between rounds.
const RETRY_PAUSE: Duration = Duration::from_millis(150);
/// Deadline of one HTTP call to one member; a write waits for a majority's fsync.
const CALL_MAX: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub node: NodeId,
    /// Where the node serves purchases (for operators and the admin view).
    pub addr: String,
    /// Random per node process: lets the coordinator recognise a retried registration.
    pub instance: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    pub node: NodeId,
    pub epoch: u64,
    pub reports: BTreeMap<SkuId, SkuReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaveRequest {
    pub node: NodeId,
    pub epoch: u64,
}

/// `POST /api/lock/acquire`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LockAcquireRequest {
    pub name: String,
    pub owner: String,
    pub hold: u64,
    pub ttl_ms: u64,
}

/// `POST /api/lock/release`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LockReleaseRequest {
    pub name: String,
    pub owner: String,
    pub fence: u64,
    pub hold: u64,
}

/// `POST /api/lock/extend`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LockExtendRequest {
    pub name: String,
    pub owner: String,
    pub fence: u64,
    pub ttl_ms: u64,
}

/// The body of a refusal from a member.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Refusal {
    pub error: String,
    /// With `not_leader`: the leader's address, if this member knows it.
    pub leader: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no coordinator member accepted the call: {0}")]
    Unavailable(String),
}

/// A client for the whole group. Cheap calls; one instance per node. Calls are serialized, so a
/// node's lock watchdogs wait behind its heartbeats: give locks their own client if a slow
/// coordinator must not delay both.
pub struct CoordinatorClient {
    members: Vec<String>,
    /// Connections by address, the leader first. A tokio `Mutex`: a node makes one call at a
    /// time, and the lock is held across the call's `.await`.
    connections: Mutex<(Option<String>, BTreeMap<String, Connection>)>,
}

impl CoordinatorClient {
    pub fn new(members: Vec<String>) -> Self {
        Self { members, connections: Mutex::new((None, BTreeMap::new())) }
    }

    pub async fn register(&self, request: &RegisterRequest) -> Result<Outcome, ClientError> {
        self.call("/api/register", request).await
    }

    pub async fn heartbeat(&self, request: &HeartbeatRequest) -> Result<Outcome, ClientError> {
        self.call("/api/heartbeat", request).await
    }

    pub async fn leave(&self, request: &LeaveRequest) -> Result<Outcome, ClientError> {
        self.call("/api/leave", request).await
    }

    async fn call<T: Serialize>(&self, path: &str, request: &T) -> Result<Outcome, ClientError> {
        let body = Bytes::from(serde_json::to_vec(request).map_err(|e| ClientError::Unavailable(e.to_string()))?);
        let mut guard = self.connections.lock().await;
        let (leader, connections) = &mut *guard;
        let mut last_error = String::from("no members configured");
        for round in 0..RETRIES_MAX {
            if round > 0 {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            let mut order: Vec<String> = leader.iter().cloned().collect();
            order.extend(self.members.iter().filter(|m| Some(*m) != leader.as_ref()).cloned());
            let mut at = 0;
            while at < order.len() {
                let addr = order[at].clone();
                at += 1;
                let connection = connections.entry(addr.clone()).or_insert_with(|| Connection::new(addr.clone()));
                match connection.post(path, body.clone(), CALL_MAX).await {
                    Ok((StatusCode::OK, answer)) => {
                        *leader = Some(addr);
                        return serde_json::from_slice(&answer).map_err(|e| ClientError::Unavailable(e.to_string()));
                    }
                    Ok((status, answer)) => {
                        let refusal: Option<Refusal> = serde_json::from_slice(&answer).ok();
                        last_error = format!("{addr} answered {status}: {refusal:?}");
                        if let Some(hint) = refusal.and_then(|r| r.leader).filter(|hint| *hint != addr) {
                            // One hop to the leader the member named, tried next.
                            *leader = Some(hint.clone());
                            order.insert(at, hint);
                        }
                    }
                    Err(e) => last_error = e.to_string(),
                }
            }
            *leader = None;
        }
        Err(ClientError::Unavailable(last_error))
    }
}

fn unexpected(outcome: Outcome) -> LockError {
    LockError::Corrupt(format!("unexpected coordinator outcome {outcome:?}"))
}

fn unavailable(error: ClientError) -> LockError {
    LockError::Unavailable(error.to_string())
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

/// Locks kept in the replicated state: every call is a raft write, so mutual exclusion and
/// fence order survive the loss of a minority of members.
#[async_trait::async_trait]
impl LockBackend for CoordinatorClient {
    fn kind(&self) -> &'static str {
        "coordinator"
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        hold: HoldId,
        ttl: Duration,
    ) -> Result<Acquisition, LockError> {
        check_ttl(ttl)?;
        let request = LockAcquireRequest {
            name: name.to_string(),
            owner: owner.as_str().to_string(),
            hold: hold.0,
            ttl_ms: millis(ttl),
        };
        match self.call("/api/lock/acquire", &request).await.map_err(unavailable)? {
            Outcome::LockAcquired { fence, holds } => Ok(Acquisition::Acquired { fence: FencingToken(fence), holds }),
            Outcome::LockHeld { retry_after_ms } => {
                Ok(Acquisition::Held { retry_after: Duration::from_millis(retry_after_ms) })
            }
            Outcome::LockHoldsMax => Err(LockError::holds_max()),
            other => Err(unexpected(other)),
        }
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        hold: HoldId,
    ) -> Result<Release, LockError> {
        let request = LockReleaseRequest {
            name: name.to_string(),
            owner: owner.as_str().to_string(),
            fence: fence.0,
            hold: hold.0,
        };
        match self.call("/api/lock/release", &request).await.map_err(unavailable)? {
            Outcome::LockReleased { holds_left } => Ok(Release::Released { holds_left }),
            Outcome::LockNotHeld => Ok(Release::NotHeld),
            other => Err(unexpected(other)),
        }
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        ttl: Duration,
    ) -> Result<Extension, LockError> {
        check_ttl(ttl)?;
        let request = LockExtendRequest {
            name: name.to_string(),
            owner: owner.as_str().to_string(),
            fence: fence.0,
            ttl_ms: millis(ttl),
        };
        match self.call("/api/lock/extend", &request).await.map_err(unavailable)? {
            Outcome::LockExtended => Ok(Extension::Extended),
            Outcome::LockNotHeld => Ok(Extension::NotHeld),
            other => Err(unexpected(other)),
        }
    }
}
