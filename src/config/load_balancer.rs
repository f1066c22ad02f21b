//! `[load_balancer]`: what nginx does before a request reaches a node, and where nginx itself
//! connects from, so the nodes and the order service believe its `X-Forwarded-For`.

use serde::Deserialize;

use super::{invalid, ConfigError};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoadBalancerSection {
    /// Requests per second one client address may send through nginx (`limit_req`), the first
    /// and cheapest layer against a flood; 0 (the default) turns it off. Off by default because
    /// load tests, like a crowd behind one NAT, come from a few addresses.
    pub rate_per_address: u32,
    /// Requests above the rate let through at once before nginx answers 429.
    pub burst_per_address: u32,
    /// The addresses (or CIDR blocks) the fleet's own nginx connects from: added to
    /// `[safeguards] trusted_proxies`, so a buyer behind it is known by the address nginx
    /// names, not by nginx's. Without them every buyer behind nginx shares its address, and one
    /// flood spends everyone's per-address budget. Empty by default (a forged header from
    /// anywhere changes nothing); `fleet up` fills in loopback, where it runs nginx, and the
    /// Compose fleet names its nginx's address.
    pub addresses: Vec<String>,
}

impl LoadBalancerSection {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.rate_per_address == 0 && self.burst_per_address > 0 {
            return Err(invalid("load_balancer.burst_per_address", "needs rate_per_address above zero"));
        }
        Ok(())
    }
}
