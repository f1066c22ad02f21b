//! What a node and the coordinator say to each other: register, heartbeat, leave, and the
//! answers. These are the node API's bodies (`POST /api/register|heartbeat|leave`, JSON); the
//! coordinator's raft log has its own records and maps them to these at its edge.
//!
//! **Versions.** Every request carries [`PROTOCOL_VERSION`]; a request without one is from a
//! node built before versions existed, whose messages have this exact shape, and counts as 1.
//! A member refuses a version it does not speak with [`Refusal`] `unsupported_version` (HTTP
//! 400), naming both versions, instead of misreading the message. Fields are only ever added
//! with serde defaults within one version; anything else bumps it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{NodeId, SkuId};
use crate::terms::SkuTerms;

/// The version of the node↔coordinator messages this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

fn version_one() -> u32 {
    1
}

/// `POST /api/register`: a node joins (or rejoins) the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    #[serde(default = "version_one")]
    pub version: u32,
    pub node: NodeId,
    /// Where the node serves purchases (for operators and the admin view).
    pub addr: String,
    /// Random per node process: lets the coordinator recognise a retried registration.
    pub instance: u64,
}

/// `POST /api/heartbeat`: a node renews its lease and reports its stock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    #[serde(default = "version_one")]
    pub version: u32,
    pub node: NodeId,
    pub epoch: u64,
    pub reports: BTreeMap<SkuId, SkuReport>,
}

/// `POST /api/leave`: a node shutting down hands its lease back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveRequest {
    #[serde(default = "version_one")]
    pub version: u32,
    pub node: NodeId,
    pub epoch: u64,
}

/// What one node reports about one SKU in a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuReport {
    /// Units in its local allotment.
    pub local_remaining: u64,
    /// Units of `granted` it has added to its allotment so far (grants reach it by heartbeat).
    pub applied: u64,
    /// Units it sold in this epoch.
    pub sold: u64,
    /// Its last ledger call for this SKU succeeded. A node that cannot reach the ledger cannot
    /// sell what it holds: the coordinator counts those units as gone and grants them to nodes
    /// that can. (Absent from nodes built before it: they count as reaching it.)
    #[serde(default = "reaching")]
    pub ledger_reachable: bool,
    /// Purchase requests that named this SKU here since the node started (0 from nodes built
    /// before it), for the operator's requests per second.
    #[serde(default)]
    pub requests: u64,
    /// Units it gave back in this epoch because the leader asked it to hold at most some
    /// number ([`Assignment::hold_max`]); they are in neither `local_remaining` nor `sold`.
    #[serde(default)]
    pub returned: u64,
}

fn reaching() -> bool {
    true
}

impl SkuReport {
    pub fn new(local_remaining: u64, applied: u64, sold: u64) -> Self {
        Self { local_remaining, applied, sold, ledger_reachable: true, requests: 0, returned: 0 }
    }
}

/// What a node is told after registering or renewing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub epoch: u64,
    pub worker_id: u16,
    /// Leader wall-clock ms until which the lease holds (for operators; nodes fence on their
    /// own clock).
    pub lease_until_ms: u64,
    /// Cumulative grants per SKU in this epoch; the node adds what it has not applied yet.
    pub granted: BTreeMap<SkuId, u64>,
    /// Every SKU the group knows, with its current terms.
    #[serde(default)]
    pub skus: BTreeMap<SkuId, SkuTerms>,
    /// Units of a SKU the node should hold at most: it gives back what its allotment holds
    /// beyond, and reports it as `returned`. The leader asks this of nodes holding far more
    /// than their share while the fleet holds more than it needs (a node joined and was
    /// granted its share on top), so the stock is rebalanced towards the others' sell rate.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hold_max: BTreeMap<SkuId, u64>,
}

/// The answer to a registration or a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseAnswer {
    Assigned(Assignment),
    /// The node's epoch is not the current one: it must drop its allotment and re-register.
    StaleEpoch {
        current: u64,
    },
    /// The coordinator has no record of the node: it must register.
    UnknownNode,
    /// Every worker id is held by a live node; try again later.
    NoWorkerId,
    /// `[coordinator] max_nodes` nodes are live already; try again when one leaves, or raise it.
    FleetFull {
        max_nodes: u64,
    },
}

/// The answer to a leave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaveAnswer {
    /// The epoch ended; these grants were revoked and go to the live nodes.
    Left {
        revoked: BTreeMap<SkuId, u64>,
    },
    StaleEpoch {
        current: u64,
    },
    UnknownNode,
}

/// `POST /api/catalogue` (body `{}`): every SKU the group sells, with its terms, as the
/// answering member's applied state holds them. Order services follow it to consume SKUs
/// created at run time and price their orders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogueAnswer {
    pub skus: std::collections::BTreeMap<crate::ids::SkuId, crate::SkuTerms>,
}

/// The answer to `/api/nodes`: the nodes leased now, as the answering member's applied state
/// holds them. The load balancer's sync follows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesAnswer {
    pub nodes: Vec<LiveNode>,
}

/// A leased node: its id, where it serves purchases (`host:port` as it registered) and its
/// epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveNode {
    pub id: crate::ids::NodeId,
    pub addr: String,
    pub epoch: u64,
}

/// The body of any refusal from a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// A stable code: `not_leader`, `unavailable`, `bad_request`, `unsupported_version`, …
    pub error: String,
    /// With `not_leader`: the leader's address, if this member knows it.
    pub leader: Option<String>,
    /// A sentence for the operator, where the code alone does not say enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Refusal {
    pub fn new(error: &str) -> Self {
        Self { error: error.to_string(), leader: None, message: None }
    }

    /// A message of another version than this build speaks.
    pub fn unsupported_version(theirs: u32) -> Self {
        Self {
            error: "unsupported_version".to_string(),
            leader: None,
            message: Some(format!(
                "this coordinator speaks protocol version {PROTOCOL_VERSION}, the request version {theirs}; \
                 run nodes and coordinator members of one release"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_of_nodes_built_before_versions_read_as_version_one() {
        let old = r#"{"node":"n1","addr":"127.0.0.1:1","instance":7}"#;
        let request: RegisterRequest = serde_json::from_str(old).unwrap();
        assert_eq!(request.version, 1);
        let old = r#"{"node":"n1","epoch":3,"reports":{"s":{"local_remaining":1,"applied":2,"sold":3}}}"#;
        assert_eq!(serde_json::from_str::<HeartbeatRequest>(old).unwrap().version, 1);
    }

    #[test]
    fn answers_keep_the_shape_older_nodes_read() {
        let answer = LeaseAnswer::StaleEpoch { current: 4 };
        assert_eq!(serde_json::to_string(&answer).unwrap(), r#"{"StaleEpoch":{"current":4}}"#);
        let refusal = serde_json::to_string(&Refusal::new("not_leader")).unwrap();
        assert_eq!(refusal, r#"{"error":"not_leader","leader":null}"#);
    }
}
