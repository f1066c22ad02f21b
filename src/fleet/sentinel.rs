//! `fleet up`'s Redis Sentinel group, started when `[ledger] url` is a `redis+sentinel://` URL
//! whose sentinels are all on this machine: a master, one replica and one sentinel per address
//! of the URL, from Debian's `redis-server` (sentinels run as `redis-server <conf> --sentinel`,
//! the binary `redis-sentinel` links to).
//!
//! **Config files that outlive a run.** The URL names only the sentinels, so the first `up`
//! draws the two data nodes' ports and writes every process a config file under
//! `<run dir>/sentinel/`; every later `up` on the run directory starts them from those files
//! unchanged. Redis and Sentinel rewrite their own files when roles change (the sentinels send
//! `REPLICAOF` + `CONFIG REWRITE` to the servers, and record the master they follow), so after a
//! failover a `down` and `up` starts each server in the role it last had, on its own data:
//! never the old master over the promoted replica's writes.
//!
//! **What each data node runs.** `appendonly yes` (and `appendfsync always` under
//! `durability = "fsync"`), and `min-replicas-to-write 1`: a master without a replica in sync
//! refuses writes, so a master cut off alone cannot take sales the promoted replica never sees.
//! With one replica that also means no sales while the replica is down; `durability =
//! "replica"` is what makes an answered sale survive a failover (`ledger::Durability`).
//!
//! **Timings.** A master is called down after [`DOWN_AFTER_MS`] without an answer, long enough
//! to ride out a slow fsync or a busy host; a stalled failover is retried after
//! [`FAILOVER_TIMEOUT_MS`]. Both are in the sentinels' config files, for an operator to change.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use ledger::{RedisTarget, SentinelSeeds};

/// How long a master may be silent before a sentinel calls it down.
pub const DOWN_AFTER_MS: u64 = 5_000;

/// How long a failover may take before the sentinels start another one.
pub const FAILOVER_TIMEOUT_MS: u64 = 60_000;

/// How long a started group may take until every sentinel knows the replica and the others
/// (they discover each other through the master, every two seconds) and the replica is in sync.
const READY_MAX: Duration = Duration::from_secs(60);

/// The data nodes, by the name of their config file; the first one starts as the master.
const DATA_NODES: [&str; 2] = ["redis-a", "redis-b"];

/// The sentinels of a `redis+sentinel://` ledger URL that `fleet up` starts: `None` when none of
/// them is on this machine (somebody else runs that Redis). The error names `[ledger] url` when
/// only some are, or when the URL carries credentials (the group `up` starts has none: the
/// sentinels would need `auth-pass`, the replicas `masterauth`, and both rewrite their config
/// files, which would then hold the password, on every failover).
pub fn local_group(url: &str) -> anyhow::Result<Option<SentinelSeeds>> {
    let Ok(RedisTarget::Sentinel(seeds)) = RedisTarget::parse(url) else { return Ok(None) };
    let local: Vec<bool> = seeds.addrs.iter().map(|addr| local_port(addr).is_some()).collect();
    if !local.contains(&true) {
        return Ok(None);
    }
    anyhow::ensure!(
        !local.contains(&false),
        "[ledger] url names sentinels on this machine and elsewhere ({}): `fleet up` starts a Sentinel group only \
         when every sentinel is on 127.0.0.1 or localhost",
        seeds.addrs.join(",")
    );
    anyhow::ensure!(
        !seeds.has_credentials(),
        "[ledger] url carries credentials (or {} gives it some), but the Sentinel group `fleet up` starts has no \
         password: drop them, or start the group yourself",
        crate::config::REDIS_PASSWORD_ENV
    );
    Ok(Some(seeds))
}

fn local_port(addr: &str) -> Option<u16> {
    let (host, port) = addr.rsplit_once(':')?;
    matches!(host, "127.0.0.1" | "localhost").then(|| port.parse().ok()).flatten()
}

/// Starts the group's data nodes, then its sentinels, through `spawn` (given each process's
/// command, kind and name), and waits until the group can fail over: every sentinel agrees on
/// the master and knows the replica and the other sentinels, and the master has the replica in
/// sync.
pub async fn start(
    seeds: &SentinelSeeds,
    run_dir: &Path,
    fsync: bool,
    mut spawn: impl FnMut(Command, &str, &str) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = run_dir.join("sentinel");
    let sentinel_ports: Vec<u16> = seeds.addrs.iter().filter_map(|addr| local_port(addr)).collect();
    write_configs_once(&dir, &seeds.master_name, &sentinel_ports)?;
    for name in DATA_NODES {
        let mut redis = Command::new("redis-server");
        redis.arg(dir.join(name).join("redis.conf"));
        // On the command line, not in the file: the setting follows `durability` on every `up`.
        if fsync {
            redis.args(["--appendfsync", "always"]);
        }
        spawn(redis, "redis", name)?;
    }
    for (at, _) in sentinel_ports.iter().enumerate() {
        let name = sentinel_name(at);
        let mut sentinel = Command::new("redis-server");
        sentinel.arg(dir.join(&name).join("sentinel.conf")).arg("--sentinel");
        spawn(sentinel, "sentinel", &name)?;
    }
    let master_name = seeds.master_name.clone();
    let status = dir.clone();
    tokio::task::spawn_blocking(move || wait_ready(&master_name, &sentinel_ports))
        .await?
        .with_context(|| format!("the Sentinel group is not ready; see its logs and {}", status.display()))
}

fn sentinel_name(at: usize) -> String {
    format!("sentinel-{}", at + 1)
}

/// Writes each process's config file unless the run directory has them from an earlier `up`.
fn write_configs_once(dir: &Path, master_name: &str, sentinel_ports: &[u16]) -> anyhow::Result<()> {
    // The last file written: when it is there, so is every other (an `up` cut short before it
    // started nothing, and its files are written again).
    let last = dir.join(sentinel_name(sentinel_ports.len().saturating_sub(1))).join("sentinel.conf");
    if last.exists() {
        return Ok(());
    }
    let mut data_ports = Vec::new();
    for name in DATA_NODES {
        let port = backing::free_port().context("no free port for a Sentinel group's Redis")?;
        let home = make_dir(&dir.join(name))?;
        let replica_of = match data_ports.first() {
            Some(master) => format!("replicaof 127.0.0.1 {master}\n"),
            None => String::new(),
        };
        data_ports.push(port);
        fs::write(
            home.join("redis.conf"),
            format!(
                "bind 127.0.0.1\nport {port}\ndir {home}\nappendonly yes\nsave \"\"\nmin-replicas-to-write 1\n\
                 min-replicas-max-lag 10\n{replica_of}",
                home = home.display()
            ),
        )?;
    }
    // A majority of the sentinels must call the master down before a failover starts.
    let quorum = sentinel_ports.len() / 2 + 1;
    for (at, port) in sentinel_ports.iter().enumerate() {
        let home = make_dir(&dir.join(sentinel_name(at)))?;
        fs::write(
            home.join("sentinel.conf"),
            format!(
                "bind 127.0.0.1\nport {port}\ndir {home}\n\
                 sentinel monitor {master_name} 127.0.0.1 {master} {quorum}\n\
                 sentinel down-after-milliseconds {master_name} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {master_name} {FAILOVER_TIMEOUT_MS}\n\
                 sentinel parallel-syncs {master_name} 1\n",
                home = home.display(),
                master = data_ports[0],
            ),
        )?;
    }
    Ok(())
}

/// Creates `dir`, returning its absolute path (Redis resolves `dir` from where it starts).
fn make_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(fs::canonicalize(dir)?)
}

/// Polls until every sentinel names the same master, knows one replica and the other
/// sentinels, and that master reports its replica online.
fn wait_ready(master_name: &str, sentinel_ports: &[u16]) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_MAX;
    let mut last = String::from("no sentinel answered");
    while Instant::now() < deadline {
        match group_state(master_name, sentinel_ports) {
            Ok(()) => return Ok(()),
            Err(why) => last = why,
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    anyhow::bail!("after {READY_MAX:?}: {last}")
}

/// `Ok` when the group is ready (see [`wait_ready`]), else what is still missing.
fn group_state(master_name: &str, sentinel_ports: &[u16]) -> Result<(), String> {
    let mut master = None;
    for port in sentinel_ports {
        let fields: std::collections::HashMap<String, String> =
            query(*port, redis::cmd("SENTINEL").arg("master").arg(master_name))
                .map_err(|e| format!("sentinel on port {port}: {e}"))?;
        let field = |name: &str| fields.get(name).cloned().unwrap_or_default();
        let others = (sentinel_ports.len() - 1).to_string();
        if field("num-slaves") != "1" || field("num-other-sentinels") != others {
            return Err(format!(
                "sentinel on port {port} knows {} replicas and {} other sentinels",
                field("num-slaves"),
                field("num-other-sentinels")
            ));
        }
        let named = field("port");
        if master.get_or_insert_with(|| named.clone()) != &named {
            return Err("the sentinels name different masters".into());
        }
    }
    let port: u16 = master.and_then(|port| port.parse().ok()).ok_or("no sentinel named a master")?;
    let info: String =
        query(port, redis::cmd("INFO").arg("replication")).map_err(|e| format!("the master on port {port}: {e}"))?;
    if !info.lines().any(|line| line.starts_with("slave0:") && line.contains("state=online")) {
        return Err(format!("the master on port {port} has no replica in sync yet"));
    }
    Ok(())
}

fn query<T: redis::FromRedisValue>(port: u16, command: &redis::Cmd) -> redis::RedisResult<T> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let client = redis::Client::open(format!("redis://{addr}"))?;
    let mut connection = client.get_connection_with_timeout(Duration::from_secs(1))?;
    connection.set_read_timeout(Some(Duration::from_secs(1)))?;
    command.query(&mut connection)
}
