//! The ledger on Redis: the Lua scripts in `lua/` do every write, so each operation is one
//! atomic step on the server, and Redis persistence (AOF) is what makes sales durable.
//!
//! Key layout, for SKU `s` under prefix `p` (the `{s}` hash tag keeps a SKU in one cluster slot):
//! - `p:{s}:meta`     hash: total, sold, remaining, per_user_limit, order_seq, closed (once
//!   closed)
//! - `p:{s}:by_user`  hash: user → units bought (at most one field per buyer, so ≤ total fields)
//! - `p:{s}:by_epoch` hash: `node#epoch` → units sold by that node in that epoch (per-node
//!   totals are its sums: one write per confirmed batch instead of two)
//! - `p:{s}:orders`   stream of order events; entry ids are `0-<seq>`, so a reader resumes
//!   from the last sequence number it saw
//! - `p:{s}:key:<k>`  the stored decision for idempotency key k, with a TTL
//! - `p:{s}:token:<t>` the user submit token t was issued to, with the token's TTL; deleted by
//!   the purchase of that user that presents it (`confirm.lua`)
//! - `p:{s}:token_holder:<u>` the token user u holds, with the token's TTL: asked again,
//!   `token.lua` returns it; deleted with the token it names
//! - `p:{s}:tokens:<w>` tokens issued in window w (one token TTL long), expiring after two
//!   windows: the count `token.lua` caps, so tokens take bounded memory
//! - `p:{s}:fence`    a counter written before each `WAIT` under `durability = "replica"`, so
//!   the wait covers what a read or a replay saw (see [`RedisLedger::fenced`])
//!
//! **Redis Cluster.** A `redis+cluster://host:port,host:port,…` URL names seed nodes of a
//! cluster; the client learns the slot map from them, sends each call to the master that owns
//! the slot of its first key and follows MOVED/ASK. Every key one call touches carries the same
//! `{s}` tag, so every script, pipeline and XRANGE runs on one node and never meets CROSSSLOT.
//! Replicas are not read from: a stale read of `meta` would be harmless for display, but the
//! order stream feeds replays, and one code path for reads is simpler to reason about.
//!
//! With replicas and [`Durability::Replica`], `WAIT` is per shard: redis-rs (1.8) routes a
//! pipeline as a whole, by its first command that names a key, so the script and the keyless
//! `WAIT` after it go to the master of the SKU's slot, in one write on that node's one
//! multiplexed connection (alone, `WAIT` would be fanned out to every master); a MOVED or ASK
//! in any reply sends the whole pipeline again to the new owner, so they stay together across
//! a failover. `WAIT` counts that master's replicas only: a stalled replica refuses its shard's
//! writes and no other's (`tests/cluster/redis_cluster_replicas.rs`).
//!
//! **Redis Sentinel.** A `redis+sentinel://host:port,…/master-name` URL names sentinels; the
//! ledger asks them for the master and follows it across a failover (`crate::sentinel`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::{ClusterClientBuilder, ClusterConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{
    AsyncCommands, Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Script,
    ScriptInvocation, ServerErrorKind, Value,
};

use crate::durability::{fsync_mismatch, FSYNC_SETTINGS};
use crate::sentinel::{SentinelConnection, SentinelSeeds, SENTINEL_SCHEME};
use crate::types::stored;
use crate::*;

static CONFIRM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/confirm.lua")));
static CREATE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/create.lua")));
static RESTOCK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/restock.lua")));
static CLOSE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/close.lua")));
static END_EPOCH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/end_epoch.lua")));
static TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/token.lua")));
static PRICING: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/pricing.lua")));

/// How to reach Redis and how long to wait for it.
#[derive(Clone)]
pub struct RedisLedgerConfig {
    /// `redis://host:port[/db]` for one server, `redis+cluster://host:port,host:port,…` for
    /// the seed nodes of a Redis Cluster, or `redis+sentinel://host:port,…/master-name` for
    /// the sentinels watching a master (see [`RedisTarget`]).
    pub url: String,
    /// Multiplexed connections to spread calls over; one connection already pipelines, more
    /// help only when a single socket's read loop becomes the bottleneck. On a cluster each
    /// one is a cluster client holding one multiplexed socket per master.
    pub connections: usize,
    /// Upper bound on one call, reconnect included. A sale whose confirmation outlives it is
    /// answered 503 and decided by the client's retry, so keep it well under client timeouts.
    pub call_timeout: Duration,
    /// Upper bound on opening a connection.
    pub connect_timeout: Duration,
    /// How long a stored decision answers retries.
    pub idempotency_ttl: Duration,
    /// How long a sale's record is kept, against which its release is checked (see
    /// [`crate::SALE_RECORD_TTL_DEFAULT`]).
    pub sale_record_ttl: Duration,
    /// First part of every key, so several sales can share one Redis.
    pub key_prefix: String,
    /// Submit tokens one SKU issues per window of one token TTL (see
    /// [`crate::TOKEN_ISSUE_MAX_DEFAULT`], which says what memory this bounds).
    pub token_issue_max: u64,
    /// What a decision has survived when the ledger answers it ([`Durability`]). `Fsync` is
    /// checked by [`RedisLedger::check_durability`]; `Replica` waits after every write script.
    pub durability: Durability,
}

impl RedisLedgerConfig {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            connections: 2,
            call_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(500),
            idempotency_ttl: IDEMPOTENCY_TTL_DEFAULT,
            sale_record_ttl: crate::SALE_RECORD_TTL_DEFAULT,
            key_prefix: "seckill".into(),
            token_issue_max: crate::TOKEN_ISSUE_MAX_DEFAULT,
            durability: Durability::None,
        }
    }
}

/// The scheme of a Redis Cluster URL. Not a redis-rs scheme: a cluster is a list of seed nodes,
/// which no single `redis://` URL can name.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// How many times the cluster client retries one call after a redirect (MOVED/ASK), a busy
/// slot (TRYAGAIN) or a dropped socket. One redirect plus one reconnect fits; the call's own
/// deadline (`call_timeout`) bounds the total anyway.
const CLUSTER_RETRIES_MAX: u32 = 3;

/// Shortest and longest pause before a cluster retry, in milliseconds. redis-rs defaults to
/// 1.28 s at least, longer than a whole call may take; these match the single-server
/// reconnect delays.
const CLUSTER_RETRY_WAIT_MIN_MS: u64 = 10;
const CLUSTER_RETRY_WAIT_MAX_MS: u64 = 100;

/// The URL's password replaced by `***`, for every message and log line that names a Redis:
/// `redis://user:secret@host:1/0` → `redis://user:***@host:1/0`, `redis://:secret@h:1` →
/// `redis://:***@h:1`, a lone `redis://secret@h:1` → `redis://***@h:1`. Text that is not a URL
/// comes back as is; a cluster URL's one credential part is redacted the same way.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((credentials, hosts)) = authority.rsplit_once('@') else { return url.to_string() };
    let hidden = match credentials.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{scheme}://{hidden}@{hosts}{tail}")
}

/// `message` with the URL's credentials, wherever they appear, replaced by `***`: for errors of
/// other libraries, which may quote what they were given.
pub(crate) fn scrub(message: &str, url: &str) -> String {
    let credentials = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next()?.rsplit_once('@'))
        .map(|(credentials, _)| credentials);
    let mut scrubbed = message.to_string();
    for secret in credentials.into_iter().flat_map(|c| [c, c.split_once(':').map_or(c, |(_, pw)| pw)]) {
        if !secret.is_empty() {
            scrubbed = scrubbed.replace(secret, "***");
        }
    }
    scrubbed
}

impl std::fmt::Debug for RedisLedgerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedgerConfig")
            .field("url", &redact_url(&self.url))
            .field("connections", &self.connections)
            .field("call_timeout", &self.call_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("idempotency_ttl", &self.idempotency_ttl)
            .field("sale_record_ttl", &self.sale_record_ttl)
            .field("key_prefix", &self.key_prefix)
            .field("token_issue_max", &self.token_issue_max)
            .field("durability", &self.durability)
            .finish()
    }
}

/// Where the ledger's Redis is, parsed from [`RedisLedgerConfig::url`]. Its `Debug` hides
/// passwords.
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
pub(crate) fn parse_addrs(hosts: &str, shown: &str, what: &str) -> Result<Vec<String>, String> {
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

/// One handle on Redis. Every kind multiplex concurrent calls over their sockets and reconnect
/// on their own; cloning shares the sockets.
#[derive(Clone)]
pub enum RedisConnection {
    Single(ConnectionManager),
    /// Routes each command to the master owning its first key's slot, follows MOVED/ASK, and
    /// refreshes the slot map when the cluster changes.
    Cluster(ClusterConnection),
    /// The master the sentinels name, found again after a failover.
    Sentinel(SentinelConnection),
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(con) => con.req_packed_command(cmd),
            RedisConnection::Cluster(con) => con.req_packed_command(cmd),
            RedisConnection::Sentinel(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(con) => con.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
            RedisConnection::Sentinel(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(con) => con.get_db(),
            RedisConnection::Cluster(con) => con.get_db(),
            RedisConnection::Sentinel(con) => con.get_db(),
        }
    }
}

/// The Redis ledger. Cheap to share: connections are multiplexed and reconnect on their own.
pub struct RedisLedger {
    connections: Vec<RedisConnection>,
    next_connection: AtomicUsize,
    config: RedisLedgerConfig,
}

pub(crate) struct SkuKeys {
    pub(crate) meta: String,
    pub(crate) by_user: String,
    pub(crate) by_epoch: String,
    pub(crate) orders: String,
    pub(crate) record_prefix: String,
    pub(crate) releases: String,
    /// Followed by a window number: the hash of that window's sale records (confirm.lua).
    pub(crate) sales_prefix: String,
    /// Followed by a token to name its key. Bare, it names the key a purchase without a token
    /// passes: tokens are never empty, so it never exists, and it keeps the batch in the slot.
    pub(crate) token_prefix: String,
    /// Followed by a user id to name the key of the token that user holds.
    pub(crate) holder_prefix: String,
    /// Written before every `WAIT` under [`Durability::Replica`] (see [`RedisLedger::fenced`]):
    /// a counter with no other meaning.
    pub(crate) fence: String,
}

impl SkuKeys {
    /// The sales hash of the window holding `at_ms` (see [`crate::SALE_WINDOW`]).
    pub(crate) fn sales_window(&self, at_ms: u64) -> String {
        self.sales_window_numbered(at_ms / sale_window_ms())
    }

    fn sales_window_numbered(&self, window: u64) -> String {
        format!("{}{window}", self.sales_prefix)
    }

    /// The sales hashes a release of a sale made at `at_ms` looks in: its window and both
    /// neighbours, so a seller's clock off by less than a window still finds the record.
    pub(crate) fn sales_windows_around(&self, at_ms: u64) -> [String; 3] {
        let window = at_ms / sale_window_ms();
        [window.saturating_sub(1), window, window.saturating_add(1)].map(|w| self.sales_window_numbered(w))
    }
}

fn sale_window_ms() -> u64 {
    u64::try_from(crate::SALE_WINDOW.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisLedger {
    /// Connects lazily: the ledger can be built while Redis is still starting, and calls fail
    /// with [`LedgerError::Unavailable`] until it answers. A cluster client that could not reach
    /// any seed at first tries the seeds again on the next call.
    pub fn connect(config: RedisLedgerConfig) -> Result<Self, LedgerError> {
        let connections = RedisConnection::open_many(&config, config.connections.max(1))?;
        Ok(Self { connections, next_connection: AtomicUsize::new(0), config })
    }
}

impl RedisConnection {
    /// One handle on the Redis (or Redis Cluster) at `config.url`, with the ledger's timeouts,
    /// for other users of the same Redis (the node's rate limits and blacklist). Connects lazily.
    pub fn open(config: &RedisLedgerConfig) -> Result<Self, LedgerError> {
        let mut one = Self::open_many(config, 1)?;
        one.pop().ok_or_else(|| LedgerError::Unavailable("no connection".into()))
    }

    fn open_many(config: &RedisLedgerConfig, count: usize) -> Result<Vec<Self>, LedgerError> {
        let bad_url = |e: String| LedgerError::Unavailable(format!("bad Redis URL: {e}"));
        match RedisTarget::parse(&config.url).map_err(bad_url)? {
            RedisTarget::Single(url) => Self::single(&url, config, count),
            RedisTarget::Cluster(seeds) => Self::cluster(&seeds, config, count),
            RedisTarget::Sentinel(seeds) => (0..count)
                .map(|_| {
                    SentinelConnection::new(&seeds, config.connect_timeout, config.call_timeout)
                        .map(RedisConnection::Sentinel)
                        .map_err(|e| LedgerError::Unavailable(scrub(&e.to_string(), &config.url)))
                })
                .collect(),
        }
    }

    fn single(url: &str, config: &RedisLedgerConfig, count: usize) -> Result<Vec<RedisConnection>, LedgerError> {
        let client = ::redis::Client::open(url).map_err(|e| unavailable(&e))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.call_timeout))
            // Reconnect attempts happen inside a call; one quick retry keeps a call within its
            // timeout, and the next call tries again anyway.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        (0..count)
            .map(|_| {
                ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
                    .map(RedisConnection::Single)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| unavailable(&e))
    }

    fn cluster(
        seeds: &ClusterSeeds,
        config: &RedisLedgerConfig,
        count: usize,
    ) -> Result<Vec<RedisConnection>, LedgerError> {
        let client = ClusterClientBuilder::new(seeds.urls())
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.call_timeout)
            // Redirects and retries included, a call ends within the same deadline as on one
            // server.
            .overall_response_timeout(Some(config.call_timeout))
            .retries(CLUSTER_RETRIES_MAX)
            .min_retry_wait(CLUSTER_RETRY_WAIT_MIN_MS)
            .max_retry_wait(CLUSTER_RETRY_WAIT_MAX_MS)
            .build()
            .map_err(|e| unavailable(&e))?;
        // The per-connection config replaces the builder's timeouts, so it repeats them.
        let connection_config = ClusterConfig::new()
            .set_connection_timeout(config.connect_timeout)
            .set_response_timeout(config.call_timeout);
        // "Pending": the connection is made in the background, so building the ledger never
        // waits for (or fails on) a cluster that is still starting.
        Ok((0..count)
            .map(|_| {
                RedisConnection::Cluster(client.get_pending_async_connection_with_config(connection_config.clone()))
            })
            .collect())
    }
}

impl RedisLedger {
    pub(crate) fn connection(&self) -> RedisConnection {
        // Relaxed: the counter only spreads load; no other memory depends on its value.
        let at = self.next_connection.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        self.connections[at].clone()
    }

    pub(crate) fn keys(&self, sku: &SkuId) -> SkuKeys {
        let base = format!("{}:{{{sku}}}", self.config.key_prefix);
        SkuKeys {
            meta: format!("{base}:meta"),
            by_user: format!("{base}:by_user"),
            by_epoch: format!("{base}:by_epoch"),
            orders: format!("{base}:orders"),
            record_prefix: format!("{base}:key:"),
            releases: format!("{base}:releases"),
            sales_prefix: format!("{base}:sales:"),
            token_prefix: format!("{base}:token:"),
            holder_prefix: format!("{base}:token_holder:"),
            fence: format!("{base}:fence"),
        }
    }

    /// Runs one write script. Under [`Durability::Replica`] it goes out [`fenced`](Self::fenced),
    /// so the answer waits for the replicas; the deadline covers script and wait together.
    pub(crate) async fn write<T: FromRedisValue>(
        &self,
        sku: &SkuId,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LedgerError> {
        let mut con = self.connection();
        let Durability::Replica { replicas, timeout } = self.config.durability else {
            return self.call(Some(sku), invocation.invoke_async(&mut con)).await;
        };
        let mut script = ::redis::pipe();
        script.invoke_script(invocation);
        let (mut replies, mut replicated) = self.fenced(sku, &mut con, &script, replicas, timeout).await?;
        if matches!(replies.first(), Some(Value::ServerError(e)) if e.kind() == Some(ServerErrorKind::NoScript)) {
            // First use of the script on this server (or after SCRIPT FLUSH / a restart): load
            // it, then run the pipeline again. Nothing was written by the refused EVALSHA.
            let _sha: String = self.call(Some(sku), invocation.load_async(&mut con)).await?;
            (replies, replicated) = self.fenced(sku, &mut con, &script, replicas, timeout).await?;
        }
        let value = only_reply(replies, sku)?;
        replicated?;
        Ok(value)
    }

    /// Runs one read whose answer somebody acts on (order events a node replays from, entries
    /// the order consumer turns into orders). Under [`Durability::Replica`] it goes out
    /// [`fenced`](Self::fenced): what the master has and the replicas lack may still be undone by
    /// a failover, so it is not handed out until they have it.
    pub(crate) async fn read<T: FromRedisValue>(&self, sku: &SkuId, command: &Cmd) -> Result<T, LedgerError> {
        let mut con = self.connection();
        let Durability::Replica { replicas, timeout } = self.config.durability else {
            return self.call(Some(sku), command.query_async(&mut con)).await;
        };
        let mut read = ::redis::pipe();
        read.add_command(command.clone());
        let (replies, replicated) = self.fenced(sku, &mut con, &read, replicas, timeout).await?;
        let value = only_reply(replies, sku)?;
        replicated?;
        Ok(value)
    }

    /// Sends `commands`, then a write to the SKU's fence key, then `WAIT replicas timeout`, in
    /// one pipeline: one buffer on one socket, so Redis runs them back to back for one client,
    /// on the master of the SKU's slot on a cluster (see the module docs). Returns the
    /// commands' replies (errors kept, for the caller to tell apart) and whether enough
    /// replicas acknowledged.
    ///
    /// Why the fence: `WAIT` waits for the replication offset of the client's last command (on
    /// Redis 7.0, any command; where only a client's own writes set it, the last write that
    /// propagated). A script that only replays a stored decision writes nothing, and a read
    /// writes nothing, yet both hand out what another client wrote, which the replicas may lack.
    /// The fence is a write after them, so whichever rule the server follows, `WAIT` covers
    /// everything they saw. It also meets `min-replicas-to-write`: a master left without
    /// replicas refuses it, and so the read.
    async fn fenced(
        &self,
        sku: &SkuId,
        con: &mut RedisConnection,
        commands: &Pipeline,
        replicas: u32,
        timeout: Duration,
    ) -> Result<(Vec<Value>, Result<(), LedgerError>), LedgerError> {
        let mut pipe = commands.clone();
        pipe.ignore_errors().cmd("INCR").arg(self.keys(sku).fence);
        pipe.cmd("WAIT").arg(replicas).arg(timeout.as_millis() as u64);
        let mut replies: Vec<Value> = self.call(Some(sku), pipe.query_async(con)).await?;
        let (Some(acked), Some(fence)) = (replies.pop(), replies.pop()) else {
            return Err(LedgerError::Corrupt("a fenced pipeline returned too few replies".into()));
        };
        let replicated = match (fence, acked) {
            (Value::ServerError(e), _) => Err(LedgerError::Unavailable(format!("the replication fence failed: {e:?}"))),
            (_, Value::ServerError(e)) => Err(LedgerError::Unavailable(format!("WAIT failed: {e:?}"))),
            (Value::Int(_), Value::Int(acked)) => {
                let acked = u64::try_from(acked).unwrap_or(0);
                if acked < u64::from(replicas) {
                    Err(LedgerError::NotReplicated { acked, wanted: u64::from(replicas) })
                } else {
                    Ok(())
                }
            }
            (fence, acked) => Err(LedgerError::Corrupt(format!("the fence answered {fence:?}, WAIT {acked:?}"))),
        };
        Ok((replies, replicated))
    }

    /// How long a read may block on the server: the call deadline less what a fenced read's
    /// `WAIT` may take after it, halved so the answer has time to come back.
    pub(crate) fn block_max(&self) -> Duration {
        let wait = match self.config.durability {
            Durability::Replica { timeout, .. } => timeout,
            _ => Duration::ZERO,
        };
        self.config.call_timeout.saturating_sub(wait) / 2
    }

    /// [`SalesLedger::confirm`] with `script` in place of `lua/confirm.lua`: for measurements that
    /// compare the script with another version of it (`examples/confirm_cost.rs`) under the
    /// same keys and arguments. Not for production use.
    #[doc(hidden)]
    pub async fn confirm_by(
        &self,
        script: &Script,
        sku: &SkuId,
        seller: &Seller,
        purchases: &[Purchase],
    ) -> Result<BatchOutcome, LedgerError> {
        assert!(purchases.len() <= BATCH_MAX, "confirm takes at most BATCH_MAX purchases");
        let keys = self.keys(sku);
        let mut invocation = script.key(&keys.meta);
        invocation.key(&keys.by_epoch).key(&keys.by_user).key(&keys.orders);
        invocation.key(keys.sales_window(crate::unix_ms()));
        invocation.arg(sku.as_str()).arg(seller.node.as_str()).arg(self.config.idempotency_ttl.as_secs().max(1));
        invocation.arg(seller.epoch_key()).arg(seller.epoch);
        invocation.arg(u64::try_from(self.config.sale_record_ttl.as_millis()).unwrap_or(u64::MAX).max(1));
        for purchase in purchases {
            invocation.key(format!("{}{}", keys.record_prefix, purchase.key));
            let token = purchase.token.as_ref().map_or("", SubmitToken::as_str);
            invocation.key(format!("{}{token}", keys.token_prefix));
            invocation.key(format!("{}{}", keys.holder_prefix, purchase.user));
            invocation.arg(purchase.key.as_str()).arg(purchase.user.as_str()).arg(purchase.qty);
            invocation.arg(purchase.order_id.as_ref().map_or("", |id| id.0.as_str()));
        }
        let reply: Vec<String> = self.write(sku, &invocation).await?;
        if reply.len() != purchases.len() * 2 + 3 {
            return Err(LedgerError::Corrupt(format!(
                "confirm returned {} fields for {} purchases",
                reply.len(),
                purchases.len()
            )));
        }
        let verdicts = reply[..purchases.len() * 2]
            .chunks(2)
            .map(|pair| match pair[0].as_str() {
                "fresh" => parse_decision(&pair[1]).map(Verdict::Fresh),
                "replayed" => parse_decision(&pair[1]).map(Verdict::Replayed),
                "key_reused" => Ok(Verdict::KeyReused),
                other => Err(LedgerError::Corrupt(format!("unknown verdict {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sold = parse_count(reply.get(purchases.len() * 2), "sold")?;
        let remaining = parse_count(reply.get(purchases.len() * 2 + 1), "remaining")?;
        let released = parse_count(reply.get(purchases.len() * 2 + 2), "released")?;
        Ok(BatchOutcome { verdicts, sold, remaining, released })
    }

    /// Refuses to run when the server does not keep what `durability` promises: under
    /// [`Durability::Fsync`], every master must answer `CONFIG GET` with `appendonly yes` and
    /// `appendfsync always`. The error names the setting that is wrong, or says that `CONFIG`
    /// was refused (renamed, or denied to the ledger's user); an unreachable Redis is
    /// [`LedgerError::Unavailable`]. `None` and `Replica` need no check (a `Replica` shortfall
    /// shows on every write).
    pub async fn check_durability(&self) -> Result<(), LedgerError> {
        if self.config.durability != Durability::Fsync {
            return Ok(());
        }
        let shown = redact_url(&self.config.url);
        match self.connection() {
            RedisConnection::Single(mut con) => check_fsync(&shown, &mut con, &self.config).await,
            // The master of the moment; a replica promoted later is not checked, so run every
            // data node behind the sentinels with the same settings.
            RedisConnection::Sentinel(mut con) => check_fsync(&shown, &mut con, &self.config).await,
            RedisConnection::Cluster(mut con) => {
                let slots: Value = self.call(None, ::redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut con)).await?;
                let masters = slot_masters(&slots).map_err(LedgerError::Unavailable)?;
                for (host, port) in masters {
                    let mut node = MasterAt { con: con.clone(), host: host.clone(), port };
                    check_fsync(&format!("{host}:{port}"), &mut node, &self.config).await?;
                }
                Ok(())
            }
        }
    }

    /// Runs one Redis call under the configured deadline and maps its failure.
    pub(crate) async fn call<T>(
        &self,
        sku: Option<&SkuId>,
        fut: impl std::future::Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, LedgerError> {
        match tokio::time::timeout(self.config.call_timeout, fut).await {
            Err(_) => Err(LedgerError::Unavailable(format!("no answer within {:?}", self.config.call_timeout))),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(&e, sku)),
        }
    }
}

/// Reads the `FSYNC_SETTINGS` of one server with `CONFIG GET` and refuses a mismatch.
async fn check_fsync(
    server: &str,
    con: &mut impl ConnectionLike,
    config: &RedisLedgerConfig,
) -> Result<(), LedgerError> {
    let mut pairs = Vec::new();
    for (name, _) in FSYNC_SETTINGS {
        let read = tokio::time::timeout(
            config.call_timeout,
            ::redis::cmd("CONFIG").arg("GET").arg(name).query_async::<Vec<(String, String)>>(con),
        )
        .await;
        match read {
            Err(_) => {
                return Err(LedgerError::Unavailable(format!(
                    "durability = \"fsync\": Redis {server} did not answer CONFIG GET {name} within {:?}",
                    config.call_timeout
                )))
            }
            Ok(Ok(answer)) => pairs.extend(answer),
            Ok(Err(e))
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() =>
            {
                return Err(LedgerError::Unavailable(format!(
                    "durability = \"fsync\": cannot read Redis {server}'s settings: {e}"
                )))
            }
            Ok(Err(e)) => {
                return Err(LedgerError::Misconfigured(format!(
                    "durability = \"fsync\" must read Redis {server}'s `{name}` with CONFIG GET, and Redis refused: \
                     {e}. Is CONFIG renamed (rename-command) or denied to the ledger's user? Allow it, or choose \
                     another durability"
                )))
            }
        }
    }
    match fsync_mismatch(server, &pairs) {
        Some(reason) => Err(LedgerError::Misconfigured(reason)),
        None => Ok(()),
    }
}

/// A cluster connection that sends every command to one master, by address: `CONFIG GET`
/// has no key to route by.
struct MasterAt {
    con: ClusterConnection,
    host: String,
    port: u16,
}

impl ConnectionLike for MasterAt {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let route =
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host: self.host.clone(), port: self.port });
        Box::pin(async move { self.con.route_command(cmd.clone(), route).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async { Err(RedisError::from((ErrorKind::Client, "pipelines are not routed by address here"))) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// PINGs, by address, every master that `CLUSTER SLOTS` names. A plain PING is no check: the
/// client fans it out only to masters it holds a live connection to, so with one master down
/// it still succeeds.
async fn ping_every_master(con: &mut ClusterConnection) -> ::redis::RedisResult<()> {
    let slots: Value = ::redis::cmd("CLUSTER").arg("SLOTS").query_async(con).await?;
    let masters =
        slot_masters(&slots).map_err(|reason| RedisError::from((ErrorKind::Client, "CLUSTER SLOTS", reason)))?;
    for (host, port) in masters {
        let ping = ::redis::cmd("PING");
        con.route_command(ping, RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port })).await?;
    }
    Ok(())
}

/// The master (`host`, `port`) of every slot range in a `CLUSTER SLOTS` reply: ranges of
/// `[first, last, [host, port, id, …], replicas…]`.
fn slot_masters(slots: &Value) -> Result<BTreeSet<(String, u16)>, String> {
    let Value::Array(ranges) = slots else { return Err(format!("not an array: {slots:?}")) };
    let mut masters = BTreeSet::new();
    for range in ranges {
        let master = match range {
            Value::Array(range) => range.get(2),
            _ => None,
        };
        let Some(Value::Array(master)) = master else { return Err(format!("a range without a master: {range:?}")) };
        let (host, port) = match (master.first(), master.get(1)) {
            (Some(Value::BulkString(host)), Some(Value::Int(port))) => (String::from_utf8_lossy(host), port),
            _ => return Err(format!("a master without host and port: {master:?}")),
        };
        // An empty host means "the node you asked", and `?` an unknown one: neither can be
        // pinged by address. Redis announces the node's IP unless configured otherwise.
        if host.is_empty() || host == "?" {
            return Err(format!("a master announces no address: {master:?}"));
        }
        let port = u16::try_from(*port).map_err(|_| format!("a master with port {port}"))?;
        masters.insert((host.into_owned(), port));
    }
    if masters.is_empty() {
        return Err("no slot has a master".into());
    }
    Ok(masters)
}

/// The one reply of a one-command pipeline, read as `T`; a server error is classified.
fn only_reply<T: FromRedisValue>(replies: Vec<Value>, sku: &SkuId) -> Result<T, LedgerError> {
    let [reply] = <[Value; 1]>::try_from(replies)
        .map_err(|replies| LedgerError::Corrupt(format!("one command returned {} replies", replies.len())))?;
    match reply {
        Value::ServerError(e) => Err(classify(&RedisError::from(e), Some(sku))),
        value => T::from_redis_value(value).map_err(|e| LedgerError::Corrupt(format!("unreadable reply: {e}"))),
    }
}

fn unavailable(e: &RedisError) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

/// Script errors carry our own codes; anything else is a transport or server fault that the
/// caller treats as "outcome unknown, retry".
fn classify(e: &RedisError, sku: Option<&SkuId>) -> LedgerError {
    let text = e.to_string();
    match sku {
        Some(sku) if text.contains("SECKILL_MISSING") => LedgerError::Missing(sku.clone()),
        _ if text.contains("SECKILL_CORRUPT") => LedgerError::Corrupt(text),
        _ if text.contains("SECKILL_EPOCH_ENDED") => LedgerError::EpochEnded(text),
        _ => unavailable(e),
    }
}

fn parse_decision(text: &str) -> Result<Decision, LedgerError> {
    stored::decode(text).ok_or_else(|| LedgerError::Corrupt(format!("unreadable stored decision {text:?}")))
}

fn parse_count(text: Option<&String>, what: &str) -> Result<u64, LedgerError> {
    text.and_then(|t| t.parse().ok()).ok_or_else(|| LedgerError::Corrupt(format!("unreadable {what}")))
}

#[async_trait::async_trait]
impl LedgerReads for RedisLedger {
    async fn status(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let (meta, by_epoch): (BTreeMap<String, String>, BTreeMap<String, u64>) = self
            .call(Some(sku), ::redis::pipe().hgetall(&keys.meta).hgetall(&keys.by_epoch).query_async(&mut con))
            .await?;
        if meta.is_empty() {
            return Err(LedgerError::Missing(sku.clone()));
        }
        let field = |name: &str| parse_count(meta.get(name), name);
        let mut sold_by_node: BTreeMap<NodeId, u64> = BTreeMap::new();
        for (seller, sold) in by_epoch {
            let node = seller.rsplit_once('#').map_or(seller.as_str(), |(node, _)| node);
            let node = NodeId::new(node).map_err(|_| LedgerError::Corrupt(format!("bad seller {seller:?}")))?;
            *sold_by_node.entry(node).or_insert(0) += sold;
        }
        let status = SkuStatus {
            total: field("total")?,
            sold: field("sold")?,
            remaining: field("remaining")?,
            per_user_limit: u32::try_from(field("per_user_limit")?)
                .map_err(|_| LedgerError::Corrupt("per_user_limit".into()))?,
            sold_by_node,
            closed: meta.get("closed").is_some_and(|closed| closed == "1"),
            require_token: meta.get("require_token").is_some_and(|required| required == "1"),
            // Absent until the first release.
            released: meta.get("released").map_or(Ok(0), |_| field("released"))?,
            orders: field("order_seq")?,
        };
        if status.sold + status.remaining != status.total {
            return Err(LedgerError::Corrupt(format!("{sku}: sold + remaining ~= total")));
        }
        Ok(status)
    }

    /// An entry that is not an order event (a corrupt write, or one planted by hand) is skipped
    /// with a warning instead of failing the page: nodes page through this stream to replay
    /// retries, and one bad entry must not stop them at it for good. The order consumer reads
    /// the same entry through its group and dead-letters it, where an operator sees it. Pages
    /// are filled past skipped entries, so a page shorter than `limit` still means the end.
    async fn orders(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<OrderEvent>, LedgerError> {
        let keys = self.keys(sku);
        let limit = limit.min(ORDER_EVENTS_MAX);
        let mut events = Vec::new();
        let mut after = after;
        while events.len() < limit {
            let want = limit - events.len();
            let entries: Vec<crate::redis_feed::RawOrderEntry> =
                self.entries_after(sku, &keys.orders, after, want).await?;
            let got = entries.len();
            for (id, fields) in entries {
                let seq = crate::redis_feed::seq_of(&id)?;
                after = seq;
                match FeedEntry::from_raw(seq, fields, 0).event() {
                    Ok(event) => events.push(event),
                    Err(reason) => tracing::warn!(%sku, seq, "order stream entry skipped: {reason}"),
                }
            }
            if got < want {
                break;
            }
        }
        Ok(events)
    }

    /// On a cluster, succeeds only if every master answers: a ledger with one master down
    /// cannot sell the SKUs in its slots.
    async fn ping(&self) -> Result<(), LedgerError> {
        match self.connection() {
            RedisConnection::Single(mut con) => {
                let _: String = self.call(None, async { con.ping().await }).await?;
            }
            RedisConnection::Cluster(mut con) => self.call(None, ping_every_master(&mut con)).await?,
            RedisConnection::Sentinel(mut con) => {
                let _: String = self.call(None, ::redis::cmd("PING").query_async(&mut con)).await?;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl SalesLedger for RedisLedger {
    async fn issue_token(&self, sku: &SkuId, user: &UserId, ttl: Duration) -> Result<IssuedToken, LedgerError> {
        let keys = self.keys(sku);
        let ttl = ttl.min(TOKEN_TTL_MAX);
        let ttl_ms = ttl.as_millis().max(1) as u64;
        let (window, retry_after_ms) = crate::token_window(crate::unix_ms(), ttl);
        for _ in 0..TOKEN_DRAWS_MAX {
            let token = SubmitToken::generate()
                .map_err(|e| LedgerError::Unavailable(format!("no secure random source for a token: {e}")))?;
            let mut invocation = TOKEN.key(&keys.meta);
            invocation
                .key(format!("{}{token}", keys.token_prefix))
                .key(format!("{}{window}", keys.token_prefix.replace(":token:", ":tokens:")))
                .key(format!("{}{user}", keys.holder_prefix))
                .arg(user.as_str())
                .arg(ttl_ms)
                .arg(self.config.token_issue_max)
                .arg(token.as_str());
            let (status, text, left_ms): (i64, String, i64) = self.write(sku, &invocation).await?;
            match status {
                -1 => return Err(LedgerError::TokensExhausted { retry_after_ms }),
                0 => continue,
                1 | 2 => {
                    let token = SubmitToken::new(&text)
                        .map_err(|e| LedgerError::Corrupt(format!("the token a buyer holds is unreadable: {e}")))?;
                    let expires_in = Duration::from_millis(u64::try_from(left_ms).unwrap_or(0));
                    return Ok(IssuedToken { token, expires_in });
                }
                other => return Err(LedgerError::Corrupt(format!("token.lua answered status {other}"))),
            }
        }
        Err(LedgerError::Corrupt(
            "fresh submit tokens keep colliding with stored ones; is the random source broken?".into(),
        ))
    }

    async fn confirm(&self, sku: &SkuId, seller: &Seller, purchases: &[Purchase]) -> Result<BatchOutcome, LedgerError> {
        self.confirm_by(&CONFIRM, sku, seller, purchases).await
    }
}

#[async_trait::async_trait]
impl CatalogueLedger for RedisLedger {
    async fn create_sku(&self, sku: &SkuId, terms: &SkuTerms) -> Result<Created, LedgerError> {
        let keys = self.keys(sku);
        let mut invocation = CREATE.key(&keys.meta);
        invocation.arg(terms.total).arg(terms.per_user_limit).arg(u8::from(terms.require_token));
        invocation.arg(terms.price).arg(terms.currency.as_str()).arg(terms.pay_timeout_s);
        let created: i64 = self.write(sku, &invocation).await?;
        let status = self.status(sku).await?;
        Ok(if created == 1 { Created::New(status) } else { Created::Existing(status) })
    }

    async fn restock_to(&self, sku: &SkuId, total: u64) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(sku);
        let _total: i64 = self.write(sku, RESTOCK.key(&keys.meta).arg(total)).await?;
        self.status(sku).await
    }

    async fn set_pricing(&self, sku: &SkuId, pricing: &Pricing) -> Result<(), LedgerError> {
        let keys = self.keys(sku);
        let mut invocation = PRICING.key(&keys.meta);
        invocation.arg(pricing.price).arg(pricing.currency.as_str()).arg(pricing.pay_timeout_s);
        let _set: i64 = self.write(sku, &invocation).await?;
        Ok(())
    }

    async fn close(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(sku);
        let _closed: i64 = self.write(sku, &CLOSE.key(&keys.meta)).await?;
        self.status(sku).await
    }

    async fn end_epoch(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        let keys = self.keys(sku);
        let mut invocation = END_EPOCH.key(&keys.meta);
        invocation.key(&keys.by_epoch).arg(seller.node.as_str()).arg(seller.epoch).arg(seller.epoch_key());
        self.write(sku, &invocation).await
    }

    async fn sold_by(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let (exists, sold): (bool, Option<u64>) = self
            .call(
                Some(sku),
                ::redis::pipe().exists(&keys.meta).hget(&keys.by_epoch, seller.epoch_key()).query_async(&mut con),
            )
            .await?;
        if !exists {
            return Err(LedgerError::Missing(sku.clone()));
        }
        Ok(sold.unwrap_or(0))
    }
}

#[async_trait::async_trait]
impl OrderFeed for RedisLedger {
    async fn release(&self, sku: &SkuId, release: &Release) -> Result<ReleaseOutcome, LedgerError> {
        self.release_units(sku, release).await
    }

    async fn releases(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<ReleaseEvent>, LedgerError> {
        self.release_log(sku, after, limit).await
    }

    async fn feed_read(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        self.group_read(sku, group, consumer, count, block).await
    }

    async fn feed_claim(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        self.group_claim(sku, group, consumer, min_idle, count).await
    }

    async fn feed_ack(&self, sku: &SkuId, group: &str, seqs: &[u64]) -> Result<(), LedgerError> {
        self.group_ack(sku, group, seqs).await
    }

    async fn feed_lag(&self, sku: &SkuId, group: &str) -> Result<FeedLag, LedgerError> {
        self.group_lag(sku, group).await
    }

    async fn feed_trim(&self, sku: &SkuId, group: &str, retain: u64) -> Result<u64, LedgerError> {
        self.group_trim(sku, group, retain).await
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn passwords_never_reach_a_message() {
        assert_eq!(redact_url("redis://user:s3cret@h:1/0"), "redis://user:***@h:1/0");
        assert_eq!(redact_url("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(redact_url("redis://s3cret@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis+cluster://u:s3cret@a:1,b:2"), "redis+cluster://u:***@a:1,b:2");
        assert_eq!(redact_url("redis+sentinel://u:s3cret@a:1,b:2/m"), "redis+sentinel://u:***@a:1,b:2/m");
        assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact_url("embedded"), "embedded");
        for bad in [
            "redis://:s3cret@h:notaport",
            "redis+cluster://:s3cret@a:1,b",
            "redis+cluster://:s3cret@a:1/0",
            "redis+sentinel://:s3cret@a:1,b/m",
            "redis+sentinel://:s3cret@a:1",
        ] {
            let error = RedisTarget::parse(bad).expect_err("must be refused");
            assert!(!error.contains("s3cret"), "{error}");
        }
        let config = RedisLedgerConfig::new("redis://u:s3cret@h:1");
        assert!(!format!("{config:?}").contains("s3cret"));
        let target = RedisTarget::parse("redis+cluster://u:s3cret@a:1,b:2").unwrap();
        assert!(!format!("{target:?}").contains("s3cret"));
        let target = RedisTarget::parse("redis+sentinel://u:s3cret@a:1,b:2/m").unwrap();
        assert!(!format!("{target:?}").contains("s3cret"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn range(first: i64, last: i64, host: &str, port: i64) -> Value {
        let replica = Value::Array(vec![bulk("127.0.0.9"), Value::Int(9), bulk("id9")]);
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
            replica,
        ])
    }

    #[test]
    fn every_master_of_the_slot_map_is_pinged_once_and_no_replica() {
        let slots = Value::Array(vec![
            range(0, 99, "10.0.0.1", 7000),
            range(100, 199, "10.0.0.2", 7001),
            range(200, 16383, "10.0.0.1", 7000),
        ]);
        let masters: Vec<_> = slot_masters(&slots).unwrap().into_iter().collect();
        assert_eq!(masters, [("10.0.0.1".to_string(), 7000), ("10.0.0.2".to_string(), 7001)]);
    }

    #[test]
    fn a_slot_map_that_cannot_be_pinged_is_an_error() {
        assert!(slot_masters(&Value::Array(vec![])).is_err(), "no masters");
        assert!(slot_masters(&Value::Array(vec![range(0, 16383, "", 7000)])).is_err(), "no address");
        assert!(slot_masters(&Value::Array(vec![range(0, 16383, "?", 7000)])).is_err(), "unknown node");
        assert!(slot_masters(&Value::Int(1)).is_err(), "not a slot map");
    }

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
}
