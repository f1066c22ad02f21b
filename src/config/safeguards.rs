//! `[safeguards]`: rate limits, lock-outs, automatic bans and trusted proxies, checked and turned
//! into the safeguards crate's own types (`crate::guard` builds the node's gate from them).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ledger::SkuId;
use safeguards::blacklist::AutoBanRule;
use safeguards::client_ip::TrustedProxies;
use safeguards::ratelimit::{LimitSettings, LockoutRule, Rate};
use serde::Deserialize;

use super::{invalid, ConfigError, LedgerSection};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafeguardsSection {
    /// Off: every request is admitted (the gate is not even consulted). Only for measuring what
    /// the safeguards cost.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Load balancers whose `X-Forwarded-For` is believed: addresses or CIDR blocks.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Limits for every SKU without its own entry in `sku_limits`.
    #[serde(default)]
    pub limits: LimitsSection,
    /// Per-SKU limits; an entry replaces `limits` for that SKU entirely.
    #[serde(default)]
    pub sku_limits: BTreeMap<SkuId, LimitsSection>,
    /// Ban a user or address fleet-wide after repeated abusive refusals.
    pub auto_ban: Option<AutoBanSection>,
    /// How often nodes check the blacklist for changes.
    #[serde(default = "default_sync_ms")]
    pub blacklist_sync_ms: u64,
    /// Bits of an IPv6 address that name one client: per-address limits, lock-outs and bans
    /// count a whole block of this size as one address (IPv4 addresses count one by one).
    #[serde(default = "default_ipv6_prefix")]
    pub ipv6_prefix: u8,
    /// Submit tokens one client address may be issued per second on a node, whatever users it
    /// names: user ids cost nothing to invent, so without it one address could take a SKU's
    /// whole window of tokens. 0 turns it off.
    #[serde(default = "default_token_rate_per_address")]
    pub token_rate_per_address: f64,
    /// How many of those may come at once.
    #[serde(default = "default_token_burst_per_address")]
    pub token_burst_per_address: u32,
}

impl Default for SafeguardsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            trusted_proxies: Vec::new(),
            limits: LimitsSection::default(),
            sku_limits: BTreeMap::new(),
            auto_ban: None,
            blacklist_sync_ms: default_sync_ms(),
            ipv6_prefix: default_ipv6_prefix(),
            token_rate_per_address: default_token_rate_per_address(),
            token_burst_per_address: default_token_burst_per_address(),
        }
    }
}

/// Generous for a buyer (who holds one token per SKU and asks again only after spending it), a
/// few dozen buyers behind one NAT, or a reload-happy browser; a wall for a script inventing
/// users from one address.
fn default_token_rate_per_address() -> f64 {
    5.0
}

fn default_token_burst_per_address() -> u32 {
    20
}

fn default_ipv6_prefix() -> u8 {
    ::safeguards::client_ip::IPV6_PREFIX_DEFAULT
}

fn yes() -> bool {
    true
}

fn default_sync_ms() -> u64 {
    250
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub per_user: Option<RateEntry>,
    pub per_ip: Option<RateEntry>,
    /// Per user across the whole fleet, on Redis.
    pub fleet_per_user: Option<RateEntry>,
    /// Per client address across the whole fleet, on Redis.
    pub fleet_per_ip: Option<RateEntry>,
    pub lockout: Option<LockoutEntry>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateEntry {
    pub per_s: f64,
    #[serde(default = "one")]
    pub burst: u32,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockoutEntry {
    pub hits: u32,
    pub window_s: u64,
    pub block_s: u64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoBanSection {
    pub rejections: u32,
    pub window_s: u64,
    pub ban_s: u64,
}

/// The section, checked and turned into the safeguards' own types.
#[derive(Debug, Clone)]
pub struct Safeguards {
    pub enabled: bool,
    pub trusted_proxies: TrustedProxies,
    pub defaults: LimitSettings,
    pub per_sku: HashMap<String, LimitSettings>,
    pub auto_ban: Option<AutoBanRule>,
    pub blacklist_sync: Duration,
    pub ipv6_prefix: u8,
    /// Per client address, over all SKUs, on `POST /v1/tokens`; `None`: off.
    pub token_rate_per_address: Option<Rate>,
}

impl SafeguardsSection {
    pub fn validate(&self, ledger: &LedgerSection) -> Result<Safeguards, ConfigError> {
        let trusted_proxies = TrustedProxies::parse(self.trusted_proxies.iter().map(String::as_str))
            .map_err(|e| invalid("safeguards.trusted_proxies", e))?;
        let defaults = self.limits.validate("safeguards.limits", ledger)?;
        let mut per_sku = HashMap::new();
        for (sku, limits) in &self.sku_limits {
            per_sku.insert(sku.to_string(), limits.validate(&format!("safeguards.sku_limits.{sku}"), ledger)?);
        }
        let auto_ban = match self.auto_ban {
            None => None,
            Some(ban) if ban.rejections == 0 || ban.window_s == 0 || ban.ban_s == 0 => {
                return Err(invalid("safeguards.auto_ban", "rejections, window_s and ban_s must be above zero"))
            }
            Some(ban) => Some(AutoBanRule {
                rejections: ban.rejections,
                window: Duration::from_secs(ban.window_s),
                ban: Duration::from_secs(ban.ban_s),
            }),
        };
        if self.blacklist_sync_ms == 0 {
            return Err(invalid("safeguards.blacklist_sync_ms", "must be above zero"));
        }
        if !(32..=128).contains(&self.ipv6_prefix) {
            return Err(invalid(
                "safeguards.ipv6_prefix",
                "must be between 32 and 128 (64 is one subscriber's block at most ISPs)",
            ));
        }
        let token_rate_per_address = self.token_rate_per_address()?;
        Ok(Safeguards {
            enabled: self.enabled,
            trusted_proxies,
            defaults,
            per_sku,
            auto_ban,
            blacklist_sync: Duration::from_millis(self.blacklist_sync_ms),
            ipv6_prefix: self.ipv6_prefix,
            token_rate_per_address,
        })
    }

    fn token_rate_per_address(&self) -> Result<Option<Rate>, ConfigError> {
        let per_s = self.token_rate_per_address;
        if !per_s.is_finite() || per_s < 0.0 {
            return Err(invalid(
                "safeguards.token_rate_per_address",
                "must be a number of tokens per second, 0 or more (0 turns the limit off)",
            ));
        }
        if per_s == 0.0 {
            return Ok(None);
        }
        if self.token_burst_per_address == 0 {
            return Err(invalid("safeguards.token_burst_per_address", "must be at least 1"));
        }
        Ok(Some(Rate { per_s, burst: self.token_burst_per_address }))
    }
}

impl LimitsSection {
    fn validate(&self, at: &str, ledger: &LedgerSection) -> Result<LimitSettings, ConfigError> {
        let rate = |name: &str, entry: Option<RateEntry>| -> Result<Option<Rate>, ConfigError> {
            match entry {
                None => Ok(None),
                Some(RateEntry { per_s, burst }) if per_s.is_finite() && per_s > 0.0 && burst >= 1 => {
                    Ok(Some(Rate { per_s, burst }))
                }
                Some(_) => Err(invalid(format!("{at}.{name}"), "per_s must be a positive number and burst at least 1")),
            }
        };
        let fleet_per_user = rate("fleet_per_user", self.fleet_per_user)?;
        let fleet_per_ip = rate("fleet_per_ip", self.fleet_per_ip)?;
        for (name, limit) in [("fleet_per_user", fleet_per_user), ("fleet_per_ip", fleet_per_ip)] {
            if limit.is_some() && ledger.url == "embedded" {
                return Err(invalid(
                    format!("{at}.{name}"),
                    "a fleet-wide limit lives on Redis: it needs ledger.url = \"redis://…\"",
                ));
            }
        }
        let lockout = match self.lockout {
            None => None,
            Some(l) if l.hits == 0 || l.window_s == 0 || l.block_s == 0 => {
                return Err(invalid(format!("{at}.lockout"), "hits, window_s and block_s must be above zero"))
            }
            Some(l) => Some(LockoutRule {
                hits: l.hits,
                window: Duration::from_secs(l.window_s),
                block: Duration::from_secs(l.block_s),
            }),
        };
        Ok(LimitSettings {
            per_user: rate("per_user", self.per_user)?,
            per_ip: rate("per_ip", self.per_ip)?,
            cluster_per_user: fleet_per_user,
            cluster_per_ip: fleet_per_ip,
            lockout,
        })
    }
}
