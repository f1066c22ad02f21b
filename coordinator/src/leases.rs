//! Leader-local leases: a heartbeat renews a node's lease and records its report in the leader's
//! memory, not in the raft log. Raft is written only when something the group must agree on
//! changes (registrations, leaves, expiries, grants, reallocations, the catalogue), so a steady
//! fleet of any size costs no log writes and no fsyncs.
//!
//! **Why this is safe.** What a lease protects is *fencing before revocation*: a node stops
//! selling at (send time of its last answered heartbeat + lease − margin) on its own clock, and
//! its allotment may move only after the leader saw (renewal + lease + grace) pass. Raft never
//! added anything to that argument except one thing, which this module keeps by other means:
//! every renewal a node was told about is known to whoever expires it.
//! - *Within one leadership* the renewal and the expiry meet in [`LeaseBook`], under one mutex:
//!   the leader marks a node as expiring only if its lease has still run out at that moment,
//!   and a heartbeat for a node marked expiring is refused (the node, fenced already, retries
//!   and, once the expiry is written, registers again). A renewal either lands before the
//!   mark, and the expiry is not written, or after it, and is not answered.
//! - *Across leaders* the new leader cannot know its predecessor's last renewals, so it counts
//!   every live node as renewed at the moment it took over ([`LeaseBook::view`]), and expires
//!   no one for a full lease (`policy`). That is enough because a renewal is answered only
//!   once a quorum has confirmed this member's leadership in a round recent enough that no
//!   successor can have been elected before the heartbeat arrived (`crate::quorum`: members
//!   that acknowledged a round refuse to elect anyone for a while after it). So every renewal
//!   the old leader answered arrived before the new one was elected, which is before it took
//!   over: the node's lease ends before (takeover + lease), the earliest moment the new
//!   leader's view lets it lapse, and the grace still lies beyond.
//!
//! The book is not replicated and never needs to be: losing it costs a new leader one lease of
//! patience, never a unit. The raft `Heartbeat` command is still applied from logs written by
//! older releases, and no longer written.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use protocol::{Assignment, LeaseAnswer, NodeId, SkuId, SkuReport};

use crate::state::ClusterState;

/// A node's latest renewal, as the leader answered it.
#[derive(Debug, Clone)]
struct Renewal {
    epoch: u64,
    lease_until_ms: u64,
    reports: BTreeMap<SkuId, SkuReport>,
    reported_at_ms: u64,
    /// The report before this one's `sold` figures and their time, for the sell rate.
    previous_sold: BTreeMap<SkuId, (u64, u64)>,
}

impl Renewal {
    fn new(epoch: u64) -> Renewal {
        Renewal {
            epoch,
            lease_until_ms: 0,
            reports: BTreeMap::new(),
            reported_at_ms: 0,
            previous_sold: BTreeMap::new(),
        }
    }
}

#[derive(Default)]
struct Book {
    renewals: HashMap<NodeId, Renewal>,
    /// (node, epoch) whose expiry is being written; their heartbeats are not answered.
    expiring: HashSet<(NodeId, u64)>,
    /// The control loop's last rebalance (policy rule 6): what each node should hold at most,
    /// per SKU, told in its heartbeats' answers until the next tick decides anew.
    hold_max: BTreeMap<NodeId, BTreeMap<SkuId, u64>>,
}

/// Why a renewal was not answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotRenewed {
    /// The node's lease ran out and its expiry is being written; it registers again after.
    Expiring,
}

/// The leader's leases, as renewed by heartbeats since it took over (or earlier leaderships of
/// this member: a renewal it answered then is still a lease it gave, so it only makes the
/// member more patient).
#[derive(Default)]
pub struct LeaseBook {
    book: Mutex<Book>,
}

impl LeaseBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        // A panic while holding it leaves plain data behind; the map is still usable.
        self.book.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Renews `node`'s lease under `epoch` to `now_ms + lease_ms` and records its report, if
    /// `state` still has the node live under that epoch. The answer is what the raft
    /// `Heartbeat` command used to answer.
    pub fn renew(
        &self,
        state: &ClusterState,
        node: &NodeId,
        epoch: u64,
        now_ms: u64,
        lease_ms: u64,
        reports: BTreeMap<SkuId, SkuReport>,
    ) -> Result<LeaseAnswer, NotRenewed> {
        let record = match state.fleet.nodes.get(node) {
            None => return Ok(LeaseAnswer::UnknownNode),
            Some(record) if !record.live || record.epoch != epoch => {
                return Ok(LeaseAnswer::StaleEpoch { current: record.epoch })
            }
            Some(record) => record,
        };
        let mut book = self.lock();
        if book.expiring.contains(&(node.clone(), epoch)) {
            return Err(NotRenewed::Expiring);
        }
        let renewal = book.renewals.entry(node.clone()).or_insert_with(|| Renewal::new(epoch));
        if renewal.epoch != epoch {
            *renewal = Renewal::new(epoch);
        }
        renewal.lease_until_ms = renewal.lease_until_ms.max(record.lease_until_ms).max(now_ms + lease_ms);
        renewal.previous_sold =
            renewal.reports.iter().map(|(sku, report)| (sku.clone(), (renewal.reported_at_ms, report.sold))).collect();
        renewal.reports = reports;
        renewal.reported_at_ms = now_ms;
        Ok(LeaseAnswer::Assigned(Assignment {
            epoch,
            worker_id: record.worker_id.unwrap_or(0),
            lease_until_ms: renewal.lease_until_ms,
            granted: record.granted.clone(),
            skus: state.catalogue.all_terms(),
            hold_max: book.hold_max.get(node).cloned().unwrap_or_default(),
        }))
    }

    /// The control loop's rebalance for every node, replacing the last one.
    pub fn set_hold_max(&self, hold_max: BTreeMap<NodeId, BTreeMap<SkuId, u64>>) {
        self.lock().hold_max = hold_max;
    }

    /// `state` as this leader sees it: each live node's lease is the latest of its replicated
    /// lease (registration), its renewals here, and `took_over_ms + lease_ms` (renewals a
    /// predecessor answered are not known here, and all arrived before the takeover); its
    /// reports are the latest renewal's. Forgets renewals of epochs that ended.
    pub fn view(&self, mut state: ClusterState, took_over_ms: u64, lease_ms: u64) -> ClusterState {
        let mut book = self.lock();
        book.renewals.retain(|node, renewal| {
            state.fleet.nodes.get(node).is_some_and(|record| record.live && record.epoch == renewal.epoch)
        });
        for (node, record) in state.fleet.nodes.iter_mut().filter(|(_, record)| record.live) {
            record.lease_until_ms = record.lease_until_ms.max(took_over_ms + lease_ms);
            if let Some(renewal) = book.renewals.get(node) {
                record.lease_until_ms = record.lease_until_ms.max(renewal.lease_until_ms);
                record.reports = renewal.reports.clone();
                record.reported_at_ms = renewal.reported_at_ms;
                record.previous_sold = renewal.previous_sold.clone();
            }
        }
        state
    }

    /// Marks `node` as expiring under `epoch` if its lease has still run out (+ grace) at
    /// `now_ms` by this book; from then on its heartbeats are refused until [`Self::expired`].
    /// False: a renewal landed since the decision, and the node must not be expired.
    pub fn begin_expiry(&self, node: &NodeId, epoch: u64, now_ms: u64, grace_ms: u64) -> bool {
        let mut book = self.lock();
        let renewed = book
            .renewals
            .get(node)
            .is_some_and(|renewal| renewal.epoch == epoch && renewal.lease_until_ms + grace_ms >= now_ms);
        if renewed {
            return false;
        }
        book.expiring.insert((node.clone(), epoch));
        true
    }

    /// The expiry of `node`'s `epoch` was written, or failed: either way the mark goes.
    pub fn expired(&self, node: &NodeId, epoch: u64) {
        self.lock().expiring.remove(&(node.clone(), epoch));
    }

    /// The lease `node` holds under `epoch` by this book, if it renewed here.
    pub fn lease_until_ms(&self, node: &NodeId, epoch: u64) -> Option<u64> {
        self.lock().renewals.get(node).filter(|renewal| renewal.epoch == epoch).map(|renewal| renewal.lease_until_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;

    fn id(name: &str) -> NodeId {
        NodeId::new(name).unwrap()
    }

    fn registered(lease_until_ms: u64) -> ClusterState {
        let mut state = ClusterState::default();
        state.apply(Command::Register {
            node: id("n1"),
            addr: "a".into(),
            instance: 1,
            lease_until_ms,
            max_live: None,
        });
        state
    }

    #[test]
    fn a_renewal_extends_the_lease_in_the_view_and_nowhere_in_the_state() {
        let state = registered(1_000);
        let book = LeaseBook::default();
        let answer = book.renew(&state, &id("n1"), 1, 5_000, 1_000, BTreeMap::new());
        assert!(matches!(answer, Ok(LeaseAnswer::Assigned(a)) if a.lease_until_ms == 6_000));
        assert_eq!(state.fleet.nodes[&id("n1")].lease_until_ms, 1_000, "the replicated state is untouched");
        let view = book.view(state, 0, 1_000);
        assert_eq!(view.fleet.nodes[&id("n1")].lease_until_ms, 6_000);
    }

    #[test]
    fn a_new_leader_counts_every_live_node_as_renewed_when_it_took_over() {
        let book = LeaseBook::default();
        let view = book.view(registered(1_000), 50_000, 2_000);
        assert_eq!(view.fleet.nodes[&id("n1")].lease_until_ms, 52_000);
    }

    #[test]
    fn stale_and_unknown_nodes_are_told_so_and_renew_nothing() {
        let state = registered(1_000);
        let book = LeaseBook::default();
        assert_eq!(
            book.renew(&state, &id("n1"), 7, 5_000, 1_000, BTreeMap::new()),
            Ok(LeaseAnswer::StaleEpoch { current: 1 })
        );
        assert_eq!(book.renew(&state, &id("n9"), 1, 5_000, 1_000, BTreeMap::new()), Ok(LeaseAnswer::UnknownNode));
        assert_eq!(book.lease_until_ms(&id("n1"), 1), None);
    }

    #[test]
    fn an_expiry_and_a_renewal_never_both_win() {
        let state = registered(1_000);
        let book = LeaseBook::default();
        // Renewed after the leader decided, before it marked: the mark is refused.
        book.renew(&state, &id("n1"), 1, 5_000, 1_000, BTreeMap::new()).unwrap();
        assert!(!book.begin_expiry(&id("n1"), 1, 5_500, 100), "a lease renewed since the decision is kept");
        // Lapsed by the book: marked, and heartbeats from then on are not answered.
        assert!(book.begin_expiry(&id("n1"), 1, 7_000, 100));
        assert_eq!(book.renew(&state, &id("n1"), 1, 7_001, 1_000, BTreeMap::new()), Err(NotRenewed::Expiring));
        assert_eq!(book.lease_until_ms(&id("n1"), 1), Some(6_000), "the refused heartbeat renewed nothing");
        book.expired(&id("n1"), 1);
        assert!(book.renew(&state, &id("n1"), 1, 7_002, 1_000, BTreeMap::new()).is_ok());
    }

    #[test]
    fn the_view_carries_reports_and_the_sell_rate_and_forgets_ended_epochs() {
        let mut state = registered(1_000);
        let book = LeaseBook::default();
        let sku = SkuId::new("s").unwrap();
        let report = |sold| SkuReport { sold, ..SkuReport::new(10, 0, 0) };
        book.renew(&state, &id("n1"), 1, 1_000, 1_000, BTreeMap::from([(sku.clone(), report(0))])).unwrap();
        book.renew(&state, &id("n1"), 1, 2_000, 1_000, BTreeMap::from([(sku.clone(), report(50))])).unwrap();
        let view = book.view(state.clone(), 0, 1_000);
        assert_eq!(view.fleet.nodes[&id("n1")].sell_rate(&sku), 50.0);
        state.apply(Command::Leave { node: id("n1"), epoch: 1, lease_until_ms: 0 });
        let _ = book.view(state, 0, 1_000);
        assert_eq!(book.lease_until_ms(&id("n1"), 1), None, "an ended epoch's renewal is forgotten");
    }
}
