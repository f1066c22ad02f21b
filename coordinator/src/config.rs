//! The coordinator's settings, validated by the CLI's `cluster.toml` loader.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// One member of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberAddr {
    /// The member's name in the config, e.g. `c1`.
    pub name: String,
    /// What the member binds.
    pub listen: SocketAddr,
    /// `host:port` its peers and the nodes reach it at (a DNS name resolved on each connect,
    /// so a member whose container came back with a new address is found); raft knows the
    /// member by it.
    pub addr: String,
}

#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Every member, in config order; a member's raft id is its position + 1.
    pub members: Vec<MemberAddr>,
    /// Each member keeps its log, vote and snapshots under `data_dir/<name>`.
    pub data_dir: PathBuf,
    /// How often nodes renew their lease.
    pub heartbeat: Duration,
    /// How long a renewal holds. At least 5 × the election timeout, so a leader change fits
    /// inside one lease.
    pub lease: Duration,
    /// Extra wait past a lease before the leader revokes it; covers clock drift between the
    /// node's fencing and the leader's expiry.
    pub grace: Duration,
    /// The node stops selling this long before its lease runs out.
    pub fence_margin: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Off only to show what happens without it (the undersell test).
    pub reallocate: bool,
    /// The bearer token `/admin/*` requires; `None` turns the admin API off.
    pub admin_token: Option<protocol::Secret>,
    /// The cluster token this member presents to its peers, and the ones it accepts on
    /// `/raft/*` and `/api/*` from peers and nodes.
    pub cluster: protocol::ClusterCredential,
    /// Mutual TLS for raft and the node API (`[coordinator.tls]`); `{name}` in its paths is the
    /// member's name. `None`: plain HTTP on a private network.
    pub tls: Option<protocol::tls::TlsFiles>,
    /// The order service's API (`host:port`), whose metrics give the operator's orders by
    /// state on `/admin/cluster`; `None`: not shown.
    pub orders_api: Option<String>,
    /// Live nodes the group leases at most: a registration past it is refused (the node retries
    /// and says so), so a runaway scale-out cannot exhaust worker ids or spread stock thin.
    pub max_nodes: usize,
}

impl CoordinatorConfig {
    pub fn member_id(&self, name: &str) -> Option<u64> {
        self.members.iter().position(|m| m.name == name).map(|at| at as u64 + 1)
    }
}

/// A SKU of `cluster.toml` as the coordinator plans it: the leader creates its ledger once, when
/// it first defines the SKU, with each node's starting allotment.
#[derive(Debug, Clone)]
pub struct SkuPlan {
    pub sku: protocol::SkuId,
    pub terms: protocol::SkuTerms,
    pub starting: BTreeMap<protocol::NodeId, u64>,
}
