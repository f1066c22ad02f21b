//! The replicated state machine: which nodes are alive under which epoch, what each holds, and
//! the per-SKU starting plan. `apply` is deterministic: every time it needs comes stamped in the
//! command by the leader, so every member computes the same state from the same log.
//!
//! It also keeps the fleet's coordinator-backed locks (`safeguards::lock`): who holds each, until
//! when (leader time), and one fencing counter for all of them.
//!
//! Invariants (asserted after every apply):
//! - a node's `granted` only grows within one epoch, and is empty while the node is not live;
//! - a worker id is held by at most one live node;
//! - epochs only grow;
//! - a lock record has 1..=`LOCK_HOLDS_MAX` holds and a fence no greater than `lock_fence`.

use std::collections::{BTreeMap, BTreeSet};

use ledger::{NodeId, SkuId};
use serde::{Deserialize, Serialize};

use crate::config::Buffer;

/// Holds one owner may stack on one lock; the same bound as the Redis backend.
const LOCK_HOLDS_MAX: usize = safeguards::lock::LOCK_HOLDS_MAX as usize;

/// Worker ids are 10 bits in the Snowflake layout the order-id generator uses: the generator's
/// own bound, so the two cannot disagree.
pub const WORKER_IDS_MAX: u16 = safeguards::idgen::WORKER_IDS_MAX;

/// What one node reported about one SKU in its last heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuReport {
    /// Units in its local allotment.
    pub local_remaining: u64,
    /// Units of `granted` it has added to its allotment so far (grants reach it by heartbeat).
    pub applied: u64,
    /// Units it sold in this epoch.
    pub sold: u64,
}

/// One node as the coordinator knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub addr: String,
    /// Bumped on every registration and every expiry: a node holding an older epoch must
    /// re-register before selling again.
    pub epoch: u64,
    pub live: bool,
    /// Leader wall-clock ms until which the lease holds.
    pub lease_until_ms: u64,
    /// The node process that holds the current epoch; a repeated registration from it is the
    /// same registration (its first answer was lost), not a new epoch.
    #[serde(default)]
    pub instance: u64,
    pub worker_id: Option<u16>,
    /// Units granted per SKU in the current epoch, cumulative.
    pub granted: BTreeMap<SkuId, u64>,
    /// The last heartbeat's report, and the one before (for the sell rate).
    pub reports: BTreeMap<SkuId, SkuReport>,
    pub reported_at_ms: u64,
    pub previous_sold: BTreeMap<SkuId, (u64, u64)>,
}

impl NodeRecord {
    /// Units this node holds or is about to hold: its reported local stock plus grants it has
    /// not applied yet.
    pub fn effective_local(&self, sku: &SkuId) -> u64 {
        let report = self.reports.get(sku).cloned().unwrap_or_default();
        let granted = self.granted.get(sku).copied().unwrap_or(0);
        report.local_remaining + granted.saturating_sub(report.applied)
    }

    /// Units per second sold between the last two heartbeats.
    pub fn sell_rate(&self, sku: &SkuId) -> f64 {
        let (Some((then_ms, then_sold)), Some(now)) = (self.previous_sold.get(sku), self.reports.get(sku)) else {
            return 0.0;
        };
        let elapsed_ms = self.reported_at_ms.saturating_sub(*then_ms);
        if elapsed_ms == 0 {
            return 0.0;
        }
        now.sold.saturating_sub(*then_sold) as f64 * 1000.0 / elapsed_ms as f64
    }
}

/// The terms a SKU is sold on, as the group agreed them: from `cluster.toml` or the admin API.
/// Nodes learn them with every assignment, so a SKU created at run time reaches every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuTerms {
    /// The total as last set here; the ledger's own figure is the one that counts.
    pub total: u64,
    /// Units one user may buy; 0 = no limit.
    pub per_user_limit: u32,
    pub qty_max: u32,
    /// Sale window in Unix ms.
    pub starts_at_ms: Option<u64>,
    pub ends_at_ms: Option<u64>,
    /// How many units beyond the ledger's remaining count the live nodes hold together: the
    /// leader tops allotments up to remaining + this, per live node.
    pub buffer: Buffer,
    /// Closed by an operator: nodes stop selling it (the ledger already refuses).
    pub closed: bool,
    /// Purchases must present a submit token (the ledger enforces it; nodes refuse a purchase
    /// without one from memory). Defaults keep logs written before tokens existed readable.
    #[serde(default)]
    pub require_token: bool,
    /// How long a submit token issued for this SKU stays usable, in seconds.
    #[serde(default = "token_ttl_s_default")]
    pub token_ttl_s: u64,
}

fn token_ttl_s_default() -> u64 {
    ledger::TOKEN_TTL_DEFAULT.as_secs()
}

impl SkuTerms {
    /// Units the live nodes should hold together when the ledger has `remaining` left.
    pub fn target_local(&self, remaining: u64, live_nodes: u64) -> u64 {
        if remaining == 0 || self.closed || live_nodes == 0 {
            return 0;
        }
        let buffer = match self.buffer {
            Buffer::Units(units) => units.saturating_mul(live_nodes),
            // Each node's share of `remaining` is remaining / live; its buffer a percentage of it.
            Buffer::Percent(_) => self.buffer.units(remaining),
        };
        remaining.saturating_add(buffer)
    }
}

/// What a node is told after registering or renewing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub epoch: u64,
    pub worker_id: u16,
    pub lease_until_ms: u64,
    /// Cumulative grants per SKU in this epoch; the node adds what it has not applied yet.
    pub granted: BTreeMap<SkuId, u64>,
    /// Every SKU the group knows, with its current terms.
    #[serde(default)]
    pub skus: BTreeMap<SkuId, SkuTerms>,
}

/// One grant of units to a live node, valid only for the named epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantItem {
    pub node: NodeId,
    pub epoch: u64,
    pub units: u64,
}

/// A lock held through the coordinator. The holder is an owner token; each acquisition by it is
/// a hold id, so a retried acquisition or release (its answer was lost) changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord {
    pub owner: String,
    pub fence: u64,
    pub holds: BTreeSet<u64>,
    /// Leader wall-clock ms at which the lock frees itself unless extended.
    pub expires_at_ms: u64,
}

/// A change to the cluster state. Time-dependent fields are stamped by the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Sets a SKU's terms and starting allotment per node (from `cluster.toml` or the admin
    /// API), once: live nodes get their share now, others on their first registration; a
    /// rejoining node never does.
    DefineSku { sku: SkuId, starting: BTreeMap<NodeId, u64>, terms: SkuTerms },
    /// An operator changed a defined SKU's buffer.
    SetBuffer { sku: SkuId, buffer: Buffer },
    /// An operator raised a SKU's total (the ledger was restocked first).
    Restock { sku: SkuId, total: u64 },
    /// An operator closed a SKU's sale (the ledger was closed first).
    Close { sku: SkuId },
    /// A node joins or rejoins: a new epoch, a worker id, and its starting allotment if it never
    /// registered before (zero otherwise: whatever it held was revoked or will be).
    Register { node: NodeId, addr: String, instance: u64, lease_until_ms: u64 },
    /// A node renews its lease and reports its stock.
    Heartbeat { node: NodeId, epoch: u64, now_ms: u64, lease_until_ms: u64, reports: BTreeMap<SkuId, SkuReport> },
    /// The leader saw the lease run out; applies only if it still has (a racing heartbeat may
    /// have renewed it) and the epoch still matches.
    Expire { node: NodeId, epoch: u64, now_ms: u64, grace_ms: u64 },
    /// A node shutting down hands its lease back.
    Leave { node: NodeId, epoch: u64 },
    /// Adds units to live nodes; items for a stale epoch or a dead node are skipped.
    Grant { sku: SkuId, items: Vec<GrantItem> },
    /// Takes a free (or expired) lock with a new fence, or adds a hold for the owner holding it.
    AcquireLock { name: String, owner: String, hold: u64, ttl_ms: u64, now_ms: u64 },
    /// Drops a hold, if the owner holds the lock under that fence; the last hold frees it.
    ReleaseLock { name: String, owner: String, fence: u64, hold: u64 },
    /// Moves the expiry to `now_ms + ttl_ms`, if the owner holds the live lock under that fence.
    ExtendLock { name: String, owner: String, fence: u64, ttl_ms: u64, now_ms: u64 },
}

/// The outcome of a command; business refusals are values, never storage errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Defined,
    /// A SKU's terms after an operator's change.
    Terms(SkuTerms),
    UnknownSku,
    Assigned(Assignment),
    /// The node's epoch is not the current one: it must re-register.
    StaleEpoch {
        current: u64,
    },
    UnknownNode,
    NoWorkerId,
    /// The node was expired; these grants were revoked.
    Expired {
        revoked: BTreeMap<SkuId, u64>,
    },
    StillLeased,
    Left {
        revoked: BTreeMap<SkuId, u64>,
    },
    Granted {
        units: u64,
    },
    /// The caller holds the lock; `holds` counts its holds.
    LockAcquired {
        fence: u64,
        holds: u32,
    },
    /// Another owner holds the lock for `retry_after_ms` more, unless it is extended.
    LockHeld {
        retry_after_ms: u64,
    },
    LockReleased {
        holds_left: u32,
    },
    LockExtended,
    /// The lock is not the caller's (expired, taken over, or never held).
    LockNotHeld,
    /// The owner already holds the lock `LOCK_HOLDS_MAX` times.
    LockHoldsMax,
    /// A membership or blank entry.
    Nothing,
}

/// Everything the coordinator group agrees on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Each defined SKU's starting allotment per node.
    pub skus: BTreeMap<SkuId, BTreeMap<NodeId, u64>>,
    pub nodes: BTreeMap<NodeId, NodeRecord>,
    /// Each defined SKU's terms (same keys as `skus`).
    #[serde(default)]
    pub terms: BTreeMap<SkuId, SkuTerms>,
    /// Live locks by name (expired ones are dropped on the next acquisition). `default`: states
    /// snapshotted before locks existed load with none.
    #[serde(default)]
    pub locks: BTreeMap<String, LockRecord>,
    /// The last fencing token handed out, to any lock. One counter for all names: it only grows,
    /// so each name's fences strictly increase, and a freed lock leaves no record behind.
    #[serde(default)]
    pub lock_fence: u64,
}

impl ClusterState {
    pub fn apply(&mut self, command: Command) -> Outcome {
        let outcome = match command {
            Command::DefineSku { sku, starting, terms } => {
                if !self.skus.contains_key(&sku) {
                    self.terms.insert(sku.clone(), terms);
                    // Nodes that registered before the SKU existed get their starting share now;
                    // later first registrations get it in `register`.
                    for (node, record) in self.nodes.iter_mut().filter(|(_, r)| r.live) {
                        let units = starting.get(node).copied().unwrap_or(0);
                        *record.granted.entry(sku.clone()).or_insert(0) += units;
                    }
                    self.skus.insert(sku, starting);
                }
                Outcome::Defined
            }
            Command::SetBuffer { sku, buffer } => self.change_terms(&sku, |terms| terms.buffer = buffer),
            Command::Restock { sku, total } => self.change_terms(&sku, |terms| terms.total = terms.total.max(total)),
            Command::Close { sku } => self.change_terms(&sku, |terms| terms.closed = true),
            Command::Register { node, addr, instance, lease_until_ms } => {
                self.register(node, addr, instance, lease_until_ms)
            }
            Command::Heartbeat { node, epoch, now_ms, lease_until_ms, reports } => {
                self.heartbeat(&node, epoch, now_ms, lease_until_ms, reports)
            }
            Command::Expire { node, epoch, now_ms, grace_ms } => match self.nodes.get_mut(&node) {
                None => Outcome::UnknownNode,
                Some(record) if record.epoch != epoch || !record.live => Outcome::StaleEpoch { current: record.epoch },
                Some(record) if record.lease_until_ms + grace_ms >= now_ms => Outcome::StillLeased,
                Some(record) => Outcome::Expired { revoked: retire(record) },
            },
            Command::Leave { node, epoch } => match self.nodes.get_mut(&node) {
                None => Outcome::UnknownNode,
                Some(record) if record.epoch != epoch || !record.live => Outcome::StaleEpoch { current: record.epoch },
                Some(record) => Outcome::Left { revoked: retire(record) },
            },
            Command::Grant { sku, items } => {
                let mut units = 0;
                for item in items {
                    if let Some(record) = self.nodes.get_mut(&item.node) {
                        if record.live && record.epoch == item.epoch {
                            *record.granted.entry(sku.clone()).or_insert(0) += item.units;
                            units += item.units;
                        }
                    }
                }
                Outcome::Granted { units }
            }
            Command::AcquireLock { name, owner, hold, ttl_ms, now_ms } => {
                self.acquire_lock(name, owner, hold, ttl_ms, now_ms)
            }
            Command::ReleaseLock { name, owner, fence, hold } => match self.locks.get_mut(&name) {
                Some(lock) if lock.owner == owner && lock.fence == fence => {
                    lock.holds.remove(&hold);
                    let holds_left = lock.holds.len() as u32;
                    if holds_left == 0 {
                        self.locks.remove(&name);
                    }
                    Outcome::LockReleased { holds_left }
                }
                _ => Outcome::LockNotHeld,
            },
            Command::ExtendLock { name, owner, fence, ttl_ms, now_ms } => match self.locks.get_mut(&name) {
                Some(lock) if lock.owner == owner && lock.fence == fence && lock.expires_at_ms > now_ms => {
                    lock.expires_at_ms = now_ms + ttl_ms;
                    Outcome::LockExtended
                }
                _ => Outcome::LockNotHeld,
            },
        };
        self.check_invariants();
        outcome
    }

    fn change_terms(&mut self, sku: &SkuId, change: impl FnOnce(&mut SkuTerms)) -> Outcome {
        match self.terms.get_mut(sku) {
            Some(terms) => {
                change(terms);
                Outcome::Terms(terms.clone())
            }
            None => Outcome::UnknownSku,
        }
    }

    fn register(&mut self, node: NodeId, addr: String, instance: u64, lease_until_ms: u64) -> Outcome {
        if let Some(record) = self.nodes.get_mut(&node).filter(|r| r.live && r.instance == instance) {
            record.lease_until_ms = record.lease_until_ms.max(lease_until_ms);
            let worker_id = record.worker_id.unwrap_or(0);
            return Outcome::Assigned(assignment(record, worker_id, &self.terms));
        }
        let first_time = !self.nodes.contains_key(&node);
        let held: BTreeSet<u16> =
            self.nodes.iter().filter(|(id, r)| r.live && **id != node).filter_map(|(_, r)| r.worker_id).collect();
        let previous = self.nodes.get(&node).and_then(|r| r.worker_id).filter(|id| !held.contains(id));
        let Some(worker_id) = previous.or_else(|| (0..WORKER_IDS_MAX).find(|id| !held.contains(id))) else {
            return Outcome::NoWorkerId;
        };
        let granted: BTreeMap<SkuId, u64> = if first_time {
            self.skus.iter().map(|(sku, starting)| (sku.clone(), starting.get(&node).copied().unwrap_or(0))).collect()
        } else {
            BTreeMap::new()
        };
        let record = self.nodes.entry(node).or_insert_with(|| NodeRecord {
            addr: String::new(),
            epoch: 0,
            live: false,
            lease_until_ms: 0,
            instance: 0,
            worker_id: None,
            granted: BTreeMap::new(),
            reports: BTreeMap::new(),
            reported_at_ms: 0,
            previous_sold: BTreeMap::new(),
        });
        record.addr = addr;
        record.epoch += 1;
        record.live = true;
        record.lease_until_ms = lease_until_ms;
        record.instance = instance;
        record.worker_id = Some(worker_id);
        record.granted = granted;
        record.reports.clear();
        record.previous_sold.clear();
        Outcome::Assigned(assignment(record, worker_id, &self.terms))
    }

    fn heartbeat(
        &mut self,
        node: &NodeId,
        epoch: u64,
        now_ms: u64,
        lease_until_ms: u64,
        reports: BTreeMap<SkuId, SkuReport>,
    ) -> Outcome {
        let Some(record) = self.nodes.get_mut(node) else { return Outcome::UnknownNode };
        if record.epoch != epoch || !record.live {
            return Outcome::StaleEpoch { current: record.epoch };
        }
        record.lease_until_ms = record.lease_until_ms.max(lease_until_ms);
        record.previous_sold =
            record.reports.iter().map(|(sku, report)| (sku.clone(), (record.reported_at_ms, report.sold))).collect();
        record.reports = reports;
        record.reported_at_ms = now_ms;
        let worker_id = record.worker_id.unwrap_or(0);
        Outcome::Assigned(assignment(record, worker_id, &self.terms))
    }

    fn acquire_lock(&mut self, name: String, owner: String, hold: u64, ttl_ms: u64, now_ms: u64) -> Outcome {
        // An expired lock is free for everyone; dropping them all here keeps the map to live
        // locks. Deterministic: `now_ms` is in the command.
        self.locks.retain(|_, lock| lock.expires_at_ms > now_ms);
        match self.locks.get_mut(&name) {
            Some(lock) if lock.owner == owner => {
                if !lock.holds.contains(&hold) && lock.holds.len() >= LOCK_HOLDS_MAX {
                    return Outcome::LockHoldsMax;
                }
                lock.holds.insert(hold);
                lock.expires_at_ms = now_ms + ttl_ms;
                Outcome::LockAcquired { fence: lock.fence, holds: lock.holds.len() as u32 }
            }
            Some(lock) => Outcome::LockHeld { retry_after_ms: lock.expires_at_ms - now_ms },
            None => {
                self.lock_fence += 1;
                let fence = self.lock_fence;
                let lock = LockRecord { owner, fence, holds: BTreeSet::from([hold]), expires_at_ms: now_ms + ttl_ms };
                self.locks.insert(name, lock);
                Outcome::LockAcquired { fence, holds: 1 }
            }
        }
    }

    fn check_invariants(&self) {
        for (name, lock) in &self.locks {
            assert!(!lock.holds.is_empty(), "lock {name} is held with no hold");
            assert!(lock.holds.len() <= LOCK_HOLDS_MAX, "lock {name} has more than LOCK_HOLDS_MAX holds");
            assert!(lock.fence <= self.lock_fence, "lock {name} has a fence above the counter");
        }
        let mut workers = BTreeSet::new();
        for (id, record) in &self.nodes {
            assert!(record.live || record.granted.is_empty(), "node {id} is not live but holds grants");
            if record.live {
                if let Some(worker) = record.worker_id {
                    assert!(workers.insert(worker), "worker id {worker} held by two live nodes");
                }
            }
        }
    }

    /// Live nodes in id order.
    pub fn live_nodes(&self) -> impl Iterator<Item = (&NodeId, &NodeRecord)> {
        self.nodes.iter().filter(|(_, r)| r.live)
    }
}

/// Ends a node's epoch: bumps it (so the old one is stale everywhere), frees its worker id and
/// revokes its grants, returned so the leader can reallocate them.
fn retire(record: &mut NodeRecord) -> BTreeMap<SkuId, u64> {
    record.live = false;
    record.epoch += 1;
    record.worker_id = None;
    record.reports.clear();
    record.previous_sold.clear();
    std::mem::take(&mut record.granted)
}

fn assignment(record: &NodeRecord, worker_id: u16, terms: &BTreeMap<SkuId, SkuTerms>) -> Assignment {
    Assignment {
        epoch: record.epoch,
        worker_id,
        lease_until_ms: record.lease_until_ms,
        granted: record.granted.clone(),
        skus: terms.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> NodeId {
        NodeId::new(name).unwrap()
    }

    fn sku() -> SkuId {
        SkuId::new("s").unwrap()
    }

    fn terms() -> SkuTerms {
        SkuTerms {
            total: 100,
            per_user_limit: 1,
            qty_max: 1,
            starts_at_ms: None,
            ends_at_ms: None,
            buffer: Buffer::Percent(10),
            closed: false,
            require_token: false,
            token_ttl_s: 300,
        }
    }

    fn state_with_two_nodes() -> ClusterState {
        let mut state = ClusterState::default();
        let starting = BTreeMap::from([(id("n1"), 60), (id("n2"), 50)]);
        state.apply(Command::DefineSku { sku: sku(), starting, terms: terms() });
        for node in ["n1", "n2"] {
            state.apply(Command::Register {
                node: id(node),
                addr: format!("{node}:1"),
                instance: 1,
                lease_until_ms: 1_000,
            });
        }
        state
    }

    #[test]
    fn first_registration_gets_the_starting_allotment_and_a_restarted_node_gets_nothing() {
        let mut state = state_with_two_nodes();
        assert_eq!(state.nodes[&id("n1")].granted[&sku()], 60);
        let again =
            state.apply(Command::Register { node: id("n1"), addr: "n1:1".into(), instance: 2, lease_until_ms: 2_000 });
        let Outcome::Assigned(assignment) = again else { panic!("{again:?}") };
        assert_eq!(assignment.epoch, 2);
        assert!(assignment.granted.is_empty(), "a rejoining node starts from zero");
    }

    #[test]
    fn nodes_registered_before_a_sku_exists_get_their_starting_share_once() {
        let mut state = ClusterState::default();
        state.apply(Command::Register { node: id("n1"), addr: "n1:1".into(), instance: 1, lease_until_ms: 1_000 });
        let starting = BTreeMap::from([(id("n1"), 60), (id("n2"), 50)]);
        state.apply(Command::DefineSku { sku: sku(), starting: starting.clone(), terms: terms() });
        assert_eq!(state.nodes[&id("n1")].granted[&sku()], 60);
        state.apply(Command::DefineSku { sku: sku(), starting, terms: terms() });
        assert_eq!(state.nodes[&id("n1")].granted[&sku()], 60, "defining again grants nothing more");
    }

    #[test]
    fn a_repeated_registration_from_the_same_process_is_the_same_registration() {
        let mut state = state_with_two_nodes();
        let again = Command::Register { node: id("n1"), addr: "n1:1".into(), instance: 1, lease_until_ms: 2_000 };
        let Outcome::Assigned(assignment) = state.apply(again) else { panic!() };
        assert_eq!((assignment.epoch, assignment.granted[&sku()]), (1, 60), "same epoch, same grants");
        let restarted = Command::Register { node: id("n1"), addr: "n1:1".into(), instance: 2, lease_until_ms: 2_000 };
        let Outcome::Assigned(assignment) = state.apply(restarted) else { panic!() };
        assert_eq!(assignment.epoch, 2, "a new process starts a new epoch");
    }

    #[test]
    fn expiry_rechecks_the_lease_and_the_epoch() {
        let mut state = state_with_two_nodes();
        let renew = Command::Heartbeat {
            node: id("n1"),
            epoch: 1,
            now_ms: 900,
            lease_until_ms: 5_000,
            reports: BTreeMap::new(),
        };
        state.apply(renew);
        let early = state.apply(Command::Expire { node: id("n1"), epoch: 1, now_ms: 4_000, grace_ms: 100 });
        assert_eq!(early, Outcome::StillLeased, "a renewal that raced the expiry wins");
        let stale = state.apply(Command::Expire { node: id("n1"), epoch: 0, now_ms: 9_000, grace_ms: 100 });
        assert_eq!(stale, Outcome::StaleEpoch { current: 1 });
        let expired = state.apply(Command::Expire { node: id("n1"), epoch: 1, now_ms: 9_000, grace_ms: 100 });
        assert_eq!(expired, Outcome::Expired { revoked: BTreeMap::from([(sku(), 60)]) });
        let record = &state.nodes[&id("n1")];
        assert!(!record.live && record.epoch == 2 && record.worker_id.is_none());
        let late =
            Command::Heartbeat { node: id("n1"), epoch: 1, now_ms: 9_001, lease_until_ms: 1, reports: BTreeMap::new() };
        assert_eq!(state.apply(late), Outcome::StaleEpoch { current: 2 }, "the old epoch cannot renew");
    }

    #[test]
    fn grants_reach_only_live_nodes_of_the_named_epoch() {
        let mut state = state_with_two_nodes();
        state.apply(Command::Leave { node: id("n2"), epoch: 1 });
        let items = vec![
            GrantItem { node: id("n1"), epoch: 1, units: 7 },
            GrantItem { node: id("n2"), epoch: 1, units: 7 },
            GrantItem { node: id("n1"), epoch: 9, units: 7 },
        ];
        assert_eq!(state.apply(Command::Grant { sku: sku(), items }), Outcome::Granted { units: 7 });
        assert_eq!(state.nodes[&id("n1")].granted[&sku()], 67);
    }

    #[test]
    fn worker_ids_are_unique_among_live_nodes_and_reused_after_release() {
        let mut state = state_with_two_nodes();
        let worker = |state: &ClusterState, node: &str| state.nodes[&id(node)].worker_id;
        assert_ne!(worker(&state, "n1"), worker(&state, "n2"));
        let freed = worker(&state, "n2");
        state.apply(Command::Leave { node: id("n2"), epoch: 1 });
        state.apply(Command::Register { node: id("n3"), addr: "n3:1".into(), instance: 1, lease_until_ms: 1 });
        assert_eq!(worker(&state, "n3"), freed, "a released worker id is handed out again");
    }

    #[test]
    fn effective_local_counts_grants_not_yet_applied() {
        let mut state = state_with_two_nodes();
        let report = SkuReport { local_remaining: 10, applied: 60, sold: 50 };
        let beat = Command::Heartbeat {
            node: id("n1"),
            epoch: 1,
            now_ms: 500,
            lease_until_ms: 1_500,
            reports: BTreeMap::from([(sku(), report)]),
        };
        state.apply(beat);
        state.apply(Command::Grant { sku: sku(), items: vec![GrantItem { node: id("n1"), epoch: 1, units: 5 }] });
        assert_eq!(state.nodes[&id("n1")].effective_local(&sku()), 15);
    }

    #[test]
    fn operators_change_terms_of_defined_skus_only_and_nodes_hear_of_them() {
        let mut state = state_with_two_nodes();
        let unknown = SkuId::new("nope").unwrap();
        assert_eq!(state.apply(Command::Close { sku: unknown }), Outcome::UnknownSku);
        state.apply(Command::SetBuffer { sku: sku(), buffer: Buffer::Units(7) });
        state.apply(Command::Restock { sku: sku(), total: 150 });
        let lower = state.apply(Command::Restock { sku: sku(), total: 120 });
        let Outcome::Terms(terms) = lower else { panic!("{lower:?}") };
        assert_eq!((terms.buffer, terms.total), (Buffer::Units(7), 150), "a total never goes down");
        state.apply(Command::Close { sku: sku() });
        let beat =
            Command::Heartbeat { node: id("n1"), epoch: 1, now_ms: 1, lease_until_ms: 2, reports: BTreeMap::new() };
        let Outcome::Assigned(assignment) = state.apply(beat) else { panic!() };
        assert!(assignment.skus[&sku()].closed, "the next heartbeat carries the close");
    }

    #[test]
    fn the_buffer_sets_how_much_the_live_nodes_hold_beyond_remaining() {
        let mut terms = terms();
        assert_eq!(terms.target_local(200, 4), 220, "10% of remaining");
        terms.buffer = Buffer::Units(5);
        assert_eq!(terms.target_local(200, 4), 220, "5 per live node");
        assert_eq!(terms.target_local(0, 4), 0, "nothing to hold once sold out");
        terms.closed = true;
        assert_eq!(terms.target_local(200, 4), 0, "nothing to hold once closed");
    }

    fn acquire(state: &mut ClusterState, owner: &str, hold: u64, now_ms: u64) -> Outcome {
        state.apply(Command::AcquireLock { name: "sweeper".into(), owner: owner.into(), hold, ttl_ms: 1_000, now_ms })
    }

    #[test]
    fn a_lock_excludes_other_owners_until_released_or_expired_and_fences_grow() {
        let mut state = ClusterState::default();
        assert_eq!(acquire(&mut state, "a", 1, 0), Outcome::LockAcquired { fence: 1, holds: 1 });
        assert_eq!(acquire(&mut state, "b", 1, 400), Outcome::LockHeld { retry_after_ms: 600 });
        let not_b = Command::ReleaseLock { name: "sweeper".into(), owner: "b".into(), fence: 1, hold: 1 };
        assert_eq!(state.apply(not_b), Outcome::LockNotHeld, "nobody releases another's lock");
        let not_b = Command::ExtendLock { name: "sweeper".into(), owner: "b".into(), fence: 1, ttl_ms: 1, now_ms: 1 };
        assert_eq!(state.apply(not_b), Outcome::LockNotHeld, "nobody extends another's lock");
        assert_eq!(acquire(&mut state, "b", 1, 1_000), Outcome::LockAcquired { fence: 2, holds: 1 }, "expired");
        let late = Command::ExtendLock { name: "sweeper".into(), owner: "a".into(), fence: 1, ttl_ms: 1, now_ms: 1 };
        assert_eq!(state.apply(late), Outcome::LockNotHeld, "the old holder cannot extend");
        let release = Command::ReleaseLock { name: "sweeper".into(), owner: "b".into(), fence: 2, hold: 1 };
        assert_eq!(state.apply(release), Outcome::LockReleased { holds_left: 0 });
        assert!(state.locks.is_empty());
        assert_eq!(acquire(&mut state, "a", 2, 1_001), Outcome::LockAcquired { fence: 3, holds: 1 });
    }

    #[test]
    fn reentry_keeps_the_fence_and_repeated_calls_change_nothing() {
        let mut state = ClusterState::default();
        assert_eq!(acquire(&mut state, "a", 1, 0), Outcome::LockAcquired { fence: 1, holds: 1 });
        assert_eq!(acquire(&mut state, "a", 2, 10), Outcome::LockAcquired { fence: 1, holds: 2 });
        assert_eq!(acquire(&mut state, "a", 2, 20), Outcome::LockAcquired { fence: 1, holds: 2 }, "a retry");
        let release = Command::ReleaseLock { name: "sweeper".into(), owner: "a".into(), fence: 1, hold: 2 };
        assert_eq!(state.apply(release.clone()), Outcome::LockReleased { holds_left: 1 });
        assert_eq!(state.apply(release), Outcome::LockReleased { holds_left: 1 }, "a retried release");
        for hold in 3..=LOCK_HOLDS_MAX as u64 + 1 {
            acquire(&mut state, "a", hold, 30);
        }
        assert_eq!(acquire(&mut state, "a", 999, 40), Outcome::LockHoldsMax);
    }
}
