//! `[coordinator]`: the group's members, lease timings, admin token and cluster token, checked
//! against the timing relations the lease protocol depends on. Secrets come from the
//! environment before the file (`SECKILL_ADMIN_TOKEN`, `SECKILL_CLUSTER_TOKEN`,
//! `SECKILL_CLUSTER_TOKEN_ACCEPT`), and no error ever echoes one.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::{invalid, ConfigError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorSection {
    pub members: Vec<MemberEntry>,
    #[serde(default = "default_data_dir")]
    pub data_dir: std::path::PathBuf,
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    #[serde(default = "default_grace_ms")]
    pub grace_ms: u64,
    #[serde(default = "default_fence_margin_ms")]
    pub fence_margin_ms: u64,
    #[serde(default = "default_election_min_ms")]
    pub election_timeout_min_ms: u64,
    #[serde(default = "default_election_max_ms")]
    pub election_timeout_max_ms: u64,
    #[serde(default = "default_true")]
    pub reallocate: bool,
    /// Bearer token for `/admin/*` on the members; `SECKILL_ADMIN_TOKEN` overrides it, and is
    /// the better place for a secret. Neither set: the admin API is off.
    pub admin_token: Option<String>,
    /// The token members and nodes present to members on `/raft/*` and `/api/*`;
    /// `SECKILL_CLUSTER_TOKEN` overrides it. Neither set: a fleet in one process draws one at
    /// start, and a process that talks to others (`seckill coordinator`, `seckill node`) refuses
    /// to start.
    pub cluster_token: Option<String>,
    /// One more token members accept (never present), for a rotation; see SECURITY.md.
    /// `SECKILL_CLUSTER_TOKEN_ACCEPT` overrides it.
    pub cluster_token_accept: Option<String>,
    /// Mutual TLS for raft and the node API; absent: plain HTTP (keep it on a private network).
    pub tls: Option<TlsSection>,
    /// Where members read the order service's metrics for the operator's orders by state
    /// (`host:port`); absent: `[orders] advertise` or `listen`, a wildcard read as loopback.
    pub orders_api: Option<String>,
    /// Live nodes the group leases at most, listed or joined at run time (1 to 1024: each holds
    /// an order-id worker id).
    #[serde(default = "default_max_nodes")]
    pub max_nodes: usize,
}

/// `[coordinator.tls]`: PEM files; `{name}` in `cert` and `key` stands for the member name or
/// node id of the process reading them, so one file configures every process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// The fleet's CA; every member's and node's certificate must chain to it, and a member's
    /// must name its `listen` IP address.
    pub ca: std::path::PathBuf,
}

/// The environment variable that carries the admin token.
pub const ADMIN_TOKEN_ENV: &str = "SECKILL_ADMIN_TOKEN";
/// The environment variable that carries the cluster token.
pub const CLUSTER_TOKEN_ENV: &str = "SECKILL_CLUSTER_TOKEN";
/// The environment variable that carries a second accepted cluster token during a rotation.
pub const CLUSTER_TOKEN_ACCEPT_ENV: &str = "SECKILL_CLUSTER_TOKEN_ACCEPT";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberEntry {
    pub name: String,
    /// What the member binds, e.g. `0.0.0.0:7000`.
    pub listen: SocketAddr,
    /// `host:port` its peers and the nodes reach it at (a DNS name is fine); absent: `listen`,
    /// a wildcard there read as loopback.
    pub advertise: Option<String>,
}

/// Enough for a large sale's scale-out; far below the 1,024 worker ids, so a quarantined id
/// (a vanished node's, held until its epoch settles) never leaves a joiner without one.
pub const MAX_NODES_DEFAULT: usize = 64;

fn default_max_nodes() -> usize {
    MAX_NODES_DEFAULT
}
fn default_data_dir() -> std::path::PathBuf {
    "data/coordinator".into()
}
fn default_heartbeat_ms() -> u64 {
    250
}
fn default_lease_ms() -> u64 {
    2_000
}
fn default_grace_ms() -> u64 {
    500
}
fn default_fence_margin_ms() -> u64 {
    300
}
fn default_election_min_ms() -> u64 {
    150
}
fn default_election_max_ms() -> u64 {
    300
}
fn default_true() -> bool {
    true
}

/// Checks the timing relations the lease protocol depends on.
pub(super) fn validate_coordinator(
    section: &CoordinatorSection,
    orders_at: Option<String>,
) -> Result<::coordinator::CoordinatorConfig, ConfigError> {
    let key = |field: &str| format!("coordinator.{field}");
    let members = member_addrs(section)?;
    if !(1..=usize::from(::safeguards::WORKER_IDS_MAX)).contains(&section.max_nodes) {
        return Err(invalid(key("max_nodes"), "must be from 1 to 1024: each live node holds an order-id worker id"));
    }
    if section.election_timeout_min_ms == 0 || section.election_timeout_min_ms >= section.election_timeout_max_ms {
        return Err(invalid(key("election_timeout_min_ms"), "must be above zero and below election_timeout_max_ms"));
    }
    if section.lease_ms < 5 * section.election_timeout_max_ms {
        return Err(invalid(
            key("lease_ms"),
            "must be at least 5 x election_timeout_max_ms, so a leader change fits in one lease",
        ));
    }
    if section.heartbeat_ms == 0 || section.heartbeat_ms * 3 > section.lease_ms {
        return Err(invalid(key("heartbeat_ms"), "must be above zero and at most a third of lease_ms"));
    }
    if section.fence_margin_ms == 0 || section.fence_margin_ms + section.heartbeat_ms >= section.lease_ms {
        return Err(invalid(
            key("fence_margin_ms"),
            "must be above zero and leave room for a heartbeat within the lease",
        ));
    }
    if section.grace_ms == 0 {
        return Err(invalid(key("grace_ms"), "must be above zero: it covers clock drift between node and leader"));
    }
    let admin_token = secret(ADMIN_TOKEN_ENV, &section.admin_token, "admin_token")?;
    let cluster_token = secret(CLUSTER_TOKEN_ENV, &section.cluster_token, "cluster_token")?;
    let accept = secret(CLUSTER_TOKEN_ACCEPT_ENV, &section.cluster_token_accept, "cluster_token_accept")?;
    let cluster = match cluster_token {
        Some(token) => protocol::ClusterCredential::new(token, accept),
        None if accept.is_some() => {
            return Err(invalid(key("cluster_token_accept"), "is for a rotation: cluster_token must be set too"))
        }
        None => protocol::ClusterCredential::generate()
            .map_err(|e| invalid(key("cluster_token"), format!("no secure random source to draw one: {e}")))?,
    };
    Ok(::coordinator::CoordinatorConfig {
        members,
        data_dir: section.data_dir.clone(),
        heartbeat: Duration::from_millis(section.heartbeat_ms),
        lease: Duration::from_millis(section.lease_ms),
        grace: Duration::from_millis(section.grace_ms),
        fence_margin: Duration::from_millis(section.fence_margin_ms),
        election_timeout_min: Duration::from_millis(section.election_timeout_min_ms),
        election_timeout_max: Duration::from_millis(section.election_timeout_max_ms),
        reallocate: section.reallocate,
        admin_token,
        cluster,
        tls: section.tls.as_ref().map(|tls| protocol::tls::TlsFiles {
            cert: tls.cert.clone(),
            key: tls.key.clone(),
            ca: tls.ca.clone(),
        }),
        orders_api: orders_api(section.orders_api.as_deref(), orders_at)?,
        max_nodes: section.max_nodes,
    })
}

/// The members, each with the address its peers and the nodes reach it at: 1, 3 or 5 of them,
/// under unique names.
fn member_addrs(section: &CoordinatorSection) -> Result<Vec<::coordinator::MemberAddr>, ConfigError> {
    if ![1, 3, 5].contains(&section.members.len()) {
        return Err(invalid("coordinator.members", "a coordinator group has 1, 3 or 5 members"));
    }
    let mut names = HashSet::new();
    let mut members = Vec::with_capacity(section.members.len());
    for (at, member) in section.members.iter().enumerate() {
        if member.name.is_empty() || !names.insert(member.name.clone()) {
            return Err(invalid(format!("coordinator.members[{at}].name"), "must be non-empty and unique"));
        }
        let addr = match &member.advertise {
            Some(advertise) => super::address::host_port(&format!("coordinator.members[{at}].advertise"), advertise)?,
            None => super::address::reachable(member.listen).to_string(),
        };
        members.push(::coordinator::MemberAddr { name: member.name.clone(), listen: member.listen, addr });
    }
    Ok(members)
}

/// The address members read the order service at: `orders_api` as configured, else where the
/// service says it is reached (`[orders] advertise`, or its `listen`).
fn orders_api(configured: Option<&str>, orders_at: Option<String>) -> Result<Option<String>, ConfigError> {
    if let Some(configured) = configured {
        let (host, port) = configured.rsplit_once(':').unwrap_or((configured, ""));
        if host.is_empty() || port.parse::<u16>().map_or(true, |port| port == 0) {
            return Err(invalid("coordinator.orders_api", "must be host:port, the order service's API address"));
        }
        return Ok(Some(configured.to_string()));
    }
    Ok(orders_at)
}

/// A secret from `env` (or the file `env_FILE` names) if set, else from the file's `field`. The
/// error names both places and the rule, never the value.
fn secret(env: &str, configured: &Option<String>, field: &str) -> Result<Option<protocol::Secret>, ConfigError> {
    let from_env =
        protocol::env_secret::from_env(env).map_err(|e| invalid(format!("coordinator.{field}"), e.to_string()))?;
    let Some(text) = from_env.or(configured.clone()) else {
        return Ok(None);
    };
    protocol::Secret::new(&text).map(Some).map_err(|weak| {
        invalid(format!("coordinator.{field}"), format!("the token ({env} or coordinator.{field}) {weak}"))
    })
}
