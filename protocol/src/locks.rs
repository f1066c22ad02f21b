//! Locks kept by the coordinator group (`POST /api/lock/acquire|release|extend`): the wire side
//! of the coordinator backend of `safeguards::lock`. A lock is held by an owner token; each
//! acquisition by it is a hold id, so a retried call (its answer was lost) changes nothing.

use serde::{Deserialize, Serialize};

/// `POST /api/lock/acquire`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockAcquireRequest {
    pub name: String,
    pub owner: String,
    pub hold: u64,
    pub ttl_ms: u64,
}

/// `POST /api/lock/release`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockReleaseRequest {
    pub name: String,
    pub owner: String,
    pub fence: u64,
    pub hold: u64,
}

/// `POST /api/lock/extend`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockExtendRequest {
    pub name: String,
    pub owner: String,
    pub fence: u64,
    pub ttl_ms: u64,
}

/// The answer to a lock call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockAnswer {
    /// The caller holds the lock; `holds` counts its holds.
    LockAcquired {
        fence: u64,
        holds: u32,
    },
    /// Another owner holds the lock for `retry_after_ms` more, unless it is extended.
    LockHeld {
        retry_after_ms: u64,
    },
    LockReleased {
        holds_left: u32,
    },
    LockExtended,
    /// The lock is not the caller's (expired, taken over, or never held).
    LockNotHeld,
    /// The owner already holds the lock as many times as one owner may.
    LockHoldsMax,
}
