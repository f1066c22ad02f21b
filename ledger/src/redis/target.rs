//! What a ledger URL names, parsed: one server (`redis://`), the seed nodes of a Redis Cluster
//! (`redis+cluster://`), or the sentinels watching a master (`redis+sentinel://`). Parsing
//! refuses a URL no connection could use, with a message that names it with its password
//! hidden, so a bad URL is refused when the config is checked.

use ::redis::sentinel::SentinelNodeConnectionInfo;
use ::redis::{IntoConnectionInfo, RedisResult};

use super::redact::{redact_url, scrub};

/// The scheme of a Redis Cluster URL. Not a redis-rs scheme: a cluster is a list of seed nodes,
/// which no single `redis://` URL can name.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// The scheme of a Redis Sentinel URL. Not a redis-rs scheme: redis-rs takes sentinels as a
/// list of `redis://` URLs plus a master name, which no single URL of its own names.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// Where the ledger's Redis is, parsed from
/// [`RedisLedgerConfig::url`](crate::RedisLedgerConfig::url). Its `Debug` hides passwords.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://[user:password@]host:port[/db]` (or any URL redis-rs accepts).
    Single(String),
    /// A Redis Cluster, from `redis+cluster://[user:password@]host:port,host:port,…`.
    Cluster(ClusterSeeds),
    /// A master found through Redis Sentinel, from
    /// `redis+sentinel://[user:password@]host:port,host:port,…/master-name`; the credentials
    /// are the master's.
    Sentinel(SentinelSeeds),
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Single(url) => f.debug_tuple("Single").field(&redact_url(url)).finish(),
            RedisTarget::Cluster(seeds) => f.debug_tuple("Cluster").field(seeds).finish(),
            RedisTarget::Sentinel(seeds) => f.debug_tuple("Sentinel").field(seeds).finish(),
        }
    }
}

/// Seed nodes of a Redis Cluster. Any reachable one is enough to learn the slot map; listing
/// several lets the ledger start while one of them is down. Its `Debug` hides the credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSeeds {
    /// `user:password` (or `:password`) for every node, as written in the URL.
    credentials: Option<String>,
    /// `host:port` of each seed, in the order given.
    pub addrs: Vec<String>,
}

impl std::fmt::Debug for ClusterSeeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSeeds")
            .field("credentials", &self.credentials.as_ref().map(|_| "***"))
            .field("addrs", &self.addrs)
            .finish()
    }
}

impl ClusterSeeds {
    /// A `redis://` URL for the node at `addr`, with the cluster's credentials.
    pub fn node_url(&self, addr: &str) -> String {
        match &self.credentials {
            Some(credentials) => format!("redis://{credentials}@{addr}"),
            None => format!("redis://{addr}"),
        }
    }

    /// The seeds as `redis://` URLs.
    pub fn urls(&self) -> Vec<String> {
        self.addrs.iter().map(|addr| self.node_url(addr)).collect()
    }
}

impl RedisTarget {
    /// Parses a ledger URL. The error says what is wrong, for the config to name with its key.
    pub fn parse(url: &str) -> Result<RedisTarget, String> {
        // Every message names the URL with its password hidden.
        let shown = redact_url(url);
        if let Some(rest) = url.strip_prefix(SENTINEL_SCHEME) {
            return SentinelSeeds::parse(rest, &shown).map(RedisTarget::Sentinel);
        }
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            return match url.into_connection_info() {
                Ok(_) => Ok(RedisTarget::Single(url.to_string())),
                Err(e) => Err(format!("{shown:?} is not a Redis URL: {}", scrub(&e.to_string(), url))),
            };
        };
        // Credentials may hold any character but `@` only percent-encoded, so the last `@`
        // ends them.
        let (credentials, hosts) = match rest.rsplit_once('@') {
            Some((credentials, hosts)) => (Some(credentials.to_string()), hosts),
            None => (None, rest),
        };
        if hosts.contains(['/', '?']) {
            return Err(format!(
                "{shown:?}: a cluster URL lists seed nodes only (host:port,host:port,…); Redis Cluster has no database \
                 number, and options are not supported"
            ));
        }
        let addrs = parse_addrs(hosts, &shown, "seed")?;
        let seeds = ClusterSeeds { credentials, addrs };
        for seed in seeds.urls() {
            seed.as_str().into_connection_info().map_err(|e| {
                format!("{shown:?}: seed {:?} is not usable: {}", redact_url(&seed), scrub(&e.to_string(), url))
            })?;
        }
        Ok(RedisTarget::Cluster(seeds))
    }
}

/// `host:port,host:port,…` as a list; `what` names one entry in messages ("seed").
fn parse_addrs(hosts: &str, shown: &str, what: &str) -> Result<Vec<String>, String> {
    let mut addrs = Vec::new();
    for addr in hosts.split(',') {
        let addr = addr.trim();
        let port = addr.rsplit_once(':').filter(|(host, _)| !host.is_empty()).map(|(_, port)| port.parse::<u16>());
        if !matches!(port, Some(Ok(port)) if port > 0) {
            return Err(format!("{shown:?}: {what} {addr:?} is not host:port"));
        }
        addrs.push(addr.to_string());
    }
    Ok(addrs)
}

/// Sentinels and the name of the master they watch, parsed from a `redis+sentinel://` URL. Its
/// `Debug` hides the credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelSeeds {
    /// `user:password` (or `:password`) for the master and its replicas, as written in the URL.
    credentials: Option<String>,
    /// `host:port` of each sentinel, in the order given.
    pub addrs: Vec<String>,
    /// The name the sentinels know the master by (`sentinel monitor <name> …`).
    pub master_name: String,
}

impl std::fmt::Debug for SentinelSeeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelSeeds")
            .field("credentials", &self.credentials.as_ref().map(|_| "***"))
            .field("addrs", &self.addrs)
            .field("master_name", &self.master_name)
            .finish()
    }
}

impl SentinelSeeds {
    /// Parses what follows [`SENTINEL_SCHEME`]; `shown` is the whole URL, redacted, for messages.
    fn parse(rest: &str, shown: &str) -> Result<SentinelSeeds, String> {
        let Some((authority, master_name)) = rest.rsplit_once('/') else {
            return Err(format!("{shown:?}: a sentinel URL ends with /master-name (host:port,host:port,…/mymaster)"));
        };
        let valid_name = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if master_name.is_empty() || !master_name.chars().all(valid_name) {
            return Err(format!(
                "{shown:?}: the master name after the last / must be letters, digits, '-', '_' or '.' (a database \
                 number and options are not supported)"
            ));
        }
        // Credentials may hold any character but `@` only percent-encoded, so the last `@`
        // ends them.
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((credentials, hosts)) => (Some(credentials.to_string()), hosts),
            None => (None, authority),
        };
        if hosts.contains(['/', '?']) {
            return Err(format!("{shown:?}: a sentinel URL lists sentinels as host:port,host:port,… only"));
        }
        let addrs = parse_addrs(hosts, shown, "sentinel")?;
        let seeds = SentinelSeeds { credentials, addrs, master_name: master_name.to_string() };
        for url in seeds.sentinel_urls() {
            url.as_str()
                .into_connection_info()
                .map_err(|e| format!("{shown:?}: sentinel {url:?} is not usable: {e}"))?;
        }
        seeds.master_info().map_err(|e| {
            format!("{shown:?}: the credentials are not usable: {}", scrub(&e.to_string(), &seeds.master_url("h:1")))
        })?;
        Ok(seeds)
    }

    /// Whether the URL carries credentials for the master.
    pub fn has_credentials(&self) -> bool {
        self.credentials.is_some()
    }

    /// The sentinels as `redis://` URLs, without credentials (see the module docs).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.addrs.iter().map(|addr| format!("redis://{addr}")).collect()
    }

    /// A `redis://` URL for the data node at `addr` (a master or replica the sentinels name),
    /// with the URL's credentials.
    pub fn master_url(&self, addr: &str) -> String {
        match &self.credentials {
            Some(credentials) => format!("redis://{credentials}@{addr}"),
            None => format!("redis://{addr}"),
        }
    }

    /// How to log in to the master: the URL's credentials, parsed as redis-rs parses them in a
    /// `redis://` URL (percent-decoding included).
    pub fn master_info(&self) -> RedisResult<SentinelNodeConnectionInfo> {
        let info = self.master_url("localhost:1").as_str().into_connection_info()?;
        Ok(SentinelNodeConnectionInfo::default().set_redis_connection_info(info.redis_settings().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_urls_name_one_server_or_a_cluster() {
        assert_eq!(RedisTarget::parse("redis://h:1/2"), Ok(RedisTarget::Single("redis://h:1/2".into())));
        let Ok(RedisTarget::Cluster(seeds)) = RedisTarget::parse("redis+cluster://u:p@a:1,b:2") else {
            panic!("a cluster URL");
        };
        assert_eq!(seeds.urls(), ["redis://u:p@a:1", "redis://u:p@b:2"]);
        for bad in
            ["redis+cluster://a:1/0", "redis+cluster://a:1?x=1", "redis+cluster://a:0", "redis+cluster://:1", "ftp://x"]
        {
            assert!(RedisTarget::parse(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn sentinel_urls_name_sentinels_and_a_master() {
        let seeds = SentinelSeeds::parse("u:p@a:1,b:2/mymaster", "shown").unwrap();
        assert_eq!(seeds.sentinel_urls(), ["redis://a:1", "redis://b:2"]);
        assert_eq!(seeds.master_name, "mymaster");
        assert_eq!(seeds.master_url("m:3"), "redis://u:p@m:3");
        for bad in ["a:1", "a:1/", "a:1/my master", "a:1/m?x=1", "a:1,b/m", "a:0/m", ":1/m", "a:1/m/0"] {
            assert!(SentinelSeeds::parse(bad, "shown").is_err(), "{bad} must be refused");
        }
    }
}
