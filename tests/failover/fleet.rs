//! A fleet of real processes for the failover tests: a private Redis, `seckill coordinator`
//! members and `seckill node`s, each with its own log file, all on free loopback ports. Every
//! process is killed when the fleet is dropped; if the test failed, the logs' tails are printed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{Ledger, RedisLedger, RedisLedgerConfig};

use crate::harness::{request, RedisServer};

fn free_port() -> u16 {
    testkit::redis::free_port().expect("free port")
}

/// How long a process may take to become ready.
const READY_MAX: Duration = Duration::from_secs(20);

/// Lease settings for the tests: short enough that a failover shows within seconds, long
/// enough to ride out a busy 2-core machine.
pub const COORDINATOR_TIMINGS: &str = "heartbeat_ms = 150\nlease_ms = 1500\ngrace_ms = 300\nfence_margin_ms = 200\n\
     election_timeout_min_ms = 150\nelection_timeout_max_ms = 300\n";

/// The cluster token every process of the fleet presents; a test that forges calls uses
/// anything else.
pub const CLUSTER_TOKEN: &str = "failover-fleet-cluster-token-0123456789";

struct Process {
    addr: SocketAddr,
    child: Option<Child>,
    log: PathBuf,
}

pub struct Fleet {
    pub redis: RedisServer,
    dir: tempfile::TempDir,
    config: PathBuf,
    members: BTreeMap<String, Process>,
    nodes: BTreeMap<String, Process>,
}

impl Fleet {
    /// Writes a `cluster.toml` for `members` coordinator members and `nodes` nodes selling
    /// `skus_toml`; `coordinator_extra` adds keys to `[coordinator]`. Starts nothing but Redis.
    pub fn new(members: usize, nodes: usize, skus_toml: &str, coordinator_extra: &str) -> Fleet {
        let redis = RedisServer::start();
        let dir = tempfile::tempdir().expect("temp dir");
        let member_list: Vec<(String, SocketAddr)> =
            (1..=members).map(|n| (format!("c{n}"), loopback(free_port()))).collect();
        let node_list: Vec<(String, SocketAddr)> =
            (1..=nodes).map(|n| (format!("n{n}"), loopback(free_port()))).collect();
        let mut text = format!("[ledger]\nurl = \"{}\"\n\n{skus_toml}\n\n[coordinator]\nmembers = [", redis.url());
        let entries: Vec<String> =
            member_list.iter().map(|(name, addr)| format!("{{ name = \"{name}\", listen = \"{addr}\" }}")).collect();
        text.push_str(&entries.join(", "));
        text.push_str(&format!(
            "]\ndata_dir = {:?}\ncluster_token = \"{CLUSTER_TOKEN}\"\n{COORDINATOR_TIMINGS}{coordinator_extra}\n",
            dir.path().join("raft")
        ));
        for (name, addr) in &node_list {
            text.push_str(&format!("\n[[nodes]]\nid = \"{name}\"\nlisten = \"{addr}\"\n"));
        }
        let config = dir.path().join("cluster.toml");
        std::fs::write(&config, text).expect("write cluster.toml");
        let process = |(name, addr): (String, SocketAddr)| {
            let log = dir.path().join(format!("{name}.log"));
            (name, Process { addr, child: None, log })
        };
        Fleet {
            redis,
            members: member_list.into_iter().map(process).collect(),
            nodes: node_list.into_iter().map(process).collect(),
            dir,
            config,
        }
    }

    fn spawn(config: &PathBuf, role: &str, name: &str, process: &mut Process) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&process.log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_seckill"))
            .args([role, "--id", name, "--config"])
            .arg(config)
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn seckill");
        process.child = Some(child);
    }

    /// Where a member keeps its raft log, vote and snapshots.
    pub fn member_data_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join("raft").join(name)
    }

    pub fn start_member(&mut self, name: &str) {
        let process = self.members.get_mut(name).expect("member");
        Self::spawn(&self.config, "coordinator", name, process);
    }

    pub fn start_node(&mut self, name: &str) {
        let process = self.nodes.get_mut(name).expect("node");
        Self::spawn(&self.config, "node", name, process);
    }

    pub fn start_all(&mut self) {
        let members: Vec<String> = self.members.keys().cloned().collect();
        for name in members {
            self.start_member(&name);
        }
        let nodes: Vec<String> = self.nodes.keys().cloned().collect();
        for name in nodes {
            self.start_node(&name);
        }
    }

    pub fn node_addr(&self, name: &str) -> SocketAddr {
        self.nodes[name].addr
    }

    pub fn node_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.values().map(|p| p.addr).collect()
    }

    pub fn member_names(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }

    fn process(&mut self, name: &str) -> &mut Process {
        if self.members.contains_key(name) {
            self.members.get_mut(name).expect("member")
        } else {
            self.nodes.get_mut(name).expect("node")
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self, name: &str) {
        if let Some(mut child) = self.process(name).child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP / SIGCONT.
    pub fn signal(&mut self, name: &str, signal: &str) {
        let pid = self.process(name).child.as_ref().expect("running").id();
        assert!(Command::new("kill").args([signal, &pid.to_string()]).status().expect("kill(1)").success());
    }

    /// Waits until every running node answers `/ready` with 200.
    pub async fn wait_nodes_ready(&self) {
        for (name, process) in &self.nodes {
            if process.child.is_none() {
                continue;
            }
            let deadline = Instant::now() + READY_MAX;
            loop {
                if let Ok(status) = try_get_status(process.addr, "/ready").await {
                    if status == 200 {
                        break;
                    }
                }
                assert!(Instant::now() < deadline, "node {name} not ready after {READY_MAX:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// `/api/state` of a member, if it answers.
    pub async fn member_state(&self, name: &str) -> Option<serde_json::Value> {
        let addr = self.members[name].addr;
        if try_get_status(addr, "/health").await.is_err() {
            return None;
        }
        let authorization = format!("Bearer {CLUSTER_TOKEN}");
        Some(request(addr, "GET", "/api/state", &[("authorization", &authorization)], bytes::Bytes::new()).await.body)
    }

    pub fn member_addr(&self, name: &str) -> SocketAddr {
        self.members[name].addr
    }

    /// The leader's name, as any running member sees it.
    pub async fn leader(&self) -> Option<String> {
        for name in self.member_names() {
            if self.members[&name].child.is_none() {
                continue;
            }
            if let Some(state) = self.member_state(&name).await {
                if let Some(id) = state["leader"].as_u64() {
                    return Some(format!("c{id}"));
                }
            }
        }
        None
    }

    /// The cluster state as the current leader holds it.
    pub async fn cluster_state(&self) -> Option<serde_json::Value> {
        let leader = self.leader().await?;
        self.member_state(&leader).await.map(|s| s["applied"]["state"]["fleet"].clone())
    }

    pub fn config_path(&self) -> &std::path::Path {
        &self.config
    }

    pub fn ledger(&self) -> Arc<dyn Ledger> {
        Arc::new(RedisLedger::connect(RedisLedgerConfig::new(self.redis.url())).expect("ledger"))
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let names: Vec<String> = self.members.keys().chain(self.nodes.keys()).cloned().collect();
        for name in &names {
            self.kill(name);
        }
        if std::thread::panicking() {
            for name in names {
                let log = std::fs::read_to_string(&self.process(&name).log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(25).collect();
                eprintln!("---- {name} (last lines) ----");
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
            eprintln!("fleet dir kept at {}", self.dir.path().display());
            let _ = self.dir.path();
        }
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// GET that tolerates a peer that is down.
async fn try_get_status(addr: SocketAddr, path: &str) -> Result<u16, ()> {
    let connect = tokio::time::timeout(Duration::from_millis(500), testkit::load::connect(addr)).await;
    let Ok(Ok(mut sender)) = connect else { return Err(()) };
    let request = hyper::Request::get(path)
        .header("host", addr.to_string())
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .map_err(|_| ())?;
    match tokio::time::timeout(Duration::from_secs(2), sender.send_request(request)).await {
        Ok(Ok(response)) => Ok(response.status().as_u16()),
        _ => Err(()),
    }
}
