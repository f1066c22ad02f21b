//! The replicated state machine. `apply` is deterministic: every time it needs comes stamped in
//! the command by the leader, so every member computes the same state from the same log.
//!
//! The state is three sub-states, each with its own changes and invariants, asserted on every
//! change it makes:
//! - [`Fleet`]: nodes, epochs, leases, worker ids, grants;
//! - [`Catalogue`]: SKUs, their terms and starting allotments;
//! - [`Locks`]: the coordinator-backed locks and their fence;
//! - [`Stripes`]: striped SKUs' own totals and the transfers between their stripes.
//!
//! **Formats.** [`Command`] is the raft log's record: its variants and fields keep their
//! serialized names across releases (new fields get serde defaults), so a member replays a log
//! written by an older one. Snapshots carry a format number: format 1 (before the split, no
//! number) is read and converted; a format newer than [`SNAPSHOT_FORMAT`] is refused with an
//! error naming both, rather than misread. Nodes never see these types: the HTTP edge maps
//! outcomes to `protocol` answers.

mod catalogue;
mod fleet;
mod locks;
mod stripes;

use std::collections::BTreeMap;

use protocol::locks::LockAnswer;
use protocol::{Buffer, LeaseAnswer, LeaveAnswer, NodeId, SkuId, SkuReport, SkuTerms};
use serde::{Deserialize, Serialize};

pub use self::catalogue::{Catalogue, CatalogueEntry, TermsChange};
pub use self::fleet::{Expiry, Fleet, GrantItem, NodeRecord, Refused, Registration};
pub use self::locks::{LockRecord, Locks};
pub use self::stripes::{Skipped, Stripes, Transfer};

/// The snapshot format this build writes; it reads this one and every older one.
/// Format 3 added the stripes' sub-state: a build that reads only format 2 would drop the units
/// in flight, so it refuses format 3. A state without striped SKUs is still written as format 2.
pub const SNAPSHOT_FORMAT: u32 = 3;

/// A change to the cluster state, as the raft log records it. Time-dependent fields are stamped
/// by the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Sets a SKU's terms and starting allotment per node, once: live nodes get their share
    /// now, others on their first registration; a rejoining node never does.
    DefineSku {
        sku: SkuId,
        starting: BTreeMap<NodeId, u64>,
        terms: SkuTerms,
    },
    /// An operator changed a defined SKU's buffer.
    SetBuffer {
        sku: SkuId,
        buffer: Buffer,
    },
    /// An operator raised a SKU's total (the ledger was restocked first).
    Restock {
        sku: SkuId,
        total: u64,
    },
    /// An operator closed a SKU's sale (the ledger was closed first).
    Close {
        sku: SkuId,
    },
    /// An operator changed the terms a SKU's orders are priced on (the ledger was changed
    /// first: orders already sold keep theirs).
    SetPricing {
        sku: SkuId,
        price: u64,
        currency: String,
        pay_timeout_s: u64,
    },
    /// A node joins or rejoins. `max_live`: the `[coordinator] max_nodes` the leader enforced
    /// (absent in records written before there was one: no bound).
    Register {
        node: NodeId,
        addr: String,
        instance: u64,
        lease_until_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_live: Option<u64>,
    },
    /// A node renewed its lease and reported its stock. Written by releases before leases moved
    /// into the leader's memory, still applied when their logs are replayed; never written now.
    Heartbeat {
        node: NodeId,
        epoch: u64,
        now_ms: u64,
        lease_until_ms: u64,
        reports: BTreeMap<SkuId, SkuReport>,
    },
    /// The leader saw the lease run out; applies only if it still has and the epoch matches.
    Expire {
        node: NodeId,
        epoch: u64,
        now_ms: u64,
        grace_ms: u64,
    },
    /// A node shutting down hands its lease back. `lease_until_ms` is the lease the leader had
    /// renewed it to (leases live in the leader's memory, not in this state), kept in the record
    /// for operators; 0 in logs written before leader-local leases.
    Leave {
        node: NodeId,
        epoch: u64,
        #[serde(default)]
        lease_until_ms: u64,
    },
    /// Adds units to live nodes; items for a stale epoch or a dead node are skipped.
    Grant {
        sku: SkuId,
        items: Vec<GrantItem>,
    },
    /// Settles one SKU of a node's ended epoch (fenced at the ledger first): grants its unsold
    /// units to live nodes and forgets the entry, once.
    Reallocate {
        node: NodeId,
        epoch: u64,
        sku: SkuId,
        items: Vec<GrantItem>,
    },
    AcquireLock {
        name: String,
        owner: String,
        hold: u64,
        ttl_ms: u64,
        now_ms: u64,
    },
    ReleaseLock {
        name: String,
        owner: String,
        fence: u64,
        hold: u64,
    },
    ExtendLock {
        name: String,
        owner: String,
        fence: u64,
        ttl_ms: u64,
        now_ms: u64,
    },
    /// Step 1 of moving up to `most` units from one stripe of a striped SKU to another; `id` is
    /// the state's next transfer id (a start with any other id changes nothing).
    TransferStarted {
        id: u64,
        sku: SkuId,
        from: u32,
        to: u32,
        most: u64,
    },
    /// Step 2: the source stripe's ledger gave `units` (`transfer_out`); they are in flight.
    TransferDebited {
        id: u64,
        units: u64,
    },
    /// Step 3: the destination stripe's ledger took them (`transfer_in`).
    TransferDone {
        id: u64,
    },
    /// An operator restocked a striped SKU by `units`: a transfer into stripe 0 with no source,
    /// in flight from here until its `TransferDone`.
    RestockStarted {
        id: u64,
        sku: SkuId,
        units: u64,
    },
}

/// The outcome of a command; business refusals are values, never storage errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Defined,
    /// A SKU's terms after an operator's change.
    Terms(SkuTerms),
    UnknownSku,
    /// A registration's or a heartbeat's answer, as the node receives it.
    Lease(LeaseAnswer),
    /// A leave's answer, as the node receives it.
    Leave(LeaveAnswer),
    /// The node was expired; these grants were revoked.
    Expired {
        revoked: BTreeMap<SkuId, u64>,
    },
    /// A renewal that raced the expiry won.
    StillLeased,
    /// The expiry named an epoch that is no longer live.
    NotLive,
    Granted {
        units: u64,
    },
    Lock(LockAnswer),
    /// A transfer step took effect.
    Transferred,
    /// A transfer step changed nothing.
    TransferSkipped(Skipped),
    /// A membership or blank entry.
    Nothing,
}

/// Everything the coordinator group agrees on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StoredState", into = "StoredState")]
pub struct ClusterState {
    pub fleet: Fleet,
    pub catalogue: Catalogue,
    pub locks: Locks,
    pub stripes: Stripes,
}

impl ClusterState {
    pub fn apply(&mut self, command: Command) -> Outcome {
        match command {
            Command::DefineSku { sku, starting, terms } => self.define(sku, starting, terms),
            Command::SetBuffer { sku, buffer } => self.change_terms(&sku, TermsChange::SetBuffer(buffer)),
            Command::Restock { sku, total } => self.restock(&sku, total),
            Command::Close { sku } => self.change_terms(&sku, TermsChange::Close),
            Command::SetPricing { sku, price, currency, pay_timeout_s } => {
                self.change_terms(&sku, TermsChange::SetPricing { price, currency, pay_timeout_s })
            }
            Command::Register { node, addr, instance, lease_until_ms, max_live } => {
                let catalogue = &self.catalogue;
                let starting = || catalogue.starting_for(&node);
                let registration = Registration { node: node.clone(), addr, instance, lease_until_ms, max_live };
                let registered = self.fleet.register(registration, starting, &catalogue.all_terms());
                Outcome::Lease(lease_answer(registered))
            }
            Command::Heartbeat { node, epoch, now_ms, lease_until_ms, reports } => {
                let skus = self.catalogue.all_terms();
                Outcome::Lease(lease_answer(self.fleet.heartbeat(&node, epoch, now_ms, lease_until_ms, reports, &skus)))
            }
            Command::Expire { node, epoch, now_ms, grace_ms } => {
                match self.fleet.expire(&node, epoch, now_ms, grace_ms) {
                    Ok(Expiry::Expired { revoked }) => Outcome::Expired { revoked },
                    Ok(Expiry::StillLeased) => Outcome::StillLeased,
                    Err(_) => Outcome::NotLive,
                }
            }
            Command::Leave { node, epoch, lease_until_ms } => {
                Outcome::Leave(match self.fleet.leave(&node, epoch, lease_until_ms) {
                    Ok(revoked) => LeaveAnswer::Left { revoked },
                    Err(Refused::StaleEpoch { current }) => LeaveAnswer::StaleEpoch { current },
                    Err(Refused::UnknownNode | Refused::NoWorkerId | Refused::FleetFull { .. }) => {
                        LeaveAnswer::UnknownNode
                    }
                })
            }
            Command::Grant { sku, items } => Outcome::Granted { units: self.fleet.grant(&sku, items) },
            Command::Reallocate { node, epoch, sku, items } => {
                Outcome::Granted { units: self.fleet.reallocate(&node, epoch, &sku, items) }
            }
            Command::AcquireLock { name, owner, hold, ttl_ms, now_ms } => {
                Outcome::Lock(self.locks.acquire(name, owner, hold, ttl_ms, now_ms))
            }
            Command::ReleaseLock { name, owner, fence, hold } => {
                Outcome::Lock(self.locks.release(&name, &owner, fence, hold))
            }
            Command::ExtendLock { name, owner, fence, ttl_ms, now_ms } => {
                Outcome::Lock(self.locks.extend(&name, &owner, fence, ttl_ms, now_ms))
            }
            Command::TransferStarted { id, sku, from, to, most } => {
                let transfer = Transfer { sku, from: Some(from), to, most, debited: None };
                self.transfer_step(|stripes, _| stripes.start(id, transfer))
            }
            Command::RestockStarted { id, sku, units } => {
                let transfer = Transfer { sku, from: None, to: 0, most: units, debited: Some(units) };
                self.transfer_step(|stripes, _| stripes.start(id, transfer))
            }
            Command::TransferDebited { id, units } => self.transfer_step(|stripes, catalogue| {
                if let Some((sku, from)) = stripes.debit(id, units)? {
                    catalogue.change(&sku.stripe(from), TermsChange::TransferOut(units)).ok_or(Skipped::NotStriped)?;
                }
                Ok(())
            }),
            Command::TransferDone { id } => self.transfer_step(|stripes, catalogue| {
                let (sku, to, units) = stripes.done(id)?;
                catalogue.change(&sku.stripe(to), TermsChange::TransferIn(units)).ok_or(Skipped::NotStriped)?;
                Ok(())
            }),
        }
    }

    fn define(&mut self, sku: SkuId, starting: BTreeMap<NodeId, u64>, terms: SkuTerms) -> Outcome {
        let (stripes, total) = (terms.stripes, terms.total);
        if self.catalogue.define(sku.clone(), terms, starting.clone()) {
            self.fleet.grant_starting(&sku, &starting);
            if stripes > 1 {
                let (parent, _) = sku.stripe_parent();
                self.stripes.defined(parent.clone(), stripes, total);
                self.assert_stripes(&parent);
            }
        }
        Outcome::Defined
    }

    /// An absolute total conflicts with transfers moving a striped SKU's units between its
    /// stripes: a striped SKU is restocked by `RestockStarted` instead, and this changes nothing.
    fn restock(&mut self, sku: &SkuId, total: u64) -> Outcome {
        let (parent, _) = sku.stripe_parent();
        if self.stripes.is_striped(&parent) {
            return self.catalogue.terms(sku).cloned().map(Outcome::Terms).unwrap_or(Outcome::UnknownSku);
        }
        self.change_terms(sku, TermsChange::Restock(total))
    }

    /// An operator's change to a SKU is a change to every stripe of it (stripe 0's terms answer).
    fn change_terms(&mut self, sku: &SkuId, change: TermsChange) -> Outcome {
        let stripes = self.stripes.skus.get(sku).map_or(1, |striped| striped.stripes);
        for index in 1..stripes {
            self.catalogue.change(&sku.stripe(index), change.clone());
        }
        self.catalogue.change(sku, change).map(Outcome::Terms).unwrap_or(Outcome::UnknownSku)
    }

    /// Runs one transfer step on a copy, so a step refused halfway leaves nothing behind, and
    /// asserts the striped SKUs' invariant after it.
    fn transfer_step(&mut self, step: impl FnOnce(&mut Stripes, &mut Catalogue) -> Result<(), Skipped>) -> Outcome {
        let (mut stripes, mut catalogue) = (self.stripes.clone(), self.catalogue.clone());
        if let Err(skipped) = step(&mut stripes, &mut catalogue) {
            return Outcome::TransferSkipped(skipped);
        }
        (self.stripes, self.catalogue) = (stripes, catalogue);
        let skus: Vec<SkuId> = self.stripes.skus.keys().cloned().collect();
        for sku in &skus {
            self.assert_stripes(sku);
        }
        Outcome::Transferred
    }

    fn assert_stripes(&self, sku: &SkuId) {
        let Some(striped) = self.stripes.skus.get(sku) else { return };
        let stripes = self.catalogue.stripe_totals(sku, striped.stripes);
        let in_flight = self.stripes.in_flight_of(sku);
        assert_eq!(
            stripes + in_flight,
            striped.total,
            "striped SKU {sku}: its stripes hold {stripes} and {in_flight} are in flight, but its total is {}",
            striped.total
        );
        assert!(self.stripes.in_flight.keys().all(|id| *id < self.stripes.next_id), "a transfer id was reused");
    }

    /// Live nodes in id order.
    pub fn live_nodes(&self) -> impl Iterator<Item = (&NodeId, &NodeRecord)> {
        self.fleet.live_nodes()
    }
}

fn lease_answer(result: Result<protocol::Assignment, Refused>) -> LeaseAnswer {
    match result {
        Ok(assignment) => LeaseAnswer::Assigned(assignment),
        Err(Refused::StaleEpoch { current }) => LeaseAnswer::StaleEpoch { current },
        Err(Refused::UnknownNode) => LeaseAnswer::UnknownNode,
        Err(Refused::NoWorkerId) => LeaseAnswer::NoWorkerId,
        Err(Refused::FleetFull { max_live }) => LeaseAnswer::FleetFull { max_nodes: max_live },
    }
}

/// The state as snapshots store it. Format 2 names the sub-states, format 3 adds the stripes';
/// format 1 (no `format`
/// field) kept the catalogue as two parallel maps and the locks at the top level.
#[derive(Serialize, Deserialize)]
struct StoredState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    format: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fleet: Option<Fleet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    catalogue: Option<Catalogue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lock_table: Option<Locks>,
    /// From format 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stripes: Option<Stripes>,
    // Format 1.
    #[serde(default, skip_serializing)]
    nodes: BTreeMap<NodeId, NodeRecord>,
    #[serde(default, skip_serializing)]
    skus: BTreeMap<SkuId, BTreeMap<NodeId, u64>>,
    #[serde(default, skip_serializing)]
    terms: BTreeMap<SkuId, SkuTerms>,
    #[serde(default, skip_serializing)]
    locks: BTreeMap<String, LockRecord>,
    #[serde(default, skip_serializing)]
    lock_fence: u64,
}

impl From<ClusterState> for StoredState {
    fn from(state: ClusterState) -> Self {
        // Until a striped SKU exists, the state is one format 2 describes whole: members of the
        // release before keep reading it (a rolling upgrade), and nothing is lost on them.
        let striped = state.stripes != Stripes::default();
        StoredState {
            format: Some(if striped { SNAPSHOT_FORMAT } else { 2 }),
            fleet: Some(state.fleet),
            catalogue: Some(state.catalogue),
            lock_table: Some(state.locks),
            stripes: striped.then_some(state.stripes),
            nodes: BTreeMap::new(),
            skus: BTreeMap::new(),
            terms: BTreeMap::new(),
            locks: BTreeMap::new(),
            lock_fence: 0,
        }
    }
}

impl TryFrom<StoredState> for ClusterState {
    type Error = String;

    fn try_from(stored: StoredState) -> Result<Self, String> {
        match stored.format {
            None | Some(1) => {
                let mut catalogue = Catalogue::default();
                for (sku, starting) in stored.skus {
                    let terms = stored
                        .terms
                        .get(&sku)
                        .cloned()
                        .ok_or_else(|| format!("format-1 snapshot: SKU {sku} has a plan but no terms"))?;
                    catalogue.define(sku, terms, starting);
                }
                Ok(ClusterState {
                    fleet: Fleet { nodes: stored.nodes },
                    catalogue,
                    locks: Locks { held: stored.locks, fence: stored.lock_fence },
                    stripes: Stripes::default(),
                })
            }
            // Format 2 knew no striped SKU: its stripes' state is empty.
            Some(2 | SNAPSHOT_FORMAT) => Ok(ClusterState {
                fleet: stored.fleet.unwrap_or_default(),
                catalogue: stored.catalogue.unwrap_or_default(),
                locks: stored.lock_table.unwrap_or_default(),
                stripes: stored.stripes.unwrap_or_default(),
            }),
            Some(newer) => Err(format!(
                "snapshot format {newer} was written by a newer seckill; this build reads formats up to \
                 {SNAPSHOT_FORMAT}: run the newer release, or start this member from an empty data_dir"
            )),
        }
    }
}

#[cfg(test)]
mod tests;
