//! A coordinator answered in process: registrations open a new epoch with no grants, heartbeats
//! renew it with the grants the script made, and the script can take the group down or end a
//! node's epoch (as the real leader does when a lease lapses: it ends the epoch at the ledger
//! first, then tells the node its epoch is stale).

use std::collections::BTreeMap;
use std::sync::Mutex;

use node::Coordinator;
use protocol::{
    Assignment, ClientError, HeartbeatRequest, LeaseAnswer, LeaveAnswer, LeaveRequest, NodeId, RegisterRequest, SkuId,
    SkuTerms,
};

#[derive(Default)]
pub struct ScriptCoordinator {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Every call fails as if no member answered.
    down: bool,
    /// The last epoch handed out, fleet-wide.
    last_epoch: u64,
    /// Each node's current epoch and its cumulative grants in it.
    leases: BTreeMap<NodeId, (u64, BTreeMap<SkuId, u64>)>,
    /// What each node is told to hold at most, per SKU.
    hold_max: BTreeMap<NodeId, BTreeMap<SkuId, u64>>,
    terms: BTreeMap<SkuId, SkuTerms>,
}

impl ScriptCoordinator {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    pub fn set_down(&self, down: bool) {
        self.state().down = down;
    }

    pub fn define(&self, sku: SkuId, terms: SkuTerms) {
        self.state().terms.insert(sku, terms);
    }

    pub fn close(&self, sku: &SkuId) {
        if let Some(terms) = self.state().terms.get_mut(sku) {
            terms.closed = true;
        }
    }

    /// Adds `units` to the node's cumulative grant of `sku` in its current epoch; the node
    /// hears of it at its next heartbeat.
    pub fn grant(&self, node: &NodeId, sku: &SkuId, units: u64) -> Result<u64, String> {
        let mut state = self.state();
        let (_, granted) = state.leases.get_mut(node).ok_or("the node holds no lease")?;
        let total = granted.entry(sku.clone()).or_insert(0);
        *total += units;
        Ok(*total)
    }

    /// Tells the node, from its next heartbeat on, to hold at most `units` of `sku`.
    pub fn hold_max(&self, node: &NodeId, sku: &SkuId, units: u64) {
        self.state().hold_max.entry(node.clone()).or_default().insert(sku.clone(), units);
    }

    /// Ends the node's epoch: its next heartbeat is told the epoch is stale. Returns the epoch.
    pub fn end_epoch(&self, node: &NodeId) -> Option<u64> {
        self.state().leases.remove(node).map(|(epoch, _)| epoch)
    }

    fn assignment(state: &State, node: &NodeId) -> Option<Assignment> {
        let (epoch, granted) = state.leases.get(node)?;
        Some(Assignment {
            epoch: *epoch,
            worker_id: 1,
            lease_until_ms: 0,
            granted: granted.clone(),
            skus: state.terms.clone(),
            hold_max: state.hold_max.get(node).cloned().unwrap_or_default(),
        })
    }
}

fn unreachable() -> ClientError {
    ClientError::Unavailable("the scripted coordinator is down".into())
}

#[async_trait::async_trait]
impl Coordinator for ScriptCoordinator {
    async fn register(&self, request: &RegisterRequest) -> Result<LeaseAnswer, ClientError> {
        let mut state = self.state();
        if state.down {
            return Err(unreachable());
        }
        state.last_epoch += 1;
        let epoch = state.last_epoch;
        state.leases.insert(request.node.clone(), (epoch, BTreeMap::new()));
        Ok(Self::assignment(&state, &request.node).map_or(LeaseAnswer::UnknownNode, LeaseAnswer::Assigned))
    }

    async fn heartbeat(&self, request: &HeartbeatRequest) -> Result<LeaseAnswer, ClientError> {
        let state = self.state();
        if state.down {
            return Err(unreachable());
        }
        match state.leases.get(&request.node) {
            Some((epoch, _)) if *epoch == request.epoch => {
                Ok(Self::assignment(&state, &request.node).map_or(LeaseAnswer::UnknownNode, LeaseAnswer::Assigned))
            }
            _ => Ok(LeaseAnswer::StaleEpoch { current: state.last_epoch }),
        }
    }

    async fn leave(&self, request: &LeaveRequest) -> Result<LeaveAnswer, ClientError> {
        let mut state = self.state();
        if state.down {
            return Err(unreachable());
        }
        state.leases.remove(&request.node);
        Ok(LeaveAnswer::Left { revoked: BTreeMap::new() })
    }
}
