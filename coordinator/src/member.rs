//! One coordinator member, wired: its raft instance over the on-disk store and the HTTP network,
//! the [`Context`] its handlers share, its HTTP server, the leader's control loop, the stripes'
//! transfer loop and the election watchdog. This is the only module that starts anything; no
//! other module imports it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ledger::CatalogueLedger;
use openraft::{BasicNode, SnapshotPolicy};
use safeguards::blacklist::BlacklistStore;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{CoordinatorConfig, SkuPlan};
use crate::context::{Context, MemberStatus, Parts};
use crate::network::Network;
use crate::store::{LogStore, StateMachineStore};
use crate::Raft;

/// Raft heartbeats are sent this many times per minimum election timeout.
const RAFT_HEARTBEATS_PER_ELECTION: u64 = 3;
/// openraft's 200 ms default is too short for a snapshot on a busy machine; a timed-out install
/// restarts from scratch and can repeat forever.
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 5_000;
/// Entries between snapshots; the state is small, so snapshots are cheap and keep restarts fast.
const SNAPSHOT_EVERY_ENTRIES: u64 = 2_000;

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
    context: Arc<Context>,
    /// Shut down after the tasks that use it have stopped.
    raft: Raft,
    /// Shared with the state machine, for [`StatusProbe`]s.
    store: StateMachineStore,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// A member's raft instance over its opened store.
struct Opened {
    raft: Raft,
    store: StateMachineStore,
    /// The log was empty: this member has never been part of a group (or lost its disk).
    brand_new: bool,
    log_fsyncs: Arc<std::sync::atomic::AtomicU64>,
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
        let Opened { raft, store, brand_new, log_fsyncs } = open(&config, name, id, tls.clone()).await?;
        // Only a brand-new group is initialized, by its first member. A first member restarted on
        // a wiped directory finds the group alive elsewhere and must wait to be added back
        // (`crate::membership`): initializing again would start a second group.
        if brand_new && id == 1 && !group_exists_elsewhere(&config, id, tls.as_ref()).await {
            initialize(&raft, &config).await;
        }
        crate::control::register_metrics(name);
        let context = Arc::new(Context::new(Parts {
            raft: raft.clone(),
            store: store.clone(),
            config,
            id,
            name: name.to_string(),
            ledger,
            plans,
            metrics,
            blacklist,
            log_fsyncs,
        }));
        let (stop, stopped) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(crate::http::serve(context.clone(), listener, tls.map(|tls| tls.acceptor()), stopped.clone())),
            tokio::spawn(crate::control::run(context.clone(), stopped.clone())),
            tokio::spawn(crate::stripes::run(context.clone(), stopped.clone())),
            tokio::spawn(crate::watchdog::run(context.clone(), stopped)),
        ];
        tracing::info!(member = name, id, brand_new, "coordinator member started");
        Ok(Member { context, raft, store, stop, tasks })
    }

    pub fn status(&self) -> MemberStatus {
        self.context.status()
    }

    /// A cheap handle that reads this member's applied state (stale by its replication lag).
    pub fn status_probe(&self) -> StatusProbe {
        StatusProbe { store: self.store.clone() }
    }

    pub async fn stop(self) {
        self.stop.send_replace(true);
        for task in self.tasks {
            let _ = task.await;
        }
        let _ = self.raft.shutdown().await;
    }
}

/// Opens the log and the state machine under `data_dir/<name>` and starts raft over them, with
/// raft RPC going out over HTTP (and `tls` if configured).
async fn open(
    config: &CoordinatorConfig,
    name: &str,
    id: u64,
    tls: Option<protocol::tls::Tls>,
) -> Result<Opened, StartError> {
    let dir = config.data_dir.join(name);
    let store_error = |source| StartError::Store { dir: dir.display().to_string(), source };
    let log = LogStore::open(&dir).map_err(store_error)?;
    let log_fsyncs = log.fsyncs();
    let store = StateMachineStore::open(&dir).map_err(store_error)?;
    let brand_new = log.is_empty();
    let network = Network { token: config.cluster.token().clone(), tls };
    let raft = Raft::new(id, raft_config(config)?, network, log, store.clone())
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
    Ok(Opened { raft, store, brand_new, log_fsyncs })
}

/// openraft's settings, from the member's election timeouts.
fn raft_config(config: &CoordinatorConfig) -> Result<Arc<openraft::Config>, StartError> {
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
    Ok(Arc::new(raft_config.validate().map_err(|e| StartError::Raft(e.to_string()))?))
}

/// Makes every member of the config a voter of a new group.
async fn initialize(raft: &Raft, config: &CoordinatorConfig) {
    let members: BTreeMap<u64, BasicNode> =
        config.members.iter().enumerate().map(|(at, m)| (at as u64 + 1, BasicNode { addr: m.addr.clone() })).collect();
    if let Err(e) = raft.initialize(members).await {
        tracing::debug!("group already initialized: {e}");
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
        let mut connection = protocol::connection::Connection::new(other.addr.clone(), config.cluster.token().clone())
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

#[cfg(test)]
mod tests;
