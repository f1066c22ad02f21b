//! `[coordinator]`: the group's members, lease timings and admin token, checked against the
//! timing relations the lease protocol depends on.

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
}

/// The environment variable that carries the admin token.
pub const ADMIN_TOKEN_ENV: &str = "SECKILL_ADMIN_TOKEN";

/// Shorter tokens can be guessed; 16 random characters cannot.
const ADMIN_TOKEN_MIN_BYTES: usize = 16;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberEntry {
    pub name: String,
    pub listen: SocketAddr,
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
) -> Result<::coordinator::CoordinatorConfig, ConfigError> {
    let key = |field: &str| format!("coordinator.{field}");
    if ![1, 3, 5].contains(&section.members.len()) {
        return Err(invalid(key("members"), "a coordinator group has 1, 3 or 5 members"));
    }
    let mut names = HashSet::new();
    for (at, member) in section.members.iter().enumerate() {
        if member.name.is_empty() || !names.insert(member.name.clone()) {
            return Err(invalid(format!("coordinator.members[{at}].name"), "must be non-empty and unique"));
        }
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
    let admin_token = std::env::var(ADMIN_TOKEN_ENV).ok().filter(|t| !t.is_empty()).or(section.admin_token.clone());
    if admin_token.as_ref().is_some_and(|t| t.len() < ADMIN_TOKEN_MIN_BYTES || t.contains(char::is_whitespace)) {
        return Err(invalid(
            key("admin_token"),
            format!("the admin token ({ADMIN_TOKEN_ENV} or coordinator.admin_token) needs at least {ADMIN_TOKEN_MIN_BYTES} characters and no spaces"),
        ));
    }
    Ok(::coordinator::CoordinatorConfig {
        members: section
            .members
            .iter()
            .map(|m| ::coordinator::MemberAddr { name: m.name.clone(), addr: m.listen })
            .collect(),
        data_dir: section.data_dir.clone(),
        heartbeat: Duration::from_millis(section.heartbeat_ms),
        lease: Duration::from_millis(section.lease_ms),
        grace: Duration::from_millis(section.grace_ms),
        fence_margin: Duration::from_millis(section.fence_margin_ms),
        election_timeout_min: Duration::from_millis(section.election_timeout_min_ms),
        election_timeout_max: Duration::from_millis(section.election_timeout_max_ms),
        reallocate: section.reallocate,
        admin_token,
    })
}
