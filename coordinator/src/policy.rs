//! The leader's policy, as pure functions: the cluster state, the ledger's figures and the time
//! in, the raft commands to write out. No I/O, no clock, no metrics: `control` reads the ledger,
//! calls these, writes what they return and counts what happened. Every rule that decides
//! whether stock goes unsold lives here and is table-tested.
//!
//! The rules:
//! 1. **Expiry.** A live node whose lease + grace has passed is expired — but a new leader first
//!    waits one full lease (renewals its predecessor accepted may not be in its view yet).
//! 2. **The brake.** When most live nodes lapse at once, the fault is more likely on the leader's
//!    side than on theirs, and expiring them would only move stock away from healthy nodes: hold.
//!    The hold is bounded by [`Timing::brake_hold_ms`] (one lease): the leader calls this policy
//!    only while it holds a quorum of members, and a lapsed node has fenced itself on its own
//!    clock (its lease − margin ran out before the leader's lease + grace), so it cannot sell
//!    whether it is dead or cut off; after the hold, expiring it only moves unsellable units to
//!    nodes that can sell them. Worst case from a node's last renewal to its units moving:
//!    lease + grace + hold + one tick.
//! 3. **Reallocation.** An ended epoch is fenced at the ledger first (so its count is final),
//!    then its unsold units (granted − sold by it) go to the live nodes by recent sell rate, and
//!    the epoch is settled in the same raft entry.
//! 4. **Top-up.** For every open SKU, Σ(live nodes' local + ungranted) ≥ ledger remaining +
//!    buffer; the gap is granted by sell rate. A node that reports it cannot reach the ledger
//!    holds nothing it can sell: its units do not count, and it gets no grant until it can. While starting up (the first two leases of a
//!    leadership), nodes of the plan that have not registered yet count as holding their
//!    starting allotment, so the first node up is not handed everything.
//! 5. **Joiners.** A live node granted nothing of an open SKU in its epoch (one that joined at
//!    run time, or came back under a new epoch) gets its even share of the target at once, in
//!    the same tick, on top of what the others hold: over the target by at most that share,
//!    which the ledger's cap makes harmless, so a node added mid-sale sells from its first
//!    heartbeat instead of waiting for the others' stock to drain towards it by sell rate.
//! 6. **Rebalance.** When the live nodes hold more than the target by more than one even share
//!    (a joiner's share came on top of full allotments), the nodes holding more than twice that
//!    share are asked to hold at most what brings the fleet back to the target plus one share,
//!    the richest first, none below one share. A node gives back what it holds beyond
//!    (`hold_max` in its heartbeat's answer); the units are then the top-up's, granted by sell
//!    rate. Units a node gave back and the leader counts as still held (its report is late)
//!    only delay this; the ledger's cap keeps any count safe.
//!
//! Over-granting is harmless (the ledger caps sales); under-granting leaves stock unsold, so
//! every rule errs towards granting.

use std::collections::BTreeMap;

use protocol::{NodeId, SkuId};

use crate::state::{ClusterState, Command, GrantItem};

/// The lease timings the rules work with, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub lease_ms: u64,
    pub grace_ms: u64,
    /// Longest the brake holds expiries back.
    pub brake_hold_ms: u64,
}

impl Timing {
    /// The brake holds for one lease: long enough to ride out a blip in the leader's own links
    /// (which a renewal inside the next lease would show), short enough that a real multi-node
    /// failure costs at most one extra lease of selling time.
    pub fn new(lease_ms: u64, grace_ms: u64) -> Self {
        Self { lease_ms, grace_ms, brake_hold_ms: lease_ms }
    }
}

/// The leader's memory between ticks (not replicated: a new leader starts afresh).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leadership {
    /// When this member became leader (wall-clock ms).
    pub since_ms: u64,
    /// When the brake engaged, while it holds.
    pub brake_since_ms: Option<u64>,
}

/// What the expiry rules decided this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiries {
    pub commands: Vec<Command>,
    /// Most live nodes lapsed and the brake held them back this tick.
    pub braked: bool,
    /// The brake had held for its bound and let them go this tick.
    pub brake_released: bool,
}

/// Rules 1 and 2: which lapsed nodes to expire now. Updates the brake in `leadership`.
pub fn expiries(state: &ClusterState, now_ms: u64, leadership: &mut Leadership, timing: Timing) -> Expiries {
    let none = Expiries { commands: Vec::new(), braked: false, brake_released: false };
    if now_ms < leadership.since_ms + timing.lease_ms {
        return none;
    }
    let live = state.live_nodes().count();
    let lapsed: Vec<(NodeId, u64)> = state
        .live_nodes()
        .filter(|(_, record)| record.lease_until_ms + timing.grace_ms < now_ms)
        .map(|(id, record)| (id.clone(), record.epoch))
        .collect();
    let most_lapsed = live > 1 && lapsed.len() * 2 > live;
    if !most_lapsed {
        leadership.brake_since_ms = None;
    }
    if lapsed.is_empty() {
        return none;
    }
    let mut brake_released = false;
    if most_lapsed {
        let since = *leadership.brake_since_ms.get_or_insert(now_ms);
        if now_ms < since + timing.brake_hold_ms {
            return Expiries { braked: true, ..none };
        }
        brake_released = true;
    }
    let commands = lapsed
        .into_iter()
        .map(|(node, epoch)| Command::Expire { node, epoch, now_ms, grace_ms: timing.grace_ms })
        .collect();
    Expiries { commands, braked: false, brake_released }
}

/// Rule 3: settles one SKU of an ended epoch, fenced at the ledger with `sold` its final count:
/// its unsold units go to the live nodes (none if it sold everything, or no node is live: the
/// top-up covers those later).
pub fn reallocation(state: &ClusterState, node: &NodeId, epoch: u64, sku: &SkuId, granted: u64, sold: u64) -> Command {
    let unsold = granted.saturating_sub(sold);
    let items = match grant(state, sku, unsold) {
        Some(Command::Grant { items, .. }) if unsold > 0 => items,
        _ => Vec::new(),
    };
    Command::Reallocate { node: node.clone(), epoch, sku: sku.clone(), items }
}

/// What the ledger says of a SKU, as the top-up needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerFigures {
    pub remaining: u64,
    pub closed: bool,
}

/// What the top-up found for one SKU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopUp {
    /// Units the live nodes should hold together: remaining + buffer (0 once closed or sold).
    pub target: u64,
    /// Units they hold or are about to hold.
    pub held: u64,
    pub command: Option<Command>,
    /// Rule 6: the most units each node so asked should hold.
    pub hold_max: BTreeMap<NodeId, u64>,
}

/// Rule 4 for one SKU.
pub fn top_up(
    state: &ClusterState,
    sku: &SkuId,
    ledger: LedgerFigures,
    now_ms: u64,
    leadership: &Leadership,
    timing: Timing,
) -> TopUp {
    let live_nodes = state.live_nodes().count() as u64;
    let held: u64 = state.live_nodes().map(|(_, record)| record.effective_local(sku)).sum();
    let target = match state.catalogue.terms(sku) {
        Some(terms) if !ledger.closed => terms.target_local(ledger.remaining, live_nodes),
        Some(_) => 0,
        None => ledger.remaining,
    };
    let starting_up = now_ms < leadership.since_ms + 2 * timing.lease_ms;
    let expected: u64 = match state.catalogue.skus.get(sku) {
        Some(entry) if starting_up => entry
            .starting
            .iter()
            .filter(|(node, _)| !state.fleet.nodes.contains_key(*node))
            .map(|(_, units)| units)
            .sum(),
        _ => 0,
    };
    let mut items = joiners_shares(state, sku, target.div_ceil(live_nodes.max(1)));
    let joining: u64 = items.iter().map(|item| item.units).sum();
    let gap = target.saturating_sub(held + expected + joining);
    if let Some(Command::Grant { items: by_rate, .. }) = (gap > 0).then(|| grant(state, sku, gap)).flatten() {
        items.extend(by_rate);
    }
    let command = (!items.is_empty()).then(|| Command::Grant { sku: sku.clone(), items });
    let held = held + joining;
    TopUp { target, held, command, hold_max: rebalance(state, sku, target, held) }
}

/// Rule 6 for one SKU whose live nodes hold `held` units against `target`.
fn rebalance(state: &ClusterState, sku: &SkuId, target: u64, held: u64) -> BTreeMap<NodeId, u64> {
    let mut able: Vec<(&NodeId, u64)> = state
        .live_nodes()
        .filter(|(_, record)| record.can_sell(sku))
        .map(|(node, record)| (node, record.effective_local(sku)))
        .collect();
    if able.is_empty() || target == 0 {
        return BTreeMap::new();
    }
    let share = target.div_ceil(able.len() as u64);
    let mut excess = held.saturating_sub(target.saturating_add(share));
    able.sort_by(|(a_node, a), (b_node, b)| b.cmp(a).then(a_node.cmp(b_node)));
    let mut hold_max = BTreeMap::new();
    for (node, local) in able {
        if excess == 0 || local <= 2 * share {
            break;
        }
        let give = (local - share).min(excess);
        hold_max.insert(node.clone(), local - give);
        excess -= give;
    }
    debug_assert!(hold_max.values().all(|max| *max >= share), "no node is asked below one share");
    hold_max
}

/// Rule 5: `share` for every live node that can sell `sku` and was granted none of it in its
/// epoch and holds none.
fn joiners_shares(state: &ClusterState, sku: &SkuId, share: u64) -> Vec<GrantItem> {
    if share == 0 {
        return Vec::new();
    }
    state
        .live_nodes()
        .filter(|(_, record)| {
            record.can_sell(sku)
                && record.effective_local(sku) == 0
                && record.granted.get(sku).copied().unwrap_or(0) == 0
        })
        .map(|(node, record)| GrantItem { node: node.clone(), epoch: record.epoch, units: share })
        .collect()
}

/// A grant of `units` over the live nodes that can reach the ledger, in proportion to their
/// recent sell rate (evenly if none is selling yet); `None` without such nodes.
fn grant(state: &ClusterState, sku: &SkuId, units: u64) -> Option<Command> {
    let live: Vec<_> = state.live_nodes().filter(|(_, record)| record.can_sell(sku)).collect();
    if live.is_empty() {
        return None;
    }
    let rates: Vec<f64> = live.iter().map(|(_, record)| record.sell_rate(sku)).collect();
    // A node that sells nothing (restarted, or dry) would get no share while any other sells,
    // and so never sell again: every live node gets a tenth of the mean rate on top.
    let floor = rates.iter().sum::<f64>() / rates.len() as f64 / 10.0;
    let weights: Vec<f64> = rates.iter().map(|rate| rate + floor).collect();
    let items = live
        .iter()
        .zip(split(units, &weights))
        .filter(|(_, share)| *share > 0)
        .map(|((node, record), share)| GrantItem { node: (*node).clone(), epoch: record.epoch, units: share })
        .collect();
    Some(Command::Grant { sku: sku.clone(), items })
}

/// An even split of `total` over `nodes`, each share with `buffer` on top: the starting
/// allotments of a SKU created at run time.
pub fn even_starting(total: u64, nodes: &[NodeId], buffer: protocol::Buffer) -> BTreeMap<NodeId, u64> {
    let shares = split(total, &vec![1.0; nodes.len()]);
    nodes.iter().cloned().zip(shares).map(|(node, share)| (node, share + buffer.units(share))).collect()
}

/// Splits `units` by `weights` with largest remainders, so the parts add up exactly; all-zero
/// weights split evenly.
pub fn split(units: u64, weights: &[f64]) -> Vec<u64> {
    if weights.is_empty() {
        return Vec::new();
    }
    let total: f64 = weights.iter().sum();
    let weights: Vec<f64> = if total > 0.0 { weights.to_vec() } else { vec![1.0; weights.len()] };
    let total: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| units as f64 * w / total).collect();
    let mut shares: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let mut left = units - shares.iter().sum::<u64>().min(units);
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|a, b| (exact[*b] - exact[*b].floor()).total_cmp(&(exact[*a] - exact[*a].floor())));
    for at in order.into_iter().cycle() {
        if left == 0 {
            break;
        }
        shares[at] += 1;
        left -= 1;
    }
    shares
}

#[cfg(test)]
mod tests;
