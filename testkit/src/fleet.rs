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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::postgres::PostgresServer;
use crate::proxy::{Proxy, ProxyOptions};
use crate::redis::{free_port, RedisCluster, RedisServer};
use crate::sentinel::SentinelGroup;

/// Lease settings for fault runs: short enough that a failover shows within seconds, long
/// enough to ride out a busy 2-core machine.
pub const COORDINATOR_TIMINGS: &str = "heartbeat_ms = 150\nlease_ms = 1500\ngrace_ms = 300\n\
    fence_margin_ms = 200\nelection_timeout_min_ms = 150\nelection_timeout_max_ms = 300\n";

/// Longest one poll of a process (`/ready`, `/api/state`) may take: a frozen process must not
/// stall the caller.
const PROBE_MAX: Duration = Duration::from_millis(500);

/// Pause between readiness polls.
const POLL_PAUSE: Duration = Duration::from_millis(50);

/// Where a member reads the admin token (see `[coordinator] admin_token` in the README).
const ADMIN_TOKEN_ENV: &str = "SECKILL_ADMIN_TOKEN";

/// Tries at a proxy port whose address is as long as the upstream's (rewrites keep lengths).
const PROXY_PORT_TRIES_MAX: usize = 50;

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

/// Where the order services and the sandbox read [`PAYMENT_SECRET`].
const PAYMENT_SECRET_ENV: &str = "SECKILL_PAYMENT_SECRET";

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

impl Role {
    fn command(self) -> &'static str {
        match self {
            Role::Member => "coordinator",
            Role::Node => "node",
            Role::Orders => "orders",
            Role::Paysim => "paysim",
        }
    }
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

/// The ledger's Redis: one server, a Sentinel group and the master the fleet last knew, or a
/// Redis Cluster.
enum LedgerServers {
    Single(RedisServer),
    Sentinel { group: SentinelGroup, master: u16 },
    Cluster(RedisCluster),
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
        let redis = match spec.redis {
            RedisLayout::Single => LedgerServers::Single(RedisServer::start()?),
            RedisLayout::Sentinel => {
                let group = SentinelGroup::start(1)?;
                let master = group.master_port().context("the sentinels name no master")?;
                LedgerServers::Sentinel { group, master }
            }
            RedisLayout::Cluster => LedgerServers::Cluster(RedisCluster::start_replicated()?),
        };
        let dir = tempfile::Builder::new().prefix("seckill-fleet-").tempdir()?;
        let data_dir = dir.path().join("raft");
        let members: Vec<(String, SocketAddr)> =
            (1..=spec.members).map(|n| Ok((format!("c{n}"), loopback(free_port()?)))).collect::<anyhow::Result<_>>()?;
        let nodes: Vec<(String, SocketAddr)> =
            (1..=spec.nodes).map(|n| Ok((format!("n{n}"), loopback(free_port()?)))).collect::<anyhow::Result<_>>()?;
        let ledger_url = redis.url();
        let postgres = if spec.orders > 0 { Some(PostgresServer::start()?) } else { None };
        let store = postgres.as_ref().map(PostgresServer::url);
        let paysim = if spec.payments { Some(loopback(free_port()?)) } else { None };
        // Without payments no listener: the order API is not what the fleet tests then.
        let order_apis: Vec<SocketAddr> = (1..=spec.orders)
            .map(|_| Ok(if paysim.is_some() { loopback(free_port()?) } else { loopback(0) }))
            .collect::<anyhow::Result<_>>()?;
        // Members read the first order service's metrics for the operator's orders by state.
        let orders_api = order_apis.first().copied().filter(|api| api.port() != 0);
        let text = |ledger: &str, members: &[(String, SocketAddr)], consumer: &str| {
            let orders = store.as_deref().map(|store| (store, consumer));
            config_text(spec, ledger, members, &nodes, dir.path(), orders, orders_api)
        };
        let shared = dir.path().join("cluster.toml");
        std::fs::write(&shared, text(&ledger_url, &members, "fleet"))?;

        let mut links = BTreeMap::new();
        let mut processes = BTreeMap::new();
        for (name, addr) in &members {
            let process = Process::new(Role::Member, *addr, shared.clone(), dir.path().join(format!("{name}.log")));
            processes.insert(name.clone(), process);
        }
        for (name, addr) in &nodes {
            let mut config = shared.clone();
            if spec.proxied {
                let redis_addr = match &redis {
                    LedgerServers::Single(server) => Some(loopback(server.port)),
                    LedgerServers::Sentinel { .. } | LedgerServers::Cluster(_) => None,
                };
                let node_links = node_links(redis_addr, &members).await?;
                let via: Vec<(String, SocketAddr)> =
                    node_links.members.iter().map(|(member, proxy)| (member.clone(), proxy.addr())).collect();
                config = dir.path().join(format!("{name}.toml"));
                let ledger = match &node_links.redis {
                    Some(proxy) => format!("redis://{}", proxy.addr()),
                    None => ledger_url.clone(),
                };
                std::fs::write(&config, text(&ledger, &via, "fleet"))?;
                links.insert(name.clone(), node_links);
            }
            let process = Process::new(Role::Node, *addr, config, dir.path().join(format!("{name}.log")));
            processes.insert(name.clone(), process);
        }
        let skewed = spec.orders_clock_skew_s.iter().take(spec.orders).any(|skew| *skew != 0);
        let faketime = if skewed { Some(libfaketime()?) } else { None };
        for (at, listen) in (1..=spec.orders).zip(order_apis.iter().copied()) {
            let name = format!("o{at}");
            let config = dir.path().join(format!("{name}.toml"));
            let mut text = text(&ledger_url, &members, &name);
            if let Some(paysim) = paysim {
                text.push_str(&format!(
                    "\n[payments]\nprovider = \"sandbox\"\nurl = \"http://{paysim}\"\n{}\n",
                    spec.payments_toml
                ));
                text = text.replace("\n[orders]\n", &format!("\n[orders]\nlisten = \"{listen}\"\n"));
            }
            std::fs::write(&config, text)?;
            let mut process = Process::new(Role::Orders, listen, config, dir.path().join(format!("{name}.log")));
            let skew = spec.orders_clock_skew_s.get(at - 1).copied().unwrap_or(0);
            process.skew = faketime.clone().filter(|_| skew != 0).map(|lib| (lib, skew));
            processes.insert(name, process);
        }
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

    /// Starts every member, then every node, then the sandbox and the order services.
    pub fn start_all(&mut self) -> anyhow::Result<()> {
        let names = self.member_names().into_iter().chain(self.node_names());
        for name in names.chain(self.names(Role::Paysim)).chain(self.orders_names()) {
            self.start_process(&name)?;
        }
        Ok(())
    }

    /// Spawns `name` (a member, a node or an order service) if it is not running.
    pub fn start_process(&mut self, name: &str) -> anyhow::Result<()> {
        let (exe, rust_log, token) = (self.exe.clone(), self.rust_log.clone(), self.admin_token.clone());
        let buyer_secret = self.buyer_secret.clone();
        let process = self.process_mut(name)?;
        if process.child.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&process.log)?;
        let mut command = Command::new(&exe);
        match token {
            Some(token) => command.env(ADMIN_TOKEN_ENV, token),
            None => command.env_remove(ADMIN_TOKEN_ENV),
        };
        match buyer_secret {
            Some(secret) => command.env(BUYER_SECRET_ENV, secret),
            None => command.env_remove(BUYER_SECRET_ENV),
        };
        if let Some((lib, skew)) = &process.skew {
            command
                .env("LD_PRELOAD", lib)
                .env("FAKETIME", format!("{skew:+}"))
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        if matches!(process.role, Role::Orders | Role::Paysim) {
            command.env(PAYMENT_SECRET_ENV, PAYMENT_SECRET);
        }
        command.arg(process.role.command());
        match process.role {
            // The sandbox has no config; its seed is fixed, so a schedule's draws replay.
            Role::Paysim => command.args(["--listen", &process.addr.to_string(), "--seed", "1"]),
            // The order service has no fleet id: its config names its consumer.
            Role::Orders => command.arg("--config").arg(&process.config),
            Role::Member | Role::Node => command.args(["--id", name]).arg("--config").arg(&process.config),
        };
        let child = command
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot run {}", exe.display()))?;
        process.child = Some(child);
        process.paused = false;
        Ok(())
    }

    /// SIGKILL, frozen or not: no drain, no goodbye.
    pub fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let process = self.process_mut(name)?;
        if let Some(mut child) = process.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        process.paused = false;
        Ok(())
    }

    /// The OS process id of `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.process(name).ok()?.child.as_ref().map(std::process::Child::id)
    }

    /// SIGSTOP: the process keeps its sockets and its state, and does nothing.
    pub fn pause(&mut self, name: &str) -> anyhow::Result<()> {
        self.signal(name, "-STOP")?;
        self.process_mut(name)?.paused = true;
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self, name: &str) -> anyhow::Result<()> {
        self.signal(name, "-CONT")?;
        self.process_mut(name)?.paused = false;
        Ok(())
    }

    /// Sends `signal` (as `kill` takes it: `-TERM`, `-STOP`…) to `name`. Prefer [`Fleet::kill`],
    /// [`Fleet::pause`] and [`Fleet::resume`], which keep track of the process's state.
    pub fn signal(&self, name: &str, signal: &str) -> anyhow::Result<()> {
        let pid =
            self.process(name)?.child.as_ref().map(Child::id).with_context(|| format!("{name} is not running"))?;
        anyhow::ensure!(
            Command::new("kill").args([signal, &pid.to_string()]).status()?.success(),
            "kill {signal} {pid} ({name}) failed"
        );
        Ok(())
    }

    /// Where member `name` keeps its raft log, vote and snapshots.
    pub fn member_data_dir(&self, name: &str) -> PathBuf {
        self.data_dir.join(name)
    }

    /// Kills member `name` and deletes its raft directory: the disk is lost. Restart it with
    /// [`Fleet::start_process`].
    pub fn wipe_member(&mut self, name: &str) -> anyhow::Result<()> {
        anyhow::ensure!(self.process(name)?.role == Role::Member, "{name} is not a member");
        self.kill(name)?;
        let dir = self.member_data_dir(name);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).with_context(|| dir.display().to_string()),
            _ => Ok(()),
        }
    }

    /// Whether `name` has a process (frozen or not).
    pub fn is_running(&self, name: &str) -> bool {
        self.processes.get(name).is_some_and(|p| p.child.is_some())
    }

    pub fn is_paused(&self, name: &str) -> bool {
        self.processes.get(name).is_some_and(|p| p.paused)
    }

    /// Running and not frozen: it can answer.
    pub fn is_live(&self, name: &str) -> bool {
        self.is_running(name) && !self.is_paused(name)
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

    /// The one Redis, or under Sentinel the master the sentinels name now (the one the fleet
    /// last knew while they do not agree). None under Cluster, which has a master per shard:
    /// ask [`Fleet::redis_master`].
    pub fn redis(&self) -> Option<&RedisServer> {
        match &self.redis {
            LedgerServers::Single(server) => Some(server),
            LedgerServers::Sentinel { group, master } => {
                let port = group.master_port().unwrap_or(*master);
                group.servers.iter().find(|s| s.port == port)
            }
            LedgerServers::Cluster(_) => None,
        }
    }

    /// The Sentinel group, if the fleet runs one.
    pub fn sentinel(&self) -> Option<&SentinelGroup> {
        match &self.redis {
            LedgerServers::Sentinel { group, .. } => Some(group),
            LedgerServers::Single(_) | LedgerServers::Cluster(_) => None,
        }
    }

    /// The port of the data node that takes writes to `key` now: the one Redis, the master the
    /// sentinels name, or the master of `key`'s slot.
    pub fn redis_master(&self, key: &str) -> anyhow::Result<u16> {
        match &self.redis {
            LedgerServers::Single(server) => Ok(server.port),
            LedgerServers::Sentinel { group, master } => Ok(group.master_port().unwrap_or(*master)),
            LedgerServers::Cluster(cluster) => cluster.master_of(key),
        }
    }

    /// The ledger's data node on `port` (master or replica), to signal, kill or restart.
    pub fn redis_on(&mut self, port: u16) -> Option<&mut RedisServer> {
        match &mut self.redis {
            LedgerServers::Single(server) => Some(server).filter(|s| s.port == port),
            LedgerServers::Sentinel { group, .. } => group.servers.iter_mut().find(|s| s.port == port),
            LedgerServers::Cluster(cluster) => cluster.server_on(port),
        }
    }

    /// On replicated Redis: SIGKILLs the master of `key` (see [`Fleet::redis_master`]) and
    /// returns its port.
    pub fn kill_redis_master(&mut self, key: &str) -> anyhow::Result<u16> {
        anyhow::ensure!(self.redis.replicated(), "the fleet's Redis has no replica");
        let port = self.redis_master(key)?;
        self.redis_on(port).context("the master is not one of the fleet's data nodes")?.kill();
        Ok(port)
    }

    /// On replicated Redis, after the master on `old` died: polls until another data node is
    /// the master of `key` by every sentinel's or cluster node's account, and says so itself.
    /// Returns its port.
    pub async fn wait_redis_promotion(&mut self, old: u16, key: &str, within: Duration) -> anyhow::Result<u16> {
        let deadline = Instant::now() + within;
        anyhow::ensure!(self.redis.replicated(), "the fleet's Redis has no replica");
        let slot = match &self.redis {
            LedgerServers::Cluster(cluster) => Some(cluster.slot_of(key)?),
            LedgerServers::Single(_) | LedgerServers::Sentinel { .. } => None,
        };
        loop {
            let promoted = match &mut self.redis {
                LedgerServers::Single(_) => None,
                LedgerServers::Sentinel { group, master } => {
                    let port = group.failed_over_from(old);
                    if let Some(port) = port {
                        *master = port;
                    }
                    port
                }
                LedgerServers::Cluster(cluster) => slot.and_then(|slot| cluster.failed_over_from(old, slot)),
            };
            if let Some(port) = promoted {
                return Ok(port);
            }
            anyhow::ensure!(Instant::now() < deadline, "no master promoted in place of port {old} within {within:?}");
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// On replicated Redis: restarts the data node on `port` from its AOF if it is down (a
    /// master that died comes back believing it still is one), then waits until the servers
    /// are whole again ([`Fleet::wait_redis_whole`]): the sentinels or the cluster have made it
    /// a replica, and it has synced.
    pub async fn rejoin_redis(&mut self, port: u16, within: Duration) -> anyhow::Result<()> {
        anyhow::ensure!(self.redis.replicated(), "the fleet's Redis has no replica");
        let server = self.redis_on(port).context("no data node on that port")?;
        if server.pid().is_none() {
            server.restart()?;
        }
        self.wait_redis_whole(within).await
    }

    /// Polls until every data node is in its place: under Sentinel, each one other than the
    /// master the sentinels name is that master's replica with its link up (until then, with
    /// `min-replicas-to-write 1`, the master refuses writes); under Cluster, every node sees
    /// every slot served, three masters, and each replica linked. One Redis is always whole.
    /// Every data node must run and none be frozen.
    pub async fn wait_redis_whole(&mut self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let whole = match &self.redis {
                LedgerServers::Single(_) => true,
                LedgerServers::Sentinel { group, .. } => group.is_whole(),
                LedgerServers::Cluster(cluster) => cluster.is_healthy(),
            };
            if whole {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "the ledger's Redis servers are not whole within {within:?}");
            tokio::time::sleep(POLL_PAUSE).await;
        }
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

    /// Waits until node `name` answers `/ready` with 200.
    pub async fn wait_node_ready(&self, name: &str, within: Duration) -> anyhow::Result<()> {
        let addr = self.addr(name)?;
        let deadline = Instant::now() + within;
        loop {
            if let Ok((200, _)) = crate::http::get(addr, "/ready", PROBE_MAX).await {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "node {name} not ready after {within:?}");
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// Waits until every running node answers `/ready` with 200, and the sandbox (if any)
    /// `/health`.
    pub async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        for name in self.node_names() {
            if self.is_running(&name) {
                self.wait_node_ready(&name, within).await?;
            }
        }
        if let Some(addr) = self.paysim_addr().filter(|_| self.is_running(PAYSIM)) {
            let deadline = Instant::now() + within;
            while !matches!(crate::http::get(addr, "/health", PROBE_MAX).await, Ok((200, _))) {
                anyhow::ensure!(Instant::now() < deadline, "the sandbox provider not healthy after {within:?}");
                tokio::time::sleep(POLL_PAUSE).await;
            }
        }
        Ok(())
    }

    /// `/api/state` of member `name`, if it answers within a probe's time.
    pub async fn member_status(&self, name: &str) -> Option<serde_json::Value> {
        if !self.is_live(name) {
            return None;
        }
        crate::http::get_json_with(self.addr(name).ok()?, "/api/state", Some(&self.cluster_token), PROBE_MAX).await.ok()
    }

    /// The leader's name, as the live member with the newest term sees it. Not the first
    /// answer: a member whose raft has stopped keeps reporting the leader of its last term.
    pub async fn leader(&self) -> Option<String> {
        let mut newest: Option<(u64, u64)> = None;
        for name in self.member_names() {
            let Some(status) = self.member_status(&name).await else { continue };
            if let (Some(term), Some(id)) = (status["term"].as_u64(), status["leader"].as_u64()) {
                if newest.is_none_or(|(best, _)| term > best) {
                    newest = Some((term, id));
                }
            }
        }
        newest.map(|(_, id)| format!("c{id}"))
    }

    /// The fleet part of the cluster state (nodes, epochs, grants) as the leader applied it.
    pub async fn fleet_state(&self) -> Option<serde_json::Value> {
        let leader = self.leader().await?;
        self.member_status(&leader).await.map(|s| s["applied"]["state"]["fleet"].clone())
    }

    /// The last `lines` lines of `name`'s log.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let Ok(process) = self.process(name) else { return String::new() };
        let text = std::fs::read_to_string(&process.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Copies every process's log (and the configs), and each Redis data node's as
    /// `redis-<port>.log`, into `to`, which outlives the fleet.
    pub fn copy_logs(&self, to: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(to)?;
        for server in self.redis.servers() {
            // A server that never wrote a line has no log yet.
            let _ = std::fs::copy(server.log_path(), to.join(format!("redis-{}.log", server.port)));
        }
        for entry in std::fs::read_dir(self.dir.path())? {
            let path = entry?.path();
            if path.extension().is_some_and(|ext| ext == "log" || ext == "toml") {
                if let Some(file) = path.file_name() {
                    std::fs::copy(&path, to.join(file))?;
                }
            }
        }
        Ok(())
    }

    fn process(&self, name: &str) -> anyhow::Result<&Process> {
        self.processes.get(name).with_context(|| format!("no process {name} in the fleet"))
    }

    fn process_mut(&mut self, name: &str) -> anyhow::Result<&mut Process> {
        self.processes.get_mut(name).with_context(|| format!("no process {name} in the fleet"))
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for process in self.processes.values_mut() {
            if let Some(mut child) = process.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl LedgerServers {
    fn replicated(&self) -> bool {
        !matches!(self, LedgerServers::Single(_))
    }

    fn servers(&self) -> Vec<&RedisServer> {
        match self {
            LedgerServers::Single(server) => vec![server],
            LedgerServers::Sentinel { group, .. } => group.servers.iter().collect(),
            LedgerServers::Cluster(cluster) => cluster.nodes().iter().collect(),
        }
    }

    fn url(&self) -> String {
        match self {
            LedgerServers::Single(server) => server.url(),
            LedgerServers::Sentinel { group, .. } => group.url(),
            LedgerServers::Cluster(cluster) => cluster.url(),
        }
    }
}

impl Process {
    fn new(role: Role, addr: SocketAddr, config: PathBuf, log: PathBuf) -> Self {
        Self { role, addr, config, log, child: None, paused: false, skew: None }
    }
}

/// Where Debian's libfaketime lives (`/usr/lib/<arch>/faketime/`), or an error naming the
/// package: a skewed clock is never silently a true one.
fn libfaketime() -> anyhow::Result<PathBuf> {
    let mut dirs = vec![PathBuf::from("/usr/lib/faketime")];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        dirs.extend(entries.filter_map(Result::ok).map(|entry| entry.path().join("faketime")));
    }
    dirs.into_iter().map(|dir| dir.join("libfaketime.so.1")).find(|lib| lib.is_file()).context(
        "a skewed clock needs libfaketime.so.1, which Debian's faketime package installs \
         (scripts/test installs it): apt-get install faketime",
    )
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A config in which `ledger` is the Redis URL and `members` the coordinator's; with
/// `orders`, an `[orders]` section on that store under that consumer name.
fn config_text(
    spec: &FleetSpec,
    ledger: &str,
    members: &[(String, SocketAddr)],
    nodes: &[(String, SocketAddr)],
    dir: &Path,
    orders: Option<(&str, &str)>,
    orders_api: Option<SocketAddr>,
) -> String {
    let mut text = format!("[ledger]\nurl = \"{ledger}\"\n");
    if spec.redis.replicated() {
        text.push_str("durability = \"replica\"\nreplicas = 1\n");
    }
    text.push_str(&format!("{}\n", spec.ledger_toml));
    let mut settings = spec.node_settings_toml.clone();
    if spec.order_ids {
        settings.push_str(&format!("\norder_ids_dir = {:?}\n", dir.join("order-ids")));
    }
    if !settings.is_empty() {
        text.push_str(&format!("\n[node_settings]\n{settings}\n"));
    }
    text.push_str(&format!("\n{}\n", spec.skus_toml));
    if !members.is_empty() {
        let entries: Vec<String> =
            members.iter().map(|(name, addr)| format!("{{ name = \"{name}\", listen = \"{addr}\" }}")).collect();
        // Before the spec's keys, which may open a sub-table.
        let orders_api = orders_api.map(|api| format!("orders_api = \"{api}\"\n")).unwrap_or_default();
        text.push_str(&format!(
            "\n[coordinator]\nmembers = [{}]\ndata_dir = {:?}\ncluster_token = {:?}\n{orders_api}{}\n",
            entries.join(", "),
            dir.join("raft"),
            spec.cluster_token,
            spec.coordinator_toml
        ));
    }
    for (name, addr) in nodes {
        text.push_str(&format!("\n[[nodes]]\nid = \"{name}\"\nlisten = \"{addr}\"\n"));
    }
    if let Some((store, consumer)) = orders {
        text.push_str(&format!("\n[orders]\nstore = {store:?}\nconsumer = {consumer:?}\n{}\n", spec.orders_toml));
    }
    if spec.buyer_secret.is_some() {
        text.push_str(&format!(
            "\n[auth]\nmode = \"jwt\"\nhs256_secret_env = \"{BUYER_SECRET_ENV}\"\nissuer = \"{BUYER_ISSUER}\"\naudience = \"{BUYER_AUDIENCE}\"\n"
        ));
    }
    text
}

/// One node's proxies: to Redis (if it has one address), and to each member with the
/// leader-hint rewrites. The rewrites name the proxies' own addresses, so the listeners are
/// bound first.
async fn node_links(redis: Option<SocketAddr>, members: &[(String, SocketAddr)]) -> anyhow::Result<NodeLinks> {
    let redis = match redis {
        Some(addr) => Some(Proxy::start(addr).await?),
        None => None,
    };
    let mut listeners = Vec::with_capacity(members.len());
    for (_, real) in members {
        listeners.push(same_length_listener(*real).await?);
    }
    let mut rewrites = Vec::with_capacity(members.len());
    for ((_, real), listener) in members.iter().zip(&listeners) {
        rewrites.push((real.to_string().into_bytes(), listener.local_addr()?.to_string().into_bytes()));
    }
    let mut proxies = BTreeMap::new();
    for ((name, real), listener) in members.iter().zip(listeners) {
        let options = ProxyOptions { rewrites: rewrites.clone(), ..ProxyOptions::default() };
        proxies.insert(name.clone(), Proxy::on(listener, *real, options)?);
    }
    Ok(NodeLinks { redis, members: proxies })
}

/// A loopback listener whose address is as long, as text, as `upstream`'s.
async fn same_length_listener(upstream: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let want = upstream.to_string().len();
    for _ in 0..PROXY_PORT_TRIES_MAX {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        if listener.local_addr()?.to_string().len() == want {
            return Ok(listener);
        }
    }
    anyhow::bail!("no loopback port as long as {upstream}'s after {PROXY_PORT_TRIES_MAX} tries")
}
