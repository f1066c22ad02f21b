//! The fleet: which nodes are alive under which epoch, until when their lease holds, which worker
//! id each holds, what each was granted in its epoch and what it last reported.
//!
//! Invariants (asserted on every change, see [`Fleet::check`]):
//! - a node's epoch only grows;
//! - within one epoch a node's grants only grow (revocation ends the epoch);
//! - a node that is not live holds no grants and no worker id; a live one holds a worker id;
//! - a worker id is held by at most one live node;
//! - an ended epoch awaiting settlement is older than the node's current epoch.
//!
//! **Settlement.** Ending an epoch (expiry or leave) records what it was granted as
//! *unsettled*. The leader then fences the epoch at the ledger (`CatalogueLedger::end_epoch`, which also
//! returns the epoch's final sales) and writes one `Reallocate` per SKU that grants the unsold
//! rest to live nodes and settles the entry in the same raft entry: a leader that dies halfway
//! leaves the entry for the next one, and a settled entry is never granted twice. Until its
//! node's ended epochs are settled, the worker id it held stays *quarantined*: no other node
//! gets it, so a holder that was only paused cannot stamp an order id that another node also
//! stamps (once fenced at the ledger, nothing it stamps can sell).

use std::collections::{BTreeMap, BTreeSet};

use protocol::{Assignment, NodeId, SkuId, SkuReport, SkuTerms};
use serde::{Deserialize, Serialize};

/// Worker ids are 10 bits in the Snowflake layout the order-id generator uses: the generator's
/// own bound, so the two cannot disagree.
pub const WORKER_IDS_MAX: u16 = safeguards::idgen::WORKER_IDS_MAX;

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
    /// Ended epochs whose grants are not settled yet: epoch → SKU → units granted in it.
    #[serde(default)]
    pub unsettled: BTreeMap<u64, BTreeMap<SkuId, u64>>,
    /// The worker id of an ended epoch, kept from other nodes until `unsettled` is empty.
    #[serde(default)]
    pub quarantined_worker: Option<u16>,
}

impl NodeRecord {
    fn new() -> Self {
        Self {
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
            unsettled: BTreeMap::new(),
            quarantined_worker: None,
        }
    }

    /// Units this node can sell now or soon: its reported local stock plus grants it has not
    /// applied yet; none while it reports that it cannot reach the ledger (units it cannot
    /// confirm are as good as gone, and counting them would stop the top-up from replacing them).
    pub fn effective_local(&self, sku: &SkuId) -> u64 {
        let granted = self.granted.get(sku).copied().unwrap_or(0);
        match self.reports.get(sku) {
            None => granted,
            Some(report) if !report.ledger_reachable => 0,
            Some(report) => report.local_remaining + granted.saturating_sub(report.applied),
        }
    }

    /// Whether grants of `sku` to this node can be sold: not while it cannot reach the ledger.
    pub fn can_sell(&self, sku: &SkuId) -> bool {
        self.reports.get(sku).is_none_or(|report| report.ledger_reachable)
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

    fn assignment(&self, skus: &BTreeMap<SkuId, SkuTerms>) -> Assignment {
        Assignment {
            epoch: self.epoch,
            worker_id: self.worker_id.unwrap_or(0),
            lease_until_ms: self.lease_until_ms,
            granted: self.granted.clone(),
            skus: skus.clone(),
            // The leader's memory, not the log's: see `crate::leases`.
            hold_max: BTreeMap::new(),
        }
    }

    /// Ends the epoch: bumps it (so the old one is stale everywhere), frees the worker id and
    /// revokes the grants, returned so the leader can reallocate them.
    fn retire(&mut self) -> BTreeMap<SkuId, u64> {
        let granted = std::mem::take(&mut self.granted);
        let held: BTreeMap<SkuId, u64> =
            granted.iter().filter(|(_, units)| **units > 0).map(|(s, u)| (s.clone(), *u)).collect();
        if !held.is_empty() {
            self.unsettled.insert(self.epoch, held);
            self.quarantined_worker = self.worker_id;
        }
        self.live = false;
        self.epoch += 1;
        self.worker_id = None;
        self.reports.clear();
        self.previous_sold.clear();
        granted
    }
}

/// One grant of units to a live node, valid only for the named epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantItem {
    pub node: NodeId,
    pub epoch: u64,
    pub units: u64,
}

/// Why the fleet refused a node's call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    StaleEpoch {
        current: u64,
    },
    UnknownNode,
    NoWorkerId,
    /// `max_live` nodes are live already and this one is not among them.
    FleetFull {
        max_live: u64,
    },
}

/// A node's registration, as the leader wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub node: NodeId,
    /// Where it serves purchases.
    pub addr: String,
    /// Its process, so a retried registration is the same registration.
    pub instance: u64,
    pub lease_until_ms: u64,
    /// Live nodes allowed at most; `None`: no bound.
    pub max_live: Option<u64>,
}

/// Whether an expiry happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expiry {
    Expired {
        revoked: BTreeMap<SkuId, u64>,
    },
    /// A renewal that raced the expiry won.
    StillLeased,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fleet {
    pub nodes: BTreeMap<NodeId, NodeRecord>,
}

/// What a change must not undo, captured before it: a node's epoch and, within that epoch, its
/// grants.
pub(super) struct Before {
    epoch: u64,
    granted: BTreeMap<SkuId, u64>,
}

impl Fleet {
    /// Live nodes in id order.
    pub fn live_nodes(&self) -> impl Iterator<Item = (&NodeId, &NodeRecord)> {
        self.nodes.iter().filter(|(_, r)| r.live)
    }

    /// A node joins or rejoins: a new epoch and a worker id, with `starting` as its grants if
    /// it never registered before (zero otherwise: whatever it held was revoked or will be).
    /// A repeated registration from the same process is the same registration.
    pub fn register(
        &mut self,
        registration: Registration,
        starting: impl FnOnce() -> BTreeMap<SkuId, u64>,
        skus: &BTreeMap<SkuId, SkuTerms>,
    ) -> Result<Assignment, Refused> {
        let Registration { node, addr, instance, lease_until_ms, max_live } = registration;
        let before = self.before(&node);
        if let Some(record) = self.nodes.get_mut(&node).filter(|r| r.live && r.instance == instance) {
            record.lease_until_ms = record.lease_until_ms.max(lease_until_ms);
            return Ok(record.assignment(skus));
        }
        // A live node registering again (a restart) takes its own place, not a new one.
        let others_live = self.live_nodes().filter(|(id, _)| **id != node).count() as u64;
        if let Some(max_live) = max_live.filter(|max_live| others_live >= *max_live) {
            return Err(Refused::FleetFull { max_live });
        }
        let first_time = !self.nodes.contains_key(&node);
        let held: BTreeSet<u16> = self
            .nodes
            .iter()
            .filter(|(id, _)| **id != node)
            .flat_map(|(_, r)| [r.worker_id.filter(|_| r.live), r.quarantined_worker])
            .flatten()
            .collect();
        let own = self.nodes.get(&node).and_then(|r| r.worker_id.or(r.quarantined_worker));
        let previous = own.filter(|id| !held.contains(id));
        let Some(worker_id) = previous.or_else(|| (0..WORKER_IDS_MAX).find(|id| !held.contains(id))) else {
            return Err(Refused::NoWorkerId);
        };
        let granted = if first_time { starting() } else { BTreeMap::new() };
        let record = self.nodes.entry(node.clone()).or_insert_with(NodeRecord::new);
        record.addr = addr;
        record.epoch += 1;
        record.live = true;
        record.lease_until_ms = lease_until_ms;
        record.instance = instance;
        record.worker_id = Some(worker_id);
        record.granted = granted;
        record.reports.clear();
        record.previous_sold.clear();
        let assignment = record.assignment(skus);
        self.check(&node, before);
        Ok(assignment)
    }

    /// A node renews its lease and reports its stock.
    pub fn heartbeat(
        &mut self,
        node: &NodeId,
        epoch: u64,
        now_ms: u64,
        lease_until_ms: u64,
        reports: BTreeMap<SkuId, SkuReport>,
        skus: &BTreeMap<SkuId, SkuTerms>,
    ) -> Result<Assignment, Refused> {
        let record = self.live_record(node, epoch)?;
        record.lease_until_ms = record.lease_until_ms.max(lease_until_ms);
        record.previous_sold =
            record.reports.iter().map(|(sku, report)| (sku.clone(), (record.reported_at_ms, report.sold))).collect();
        record.reports = reports;
        record.reported_at_ms = now_ms;
        Ok(record.assignment(skus))
    }

    /// The leader saw the lease run out; applies only if it still has (a racing heartbeat may
    /// have renewed it) and the epoch still matches.
    pub fn expire(&mut self, node: &NodeId, epoch: u64, now_ms: u64, grace_ms: u64) -> Result<Expiry, Refused> {
        let before = self.before(node);
        let record = self.live_record(node, epoch)?;
        if record.lease_until_ms + grace_ms >= now_ms {
            return Ok(Expiry::StillLeased);
        }
        let revoked = record.retire();
        self.check(node, before);
        Ok(Expiry::Expired { revoked })
    }

    /// A node shutting down hands its lease back (renewed up to `lease_until_ms` by the leader).
    pub fn leave(&mut self, node: &NodeId, epoch: u64, lease_until_ms: u64) -> Result<BTreeMap<SkuId, u64>, Refused> {
        let before = self.before(node);
        let record = self.live_record(node, epoch)?;
        record.lease_until_ms = record.lease_until_ms.max(lease_until_ms);
        let revoked = record.retire();
        self.check(node, before);
        Ok(revoked)
    }

    /// Adds units to live nodes; items for a stale epoch or a dead node are skipped. Returns
    /// the units granted.
    pub fn grant(&mut self, sku: &SkuId, items: Vec<GrantItem>) -> u64 {
        let mut units = 0;
        for item in items {
            let before = self.before(&item.node);
            if let Some(record) = self.nodes.get_mut(&item.node).filter(|r| r.live && r.epoch == item.epoch) {
                *record.granted.entry(sku.clone()).or_insert(0) += item.units;
                units += item.units;
                self.check(&item.node, before);
            }
        }
        units
    }

    /// Settles one SKU of an ended epoch: grants `items` and forgets the entry, in one step. An
    /// entry already settled (a retry after a leader change) grants nothing. Returns the units
    /// granted.
    pub fn reallocate(&mut self, node: &NodeId, epoch: u64, sku: &SkuId, items: Vec<GrantItem>) -> u64 {
        let Some(record) = self.nodes.get_mut(node) else { return 0 };
        let Some(skus) = record.unsettled.get_mut(&epoch) else { return 0 };
        if skus.remove(sku).is_none() {
            return 0;
        }
        if skus.is_empty() {
            record.unsettled.remove(&epoch);
        }
        if record.unsettled.is_empty() {
            record.quarantined_worker = None;
        }
        self.grant(sku, items)
    }

    /// Every ended epoch not settled yet: (node, epoch, SKU → units granted in it).
    pub fn unsettled(&self) -> impl Iterator<Item = (&NodeId, u64, &BTreeMap<SkuId, u64>)> {
        self.nodes
            .iter()
            .flat_map(|(node, record)| record.unsettled.iter().map(move |(epoch, skus)| (node, *epoch, skus)))
    }

    /// A SKU was just defined: every live node gets its starting share now (later first
    /// registrations get it in `register`).
    pub fn grant_starting(&mut self, sku: &SkuId, starting: &BTreeMap<NodeId, u64>) {
        let items = self
            .live_nodes()
            .map(|(node, record)| GrantItem {
                node: node.clone(),
                epoch: record.epoch,
                units: starting.get(node).copied().unwrap_or(0),
            })
            .collect();
        self.grant(sku, items);
    }

    fn live_record(&mut self, node: &NodeId, epoch: u64) -> Result<&mut NodeRecord, Refused> {
        match self.nodes.get_mut(node) {
            None => Err(Refused::UnknownNode),
            Some(record) if record.epoch != epoch || !record.live => Err(Refused::StaleEpoch { current: record.epoch }),
            Some(record) => Ok(record),
        }
    }

    pub(super) fn before(&self, node: &NodeId) -> Before {
        self.nodes
            .get(node)
            .map(|r| Before { epoch: r.epoch, granted: r.granted.clone() })
            .unwrap_or(Before { epoch: 0, granted: BTreeMap::new() })
    }

    /// Checks the invariants a change to `node` could break: its own in release builds (a
    /// violation means two epochs could sell the same units), the whole fleet in debug builds.
    pub(super) fn check(&self, node: &NodeId, before: Before) {
        let Some(record) = self.nodes.get(node) else { return };
        assert!(record.epoch >= before.epoch, "node {node}: epoch went back from {} to {}", before.epoch, record.epoch);
        if record.epoch == before.epoch {
            for (sku, units) in &before.granted {
                let now = record.granted.get(sku).copied().unwrap_or(0);
                assert!(now >= *units, "node {node}: grant of {sku} shrank within epoch {}", record.epoch);
            }
        }
        assert!(record.live || record.granted.is_empty(), "node {node} is not live but holds grants");
        assert_eq!(record.live, record.worker_id.is_some(), "node {node}: a worker id is held exactly while live");
        if let Some((ended, _)) = record.unsettled.last_key_value() {
            assert!(
                *ended < record.epoch,
                "node {node}: unsettled epoch {ended} is not over (current {})",
                record.epoch
            );
        }
        // Only a registration hands out a worker id (and bumps the epoch): count holders then.
        if let Some(worker) = record.worker_id.filter(|_| record.epoch != before.epoch) {
            let holders = self.live_nodes().filter(|(_, r)| r.worker_id == Some(worker)).count();
            assert_eq!(holders, 1, "worker id {worker} held by {holders} live nodes");
        }
        debug_assert!(self.check_all().is_ok(), "{:?}", self.check_all());
    }

    /// Every invariant over the whole fleet (O(nodes)): for debug builds and tests.
    pub fn check_all(&self) -> Result<(), String> {
        let mut workers = BTreeSet::new();
        for (id, record) in &self.nodes {
            if !record.live && !record.granted.is_empty() {
                return Err(format!("node {id} is not live but holds grants"));
            }
            if record.live != record.worker_id.is_some() {
                return Err(format!("node {id}: a worker id is held exactly while live"));
            }
            if let Some(worker) = record.worker_id.filter(|_| record.live) {
                if !workers.insert(worker) {
                    return Err(format!("worker id {worker} held by two live nodes"));
                }
            }
        }
        for (id, record) in &self.nodes {
            let Some(worker) = record.quarantined_worker else { continue };
            let other = self.live_nodes().find(|(other, r)| *other != id && r.worker_id == Some(worker));
            if let Some((other, _)) = other {
                return Err(format!("worker id {worker} is quarantined for {id} but held by {other}"));
            }
        }
        Ok(())
    }
}
