//! A private Redis Sentinel deployment for tests: one master, its replicas and three sentinels,
//! each a child process on a free loopback port with its own directory, all killed on drop.
//!
//! Timings are short so a test fails over within seconds: a master is called down after
//! [`DOWN_AFTER_MS`] without an answer, and a failover that stalls is retried after
//! [`FAILOVER_TIMEOUT_MS`].
//!
//! Every data node runs `min-replicas-to-write 1`: a master without a replica that is in sync
//! refuses writes (`NOREPLICAS`). That is what keeps a lone master from taking sales nobody
//! else has: an old master that comes back (or is cut off) alone cannot store a decision the
//! promoted replica never sees. The price: with one replica, a freshly promoted master takes no
//! writes until a replica (the old master, restarted and turned into one by the sentinels)
//! syncs from it.
//!
//! Sentinels run as `redis-server <conf> --sentinel`, the same binary as Debian's
//! `redis-sentinel` (a link to it), so no other package is needed.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::redis::{free_port, RedisServer};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "seckill";

/// Sentinels in a group: three, so two agree on a failover while one of them is down.
pub const SENTINELS: usize = 3;

/// Sentinels that must call the master down before a failover starts: a majority of three.
const QUORUM: usize = 2;

/// How long a master may be silent before a sentinel calls it down. Short, so tests fail over
/// in a few seconds; production deployments use several seconds to ride out pauses.
pub const DOWN_AFTER_MS: u64 = 1_000;

/// How long a failover may take before the sentinels start another one.
pub const FAILOVER_TIMEOUT_MS: u64 = 3_000;

/// How long a new group may take until every sentinel knows the replicas and the other
/// sentinels (they discover each other through the master, every two seconds).
const READY_MAX: Duration = Duration::from_secs(30);

/// How long a failover may take to be visible on every sentinel.
pub const FAILOVER_MAX: Duration = Duration::from_secs(30);

struct SentinelProcess {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl SentinelProcess {
    fn start(master_port: u16) -> anyhow::Result<SentinelProcess> {
        let dir = std::env::temp_dir().join(format!("seckill-sentinel-{}-{}", std::process::id(), fastrand::u64(..)));
        std::fs::create_dir_all(&dir)?;
        for _ in 0..5 {
            let port = free_port()?;
            // A sentinel rewrites its config file as it learns the group, so it gets its own.
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                     sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.display()
                ),
            )?;
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot run redis-server --sentinel ({e}); install redis-server"))?;
            let mut sentinel = SentinelProcess { port, dir: dir.clone(), child: Some(child) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Some(Ok(Some(_))) = sentinel.child.as_mut().map(Child::try_wait) {
                    break;
                }
                if sentinel.query::<String>(&redis::cmd("PING")).is_ok() {
                    return Ok(sentinel);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            sentinel.kill();
        }
        anyhow::bail!("redis-server --sentinel did not start; see {}", dir.display())
    }

    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut connection = redis::Client::open(format!("redis://127.0.0.1:{}", self.port))?
            .get_connection_with_timeout(Duration::from_secs(1))?;
        connection.set_read_timeout(Some(Duration::from_secs(1)))?;
        cmd.query(&mut connection)
    }

    /// The master's port as this sentinel sees it.
    fn master_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> =
            self.query(redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(MASTER_NAME)).ok()?;
        addr.map(|(_, port)| port)
    }

    /// `SENTINEL master <name>`'s field `name`, as a number.
    fn master_field(&self, name: &str) -> Option<u64> {
        let fields: std::collections::HashMap<String, String> =
            self.query(redis::cmd("SENTINEL").arg("master").arg(MASTER_NAME)).ok()?;
        fields.get(name)?.parse().ok()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A master, `replicas` replicas and [`SENTINELS`] sentinels watching them as [`MASTER_NAME`].
/// `servers` keeps the data nodes by the order they started in (the first was the master);
/// which one is master now, ask [`SentinelGroup::master_port`].
pub struct SentinelGroup {
    pub servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
}

impl SentinelGroup {
    /// Starts the group and returns once every sentinel knows every replica and the other
    /// sentinels, so a failover can be agreed on.
    pub fn start(replicas: usize) -> anyhow::Result<SentinelGroup> {
        let master = RedisServer::start_with_args(&["--min-replicas-to-write", "1"])?;
        let mut servers = vec![master];
        for _ in 0..replicas {
            let replica = RedisServer::start_replica_of(&servers[0])?;
            servers.push(replica);
        }
        let master_port = servers[0].port;
        let sentinels = (0..SENTINELS).map(|_| SentinelProcess::start(master_port)).collect::<Result<Vec<_>, _>>()?;
        let group = SentinelGroup { servers, sentinels };
        let deadline = Instant::now() + READY_MAX;
        loop {
            let ready = group.sentinels.iter().all(|sentinel| {
                sentinel.master_field("num-slaves") == Some(replicas as u64)
                    && sentinel.master_field("num-other-sentinels") == Some(SENTINELS as u64 - 1)
            });
            if ready {
                return Ok(group);
            }
            anyhow::ensure!(Instant::now() < deadline, "the sentinels did not learn the group in {READY_MAX:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The ledger URL: every sentinel, then the master's name.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("{}{}/{MASTER_NAME}", ledger::SENTINEL_SCHEME, addrs.join(","))
    }

    /// The master's port, if a majority of the sentinels name the same one.
    pub fn master_port(&self) -> Option<u16> {
        let ports: Vec<u16> = self.sentinels.iter().filter_map(SentinelProcess::master_port).collect();
        ports.iter().copied().find(|port| ports.iter().filter(|p| *p == port).count() >= QUORUM)
    }

    /// The data node listening on `port`.
    pub fn server_on(&mut self, port: u16) -> anyhow::Result<&mut RedisServer> {
        self.servers.iter_mut().find(|s| s.port == port).context("no data node on that port")
    }

    /// Whether every sentinel names a master other than the one on `old_port` and that server
    /// says it is a master: its port if so. One look, no waiting.
    pub fn failed_over_from(&self, old_port: u16) -> Option<u16> {
        let ports: Vec<Option<u16>> = self.sentinels.iter().map(SentinelProcess::master_port).collect();
        let port = (*ports.first()?)?;
        if port == old_port || !ports.iter().all(|p| *p == Some(port)) {
            return None;
        }
        let promoted = self.servers.iter().find(|s| s.port == port)?;
        let role: redis::RedisResult<redis::Value> = promoted.query(&redis::cmd("ROLE"));
        let master = matches!(role, Ok(redis::Value::Array(fields))
            if matches!(fields.first(), Some(redis::Value::BulkString(r)) if r == b"master"));
        master.then_some(port)
    }

    /// Whether the master the sentinels name has every other data node as its replica with the
    /// link up. One look: asks each server in turn, so a frozen one stalls it.
    pub fn is_whole(&self) -> bool {
        let Some(master) = self.master_port() else { return false };
        self.servers.iter().filter(|s| s.port != master).all(|server| {
            let info: String = server.query(redis::cmd("INFO").arg("replication")).unwrap_or_default();
            let lines: Vec<&str> = info.lines().map(str::trim).collect();
            lines.contains(&"role:slave")
                && lines.contains(&format!("master_port:{master}").as_str())
                && lines.contains(&"master_link_status:up")
        })
    }

    /// Polls until every sentinel names a master other than the one on `old_port`, and that
    /// server says it is a master; returns its port.
    pub fn wait_failover_from(&self, old_port: u16) -> anyhow::Result<u16> {
        let deadline = Instant::now() + FAILOVER_MAX;
        loop {
            if let Some(port) = self.failed_over_from(old_port) {
                return Ok(port);
            }
            anyhow::ensure!(Instant::now() < deadline, "no failover from port {old_port} in {FAILOVER_MAX:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
