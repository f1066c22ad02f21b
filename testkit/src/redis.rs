//! Private Redis processes for tests, benchmarks and `seckill bench`, never a Redis someone
//! else is using: [`RedisServer`] is one `redis-server` child on a free loopback port with its
//! own data directory; [`RedisCluster`] is three of them in cluster mode, joined by
//! `redis-cli --cluster create` (or, with [`RedisCluster::start_replicated`], three masters and a
//! replica of each, which fail over within seconds); [`RedisServer::start_replica_of`] adds a
//! replica to a server.
//! AOF with fsync on every write, so SIGKILL loses nothing and a restart on the same directory
//! brings every sale back (and, in a cluster, its `nodes.conf` brings back the node's identity
//! and slots).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long Redis may take to answer PING after start.
const STARTUP_MAX: Duration = Duration::from_secs(10);

/// How long a new or restarted cluster may take to report `cluster_state:ok` on every node. A
/// restarted master waits about 2 s before it declares itself writable, and the gossip that
/// spreads the slot map runs once a second or so; 30 s leaves room for a loaded test machine.
const CLUSTER_READY_MAX: Duration = Duration::from_secs(30);

/// Masters in a [`RedisCluster`]: the fewest Redis accepts for a cluster, and enough to show a
/// sale spread over several nodes.
pub const CLUSTER_MASTERS: usize = 3;

/// Slots in every Redis Cluster.
const CLUSTER_SLOTS: u32 = 16_384;

/// A node's cluster bus listens on its port plus this; both must be free.
const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// Probes for a free cluster port before giving up.
const CLUSTER_PORT_PROBES_MAX: usize = 200;

/// `cluster-node-timeout` of a [`RedisCluster::start_replicated`] cluster, in milliseconds: how
/// long a master may be unreachable before the others mark it failed and its replica takes
/// over. Redis' default is 15 s; this one makes a test fail over in a few seconds.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 1_000;

/// How long a killed master's replica may take to be promoted and the cluster to report
/// `cluster_state:ok` again: the node timeout, the failure reports' gossip, the replica's
/// election delay (0.5–1 s plus a second per rank) and the vote, with room for a loaded machine.
pub const CLUSTER_FAILOVER_MAX: Duration = Duration::from_secs(30);

pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// `appendfsync` policy: `always` for fault tests, `everysec` for benchmarks (the usual
    /// production setting, and what the Redis-only baseline would run with).
    fsync: &'static str,
    /// Runs with `--cluster-enabled yes`, its `nodes.conf` in `dir`.
    cluster_enabled: bool,
    /// `--requirepass`: the default user's password, which [`RedisServer::url`] carries.
    password: Option<String>,
    /// `--replicaof 127.0.0.1 <port>`: a replica of the server on that port.
    replica_of: Option<u16>,
    /// More `--name value` settings, kept for every restart (and given to its replicas).
    extra_args: Vec<String>,
}

pub use backing::free_port;

/// A port that was free a moment ago, whose cluster bus port (port + 10000) was free too.
pub fn free_cluster_port() -> anyhow::Result<u16> {
    for _ in 0..CLUSTER_PORT_PROBES_MAX {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let Some(bus) = port.checked_add(CLUSTER_BUS_OFFSET) else { continue };
        if TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no free port p with p + {CLUSTER_BUS_OFFSET} free after {CLUSTER_PORT_PROBES_MAX} probes")
}

fn fresh_dir() -> std::io::Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "seckill-redis-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

impl RedisServer {
    /// Starts Redis with `appendfsync always`.
    pub fn start() -> anyhow::Result<RedisServer> {
        Self::start_with("always")
    }

    pub fn start_with(fsync: &'static str) -> anyhow::Result<RedisServer> {
        Self::start_node(fsync, false)
    }

    /// Starts Redis whose default user needs `password` (`requirepass`); [`RedisServer::url`]
    /// carries it, as a ledger URL would.
    pub fn start_with_password(password: &str) -> anyhow::Result<RedisServer> {
        Self::start_configured("always", false, Some(password.to_string()), &[])
    }

    fn start_node(fsync: &'static str, cluster_enabled: bool) -> anyhow::Result<RedisServer> {
        Self::start_configured(fsync, cluster_enabled, None, &[])
    }

    fn start_configured(
        fsync: &'static str,
        cluster_enabled: bool,
        password: Option<String>,
        extra_args: &[&str],
    ) -> anyhow::Result<RedisServer> {
        let mut server = RedisServer {
            port: 0,
            dir: fresh_dir()?,
            child: None,
            fsync,
            cluster_enabled,
            password,
            replica_of: None,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
        };
        // The port is free when probed but could be taken before Redis binds it; try a few.
        for _ in 0..5 {
            server.port = if cluster_enabled { free_cluster_port()? } else { free_port()? };
            if server.spawn()? {
                return Ok(server);
            }
        }
        anyhow::bail!("redis-server did not start; see {}", server.dir.display())
    }

    /// Starts Redis with `appendfsync always` and more settings (`["--name", "value", …]`), which
    /// every restart and every replica started with [`RedisServer::start_replica_of`] keep.
    pub fn start_with_args(args: &[&str]) -> anyhow::Result<RedisServer> {
        let mut server = RedisServer {
            port: 0,
            dir: fresh_dir()?,
            child: None,
            fsync: "always",
            cluster_enabled: false,
            password: None,
            replica_of: None,
            extra_args: args.iter().map(|arg| arg.to_string()).collect(),
        };
        for _ in 0..5 {
            server.port = free_port()?;
            if server.spawn()? {
                return Ok(server);
            }
        }
        anyhow::bail!("redis-server did not start; see {}", server.dir.display())
    }

    /// Starts a replica of `master` (`--replicaof`, same fsync policy and extra settings, its own
    /// port and directory) and returns once it finished its first sync (`master_link_status:up`), so
    /// every write the master acknowledges from then on is streamed to it.
    pub fn start_replica_of(master: &RedisServer) -> anyhow::Result<RedisServer> {
        anyhow::ensure!(master.password.is_none(), "replicas of a password-protected test Redis are not supported");
        let mut replica = RedisServer {
            port: 0,
            dir: fresh_dir()?,
            child: None,
            fsync: master.fsync,
            cluster_enabled: false,
            password: None,
            replica_of: Some(master.port),
            extra_args: master.extra_args.clone(),
        };
        let mut started = false;
        for _ in 0..5 {
            replica.port = free_port()?;
            if replica.spawn()? {
                started = true;
                break;
            }
        }
        anyhow::ensure!(started, "redis-server did not start as a replica; see {}", replica.dir.display());
        replica.wait_synced()?;
        master.wait_acked_by(1)?;
        Ok(replica)
    }

    /// Polls `WAIT` until `replicas` acknowledge this master's writes. A replica whose link is
    /// up may still be loading its first sync; a test that writes under `durability = "replica"`
    /// (a short `WAIT` timeout) on a loaded machine would then see its first write refused.
    pub fn wait_acked_by(&self, replicas: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + STARTUP_MAX;
        loop {
            let acked: usize = self.query(redis::cmd("WAIT").arg(replicas).arg(100))?;
            if acked >= replicas {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{acked} of {replicas} replicas acknowledged the master on port {} in {STARTUP_MAX:?}",
                self.port
            );
        }
    }

    /// Polls `INFO replication` until this replica's link to its master is up.
    pub fn wait_synced(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + STARTUP_MAX;
        loop {
            let info: String = self.query(redis::cmd("INFO").arg("replication"))?;
            if info.lines().any(|line| line.trim() == "master_link_status:up") {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the replica on port {} did not sync in {STARTUP_MAX:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server's URL, with the default user's password if it has one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Adds an ACL user with every right over every key (`ACL SETUSER`) and returns its URL.
    pub fn add_user(&self, user: &str, password: &str) -> anyhow::Result<String> {
        let _: String = self
            .query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg(user)
                    .arg("on")
                    .arg(format!(">{password}"))
                    .arg("~*")
                    .arg("&*")
                    .arg("+@all"),
            )
            .context("ACL SETUSER")?;
        Ok(format!("redis://{user}:{password}@127.0.0.1:{}", self.port))
    }

    fn spawn(&mut self) -> anyhow::Result<bool> {
        let mut command = Command::new("redis-server");
        command
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--appendonly", "yes"])
            .args(["--appendfsync", self.fsync, "--protected-mode", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.log_path());
        if self.cluster_enabled {
            command.args(["--cluster-enabled", "yes", "--cluster-config-file"]).arg(self.dir.join("nodes.conf"));
        }
        if let Some(master) = self.replica_of {
            command.args(["--replicaof", "127.0.0.1", &master.to_string()]);
        }
        command.args(&self.extra_args);
        if let Some(password) = &self.password {
            // On the command line of a private test server only; `ps` shows it to this machine.
            command.args(["--requirepass", password]);
        }
        let child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().map_err(|e| {
            anyhow::anyhow!("cannot run redis-server ({e}); install it (scripts/test does) or pass a Redis URL")
        })?;
        self.child = Some(child);
        let deadline = Instant::now() + STARTUP_MAX;
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                return Ok(false);
            }
            if self.query::<String>(&redis::cmd("PING")).is_ok() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(false)
    }

    /// Where the server writes its log (kept across restarts; gone with the server).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// Runs one command on a fresh connection.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut connection = redis::Client::open(self.url())?.get_connection()?;
        cmd.query(&mut connection)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port and directory; the AOF brings the data back.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        anyhow::ensure!(self.spawn()?, "redis-server did not restart on port {}", self.port);
        Ok(())
    }

    /// Starts again on the same port with an empty directory: Redis lost everything.
    pub fn restart_empty(&mut self) -> anyhow::Result<()> {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        self.dir = fresh_dir()?;
        anyhow::ensure!(self.spawn()?, "redis-server did not restart on port {}", self.port);
        Ok(())
    }

    /// SIGSTOP (`"-STOP"`) or SIGCONT (`"-CONT"`): Redis hangs without closing connections.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.child.as_ref().map(Child::id).ok_or_else(|| anyhow::anyhow!("redis is not running"))?;
        anyhow::ensure!(
            Command::new("kill").args([signal, &pid.to_string()]).status()?.success(),
            "kill {signal} {pid} failed"
        );
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Work Redis did, read from `INFO`: every command counts, those run inside scripts included.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct RedisWork {
    pub commands: u64,
    pub cpu_seconds: f64,
}

impl RedisWork {
    /// Reads the counters from the Redis at `url`; for a `redis+cluster://` URL, the sum over
    /// the cluster's masters; for a `redis+sentinel://` URL, the current master's.
    pub fn read(url: &str) -> anyhow::Result<RedisWork> {
        match ledger::RedisTarget::parse(url).map_err(anyhow::Error::msg)? {
            ledger::RedisTarget::Single(url) => Self::read_node(&url),
            ledger::RedisTarget::Cluster(seeds) => {
                let mut total = RedisWork::default();
                for master in cluster_masters(&seeds)? {
                    let work = Self::read_node(&seeds.node_url(&master.addr))?;
                    total.commands += work.commands;
                    total.cpu_seconds += work.cpu_seconds;
                }
                Ok(total)
            }
            // The master of the moment, as the ledger would find it.
            ledger::RedisTarget::Sentinel(seeds) => {
                let mut sentinel = redis::sentinel::Sentinel::build(seeds.sentinel_urls())?;
                let master = sentinel.master_for(&seeds.master_name, Some(&seeds.master_info()?))?;
                Self::read_client(&master)
            }
        }
    }

    fn read_node(url: &str) -> anyhow::Result<RedisWork> {
        Self::read_client(&redis::Client::open(url)?)
    }

    fn read_client(client: &redis::Client) -> anyhow::Result<RedisWork> {
        let mut connection = client.get_connection()?;
        let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut connection)?;
        let cpu: String = redis::cmd("INFO").arg("cpu").query(&mut connection)?;
        let commands = stats
            .lines()
            .filter(|line| line.starts_with("cmdstat_"))
            .filter_map(|line| line.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
            .sum();
        let field = |name: &str| -> f64 {
            cpu.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok()).unwrap_or(0.0)
        };
        Ok(RedisWork { commands, cpu_seconds: field("used_cpu_sys") + field("used_cpu_user") })
    }

    pub fn since(self, earlier: RedisWork) -> RedisWork {
        RedisWork {
            commands: self.commands.saturating_sub(earlier.commands),
            cpu_seconds: (self.cpu_seconds - earlier.cpu_seconds).max(0.0),
        }
    }
}

/// A master of a Redis Cluster, as `CLUSTER NODES` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMaster {
    /// `host:port` clients use.
    pub addr: String,
    /// Inclusive slot ranges it serves.
    pub slots: Vec<(u16, u16)>,
}

impl ClusterMaster {
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(first, last)| (*first..=*last).contains(&slot))
    }
}

/// The live masters of the cluster, asked of the first seed that answers.
pub fn cluster_masters(seeds: &ledger::ClusterSeeds) -> anyhow::Result<Vec<ClusterMaster>> {
    let mut last_error = None;
    for (addr, url) in seeds.addrs.iter().zip(seeds.urls()) {
        let text: redis::RedisResult<String> = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .and_then(|mut connection| redis::cmd("CLUSTER").arg("NODES").query(&mut connection));
        match text {
            Ok(text) => {
                let seed_host = addr.rsplit_once(':').map_or("127.0.0.1", |(host, _)| host);
                return Ok(parse_cluster_nodes(&text, seed_host));
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(anyhow::anyhow!("no seed of the cluster answered CLUSTER NODES: {last_error:?}"))
}

/// Parses `CLUSTER NODES`: `<id> <ip:port@bus[,hostname]> <flags> <master> <ping> <pong> <epoch>
/// <link> <slot>…`, where a slot is `n`, `a-b`, or a bracketed migration note. A node that does
/// not know its own IP yet lists `:port`; `seed_host` fills it in.
fn parse_cluster_nodes(text: &str, seed_host: &str) -> Vec<ClusterMaster> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") || flags.split(',').any(|f| f == "fail" || f == "noaddr") {
                return None;
            }
            let addr = node_addr(fields.get(1)?, seed_host)?;
            let slots = fields
                .iter()
                .skip(8)
                .filter(|range| !range.starts_with('['))
                .filter_map(|range| match range.split_once('-') {
                    Some((first, last)) => Some((first.parse().ok()?, last.parse().ok()?)),
                    None => range.parse().ok().map(|slot| (slot, slot)),
                })
                .collect();
            Some(ClusterMaster { addr, slots })
        })
        .collect()
}

/// A replica of a Redis Cluster, as `CLUSTER NODES` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterReplica {
    /// `host:port` clients use.
    pub addr: String,
    /// `host:port` of the master it replicates.
    pub master_addr: String,
}

/// The replicas in a `CLUSTER NODES` answer (format as in [`parse_cluster_nodes`]) that are not
/// marked failed, each with its master's address (the fourth field names the master by id).
fn parse_cluster_replicas(text: &str, seed_host: &str) -> Vec<ClusterReplica> {
    let lines: Vec<Vec<&str>> = text.lines().map(|line| line.split_whitespace().collect()).collect();
    let addr_of_id = |id: &str| {
        lines.iter().find(|fields| fields.first() == Some(&id)).and_then(|fields| node_addr(fields.get(1)?, seed_host))
    };
    lines
        .iter()
        .filter_map(|fields| {
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "slave") || flags.split(',').any(|f| f == "fail" || f == "noaddr") {
                return None;
            }
            let master_addr = addr_of_id(fields.get(3)?)?;
            Some(ClusterReplica { addr: node_addr(fields.get(1)?, seed_host)?, master_addr })
        })
        .collect()
}

/// `host:port` from `CLUSTER NODES`' address field `ip:port@bus[,hostname]`.
fn node_addr(field: &str, seed_host: &str) -> Option<String> {
    let addr = field.split(['@', ',']).next()?;
    Some(if addr.starts_with(':') { format!("{seed_host}{addr}") } else { addr.to_string() })
}

/// The port of a `host:port` address.
fn port_of(addr: &str) -> anyhow::Result<u16> {
    addr.rsplit_once(':').and_then(|(_, port)| port.parse().ok()).with_context(|| format!("bad address {addr}"))
}

/// A private Redis Cluster: [`CLUSTER_MASTERS`] masters, with no replicas ([`Self::start`]) or
/// one replica each ([`Self::start_replicated`]), each a [`RedisServer`] in cluster mode on a
/// free loopback port (its bus port free too), with AOF. Killed and deleted on drop.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the nodes with `appendfsync always`, creates the cluster and waits until every
    /// node reports it healthy.
    pub fn start() -> anyhow::Result<RedisCluster> {
        Self::start_with("always")
    }

    pub fn start_with(fsync: &'static str) -> anyhow::Result<RedisCluster> {
        Self::launch(fsync, 0, &[])
    }

    /// Starts [`CLUSTER_MASTERS`] masters and one replica of each (`--cluster-replicas 1`), with
    /// `appendfsync always` and a [`CLUSTER_NODE_TIMEOUT_MS`] node timeout, and returns once the
    /// cluster is healthy and every replica has synced, so `WAIT 1` on any master is answered.
    /// Which node replicates which master is `redis-cli`'s choice: ask [`Self::replica_of`].
    pub fn start_replicated() -> anyhow::Result<RedisCluster> {
        let node_timeout = CLUSTER_NODE_TIMEOUT_MS.to_string();
        // Redis 7 holds every full sync back `repl-diskless-sync-delay` (5 s) for more replicas to
        // share it. A shard has one replica, and a killed master that comes back as the new
        // master's replica should sync at once.
        Self::launch("always", 1, &["--cluster-node-timeout", &node_timeout, "--repl-diskless-sync-delay", "0"])
    }

    fn launch(fsync: &'static str, replicas_per_master: usize, extra_args: &[&str]) -> anyhow::Result<RedisCluster> {
        let nodes = (0..CLUSTER_MASTERS * (1 + replicas_per_master))
            .map(|_| RedisServer::start_configured(fsync, true, None, extra_args))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let cluster = RedisCluster { nodes };
        cluster.create(replicas_per_master)?;
        cluster.wait_ready()?;
        if replicas_per_master > 0 {
            for node in cluster.running() {
                let role: String = node.query(redis::cmd("INFO").arg("replication"))?;
                if role.lines().any(|line| line.trim() == "role:master") {
                    node.wait_acked_by(replicas_per_master)?;
                }
            }
        }
        Ok(cluster)
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("{}{}", ledger::CLUSTER_SCHEME, seeds.join(","))
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Every node, killed ones too.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// One node, for commands sent to it alone.
    pub fn node(&self, at: usize) -> &RedisServer {
        &self.nodes[at]
    }

    /// Where the node listening on `port` is in [`Self::ports`].
    pub fn position(&self, port: u16) -> anyhow::Result<usize> {
        self.nodes.iter().position(|n| n.port == port).with_context(|| format!("no node of the cluster on {port}"))
    }

    /// The node listening on `port`, to signal, kill or restart.
    pub fn server_on(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.nodes.iter_mut().find(|n| n.port == port)
    }

    /// The nodes that run (not killed).
    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.pid().is_some())
    }

    /// `CLUSTER NODES` as the first running node sees it, with the host to fill in for a node
    /// that lists itself as `:port`.
    fn cluster_nodes(&self) -> anyhow::Result<String> {
        let node = self.running().next().context("no node of the cluster runs")?;
        Ok(node.query(redis::cmd("CLUSTER").arg("NODES"))?)
    }

    /// The masters and their slots, as the cluster reports them.
    pub fn masters(&self) -> anyhow::Result<Vec<ClusterMaster>> {
        match ledger::RedisTarget::parse(&self.url()).map_err(anyhow::Error::msg)? {
            ledger::RedisTarget::Cluster(seeds) => cluster_masters(&seeds),
            ledger::RedisTarget::Single(_) | ledger::RedisTarget::Sentinel(_) => {
                anyhow::bail!("a cluster URL parsed as another kind")
            }
        }
    }

    /// The slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`: CRC16 of the hash tag).
    pub fn slot_of(&self, key: &str) -> anyhow::Result<u16> {
        let node = self.running().next().context("no node of the cluster runs")?;
        Ok(node.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))?)
    }

    /// The port of the master serving `key`.
    pub fn master_of(&self, key: &str) -> anyhow::Result<u16> {
        let slot = self.slot_of(key)?;
        let master = self
            .masters()?
            .into_iter()
            .find(|m| m.serves(slot))
            .with_context(|| format!("no master serves slot {slot}"))?;
        port_of(&master.addr)
    }

    /// The port of a live replica of the master on `master_port`, as the cluster reports it.
    pub fn replica_of(&self, master_port: u16) -> anyhow::Result<u16> {
        let replicas = parse_cluster_replicas(&self.cluster_nodes()?, "127.0.0.1");
        let replica = replicas
            .iter()
            .find(|r| port_of(&r.master_addr).is_ok_and(|port| port == master_port))
            .with_context(|| format!("the master on {master_port} has no replica: {replicas:?}"))?;
        port_of(&replica.addr)
    }

    /// SIGKILL on node `at`.
    pub fn kill(&mut self, at: usize) {
        self.nodes[at].kill();
    }

    /// Starts node `at` again on its port and directory; its AOF and `nodes.conf` bring back
    /// its data, identity and slots (a master that was replaced meanwhile learns so from the
    /// others and turns into its successor's replica). Returns once it answers PING;
    /// [`Self::wait_ready`] waits for the cluster to be whole again.
    pub fn restart(&mut self, at: usize) -> anyhow::Result<()> {
        self.nodes[at].restart()
    }

    /// Joins the fresh nodes: `redis-cli --cluster create`, which splits the slots evenly,
    /// gives each master `replicas_per_master` of the other nodes as replicas, and waits until
    /// the nodes agree on the slot map.
    fn create(&self, replicas_per_master: usize) -> anyhow::Result<()> {
        let mut command = Command::new("redis-cli");
        command.arg("--cluster").arg("create");
        command.args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        command.args(["--cluster-replicas", &replicas_per_master.to_string(), "--cluster-yes"]).stdin(Stdio::null());
        let dir = &self.nodes[0].dir;
        let log = dir.join("cluster-create.log");
        let out = std::fs::File::create(&log)?;
        let mut child = command.stdout(out.try_clone()?).stderr(out).spawn().map_err(|e| {
            anyhow::anyhow!(
                "cannot run redis-cli ({e}); install it (scripts/test does: Debian ships it in redis-tools, a \
                 dependency of redis-server)"
            )
        })?;
        let deadline = Instant::now() + CLUSTER_READY_MAX;
        loop {
            if let Some(status) = child.try_wait()? {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                anyhow::ensure!(status.success(), "redis-cli --cluster create failed ({status}):\n{text}");
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!(
                    "redis-cli --cluster create did not finish within {CLUSTER_READY_MAX:?}; see {}",
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls every running node until each sees the cluster healthy, every slot served and
    /// every node known; each running replica is linked to its master; and exactly
    /// [`CLUSTER_MASTERS`] of them are masters (a replaced master that came back has turned
    /// into a replica).
    pub fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + CLUSTER_READY_MAX;
        while !self.is_healthy() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the Redis Cluster on ports {:?} is not healthy after {CLUSTER_READY_MAX:?}",
                self.ports()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// What [`Self::wait_ready`] waits for, looked at once. Asks every running node in turn,
    /// so a frozen one stalls it: SIGCONT first.
    pub fn is_healthy(&self) -> bool {
        let has = |text: &str, line: &str| text.lines().any(|l| l.trim() == line);
        let mut masters = 0;
        for node in self.running() {
            let Ok(info) = node.query::<String>(redis::cmd("CLUSTER").arg("INFO")) else { return false };
            let whole = has(&info, "cluster_state:ok")
                && has(&info, &format!("cluster_slots_ok:{CLUSTER_SLOTS}"))
                && has(&info, &format!("cluster_known_nodes:{}", self.nodes.len()));
            let Ok(replication) = node.query::<String>(redis::cmd("INFO").arg("replication")) else { return false };
            if !whole || !(has(&replication, "role:master") || has(&replication, "master_link_status:up")) {
                return false;
            }
            masters += usize::from(has(&replication, "role:master"));
        }
        masters == CLUSTER_MASTERS
    }

    /// After the master on `old_port` was killed: polls until every running node reports
    /// `cluster_state:ok` and names the same other node as the master of `key`'s slot, and that
    /// node says it is a master (`ROLE`); returns its port.
    pub fn wait_failover_from(&self, old_port: u16, key: &str) -> anyhow::Result<u16> {
        let slot = self.slot_of(key)?;
        let deadline = Instant::now() + CLUSTER_FAILOVER_MAX;
        loop {
            if let Some(port) = self.failed_over_from(old_port, slot) {
                return Ok(port);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "slot {slot} did not fail over from the master on {old_port} in {CLUSTER_FAILOVER_MAX:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether every running node reports `cluster_state:ok` and names the same node other than
    /// the one on `old_port` as the master of `slot`, and that node says it is a master
    /// (`ROLE`): its port if so. One look, no waiting.
    pub fn failed_over_from(&self, old_port: u16, slot: u16) -> Option<u16> {
        let port = self.agreed_master(slot).filter(|port| *port != old_port)?;
        let promoted = self.nodes.iter().find(|n| n.port == port)?;
        let role: redis::RedisResult<redis::Value> = promoted.query(&redis::cmd("ROLE"));
        let master = matches!(role, Ok(redis::Value::Array(fields))
            if matches!(fields.first(), Some(redis::Value::BulkString(r)) if r == b"master"));
        master.then_some(port)
    }

    /// The port of the master of `slot` if every running node is in `cluster_state:ok` and
    /// names the same one.
    fn agreed_master(&self, slot: u16) -> Option<u16> {
        let mut agreed = None;
        for node in self.running() {
            let info: String = node.query(redis::cmd("CLUSTER").arg("INFO")).ok()?;
            if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                return None;
            }
            let text: String = node.query(redis::cmd("CLUSTER").arg("NODES")).ok()?;
            let master = parse_cluster_nodes(&text, "127.0.0.1").into_iter().find(|m| m.serves(slot))?;
            let port = port_of(&master.addr).ok()?;
            if agreed.is_some_and(|agreed| agreed != port) {
                return None;
            }
            agreed = Some(port);
        }
        agreed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lists_masters_and_their_slots() {
        let text = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002,host master - 0 1426238316232 2 connected 5461-10922
e7d1 :30001@40001 myself,master - 0 0 1 connected 0-5460 [5461->-67ed]
292f 127.0.0.1:30003@40003 master,fail - 0 1426238318243 3 connected 10923-16383
9a2b 127.0.0.1:30005@40005 master - 0 1426238318243 5 connected 16000 16001-16002
";
        let masters = parse_cluster_nodes(text, "10.0.0.1");
        assert_eq!(
            masters,
            [
                ClusterMaster { addr: "127.0.0.1:30002".into(), slots: vec![(5461, 10922)] },
                ClusterMaster { addr: "10.0.0.1:30001".into(), slots: vec![(0, 5460)] },
                ClusterMaster { addr: "127.0.0.1:30005".into(), slots: vec![(16000, 16000), (16001, 16002)] },
            ]
        );
        assert!(masters[1].serves(0) && masters[1].serves(5460) && !masters[1].serves(5461));
    }

    #[test]
    fn cluster_nodes_lists_live_replicas_with_their_masters() {
        let text = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002,host master - 0 1426238316232 2 connected 5461-10922
e7d1 :30001@40001 master - 0 0 1 connected 0-5460
1f2e 127.0.0.1:30006@40006 myself,slave 67ed 0 0 2 connected
5d6c 127.0.0.1:30007@40007 slave,fail 67ed 0 0 2 disconnected
8b9a 127.0.0.1:30008@40008 slave 0000 0 0 2 connected
";
        assert_eq!(
            parse_cluster_replicas(text, "10.0.0.1"),
            [
                ClusterReplica { addr: "127.0.0.1:30004".into(), master_addr: "10.0.0.1:30001".into() },
                ClusterReplica { addr: "127.0.0.1:30006".into(), master_addr: "127.0.0.1:30002".into() },
            ],
            "a failed replica and one of an unknown master are left out"
        );
    }
}
