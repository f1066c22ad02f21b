//! One coordinator member: its raft instance over the on-disk store, its HTTP server, the
//! leader's control loop and the election watchdog.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ledger::CatalogueLedger;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, SnapshotPolicy};
use safeguards::blacklist::BlacklistStore;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{CoordinatorConfig, SkuPlan};
use crate::leases::LeaseBook;
use crate::network::Network;
use crate::quorum::QuorumCheck;
use crate::state::{ClusterState, Command, Outcome};
use crate::store::{Applied, LogStore, StateMachineStore};
use crate::Raft;

/// Raft heartbeats are sent this many times per minimum election timeout.
const RAFT_HEARTBEATS_PER_ELECTION: u64 = 3;
/// openraft's 200 ms default is too short for a snapshot on a busy machine; a timed-out install
/// restarts from scratch and can repeat forever.
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 5_000;
/// Entries between snapshots; the state is small, so snapshots are cheap and keep restarts fast.
const SNAPSHOT_EVERY_ENTRIES: u64 = 2_000;

/// Wall-clock ms, the leader's stamp for leases. Only the leader's clock matters: it stamps
/// commands, and `apply` never reads a clock.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Why a member could not start; all are fatal: the CLI prints them and exits.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0} is not a member of [coordinator] members")]
    NotAMember(String),
    #[error("cannot open the raft store in {dir}: {source}")]
    Store { dir: String, source: std::io::Error },
    #[error("raft did not start: {0}")]
    Raft(String),
    #[error("coordinator.tls: {0}")]
    Tls(#[from] protocol::tls::TlsError),
}

/// Why a write did not happen.
#[derive(Debug)]
pub enum WriteError {
    /// This member is not the leader; the leader's address if known.
    NotLeader(Option<String>),
    Unavailable(String),
}

/// The state of the group as one member sees it.
#[derive(Debug, Serialize)]
pub struct MemberStatus {
    pub member: String,
    pub id: u64,
    pub leader: Option<u64>,
    pub term: u64,
    /// The last entry in this member's log, durable or not yet committed.
    pub last_log_index: Option<u64>,
    pub applied: Applied,
}

/// What the HTTP server and the control loop share.
pub struct MemberInner {
    pub raft: Raft,
    pub store: StateMachineStore,
    pub config: CoordinatorConfig,
    pub id: u64,
    pub name: String,
    pub ledger: Arc<dyn CatalogueLedger>,
    /// Each SKU of `cluster.toml`, with its starting allotment per node.
    pub plans: Vec<SkuPlan>,
    /// Renders `/metrics`; the process installs the recorder, the member only reads it.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The fleet's blacklist, which operators edit through `/admin/blacklist`.
    pub blacklist: Arc<dyn BlacklistStore>,
    /// Leases renewed by heartbeats while this member leads (`crate::leases`).
    pub leases: LeaseBook,
    /// Confirms leadership before a renewal is answered, one round for many callers.
    pub quorum: QuorumCheck,
    /// When the control loop saw this member take over as leader; 0 while it does not lead.
    pub leading_since_ms: AtomicU64,
    /// fsyncs of the raft log and vote so far (`seckill_coordinator_log_fsyncs_total`).
    pub log_fsyncs: Arc<AtomicU64>,
}

impl MemberInner {
    pub async fn write(&self, command: Command) -> Result<Outcome, WriteError> {
        match self.raft.client_write(command).await {
            Ok(response) => Ok(response.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(WriteError::NotLeader(forward.leader_node.map(|node| node.addr)))
            }
            Err(e) => Err(WriteError::Unavailable(e.to_string())),
        }
    }

    /// The leader's HTTP address, if one is known.
    pub fn leader_addr(&self) -> Option<String> {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        metrics.membership_config.membership().get_node(&leader).map(|node| node.addr.clone())
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    /// The cluster state as this member decides on it: on the leader, the applied state with
    /// the leases and reports of its lease book (`crate::leases`); elsewhere the applied state.
    pub fn fleet_view(&self) -> ClusterState {
        self.view(self.store.read().state)
    }

    fn view(&self, state: ClusterState) -> ClusterState {
        let since = self.leading_since_ms.load(Ordering::Acquire);
        if since == 0 || !self.is_leader() {
            return state;
        }
        self.leases.view(state, since, self.config.lease.as_millis() as u64)
    }

    pub fn status(&self) -> MemberStatus {
        let metrics = self.raft.metrics().borrow().clone();
        let mut applied = self.store.read();
        applied.state = self.view(applied.state);
        MemberStatus {
            member: self.name.clone(),
            id: self.id,
            leader: metrics.current_leader,
            term: metrics.current_term,
            last_log_index: metrics.last_log_index,
            applied,
        }
    }
}

/// Reads a member's applied cluster state; outlives nothing but the store it shares.
#[derive(Clone)]
pub struct StatusProbe {
    store: StateMachineStore,
}

impl StatusProbe {
    pub fn state(&self) -> crate::ClusterState {
        self.store.read().state
    }
}

/// A running member.
pub struct Member {
    inner: Arc<MemberInner>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Member {
    /// Opens the member's store under `data_dir/<name>`, starts raft and, on a brand-new group,
    /// initializes it from the first member. Serves on `listener`.
    pub async fn start(
        config: CoordinatorConfig,
        name: &str,
        listener: TcpListener,
        ledger: Arc<dyn CatalogueLedger>,
        plans: Vec<SkuPlan>,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
        blacklist: Arc<dyn BlacklistStore>,
    ) -> Result<Member, StartError> {
        let id = config.member_id(name).ok_or_else(|| StartError::NotAMember(name.to_string()))?;
        let tls = config.tls.as_ref().map(|files| files.for_process(name).load()).transpose()?;
        let dir = config.data_dir.join(name);
        let store_error = |source| StartError::Store { dir: dir.display().to_string(), source };
        let log = LogStore::open(&dir).map_err(store_error)?;
        let log_fsyncs = log.fsyncs();
        let store = StateMachineStore::open(&dir).map_err(store_error)?;
        let brand_new = log.is_empty();
        let election_min = config.election_timeout_min.as_millis() as u64;
        let raft_config = openraft::Config {
            cluster_name: "seckill-coordinator".into(),
            election_timeout_min: election_min,
            election_timeout_max: config.election_timeout_max.as_millis() as u64,
            heartbeat_interval: (election_min / RAFT_HEARTBEATS_PER_ELECTION).max(10),
            install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_ENTRIES),
            max_in_snapshot_log_to_keep: 100,
            ..Default::default()
        };
        let raft_config = Arc::new(raft_config.validate().map_err(|e| StartError::Raft(e.to_string()))?);
        let network = Network { token: config.cluster.token().clone(), tls: tls.clone() };
        let raft = Raft::new(id, raft_config, network, log, store.clone())
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        // Only a brand-new group is initialized, by its first member. A first member restarted on
        // a wiped directory finds the group alive elsewhere and must wait to be added back
        // (`crate::membership`): initializing again would start a second group.
        if brand_new && id == 1 && !group_exists_elsewhere(&config, id, tls.as_ref()).await {
            let members: BTreeMap<u64, BasicNode> = config
                .members
                .iter()
                .enumerate()
                .map(|(at, m)| (at as u64 + 1, BasicNode { addr: m.addr.to_string() }))
                .collect();
            if let Err(e) = raft.initialize(members).await {
                tracing::debug!("group already initialized: {e}");
            }
        }
        crate::control::register_metrics(name);
        let quorum = QuorumCheck::new(config.election_timeout_max);
        let inner = Arc::new(MemberInner {
            raft,
            store,
            config,
            id,
            name: name.to_string(),
            ledger,
            plans,
            metrics,
            blacklist,
            leases: LeaseBook::default(),
            quorum,
            leading_since_ms: AtomicU64::new(0),
            log_fsyncs,
        });
        let (stop, stopped) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(crate::http::serve(inner.clone(), listener, tls.map(|tls| tls.acceptor()), stopped.clone())),
            tokio::spawn(crate::control::run(inner.clone(), stopped.clone())),
            tokio::spawn(watchdog(inner.clone(), stopped)),
        ];
        tracing::info!(member = name, id, brand_new, "coordinator member started");
        Ok(Member { inner, stop, tasks })
    }

    pub fn status(&self) -> MemberStatus {
        self.inner.status()
    }

    /// A cheap handle that reads this member's applied state (stale by its replication lag).
    pub fn status_probe(&self) -> StatusProbe {
        StatusProbe { store: self.inner.store.clone() }
    }

    pub async fn stop(self) {
        self.stop.send_replace(true);
        for task in self.tasks {
            let _ = task.await;
        }
        let _ = self.inner.raft.shutdown().await;
    }
}

/// Longest the start-up probe waits for each other member.
const PROBE_MAX: Duration = Duration::from_millis(300);

/// Whether another member of the config already holds a log (answers its state with a log
/// index). Unreachable members count as not existing: at a fleet's first start they are not up.
async fn group_exists_elsewhere(config: &CoordinatorConfig, own_id: u64, tls: Option<&protocol::tls::Tls>) -> bool {
    for (at, other) in config.members.iter().enumerate() {
        if at as u64 + 1 == own_id {
            continue;
        }
        let mut connection =
            protocol::connection::Connection::new(other.addr.to_string(), config.cluster.token().clone())
                .with_tls(tls.cloned());
        let Ok((hyper::StatusCode::OK, body)) = connection.get("/api/state", PROBE_MAX).await else { continue };
        let state: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if state["last_log_index"].as_u64().is_some_and(|index| index > 0) {
            tracing::warn!(member = %other.name, "the group exists already; not initializing, waiting to be added back");
            return true;
        }
    }
    false
}

/// openraft 0.9 draws each member's election timeout once, so two survivors that split a vote
/// can split it again forever. When no leader has been seen for several timeouts, wait a random
/// fraction of a timeout and start an election ourselves.
async fn watchdog(member: Arc<MemberInner>, mut stop: watch::Receiver<bool>) {
    let timeout_max = member.config.election_timeout_max;
    let patience = timeout_max * 4;
    let mut leaderless_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(timeout_max / 2) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        if member.raft.metrics().borrow().current_leader.is_some() {
            leaderless_since = None;
            continue;
        }
        let since = *leaderless_since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() >= patience {
            let jitter = Duration::from_millis(fastrand::u64(0..timeout_max.as_millis() as u64));
            tokio::time::sleep(jitter).await;
            if member.raft.metrics().borrow().current_leader.is_none() {
                tracing::warn!(member = %member.name, "no leader for {patience:?}; starting an election");
                let _ = member.raft.trigger().elect().await;
            }
            leaderless_since = None;
        }
    }
}
