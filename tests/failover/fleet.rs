//! The failover tests' fleet: `testkit::fleet` (a private Redis, `seckill coordinator` members
//! and `seckill node`s as processes, each with its own log, on free loopback ports) with the
//! panicking helpers tests want. When a test fails, the logs' tails are printed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ledger::{Ledger, RedisLedger, RedisLedgerConfig};
use testkit::fleet::{FleetSpec, PAYSIM};

/// How long a process may take to become ready.
const READY_MAX: Duration = Duration::from_secs(20);
/// The admin token of a fleet taking payments: the operator's page reads with it.
pub const OPS_TOKEN: &str = "ops-token-for-the-operators-page-0123";

pub struct Fleet(testkit::fleet::Fleet);

impl Fleet {
    /// A fleet of `members` coordinator members and `nodes` nodes selling `skus_toml`, with the
    /// fault tests' lease timings; `coordinator_extra` adds keys to `[coordinator]`. Starts
    /// nothing but Redis.
    pub async fn new(members: usize, nodes: usize, skus_toml: &str, coordinator_extra: &str) -> Fleet {
        let mut spec = FleetSpec::new(env!("CARGO_BIN_EXE_seckill"), members, nodes, skus_toml);
        spec.coordinator_toml.push_str(coordinator_extra);
        Fleet(testkit::fleet::Fleet::start(&spec).await.expect("a fleet (scripts/test installs redis-server)"))
    }

    /// The same fleet verifying buyers (`[auth] mode = "jwt"`): tokens signed with
    /// `buyer_secret` (HS256) are its buyers'.
    pub async fn verifying_buyers(members: usize, nodes: usize, skus_toml: &str, buyer_secret: &str) -> Fleet {
        let mut spec = FleetSpec::new(env!("CARGO_BIN_EXE_seckill"), members, nodes, skus_toml);
        spec.buyer_secret = Some(buyer_secret.to_string());
        Fleet(testkit::fleet::Fleet::start(&spec).await.expect("a fleet (scripts/test installs redis-server)"))
    }

    /// A fleet of `members` members and `nodes` nodes selling `skus_toml`, with one order
    /// service (`o1`, on a private PostgreSQL) whose API listens, and the sandbox payment
    /// provider (`p1`) it pays with. Starts nothing but Redis and PostgreSQL.
    /// A fleet taking payments, its members' admin API on [`OPS_TOKEN`] for the operator's page.
    pub async fn taking_payments(members: usize, nodes: usize, skus_toml: &str) -> Fleet {
        let mut spec = FleetSpec::new(env!("CARGO_BIN_EXE_seckill"), members, nodes, skus_toml);
        spec.orders = 1;
        spec.payments = true;
        spec.admin_token = Some(OPS_TOKEN.to_string());
        Fleet(
            testkit::fleet::Fleet::start(&spec)
                .await
                .expect("a fleet (scripts/test installs redis-server and PostgreSQL)"),
        )
    }

    /// The config of order service `o1`: the shared config plus its `[orders] listen` and
    /// `[payments]`, so `lb-config nginx` run on it routes the order API and the sandbox too.
    pub fn orders_config_path(&self) -> PathBuf {
        let path = self.0.dir().join("o1.toml");
        assert!(path.is_file(), "the fleet runs no order service: no {}", path.display());
        path
    }

    /// Each order service's API (the fleet takes payments).
    pub fn orders_apis(&self) -> Vec<SocketAddr> {
        self.0.orders_apis().into_iter().map(|(_, addr)| addr).collect()
    }

    pub fn start_member(&mut self, name: &str) {
        self.0.start_process(name).expect("start the member");
    }

    pub fn start_all(&mut self) {
        self.0.start_all().expect("start the fleet");
    }

    pub fn node_addr(&self, name: &str) -> SocketAddr {
        self.0.addr(name).expect("a node")
    }

    pub fn node_addrs(&self) -> Vec<SocketAddr> {
        self.0.node_addrs().into_iter().map(|(_, addr)| addr).collect()
    }

    pub fn member_names(&self) -> Vec<String> {
        self.0.member_names()
    }

    /// SIGKILL.
    pub fn kill(&mut self, name: &str) {
        self.0.kill(name).expect("kill");
    }

    /// SIGSTOP, SIGCONT, SIGTERM…
    pub fn signal(&mut self, name: &str, signal: &str) {
        match signal {
            "-STOP" => self.0.pause(name),
            "-CONT" => self.0.resume(name),
            other => self.0.signal(name, other),
        }
        .expect("signal");
    }

    /// SIGSTOP Redis: it hangs without closing connections.
    pub fn pause_redis(&self) {
        self.0.redis().expect("the fleet runs one Redis").signal("-STOP").expect("SIGSTOP redis");
    }

    pub fn resume_redis(&self) {
        self.0.redis().expect("the fleet runs one Redis").signal("-CONT").expect("SIGCONT redis");
    }

    /// Waits until every running node answers `/ready` with 200.
    pub async fn wait_nodes_ready(&self) {
        self.0.wait_ready(READY_MAX).await.expect("nodes ready");
    }

    /// `/api/state` of a member, if it answers.
    pub async fn member_state(&self, name: &str) -> Option<serde_json::Value> {
        self.0.member_status(name).await
    }

    pub fn member_addr(&self, name: &str) -> SocketAddr {
        self.0.addr(name).expect("a member")
    }

    /// The leader's name, as the member of the newest term sees it.
    pub async fn leader(&self) -> Option<String> {
        self.0.leader().await
    }

    /// The cluster state as the current leader holds it.
    pub async fn cluster_state(&self) -> Option<serde_json::Value> {
        self.0.fleet_state().await
    }

    pub fn config_path(&self) -> PathBuf {
        self.0.config_path()
    }

    /// Where a member keeps its raft log, vote and snapshots.
    pub fn member_data_dir(&self, name: &str) -> PathBuf {
        self.0.member_data_dir(name)
    }

    pub fn ledger(&self) -> Arc<dyn Ledger> {
        Arc::new(RedisLedger::connect(RedisLedgerConfig::new(self.0.ledger_url())).expect("ledger"))
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let others = self.0.orders_names().into_iter().chain(self.0.paysim_addr().map(|_| PAYSIM.to_string()));
            for name in self.0.member_names().into_iter().chain(self.0.node_names()).chain(others) {
                eprintln!("---- {name} (last lines) ----\n{}", self.0.log_tail(&name, 25));
            }
        }
    }
}
