//! Blacklisted users and addresses: checked in memory on every request, kept in sync across the
//! fleet through a versioned store ([`store`]: Redis, or in process for the embedded ledger).
//!
//! Entries come from operators (the admin API) and from [`AutoBan`]: a user or address whose
//! requests are refused as abusive K times within a window is banned fleet-wide for a while.
//! A node polls the store's version every `sync` period and reloads the list only when it
//! changed, so a quiet blacklist costs one small read per node per period. Expiry is kept as
//! time remaining, measured on the store's clock, so node clocks never decide who is banned.

pub mod store;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

pub use self::store::{BlacklistStore, MemoryBlacklistStore, RedisBlacklistStore, Snapshot, StoreError};
use crate::ratelimit::{Hit, Lockout, LockoutRule};

/// One blacklisted subject.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entry {
    User(String),
    Ip(IpAddr),
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entry::User(user) => write!(f, "user:{user}"),
            Entry::Ip(ip) => write!(f, "ip:{ip}"),
        }
    }
}

impl FromStr for Entry {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once(':') {
            Some(("user", user)) if !user.is_empty() => Ok(Entry::User(user.to_string())),
            Some(("ip", ip)) => ip.parse().map(Entry::Ip).map_err(|_| format!("{ip:?} is not an address")),
            _ => Err(format!("{text:?} is neither user:<id> nor ip:<address>")),
        }
    }
}

/// `None`: until removed.
type Until = Option<Instant>;

#[derive(Default)]
struct Listed {
    users: HashMap<String, Until>,
    ips: HashMap<IpAddr, Until>,
}

/// The in-memory list one node checks. Addresses are listed and looked up by
/// [`crate::client_ip::subject`]: an IPv6 entry blocks its whole block (a /64 by default).
pub struct Blacklist {
    listed: RwLock<Listed>,
    /// Bits of an IPv6 address that name one client.
    v6_prefix: u8,
    /// Entries in `listed`, readable without the lock: the usual empty list costs every request
    /// one load of a cache line nobody writes, not a lock on one every core writes.
    entries: AtomicUsize,
    /// The store version `listed` was loaded from; 0 before the first load.
    version: AtomicU64,
}

impl Default for Blacklist {
    fn default() -> Self {
        Self::new(crate::client_ip::IPV6_PREFIX_DEFAULT)
    }
}

impl Blacklist {
    pub fn new(v6_prefix: u8) -> Self {
        Self { listed: RwLock::default(), v6_prefix, entries: AtomicUsize::new(0), version: AtomicU64::new(0) }
    }

    fn subject(&self, ip: IpAddr) -> IpAddr {
        crate::client_ip::subject(ip, self.v6_prefix)
    }

    pub fn is_blocked(&self, user: &str, ip: IpAddr) -> bool {
        // Relaxed: a change is seen within a sync period anyway; a few ns later is the same.
        if self.entries.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let listed = self.listed.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let active = |until: &Until| until.is_none_or(|until| until > now);
        listed.users.get(user).is_some_and(active) || listed.ips.get(&self.subject(ip)).is_some_and(active)
    }

    pub fn version(&self) -> u64 {
        // Relaxed: compared with the store's version to decide whether to reload; a stale read
        // costs one extra reload.
        self.version.load(Ordering::Relaxed)
    }

    /// Replaces the list with a snapshot from the store.
    pub fn replace(&self, snapshot: &Snapshot) {
        let now = Instant::now();
        let mut listed = Listed::default();
        for (entry, remaining) in &snapshot.entries {
            let until = remaining.map(|r| now + r);
            match entry {
                Entry::User(user) => listed.users.insert(user.clone(), until),
                Entry::Ip(ip) => listed.ips.insert(self.subject(*ip), until),
            };
        }
        self.entries.store(listed.users.len() + listed.ips.len(), Ordering::Relaxed);
        *self.listed.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = listed;
        self.version.store(snapshot.version, Ordering::Relaxed);
    }

    /// Blocks at once on this node, before the store has it: an automatic ban must stop the
    /// abuser's very next request here, not one sync period later.
    pub fn block_locally(&self, entry: &Entry, ttl: Option<Duration>) {
        let until = ttl.map(|ttl| Instant::now() + ttl);
        let mut listed = self.listed.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        match entry {
            Entry::User(user) => listed.users.insert(user.clone(), until),
            Entry::Ip(ip) => listed.ips.insert(self.subject(*ip), until),
        };
        self.entries.store(listed.users.len() + listed.ips.len(), Ordering::Relaxed);
    }

    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Keeps `blacklist` in step with `store` until the blacklist is dropped.
pub fn spawn_sync(
    blacklist: &Arc<Blacklist>,
    store: Arc<dyn BlacklistStore>,
    period: Duration,
) -> tokio::task::JoinHandle<()> {
    let weak: Weak<Blacklist> = Arc::downgrade(blacklist);
    tokio::spawn(async move {
        loop {
            let Some(blacklist) = weak.upgrade() else { return };
            match store.version().await {
                Ok(version) if version != blacklist.version() => match store.load().await {
                    Ok(snapshot) => {
                        tracing::debug!(
                            version = snapshot.version,
                            entries = snapshot.entries.len(),
                            "blacklist reloaded"
                        );
                        blacklist.replace(&snapshot);
                    }
                    Err(e) => tracing::warn!("blacklist not reloaded: {e}"),
                },
                Ok(_) => {}
                Err(e) => tracing::warn!("blacklist version unreadable: {e}"),
            }
            drop(blacklist);
            tokio::time::sleep(period).await;
        }
    })
}

/// The rule for automatic bans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoBanRule {
    /// Refusals counted as abuse within `window` before a ban.
    pub rejections: u32,
    pub window: Duration,
    pub ban: Duration,
}

/// Counts abusive refusals per user and per address; says when one crosses the line.
pub struct AutoBan {
    rule: AutoBanRule,
    users: Lockout<String>,
    ips: Lockout<IpAddr>,
}

impl AutoBan {
    pub fn new(rule: AutoBanRule) -> Self {
        let as_lockout = LockoutRule { hits: rule.rejections, window: rule.window, block: rule.ban };
        Self { rule, users: Lockout::new(as_lockout), ips: Lockout::new(as_lockout) }
    }

    pub fn ban_for(&self) -> Duration {
        self.rule.ban
    }

    /// Records one abusive refusal; returns the entries that crossed the line with it.
    pub fn rejected(&self, user: &str, ip: IpAddr, now_ns: u64) -> Vec<Entry> {
        let mut banned = Vec::new();
        if let Hit::LockedNow(_) = self.users.hit(user, now_ns) {
            banned.push(Entry::User(user.to_string()));
        }
        if let Hit::LockedNow(_) = self.ips.hit(&ip, now_ns) {
            banned.push(Entry::Ip(ip));
        }
        banned
    }

    pub fn prune(&self, now_ns: u64) -> usize {
        self.users.prune(now_ns) + self.ips.prune(now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_what_they_print() {
        for text in ["user:ann", "ip:10.0.0.1", "ip:::1", "user:a:b"] {
            assert_eq!(text.parse::<Entry>().unwrap().to_string(), text);
        }
        assert!("ann".parse::<Entry>().is_err());
        assert!("ip:nope".parse::<Entry>().is_err());
        assert!("user:".parse::<Entry>().is_err());
    }

    #[test]
    fn snapshots_and_local_blocks_take_effect_and_expire() {
        let blacklist = Blacklist::default();
        let ip = IpAddr::from([10, 0, 0, 1]);
        assert!(!blacklist.is_blocked("ann", ip));
        let snapshot = Snapshot {
            version: 3,
            entries: vec![
                (Entry::User("ann".into()), None),
                (Entry::Ip(IpAddr::from([10, 0, 0, 9])), Some(Duration::ZERO)),
            ],
        };
        blacklist.replace(&snapshot);
        assert_eq!(blacklist.version(), 3);
        assert!(blacklist.is_blocked("ann", ip));
        assert!(!blacklist.is_blocked("bob", IpAddr::from([10, 0, 0, 9])), "an expired entry blocks no one");
        let v6: IpAddr = "2001:db8:7:7::1".parse().unwrap();
        blacklist.block_locally(&Entry::Ip(v6), None);
        assert!(blacklist.is_blocked("anyone", "2001:db8:7:7:dead:beef::9".parse().unwrap()), "its whole /64");
        assert!(!blacklist.is_blocked("anyone", "2001:db8:7:8::1".parse().unwrap()), "not the next one");
        blacklist.block_locally(&Entry::Ip(ip), Some(Duration::from_secs(60)));
        assert!(blacklist.is_blocked("bob", ip));
        assert!(blacklist.is_blocked("bob", "::ffff:10.0.0.1".parse().unwrap()), "IPv4-mapped is the same address");
    }

    #[test]
    fn auto_ban_fires_once_when_refusals_cross_the_line() {
        let ban =
            AutoBan::new(AutoBanRule { rejections: 3, window: Duration::from_secs(10), ban: Duration::from_secs(60) });
        let ip = IpAddr::from([10, 0, 0, 1]);
        for _ in 0..3 {
            assert!(ban.rejected("bot", ip, 0).is_empty());
        }
        assert_eq!(ban.rejected("bot", ip, 1), vec![Entry::User("bot".into()), Entry::Ip(ip)]);
        assert!(ban.rejected("bot", ip, 2).is_empty(), "reported once, not on every later refusal");
    }
}
