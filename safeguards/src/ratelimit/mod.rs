//! Rate limits, checked before a request may touch stock: per user and per client address
//! (GCRA in memory, [`gcra`]), the lock-out rule ([`lockout`]), and a fleet-wide per-user GCRA
//! on Redis ([`cluster`]). Settings are per SKU; a SKU without its own uses the defaults.

pub mod cluster;
pub mod gcra;
pub mod lockout;

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use dashmap::DashMap;

pub use self::cluster::{ClusterLimiter, ClusterVerdict, FleetLimit};
pub use self::gcra::{KeyedGcra, Rate};
pub use self::lockout::{Hit, Lockout, LockoutRule};

/// The limits of one SKU. `None` turns a limit off.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitSettings {
    pub per_user: Option<Rate>,
    pub per_ip: Option<Rate>,
    /// Enforced on Redis across the fleet; the node checks it through [`ClusterLimiter`].
    pub cluster_per_user: Option<Rate>,
    /// The same per client address.
    pub cluster_per_ip: Option<Rate>,
    /// Applied per user and per address.
    pub lockout: Option<LockoutRule>,
}

impl LimitSettings {
    /// Whether any limit is kept in this node's memory (the fleet-wide ones are not).
    fn limits_in_memory(&self) -> bool {
        self.per_user.is_some() || self.per_ip.is_some() || self.lockout.is_some()
    }
}

/// Why a request was refused, for the answer and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    UserRate(Duration),
    IpRate(Duration),
    /// Locked out for `wait`. `newly_user` / `newly_ip`: this very request crossed the line for
    /// the user / the address, so the caller can spread the lock-out over the fleet.
    Lockout {
        wait: Duration,
        newly_user: bool,
        newly_ip: bool,
    },
}

impl Refusal {
    pub fn retry_after(self) -> Duration {
        match self {
            Refusal::UserRate(wait) | Refusal::IpRate(wait) | Refusal::Lockout { wait, .. } => wait,
        }
    }

    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::UserRate(_) => "user_rate",
            Refusal::IpRate(_) => "ip_rate",
            Refusal::Lockout { .. } => "lockout",
        }
    }
}

struct SkuLimiter {
    per_user: Option<KeyedGcra<String>>,
    per_ip: Option<KeyedGcra<IpAddr>>,
    user_lockout: Option<Lockout<String>>,
    ip_lockout: Option<Lockout<IpAddr>>,
}

impl SkuLimiter {
    fn new(settings: &LimitSettings) -> Self {
        Self {
            per_user: settings.per_user.map(KeyedGcra::new),
            per_ip: settings.per_ip.map(KeyedGcra::new),
            user_lockout: settings.lockout.map(Lockout::new),
            ip_lockout: settings.lockout.map(Lockout::new),
        }
    }

    fn is_empty(&self) -> bool {
        self.per_user.is_none() && self.per_ip.is_none() && self.user_lockout.is_none()
    }
}

/// Every SKU's in-memory limiters on one node.
pub struct RateLimiter {
    defaults: LimitSettings,
    overrides: HashMap<String, LimitSettings>,
    /// No SKU has an in-memory limit: `check` returns at once, touching no shared state.
    off: bool,
    /// Built on a SKU's first request, so SKUs created at run time get the defaults.
    limiters: DashMap<String, SkuLimiter>,
}

impl RateLimiter {
    pub fn new(defaults: LimitSettings, overrides: HashMap<String, LimitSettings>) -> Self {
        let off = std::iter::once(&defaults).chain(overrides.values()).all(|s| !s.limits_in_memory());
        Self { defaults, overrides, off, limiters: DashMap::new() }
    }

    /// No SKU has an in-memory limit.
    pub fn is_off(&self) -> bool {
        self.off
    }

    /// The settings that apply to `sku`.
    pub fn settings(&self, sku: &str) -> &LimitSettings {
        self.overrides.get(sku).unwrap_or(&self.defaults)
    }

    /// Counts one request of `user` from `ip` on `sku` against the SKU's limits. The lock-out
    /// tallies count every request, refused or not: that is what "N hits in W" means.
    pub fn check(&self, sku: &str, user: &str, ip: IpAddr, now_ns: u64) -> Result<(), Refusal> {
        if self.off {
            return Ok(());
        }
        let limiter = match self.limiters.get(sku) {
            Some(limiter) => limiter,
            None => {
                self.limiters.entry(sku.to_string()).or_insert_with(|| SkuLimiter::new(self.settings(sku))).downgrade()
            }
        };
        if limiter.is_empty() {
            return Ok(());
        }
        let user_hit = limiter.user_lockout.as_ref().map_or(Hit::Within, |l| l.hit(user, now_ns));
        let ip_hit = limiter.ip_lockout.as_ref().map_or(Hit::Within, |l| l.hit(&ip, now_ns));
        if let Some(wait) = user_hit.locked_for().max(ip_hit.locked_for()) {
            let newly_user = matches!(user_hit, Hit::LockedNow(_));
            let newly_ip = matches!(ip_hit, Hit::LockedNow(_));
            return Err(Refusal::Lockout { wait, newly_user, newly_ip });
        }
        if let Some(gcra) = &limiter.per_user {
            gcra.check(user, now_ns).map_err(Refusal::UserRate)?;
        }
        if let Some(gcra) = &limiter.per_ip {
            gcra.check(&ip, now_ns).map_err(Refusal::IpRate)?;
        }
        Ok(())
    }

    /// Drops idle keys everywhere; returns how many. Run every few seconds.
    pub fn prune(&self, now_ns: u64) -> usize {
        let mut pruned = 0;
        for limiter in self.limiters.iter() {
            pruned += limiter.per_user.as_ref().map_or(0, |g| g.prune(now_ns));
            pruned += limiter.per_ip.as_ref().map_or(0, |g| g.prune(now_ns));
            pruned += limiter.user_lockout.as_ref().map_or(0, |l| l.prune(now_ns));
            pruned += limiter.ip_lockout.as_ref().map_or(0, |l| l.prune(now_ns));
        }
        pruned
    }

    /// Keys held across all limiters (memory watch and tests).
    pub fn keys(&self) -> usize {
        self.limiters
            .iter()
            .map(|l| {
                l.per_user.as_ref().map_or(0, KeyedGcra::keys)
                    + l.per_ip.as_ref().map_or(0, KeyedGcra::keys)
                    + l.user_lockout.as_ref().map_or(0, Lockout::keys)
                    + l.ip_lockout.as_ref().map_or(0, Lockout::keys)
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn user_and_ip_limits_apply_per_sku_with_overrides() {
        let defaults = LimitSettings { per_user: Some(Rate { per_s: 1.0, burst: 2 }), ..LimitSettings::default() };
        let strict = LimitSettings { per_ip: Some(Rate { per_s: 1.0, burst: 1 }), ..LimitSettings::default() };
        let limiter = RateLimiter::new(defaults, HashMap::from([("hot".to_string(), strict)]));
        assert!(limiter.check("a", "u", ip(1), 0).is_ok());
        assert!(limiter.check("a", "u", ip(2), 0).is_ok());
        assert!(matches!(limiter.check("a", "u", ip(3), 0), Err(Refusal::UserRate(_))), "burst 2 per user");
        assert!(limiter.check("b", "u", ip(1), 0).is_ok(), "another SKU has its own buckets");
        assert!(limiter.check("hot", "u1", ip(9), 0).is_ok());
        assert!(matches!(limiter.check("hot", "u2", ip(9), 0), Err(Refusal::IpRate(_))), "hot limits per address only");
        assert!(limiter.check("hot", "u2", ip(8), 0).is_ok());
    }

    #[test]
    fn the_lockout_outlasts_the_rate_limit() {
        let settings = LimitSettings {
            per_user: Some(Rate { per_s: 1000.0, burst: 1000 }),
            lockout: Some(LockoutRule { hits: 5, window: Duration::from_secs(1), block: Duration::from_secs(30) }),
            ..LimitSettings::default()
        };
        let limiter = RateLimiter::new(settings, HashMap::new());
        for at in 0..5 {
            assert!(limiter.check("s", "bot", ip(1), at * MS).is_ok());
        }
        let crossed = limiter.check("s", "bot", ip(1), 5 * MS);
        assert!(
            matches!(crossed, Err(Refusal::Lockout { newly_user: true, newly_ip: true, .. })),
            "the sixth hit locks out the user and the address, once: {crossed:?}"
        );
        let later = limiter.check("s", "bot", ip(2), 10_000 * MS);
        assert!(
            matches!(later, Err(Refusal::Lockout { wait, newly_user: false, .. }) if wait > Duration::from_secs(19)),
            "{later:?}"
        );
    }

    #[test]
    fn idle_keys_are_pruned_so_memory_stays_bounded() {
        let settings = LimitSettings { per_user: Some(Rate { per_s: 10.0, burst: 1 }), ..LimitSettings::default() };
        let limiter = RateLimiter::new(settings, HashMap::new());
        for user in 0..10_000 {
            limiter.check("s", &format!("u{user}"), ip(1), 0).unwrap();
        }
        assert_eq!(limiter.keys(), 10_000);
        assert_eq!(limiter.prune(200 * MS), 10_000, "every key replenished after one interval");
        assert_eq!(limiter.keys(), 0);
    }
}
