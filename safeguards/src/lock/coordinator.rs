//! The coordinator backend: locks kept in the coordinator group's replicated state, reached
//! through `protocol`'s client. Every call is a raft write, so mutual exclusion and fence order
//! survive the loss of a minority of members (and of Redis).

use std::time::Duration;

use protocol::locks::{LockAcquireRequest, LockAnswer, LockExtendRequest, LockReleaseRequest};
use protocol::{ClientError, CoordinatorClient};

use super::{
    check_ttl, Acquisition, Extension, FencingToken, HoldId, LockBackend, LockError, LockName, OwnerToken, Release,
};

/// A [`LockBackend`] over the coordinator group.
pub struct CoordinatorLockBackend {
    client: CoordinatorClient,
}

impl CoordinatorLockBackend {
    /// Give locks their own client: calls on one client are serialized, and a node's
    /// heartbeats must not wait behind lock renewals (or the reverse).
    pub fn new(client: CoordinatorClient) -> Self {
        Self { client }
    }
}

fn unexpected(answer: LockAnswer) -> LockError {
    LockError::Corrupt(format!("unexpected coordinator answer {answer:?}"))
}

fn unavailable(error: ClientError) -> LockError {
    LockError::Unavailable(error.to_string())
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

#[async_trait::async_trait]
impl LockBackend for CoordinatorLockBackend {
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
        match self.client.acquire_lock(&request).await.map_err(unavailable)? {
            LockAnswer::LockAcquired { fence, holds } => {
                Ok(Acquisition::Acquired { fence: FencingToken(fence), holds })
            }
            LockAnswer::LockHeld { retry_after_ms } => {
                Ok(Acquisition::Held { retry_after: Duration::from_millis(retry_after_ms) })
            }
            LockAnswer::LockHoldsMax => Err(LockError::holds_max()),
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
        match self.client.release_lock(&request).await.map_err(unavailable)? {
            LockAnswer::LockReleased { holds_left } => Ok(Release::Released { holds_left }),
            LockAnswer::LockNotHeld => Ok(Release::NotHeld),
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
        match self.client.extend_lock(&request).await.map_err(unavailable)? {
            LockAnswer::LockExtended => Ok(Extension::Extended),
            LockAnswer::LockNotHeld => Ok(Extension::NotHeld),
            other => Err(unexpected(other)),
        }
    }
}
