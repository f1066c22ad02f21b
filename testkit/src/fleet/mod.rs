//! A fleet of real processes on this machine: a private Redis (AOF, fsync always), `seckill
//! coordinator` members and `seckill node`s, each with its own config and log file, on free
//! loopback ports in a temp dir; and, when asked, a [`Proxy`] on every link from a node to Redis
//! and to each member, so tests can cut, slow or one-way a single node's links.
//!
//! **Role.** What fault tests and the nemesis start and break: processes they kill (SIGKILL),
//! freeze (SIGSTOP) and restart, a member whose data they wipe, links they fault. The binary is
//! the caller's (`env!("CARGO_BIN_EXE_seckill")` in tests, `current_exe()` in the CLI), so this
//! crate never links the product.
//!
//! **Configs.** Members read `cluster.toml` with the real addresses. With proxies, node `nN`
//! reads `nN.toml`: the same file except that `[ledger] url` and `[coordinator] members` name
//! that node's proxies. A follower's "the leader is at ADDR" names a real address; each of the
//! node's member proxies rewrites it to the node's proxy to that member (the addresses have the
//! same length: see [`crate::proxy`]), so a node that follows the hint stays behind its proxies.
//!
//! **Replicated Redis.** [`FleetSpec::redis`] picks the ledger's servers: one Redis, a
//! Sentinel group ([`crate::sentinel::SentinelGroup`]: a master, one replica, three sentinels,
//! every data node with `min-replicas-to-write 1`), or a Redis Cluster of three masters with a
//! replica each ([`crate::redis::RedisCluster::start_replicated`]). A replicated layout is named
//! by its `redis+sentinel://` or `redis+cluster://` URL with `durability = "replica"` and
//! `replicas = 1`: an answered sale is on the replica a failover promotes. Nodes then reach
//! Redis directly, wherever the sentinels or the slot map send them, so a node has no Redis
//! proxy (its member proxies stay). "The master" is the one serving a given key
//! ([`Fleet::redis_master`]: under Cluster, the SKU's shard); [`Fleet::kill_redis_master`],
//! [`Fleet::wait_redis_promotion`] and [`Fleet::rejoin_redis`] are a failover, step by step, and
//! [`Fleet::wait_redis_whole`] waits until every data node is back in its place.
//!
//! **Order service.** When asked ([`FleetSpec::orders`]), `cluster.toml` gains an `[orders]`
//! section whose store is a private PostgreSQL ([`crate::postgres::PostgresServer`]), and the
//! fleet runs `seckill orders` processes `o1`, `o2`… each reading `oN.toml`: the same file with
//! its own consumer name in the group. They reach Redis directly (no proxies): the faults they
//! take are their own (killed, frozen) and the store's (PostgreSQL stopped or killed).
//!
//! **Payments.** With [`FleetSpec::payments`], the fleet also runs the sandbox payment provider
//! (`seckill paysim`, process `p1`, on a free loopback port), and each order service listens
//! for its order API on a port of its own and names the sandbox in its `[payments]` (only the
//! order services' configs carry that section: whoever else reads the config has no `[orders]
//! listen` to default the callback URL to). Order services and sandbox share
//! [`PAYMENT_SECRET`] through `SECKILL_PAYMENT_SECRET`.
//!
//! **Skewed clocks.** [`FleetSpec::orders_clock_skew_s`] runs order services on a wall clock
//! off by whole seconds: libfaketime (Debian's `faketime`) preloaded into the process itself, not
//! the `faketime` wrapper, which would stand between the fleet and the process it signals. Only
//! the wall clock moves (`FAKETIME_DONT_FAKE_MONOTONIC`): timers and timeouts run true, as they
//! do on a host whose clock is merely set wrong.
//!
//! **Guarantees.** Every process is SIGKILLed when the fleet is dropped, frozen ones too; the
//! temp dir goes with it unless the caller copied the logs out first ([`Fleet::copy_logs`]).
//! **Layout.** This file holds the spec, the fleet's state and its start; `processes` starts,
//! signals and wipes the seckill processes, `redis` breaks and mends the ledger's Redis,
//! `probes` waits on and reads the running fleet, and `setup` writes the configs and binds the
//! proxies before any process starts.

mod probes;
mod processes;
mod redis;
mod setup;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use anyhow::Context;

use self::redis::LedgerServers;
use self::setup::{loopback, Configs};
use crate::postgres::PostgresServer;
use crate::proxy::Proxy;
use crate::redis::free_port;

/// Lease settings for fault runs: short enough that a failover shows within seconds, long
/// enough to ride out a busy 2-core machine.
pub const COORDINATOR_TIMINGS: &str = "heartbeat_ms = 150\nlease_ms = 1500\ngrace_ms = 300\n\
    fence_margin_ms = 200\nelection_timeout_min_ms = 150\nelection_timeout_max_ms = 300\n";

/// Pause between readiness polls.
const POLL_PAUSE: Duration = Duration::from_millis(50);

/// The ledger's Redis servers (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedisLayout {
    /// One server, with AOF.
    #[default]
    Single,
    /// A master, one replica and three sentinels.
    Sentinel,
    /// Three masters with a replica each.
    Cluster,
}

impl RedisLayout {
    /// Whether each write has a replica that a failover promotes.
    pub fn replicated(self) -> bool {
        self != RedisLayout::Single
    }
}

/// What to start.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    /// The `seckill` binary.
    pub exe: PathBuf,
    /// Coordinator members `c1`… (1, 3 or 5).
    pub members: usize,
    /// Nodes `n1`….
    pub nodes: usize,
    /// `[[skus]]` tables.
    pub skus_toml: String,
    /// Keys of `[ledger]` after `url` (and, with a replicated [`FleetSpec::redis`], after
    /// `durability` and `replicas`, which the fleet sets).
    pub ledger_toml: String,
    /// The ledger's servers; a replicated layout runs with `durability = "replica"`.
    pub redis: RedisLayout,
    /// Keys of `[node_settings]`; none: no such section.
    pub node_settings_toml: String,
    /// Keys of `[coordinator]` after `members` and `data_dir`; [`COORDINATOR_TIMINGS`] by default.
    pub coordinator_toml: String,
    /// Every node reaches Redis and each member through proxies of its own.
    pub proxied: bool,
    /// Nodes make Snowflake order ids (`[node_settings] order_ids_dir` in the fleet's dir);
    /// otherwise the ledger numbers orders.
    pub order_ids: bool,
    /// `RUST_LOG` of every process.
    pub rust_log: String,
    /// The admin API's token, handed to every member as `SECKILL_ADMIN_TOKEN` (the better home
    /// for a secret than the config); none: the admin API is off, whatever the caller's
    /// environment holds.
    pub admin_token: Option<String>,
    /// The cluster token every process presents on `/raft/*` and `/api/*` (`[coordinator]
    /// cluster_token`); the harness presents it too when it reads a member's state.
    pub cluster_token: String,
    /// `seckill orders` processes `o1`… on a private PostgreSQL; 0: no order service.
    pub orders: usize,
    /// Keys of `[orders]` after `store` and `consumer`.
    pub orders_toml: String,
    /// Run the sandbox payment provider and give the order services their API and `[payments]`
    /// (see the module docs); needs `orders` > 0.
    pub payments: bool,
    /// Keys of `[payments]` after `provider` and `url`.
    pub payments_toml: String,
    /// Each order service's wall-clock skew in seconds, `o1` first (see the module docs);
    /// missing or 0: the true clock.
    pub orders_clock_skew_s: Vec<i64>,
    /// The HS256 secret buyers' tokens are signed with: the fleet verifies buyers (`[auth] mode
    /// = "jwt"`, issuer [`BUYER_ISSUER`], audience [`BUYER_AUDIENCE`]) and every process reads
    /// the secret from [`BUYER_SECRET_ENV`]. `None`: `mode = "none"`.
    pub buyer_secret: Option<String>,
}

/// Where a fleet's processes read the buyers' HS256 secret.
pub const BUYER_SECRET_ENV: &str = "SECKILL_FLEET_BUYER_HS256_SECRET";
pub const BUYER_ISSUER: &str = "seckill-fleet-identity";
pub const BUYER_AUDIENCE: &str = "seckill";

/// The payment secret of a test fleet's order services and sandbox: fixed, as the sandbox takes
/// no real money.
pub const PAYMENT_SECRET: &str = "testkit-fleet-payment-secret-0123456789";

/// The sandbox's name in the fleet.
pub const PAYSIM: &str = "p1";

/// The cluster token of a test fleet: a fixed, long-enough string, not a secret.
pub const TEST_CLUSTER_TOKEN: &str = "testkit-fleet-cluster-token-0123456789";

impl FleetSpec {
    pub fn new(exe: impl Into<PathBuf>, members: usize, nodes: usize, skus_toml: impl Into<String>) -> Self {
        Self {
            exe: exe.into(),
            members,
            nodes,
            skus_toml: skus_toml.into(),
            ledger_toml: String::new(),
            redis: RedisLayout::Single,
            node_settings_toml: String::new(),
            coordinator_toml: COORDINATOR_TIMINGS.to_string(),
            proxied: false,
            order_ids: false,
            rust_log: "info,openraft=warn".to_string(),
            admin_token: None,
            cluster_token: TEST_CLUSTER_TOKEN.to_string(),
            orders: 0,
            orders_toml: String::new(),
            orders_clock_skew_s: Vec::new(),
            payments: false,
            payments_toml: String::new(),
            buyer_secret: None,
        }
    }
}

/// Coordinator member, node, order service or the sandbox payment provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Member,
    Node,
    Orders,
    Paysim,
}

struct Process {
    role: Role,
    addr: SocketAddr,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// libfaketime and the offset it applies, for a process on a skewed clock.
    skew: Option<(PathBuf, i64)>,
}

/// One node's links, each through a proxy of its own.
pub struct NodeLinks {
    /// None on replicated Redis: the node goes wherever the sentinels or the slot map send it
    /// (see the module docs).
    pub redis: Option<Proxy>,
    /// By member name.
    pub members: BTreeMap<String, Proxy>,
}

impl NodeLinks {
    /// Every proxy of this node.
    pub fn all(&self) -> impl Iterator<Item = &Proxy> {
        self.redis.iter().chain(self.members.values())
    }
}

pub struct Fleet {
    redis: LedgerServers,
    /// The order store, when the fleet runs the order service.
    postgres: Option<PostgresServer>,
    exe: PathBuf,
    rust_log: String,
    admin_token: Option<String>,
    buyer_secret: Option<String>,
    cluster_token: String,
    data_dir: PathBuf,
    processes: BTreeMap<String, Process>,
    links: BTreeMap<String, NodeLinks>,
    /// Last, so it is removed after every process is dead.
    dir: tempfile::TempDir,
}

impl Fleet {
    /// Starts Redis (and the proxies, when asked) and writes the configs; starts no seckill
    /// process (see [`Fleet::start_all`]). Needs a tokio runtime for the proxies.
    pub async fn start(spec: &FleetSpec) -> anyhow::Result<Fleet> {
        let redis = LedgerServers::start(spec.redis)?;
        let dir = tempfile::Builder::new().prefix("seckill-fleet-").tempdir()?;
        let data_dir = dir.path().join("raft");
        let members: Vec<(String, SocketAddr)> =
            (1..=spec.members).map(|n| Ok((format!("c{n}"), loopback(free_port()?)))).collect::<anyhow::Result<_>>()?;
        let nodes: Vec<(String, SocketAddr)> =
            (1..=spec.nodes).map(|n| Ok((format!("n{n}"), loopback(free_port()?)))).collect::<anyhow::Result<_>>()?;
        let postgres = if spec.orders > 0 { Some(PostgresServer::start()?) } else { None };
        let store = postgres.as_ref().map(PostgresServer::url);
        let paysim = if spec.payments { Some(loopback(free_port()?)) } else { None };
        // Without payments no listener: the order API is not what the fleet tests then.
        let order_apis: Vec<SocketAddr> = (1..=spec.orders)
            .map(|_| Ok(if paysim.is_some() { loopback(free_port()?) } else { loopback(0) }))
            .collect::<anyhow::Result<_>>()?;
        // Members read the first order service's metrics for the operator's orders by state.
        let orders_api = order_apis.first().copied().filter(|api| api.port() != 0);
        let configs = Configs { spec, ledger_url: redis.url(), nodes: &nodes, dir: dir.path(), store, orders_api };
        let shared = dir.path().join("cluster.toml");
        std::fs::write(&shared, configs.text(&configs.ledger_url, &members, "fleet"))?;

        let mut processes = BTreeMap::new();
        for (name, addr) in &members {
            let process = Process::new(Role::Member, *addr, shared.clone(), dir.path().join(format!("{name}.log")));
            processes.insert(name.clone(), process);
        }
        let links = setup::add_nodes(&configs, &redis, &members, &shared, &mut processes).await?;
        setup::add_orders(&configs, &members, &order_apis, paysim, &mut processes)?;
        if let Some(addr) = paysim {
            let log = dir.path().join(format!("{PAYSIM}.log"));
            processes.insert(PAYSIM.to_string(), Process::new(Role::Paysim, addr, PathBuf::new(), log));
        }
        Ok(Fleet {
            redis,
            postgres,
            exe: spec.exe.clone(),
            rust_log: spec.rust_log.clone(),
            admin_token: spec.admin_token.clone(),
            buyer_secret: spec.buyer_secret.clone(),
            cluster_token: spec.cluster_token.clone(),
            data_dir,
            processes,
            links,
            dir,
        })
    }

    pub fn member_names(&self) -> Vec<String> {
        self.names(Role::Member)
    }

    pub fn node_names(&self) -> Vec<String> {
        self.names(Role::Node)
    }

    /// The sandbox payment provider's API, if the fleet runs it.
    pub fn paysim_addr(&self) -> Option<SocketAddr> {
        self.processes.get(PAYSIM).map(|p| p.addr)
    }

    /// Each order service's API, when the fleet takes payments (see the module docs).
    pub fn orders_apis(&self) -> Vec<(String, SocketAddr)> {
        let listening = self.processes.contains_key(PAYSIM);
        let apis = self.processes.iter().filter(|(_, p)| p.role == Role::Orders && listening);
        apis.map(|(name, p)| (name.clone(), p.addr)).collect()
    }

    /// The order services `o1`…, if the fleet runs them.
    pub fn orders_names(&self) -> Vec<String> {
        self.names(Role::Orders)
    }

    fn names(&self, role: Role) -> Vec<String> {
        self.processes.iter().filter(|(_, p)| p.role == role).map(|(name, _)| name.clone()).collect()
    }

    /// Where `name` listens (its real address).
    pub fn addr(&self, name: &str) -> anyhow::Result<SocketAddr> {
        Ok(self.process(name)?.addr)
    }

    pub fn node_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.processes.iter().filter(|(_, p)| p.role == Role::Node).map(|(n, p)| (n.clone(), p.addr)).collect()
    }

    /// The node's proxies, if the fleet was started with them.
    pub fn links(&self, node: &str) -> Option<&NodeLinks> {
        self.links.get(node)
    }

    /// The order store's server, if the fleet runs the order service.
    pub fn postgres(&self) -> Option<&PostgresServer> {
        self.postgres.as_ref()
    }

    /// For its faults: stop, kill, restart.
    pub fn postgres_mut(&mut self) -> Option<&mut PostgresServer> {
        self.postgres.as_mut()
    }

    /// The order store's URL (`[orders] store`), if the fleet runs the order service.
    pub fn store_url(&self) -> Option<String> {
        self.postgres.as_ref().map(PostgresServer::url)
    }

    /// The real Redis URL, past every proxy: for checkers and monitors. On replicated Redis,
    /// the `redis+sentinel://` or `redis+cluster://` URL, which follows the masters.
    pub fn ledger_url(&self) -> String {
        self.redis.url()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The config the members read (with the real addresses); the nodes' too unless proxied.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("cluster.toml")
    }

    fn process(&self, name: &str) -> anyhow::Result<&Process> {
        self.processes.get(name).with_context(|| format!("no process {name} in the fleet"))
    }

    fn process_mut(&mut self, name: &str) -> anyhow::Result<&mut Process> {
        self.processes.get_mut(name).with_context(|| format!("no process {name} in the fleet"))
    }
}

impl Process {
    fn new(role: Role, addr: SocketAddr, config: PathBuf, log: PathBuf) -> Self {
        Self { role, addr, config, log, child: None, paused: false, skew: None }
    }
}
