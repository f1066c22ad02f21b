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
    pub addr: SocketAddr,
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
    pub admin_token: Option<String>,
}

impl CoordinatorConfig {
    pub fn member_id(&self, name: &str) -> Option<u64> {
        self.members.iter().position(|m| m.name == name).map(|at| at as u64 + 1)
    }
}

/// A SKU as the coordinator plans it: the ledger spec (the leader creates the ledger once, when
/// it first defines the SKU), each node's starting allotment and the terms nodes sell it on.
#[derive(Debug, Clone)]
pub struct SkuPlan {
    pub spec: ledger::SkuSpec,
    pub starting: BTreeMap<ledger::NodeId, u64>,
    pub terms: crate::state::SkuTerms,
}

/// Extra units a node holds beyond its share of the stock, so the fleet keeps selling through a
/// node's death until its allotment is reallocated: a unit count per node, or a percentage of
/// the node's share. Written `50` or `"10%"` in `cluster.toml` and the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    Units(u64),
    Percent(u32),
}

/// Larger buffers than 10× the share only add ledger load; they cannot add sales.
pub const BUFFER_PERCENT_MAX: u32 = 1000;

impl Default for Buffer {
    fn default() -> Self {
        Buffer::Percent(10)
    }
}

impl Buffer {
    /// The buffer of a node whose share is `share`.
    pub fn units(self, share: u64) -> u64 {
        match self {
            Buffer::Units(units) => units,
            Buffer::Percent(pct) => share.saturating_mul(u64::from(pct)).div_ceil(100),
        }
    }

    /// Reads `"10%"` or `"50"`.
    pub fn parse(text: &str) -> Option<Buffer> {
        match text.trim().strip_suffix('%') {
            Some(pct) => pct.trim().parse().ok().filter(|pct| *pct <= BUFFER_PERCENT_MAX).map(Buffer::Percent),
            None => text.trim().parse().ok().map(Buffer::Units),
        }
    }
}

impl std::fmt::Display for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Buffer::Units(units) => write!(f, "{units}"),
            Buffer::Percent(pct) => write!(f, "{pct}%"),
        }
    }
}

impl serde::Serialize for Buffer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Buffer::Units(units) => serializer.serialize_u64(*units),
            Buffer::Percent(_) => serializer.collect_str(self),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Buffer {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Units(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Units(units) => Ok(Buffer::Units(units)),
            Raw::Text(text) => Buffer::parse(&text).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "buffer {text:?} is neither a unit count nor a percentage like \"10%\" (at most {BUFFER_PERCENT_MAX}%)"
                ))
            }),
        }
    }
}
