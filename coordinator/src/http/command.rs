//! Writing a node or lock client's command through raft, and answering with its `protocol`
//! answer: nodes and lock clients read `protocol` answers, never raft outcomes.

use hyper::{Response, StatusCode};

use super::body::{json, refusal, Body};
use crate::context::{now_ms, Context, WriteError};
use crate::state::{Command, Outcome};

/// Stamps the leader's time and lease (ms) into the command and writes it through raft.
pub(super) async fn write(member: &Context, command: impl FnOnce(u64, u64) -> Command) -> Response<Body> {
    let command = command(now_ms(), member.lease().as_millis() as u64);
    match member.write(command).await {
        Ok(Outcome::Lease(answer)) => json(StatusCode::OK, &answer),
        Ok(Outcome::Leave(answer)) => json(StatusCode::OK, &answer),
        Ok(Outcome::Lock(answer)) => json(StatusCode::OK, &answer),
        Ok(other) => {
            tracing::error!("a node API write had the outcome {other:?}, which no node API route produces");
            refusal(StatusCode::INTERNAL_SERVER_ERROR, "internal", None)
        }
        Err(WriteError::NotLeader(leader)) => refusal(StatusCode::MISDIRECTED_REQUEST, "not_leader", leader),
        Err(WriteError::Unavailable(reason)) => {
            tracing::debug!("coordinator write failed: {reason}");
            refusal(StatusCode::SERVICE_UNAVAILABLE, "unavailable", None)
        }
    }
}
