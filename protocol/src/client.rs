//! The coordinator client: what a node (and the lock backend, and `seckill admin`-style tools)
//! uses to call the group. Calls go to the last known leader first; a follower answers 421 with
//! the leader's address and the call goes there (one hop); while an election runs the call is
//! retried a few times. Every call is bounded: [`RETRIES_MAX`] rounds of at most [`CALL_MAX`]
//! per member.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::connection::Connection;
use crate::credential::Secret;
use crate::fleet::{
    CatalogueAnswer, HeartbeatRequest, LeaseAnswer, LeaveAnswer, LeaveRequest, Refusal, RegisterRequest,
};
use crate::locks::{LockAcquireRequest, LockAnswer, LockExtendRequest, LockReleaseRequest};
use crate::tls::Tls;

/// Rounds over all members before a call gives up; an election takes a few hundred ms.
pub const RETRIES_MAX: usize = 3;
/// Pause between rounds.
const RETRY_PAUSE: Duration = Duration::from_millis(150);
/// Deadline of one HTTP call to one member; a write waits for a majority's fsync.
pub const CALL_MAX: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No member took the call: all unreachable, none leading, or every answer a refusal.
    #[error("no coordinator member accepted the call: {0}")]
    Unavailable(String),
    /// A member refused the call as malformed or of another protocol version; retrying the
    /// same call cannot help.
    #[error("the coordinator refused the call: {0}")]
    Refused(String),
}

/// A client for the whole group; one instance per node. Calls are serialized, so a node's lock
/// watchdogs wait behind its heartbeats: give locks their own client if a slow coordinator must
/// not delay both.
pub struct CoordinatorClient {
    members: Vec<String>,
    /// The cluster token every call presents.
    token: Secret,
    /// Mutual TLS to the members, when the fleet runs it.
    tls: Option<Tls>,
    /// Connections by address, and the last known leader. A tokio `Mutex`: one call at a time,
    /// and the lock is held across the call's `.await`.
    connections: Mutex<(Option<String>, BTreeMap<String, Connection>)>,
}

impl CoordinatorClient {
    /// `members`: every member's `host:port`; `token`: the cluster token.
    pub fn new(members: Vec<String>, token: Secret) -> Self {
        Self { members, token, tls: None, connections: Mutex::new((None, BTreeMap::new())) }
    }

    /// Calls the members over mutual TLS when `tls` is set.
    pub fn with_tls(mut self, tls: Option<Tls>) -> Self {
        self.tls = tls;
        self
    }

    pub async fn register(&self, request: &RegisterRequest) -> Result<LeaseAnswer, ClientError> {
        self.call("/api/register", request).await
    }

    pub async fn heartbeat(&self, request: &HeartbeatRequest) -> Result<LeaseAnswer, ClientError> {
        self.call("/api/heartbeat", request).await
    }

    pub async fn leave(&self, request: &LeaveRequest) -> Result<LeaveAnswer, ClientError> {
        self.call("/api/leave", request).await
    }

    /// The group's catalogue, from the first member that answers (any member: it is a read of
    /// its applied state, at most a heartbeat behind the leader's).
    pub async fn catalogue(&self) -> Result<CatalogueAnswer, ClientError> {
        self.call("/api/catalogue", &serde_json::json!({})).await
    }

    /// The nodes leased now, from the first member that answers (a read of its applied state,
    /// at most a heartbeat behind the leader's).
    pub async fn nodes(&self) -> Result<crate::fleet::NodesAnswer, ClientError> {
        self.call("/api/nodes", &serde_json::json!({})).await
    }

    pub async fn acquire_lock(&self, request: &LockAcquireRequest) -> Result<LockAnswer, ClientError> {
        self.call("/api/lock/acquire", request).await
    }

    pub async fn release_lock(&self, request: &LockReleaseRequest) -> Result<LockAnswer, ClientError> {
        self.call("/api/lock/release", request).await
    }

    pub async fn extend_lock(&self, request: &LockExtendRequest) -> Result<LockAnswer, ClientError> {
        self.call("/api/lock/extend", request).await
    }

    async fn call<T: Serialize, A: DeserializeOwned>(&self, path: &str, request: &T) -> Result<A, ClientError> {
        let body = Bytes::from(serde_json::to_vec(request).map_err(|e| ClientError::Refused(e.to_string()))?);
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
                let connection = connections
                    .entry(addr.clone())
                    .or_insert_with(|| Connection::new(addr.clone(), self.token.clone()).with_tls(self.tls.clone()));
                match connection.post(path, body.clone(), CALL_MAX).await {
                    Ok((StatusCode::OK, answer)) => {
                        *leader = Some(addr);
                        return serde_json::from_slice(&answer).map_err(|e| ClientError::Refused(e.to_string()));
                    }
                    Ok((StatusCode::UNAUTHORIZED, _)) => {
                        // Another member may accept it (a rotation half done): try on, but say
                        // what to fix if none does.
                        last_error = format!(
                            "{addr} refused this process's cluster token (401): [coordinator] cluster_token or \
                             SECKILL_CLUSTER_TOKEN must match the members'"
                        );
                    }
                    Ok((StatusCode::BAD_REQUEST, answer)) => {
                        let refusal: Option<Refusal> = serde_json::from_slice(&answer).ok();
                        return Err(ClientError::Refused(format!("{addr}: {refusal:?}")));
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
