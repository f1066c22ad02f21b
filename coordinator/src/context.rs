//! What a running member's handlers and control loop work with: its raft handle, the state
//! machine's reads, the leader's lease book, the ledger and blacklist, the tokens, the metrics.
//! Its fields are private; callers go through the named methods below, so a handler cannot reach
//! past them into the wiring (`member` builds one [`Context`] and hands it out).
//!
//! Reads are named by how fresh they are: [`Context::applied_state`] is this member's applied
//! state (stale by its replication lag), [`Context::fleet_view`] adds the leases and reports the
//! leader keeps in memory (`crate::leases`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::CatalogueLedger;
use openraft::error::{ClientWriteError, RaftError};
use protocol::{HeartbeatRequest, LeaseAnswer, NodeId, SkuId};
use safeguards::blacklist::BlacklistStore;
use serde::Serialize;

use crate::config::{CoordinatorConfig, MemberAddr, SkuPlan};
use crate::leases::{LeaseBook, NotRenewed};
use crate::quorum::QuorumCheck;
use crate::state::{ClusterState, Command, Outcome};
use crate::store::{Applied, StateMachineStore};
use crate::Raft;

/// Wall-clock ms, the leader's stamp for leases. Only the leader's clock matters: it stamps
/// commands, and `apply` never reads a clock.
pub fn now_ms() -> u64 {
    protocol::clock::unix_ms()
}

/// Why a write did not happen.
#[derive(Debug)]
pub enum WriteError {
    /// This member is not the leader; the leader's address if known.
    NotLeader(Option<String>),
    Unavailable(String),
}

/// Why a heartbeat renewed no lease.
#[derive(Debug)]
pub enum RenewRefusal {
    /// This member does not lead, or could not prove it still does; the leader's address if
    /// known.
    NotLeader(Option<String>),
    /// No quorum answered within an election timeout.
    Unavailable,
    /// The node's lease ran out and its expiry is being written; the node (fenced already)
    /// retries, and registers again once the expiry is written.
    Expiring,
}

/// Whether a caller may use `/admin/*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAccess {
    Granted,
    /// No admin token is configured: the admin API is off.
    Disabled,
    /// The token is missing or wrong.
    Unauthorized,
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

/// What `member` wires into a [`Context`]; consumed by [`Context::new`].
pub struct Parts {
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
    /// fsyncs of the raft log and vote so far (`seckill_coordinator_log_fsyncs_total`).
    pub log_fsyncs: Arc<AtomicU64>,
}

/// What the HTTP server, the control loop and the watchdog share.
pub struct Context {
    raft: Raft,
    store: StateMachineStore,
    config: CoordinatorConfig,
    id: u64,
    name: String,
    ledger: Arc<dyn CatalogueLedger>,
    plans: Vec<SkuPlan>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    blacklist: Arc<dyn BlacklistStore>,
    /// Leases renewed by heartbeats while this member leads (`crate::leases`).
    leases: LeaseBook,
    /// Confirms leadership before a renewal is answered, one round for many callers.
    quorum: QuorumCheck,
    /// When the control loop saw this member take over as leader; 0 while it does not lead.
    leading_since_ms: AtomicU64,
    log_fsyncs: Arc<AtomicU64>,
}

impl Context {
    pub fn new(parts: Parts) -> Context {
        let quorum = QuorumCheck::new(parts.config.election_timeout_max);
        Context {
            raft: parts.raft,
            store: parts.store,
            config: parts.config,
            id: parts.id,
            name: parts.name,
            ledger: parts.ledger,
            plans: parts.plans,
            metrics: parts.metrics,
            blacklist: parts.blacklist,
            leases: LeaseBook::default(),
            quorum,
            leading_since_ms: AtomicU64::new(0),
            log_fsyncs: parts.log_fsyncs,
        }
    }

    /// This member's name in `[coordinator] members`, the `member` label of its metrics.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This member's raft id (its position in `[coordinator] members` + 1).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Every member of the config, in order: a member's raft id is its position + 1.
    pub fn members(&self) -> &[MemberAddr] {
        &self.config.members
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The order service's API, whose metrics give the operator orders by state.
    pub fn orders_api(&self) -> Option<&str> {
        self.config.orders_api.as_deref()
    }

    pub fn ledger(&self) -> &dyn CatalogueLedger {
        self.ledger.as_ref()
    }

    pub fn blacklist(&self) -> &dyn BlacklistStore {
        self.blacklist.as_ref()
    }

    /// Each SKU of `cluster.toml`, with its starting allotment per node.
    pub fn plans(&self) -> &[SkuPlan] {
        &self.plans
    }

    /// How long a renewal holds.
    pub fn lease(&self) -> Duration {
        self.config.lease
    }

    /// Extra wait past a lease before the leader revokes it.
    pub fn grace(&self) -> Duration {
        self.config.grace
    }

    /// How often nodes renew their lease.
    pub fn heartbeat(&self) -> Duration {
        self.config.heartbeat
    }

    pub fn election_timeout_max(&self) -> Duration {
        self.config.election_timeout_max
    }

    /// Live nodes the group leases at most (`[coordinator] max_nodes`).
    pub fn max_nodes(&self) -> usize {
        self.config.max_nodes
    }

    /// Whether the leader reallocates and tops up (off only to show what happens without it).
    pub fn reallocates(&self) -> bool {
        self.config.reallocate
    }

    /// Whether an `Authorization` header carries a cluster token this member accepts on
    /// `/raft/*` and `/api/*`.
    pub fn admits_peer(&self, authorization: Option<&[u8]>) -> bool {
        self.config.cluster.admits(authorization)
    }

    /// Whether an `Authorization` header opens `/admin/*`.
    pub fn admin_access(&self, authorization: Option<&[u8]>) -> AdminAccess {
        let Some(expected) = self.config.admin_token.as_ref() else { return AdminAccess::Disabled };
        let given = protocol::credential::bearer_of(authorization);
        // Fixed-length digests compared in constant time: how long the check takes tells a caller
        // neither how much of the token it guessed right nor how long the token is.
        if protocol::credential::accepts(&[expected.digest()], given) {
            AdminAccess::Granted
        } else {
            AdminAccess::Unauthorized
        }
    }

    /// Writes `command` through raft, returning its outcome once applied here.
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

    /// The state this member has applied: stale by its replication lag, without the leader's
    /// in-memory leases.
    pub fn applied_state(&self) -> ClusterState {
        self.store.read().state
    }

    /// The cluster state as this member decides on it: on the leader, the applied state with
    /// the leases and reports of its lease book (`crate::leases`); elsewhere the applied state.
    pub fn fleet_view(&self) -> ClusterState {
        self.view(self.store.read().state)
    }

    fn view(&self, state: ClusterState) -> ClusterState {
        // Acquire: pairs with the Release in `took_over`, so a member that reads a takeover
        // time also sees the leadership it was stored for.
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

    /// The control loop saw this member take over as leader at `since_ms`.
    pub fn took_over(&self, since_ms: u64) {
        self.leading_since_ms.store(since_ms, Ordering::Release);
    }

    /// The control loop saw this member no longer lead.
    pub fn stepped_down(&self) {
        self.leading_since_ms.store(0, Ordering::Release);
    }

    /// Marks `node` as expiring under `epoch` if its lease (+ grace) has still run out at
    /// `now_ms` by the lease book; from then on its heartbeats are refused until
    /// [`Self::expiry_done`]. False: a renewal landed since the decision, and the node must not
    /// be expired (`crate::leases`).
    pub fn begin_expiry(&self, node: &NodeId, epoch: u64, now_ms: u64, grace_ms: u64) -> bool {
        self.leases.begin_expiry(node, epoch, now_ms, grace_ms)
    }

    /// The expiry of `node`'s `epoch` was written, or failed: either way the mark goes.
    pub fn expiry_done(&self, node: &NodeId, epoch: u64) {
        self.leases.expired(node, epoch)
    }

    /// The lease `node` holds under `epoch` by this member's lease book; 0 if it renewed
    /// nowhere here.
    pub fn renewed_until_ms(&self, node: &NodeId, epoch: u64) -> u64 {
        self.leases.lease_until_ms(node, epoch).unwrap_or(0)
    }

    /// Renews a node's lease in the leader's memory (`crate::leases`), once a quorum has
    /// confirmed this member's leadership after the heartbeat `arrived` (instant, wall-clock ms).
    pub async fn renew_lease(
        &self,
        heartbeat: HeartbeatRequest,
        arrived: (Instant, u64),
    ) -> Result<LeaseAnswer, RenewRefusal> {
        if !self.is_leader() {
            return Err(RenewRefusal::NotLeader(self.leader_addr()));
        }
        let (arrived, now_ms) = arrived;
        let round_max = self.config.election_timeout_max;
        match tokio::time::timeout(round_max, self.quorum.confirm_since(&self.raft, arrived)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!("not renewing: {e}");
                return Err(RenewRefusal::NotLeader(self.leader_addr()));
            }
            Err(_) => return Err(RenewRefusal::Unavailable),
        }
        let lease_ms = self.config.lease.as_millis() as u64;
        let HeartbeatRequest { node, epoch, reports, .. } = heartbeat;
        let renewed =
            self.store.inspect(|applied| self.leases.renew(&applied.state, &node, epoch, now_ms, lease_ms, reports));
        renewed.map_err(|NotRenewed::Expiring| RenewRefusal::Expiring)
    }

    /// The control loop's rebalance (policy rule 6), told to each node in its heartbeats'
    /// answers from now on.
    pub fn set_hold_max(&self, hold_max: BTreeMap<NodeId, BTreeMap<SkuId, u64>>) {
        self.leases.set_hold_max(hold_max);
    }

    /// The Prometheus text for `/metrics`, with the raft and fleet gauges set at this scrape;
    /// `None` when the process installed no recorder.
    pub fn render_metrics(&self) -> Option<String> {
        let handle = self.metrics.as_ref()?;
        self.publish_gauges();
        Some(handle.render())
    }

    fn publish_gauges(&self) {
        let metrics = self.raft.metrics().borrow().clone();
        let name = self.name.clone();
        let leader = f64::from(u8::from(metrics.current_leader == Some(self.id)));
        metrics::gauge!("seckill_coordinator_is_leader", "member" => name.clone()).set(leader);
        metrics::gauge!("seckill_coordinator_term", "member" => name.clone()).set(metrics.current_term as f64);
        let last_log = metrics.last_log_index.unwrap_or(0) as f64;
        metrics::gauge!("seckill_coordinator_last_log_index", "member" => name.clone()).set(last_log);
        let live = self.store.read().state.live_nodes().count() as f64;
        metrics::gauge!("seckill_coordinator_live_nodes", "member" => name.clone()).set(live);
        // Relaxed: a counter read for display; no other memory depends on it.
        let fsyncs = self.log_fsyncs.load(Ordering::Relaxed);
        metrics::counter!("seckill_coordinator_log_fsyncs_total", "member" => name).absolute(fsyncs);
    }
}
