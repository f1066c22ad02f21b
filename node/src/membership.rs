//! A node's membership in the coordinator group: register, renew the lease by heartbeat, apply
//! grants, and fence itself.
//!
//! Self-fencing: the node may sell from its allotment only until (send time of its last
//! acknowledged heartbeat + lease − margin), on its own monotonic clock. The leader revokes only
//! after (its renewal time + lease + grace), and the renewal happened after the send, so the node
//! has stopped before its allotment is handed to anyone else. A node told its epoch is stale
//! drops its allotment and registers again, starting from zero.
//!
//! Membership sees the node only through [`Leaseholder`]: what it reports and what it is
//! told. It speaks to the coordinator only through `protocol`, behind the [`Coordinator`] trait
//! (the group's HTTP client in production; the scripted tests answer in process).
//!
//! The lease is measured on Tokio's clock, which is the machine's monotonic clock unless a test
//! pauses it: the scripted tests let a lease lapse by advancing time, not by sleeping.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protocol::{
    Assignment, ClientError, CoordinatorClient, HeartbeatRequest, LeaseAnswer, LeaveAnswer, LeaveRequest, NodeId,
    RegisterRequest, SkuId, SkuReport, SkuTerms, PROTOCOL_VERSION,
};
use tokio::time::Instant;

use crate::shutdown::Shutdown;

/// What membership needs of the node it keeps leased, and nothing more.
pub trait Leaseholder: Send + Sync + 'static {
    fn id(&self) -> &NodeId;
    /// Per-SKU figures for the next heartbeat.
    fn reports(&self) -> Reports;
    /// The epoch ended (or is about to start afresh): every unit held under it is gone.
    fn drop_allotments(&self);
    /// Order ids from now on come under this worker id.
    fn use_worker_id(&self, worker_id: u16);
    /// The group's terms for every SKU: start selling new ones, apply closes and buffers.
    fn apply_terms(&self, terms: &BTreeMap<SkuId, SkuTerms>);
    /// The cumulative grants of the current epoch; the holder adds what is new.
    fn apply_grants(&self, granted: &BTreeMap<SkuId, u64>);
    /// The most units of each SKU to hold; the holder gives back what it holds beyond.
    fn apply_hold_max(&self, hold_max: &BTreeMap<SkuId, u64>);
}

/// The three calls membership makes to the coordinator group. A contract for implementors: each
/// answers as the group's leader would (`protocol::fleet`), or fails with a [`ClientError`]
/// when no member took the call.
#[async_trait::async_trait]
pub trait Coordinator: Send + Sync + 'static {
    async fn register(&self, request: &RegisterRequest) -> Result<LeaseAnswer, ClientError>;
    async fn heartbeat(&self, request: &HeartbeatRequest) -> Result<LeaseAnswer, ClientError>;
    async fn leave(&self, request: &LeaveRequest) -> Result<LeaveAnswer, ClientError>;
}

#[async_trait::async_trait]
impl Coordinator for CoordinatorClient {
    async fn register(&self, request: &RegisterRequest) -> Result<LeaseAnswer, ClientError> {
        CoordinatorClient::register(self, request).await
    }

    async fn heartbeat(&self, request: &HeartbeatRequest) -> Result<LeaseAnswer, ClientError> {
        CoordinatorClient::heartbeat(self, request).await
    }

    async fn leave(&self, request: &LeaveRequest) -> Result<LeaveAnswer, ClientError> {
        CoordinatorClient::leave(self, request).await
    }
}

/// How a node reaches the coordinator and the lease it works under.
#[derive(Clone)]
pub struct CoordinatorLink {
    pub client: Arc<dyn Coordinator>,
    /// Where this node serves purchases, as registered.
    pub advertise: String,
    pub heartbeat: Duration,
    pub lease: Duration,
    /// The node stops selling this long before its lease would run out.
    pub fence_margin: Duration,
}

/// The node's current epoch and how long it may sell. Epoch 0: not registered.
pub struct Membership {
    epoch: AtomicU64,
    /// Milliseconds since `origin` until which the node may sell.
    sellable_until_ms: AtomicU64,
    origin: Instant,
    link: CoordinatorLink,
    /// Identifies this process to the coordinator across retried registrations.
    instance: u64,
}

impl Membership {
    pub fn new(link: CoordinatorLink) -> Self {
        Self {
            epoch: AtomicU64::new(0),
            sellable_until_ms: AtomicU64::new(0),
            origin: Instant::now(),
            link,
            instance: fastrand::u64(1..),
        }
    }

    pub fn epoch(&self) -> u64 {
        // Acquire pairs with the Release in `adopt`: a reader that sees the new epoch also sees
        // the reset stock that came before it.
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the lease still covers selling right now.
    pub fn can_sell(&self) -> bool {
        // Relaxed: a reading a few ns stale moves the fence by as much; the margin covers it.
        (self.origin.elapsed().as_millis() as u64) < self.sellable_until_ms.load(Ordering::Relaxed)
    }

    fn fence(&self) {
        self.sellable_until_ms.store(0, Ordering::Relaxed);
    }

    fn extend_lease(&self, sent: Instant) {
        let until =
            sent.saturating_duration_since(self.origin) + self.link.lease.saturating_sub(self.link.fence_margin);
        self.sellable_until_ms.fetch_max(until.as_millis() as u64, Ordering::Relaxed);
    }
}

/// Registers and heartbeats until `shutdown` fires.
pub async fn run(node: impl Leaseholder, membership: Arc<Membership>, shutdown: Shutdown) {
    while !shutdown.is_triggered() {
        let go_on = if register(&node, &membership).await {
            heartbeat_while_current(&node, &membership, &shutdown).await
        } else {
            pause(&shutdown, membership.link.heartbeat).await
        };
        if !go_on {
            return;
        }
    }
}

/// Starts afresh (fenced, epoch 0, no allotment) and asks for a lease; true once one was
/// adopted.
async fn register(node: &impl Leaseholder, membership: &Membership) -> bool {
    membership.fence();
    membership.epoch.store(0, Ordering::Release);
    node.drop_allotments();
    let sent = Instant::now();
    let request = RegisterRequest {
        version: PROTOCOL_VERSION,
        node: node.id().clone(),
        addr: membership.link.advertise.clone(),
        instance: membership.instance,
    };
    match membership.link.client.register(&request).await {
        Ok(LeaseAnswer::Assigned(assignment)) => {
            tracing::info!(node = %node.id(), epoch = assignment.epoch, worker_id = assignment.worker_id, "registered");
            adopt(node, membership, &assignment, sent);
            true
        }
        Ok(LeaseAnswer::FleetFull { max_nodes }) => {
            tracing::error!(
                node = %node.id(),
                max_nodes,
                "registration refused: the fleet holds [coordinator] max_nodes live nodes already; retrying until \
                 one leaves (or raise max_nodes on the members)"
            );
            false
        }
        Ok(other) => {
            tracing::warn!(node = %node.id(), "registration refused: {other:?}");
            false
        }
        Err(e) => {
            tracing::warn!(node = %node.id(), "cannot register: {e}");
            false
        }
    }
}

/// Heartbeats once a period while the coordinator renews the current epoch. Returns false when
/// `shutdown` fired, true when the node must register again (its epoch is stale or unknown).
async fn heartbeat_while_current(node: &impl Leaseholder, membership: &Membership, shutdown: &Shutdown) -> bool {
    loop {
        if !pause(shutdown, membership.link.heartbeat).await {
            return false;
        }
        let epoch = membership.epoch();
        let sent = Instant::now();
        let request =
            HeartbeatRequest { version: PROTOCOL_VERSION, node: node.id().clone(), epoch, reports: node.reports() };
        match membership.link.client.heartbeat(&request).await {
            Ok(LeaseAnswer::Assigned(assignment)) if assignment.epoch == epoch => {
                adopt(node, membership, &assignment, sent)
            }
            Ok(LeaseAnswer::StaleEpoch { current }) => {
                tracing::warn!(node = %node.id(), epoch, current, "epoch is stale; dropping the allotment and registering again");
                return true;
            }
            Ok(other) => {
                tracing::warn!(node = %node.id(), "heartbeat refused: {other:?}; registering again");
                return true;
            }
            // The lease runs out on its own; selling stops at the fence.
            Err(e) => tracing::warn!(node = %node.id(), "heartbeat failed: {e}"),
        }
    }
}

/// Waits `period`; false if `shutdown` fired first.
async fn pause(shutdown: &Shutdown, period: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(period) => true,
        () = shutdown.wait() => false,
    }
}

/// Applies an assignment: the epoch, new grants, the lease.
fn adopt(node: &impl Leaseholder, membership: &Membership, assignment: &Assignment, sent: Instant) {
    debug_assert_ne!(assignment.epoch, 0, "epoch 0 means unregistered; the coordinator never assigns it");
    // Before the epoch is published: no sale of the new epoch gets an id of the old worker id.
    // Opening a generator blocks only when the worker id changed (rare), for up to ~1 s.
    node.use_worker_id(assignment.worker_id);
    membership.epoch.store(assignment.epoch, Ordering::Release);
    // Terms first: a grant for a SKU created at run time needs the SKU to exist.
    node.apply_terms(&assignment.skus);
    node.apply_grants(&assignment.granted);
    // After the grants: the bound is on what the node holds with them.
    node.apply_hold_max(&assignment.hold_max);
    membership.extend_lease(sent);
}

/// Hands the lease back so the coordinator can reallocate at once instead of waiting for it to
/// run out. Called after the server has drained.
pub async fn leave(node: &impl Leaseholder, membership: &Membership) {
    membership.fence();
    let epoch = membership.epoch();
    if epoch == 0 {
        return;
    }
    let request = LeaveRequest { version: PROTOCOL_VERSION, node: node.id().clone(), epoch };
    match membership.link.client.leave(&request).await {
        Ok(outcome) => tracing::info!(node = %node.id(), epoch, "left the group: {outcome:?}"),
        Err(e) => tracing::warn!(node = %node.id(), "could not leave; the lease will expire instead: {e}"),
    }
}

/// What a heartbeat reports per SKU.
pub type Reports = BTreeMap<SkuId, SkuReport>;
