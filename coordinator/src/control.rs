//! The leader's control loop. Every tick, on the leader only:
//!
//! 1. Define the SKUs of `cluster.toml` that the group does not know yet, creating their ledgers
//!    first if absent. Creation happens once in a SKU's life, recorded in the raft log: if Redis
//!    later loses its data, nothing here recreates the stock (nodes refuse to sell instead).
//! 2. Expire nodes whose lease (+ grace) has run out, unless most nodes look dead at once (then
//!    the fault is more likely our own network, and reallocating would only move stock away
//!    from healthy nodes). A new leader waits one full lease first: renewals the old leader
//!    accepted may not be in its view yet.
//! 3. Grant each expired node's unsold units (granted − sold in its epoch, sold read from the
//!    ledger) to the live nodes, in proportion to their recent sell rate.
//! 4. Keep Σ(local remaining of live nodes) ≥ ledger remaining + the SKU's buffer for every
//!    open SKU; top up the gap. The buffer is what lets the fleet keep selling at full speed while
//!    a dead node's allotment waits for reallocation.
//!
//! Over-granting is harmless (the ledger caps sales); under-granting leaves stock unsold, so
//! every rule errs towards granting.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ledger::{NodeId, Seller, SkuId};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::member::{now_ms, MemberInner};
use crate::state::{Command, GrantItem, NodeRecord, Outcome};

/// Registers the decision counters so they render as 0 before the first decision.
pub fn register_metrics(member: &str) {
    let member = member.to_string();
    metrics::counter!("seckill_coordinator_expiries_total", "member" => member.clone()).increment(0);
    metrics::counter!("seckill_coordinator_brake_total", "member" => member.clone()).increment(0);
    for reason in ["reallocation", "top_up"] {
        metrics::counter!("seckill_coordinator_granted_units_total", "member" => member.clone(), "reason" => reason)
            .increment(0);
    }
}

/// Raft and fleet gauges, set when `/metrics` is scraped.
pub fn publish_gauges(member: &MemberInner) {
    let metrics = member.raft.metrics().borrow().clone();
    let name = member.name.clone();
    let leader = f64::from(u8::from(metrics.current_leader == Some(member.id)));
    metrics::gauge!("seckill_coordinator_is_leader", "member" => name.clone()).set(leader);
    metrics::gauge!("seckill_coordinator_term", "member" => name.clone()).set(metrics.current_term as f64);
    let last_log = metrics.last_log_index.unwrap_or(0) as f64;
    metrics::gauge!("seckill_coordinator_last_log_index", "member" => name.clone()).set(last_log);
    let live = member.store.read().state.live_nodes().count() as f64;
    metrics::gauge!("seckill_coordinator_live_nodes", "member" => name).set(live);
}

pub async fn run(member: Arc<MemberInner>, mut stop: watch::Receiver<bool>) {
    let tick = (member.config.heartbeat / 2).max(Duration::from_millis(20));
    let mut leader_since: Option<Instant> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        if !member.is_leader() {
            leader_since = None;
            continue;
        }
        let since = *leader_since.get_or_insert_with(|| {
            tracing::info!(member = %member.name, "leading; waiting one lease before expiring anyone");
            Instant::now()
        });
        // Decisions below read the state; make sure it is the latest the group agreed on.
        if let Err(e) = member.raft.ensure_linearizable().await {
            tracing::debug!("not reallocating: {e}");
            continue;
        }
        if let Err(e) = step(&member, since).await {
            tracing::warn!(member = %member.name, "control step failed: {e}");
        }
    }
}

async fn step(member: &MemberInner, leader_since: Instant) -> Result<(), String> {
    for plan in &member.plans {
        let sku = &plan.spec.sku;
        if !member.store.read().state.skus.contains_key(sku) {
            let created = member.ledger.create_sku(&plan.spec).await.map_err(|e| e.to_string())?;
            tracing::info!(%sku, ?created, "defining SKU");
            let command =
                Command::DefineSku { sku: sku.clone(), starting: plan.starting.clone(), terms: plan.terms.clone() };
            write(member, command).await?;
        }
    }
    let lease = member.config.lease;
    if leader_since.elapsed() >= lease {
        expire(member).await?;
    }
    if member.config.reallocate {
        top_up(member, leader_since.elapsed() < lease * 2).await?;
    }
    Ok(())
}

async fn write(member: &MemberInner, command: Command) -> Result<Outcome, String> {
    member.write(command).await.map_err(|e| format!("{e:?}"))
}

async fn expire(member: &MemberInner) -> Result<(), String> {
    let now = now_ms();
    let grace = member.config.grace.as_millis() as u64;
    let state = member.store.read().state;
    let live = state.live_nodes().count();
    let lapsed: Vec<(NodeId, u64)> = state
        .live_nodes()
        .filter(|(_, record)| record.lease_until_ms + grace < now)
        .map(|(id, record)| (id.clone(), record.epoch))
        .collect();
    if lapsed.is_empty() {
        return Ok(());
    }
    if live > 1 && lapsed.len() * 2 > live {
        metrics::counter!("seckill_coordinator_brake_total", "member" => member.name.clone()).increment(1);
        tracing::warn!(
            lapsed = lapsed.len(),
            live,
            "most nodes look dead at once; suspecting this member's network, not reallocating"
        );
        return Ok(());
    }
    for (node, epoch) in lapsed {
        let outcome =
            write(member, Command::Expire { node: node.clone(), epoch, now_ms: now, grace_ms: grace }).await?;
        let Outcome::Expired { revoked } = outcome else { continue };
        metrics::counter!("seckill_coordinator_expiries_total", "member" => member.name.clone()).increment(1);
        tracing::warn!(%node, epoch, ?revoked, "lease expired; node's epoch ended and its allotment revoked");
        if member.config.reallocate {
            reallocate(member, &node, epoch, revoked).await?;
        }
    }
    Ok(())
}

/// Grants what an ended epoch left unsold to the live nodes.
async fn reallocate(
    member: &MemberInner,
    node: &NodeId,
    epoch: u64,
    revoked: BTreeMap<SkuId, u64>,
) -> Result<(), String> {
    let seller = Seller::new(node.clone(), epoch);
    for (sku, granted) in revoked {
        let sold = member.ledger.sold_by(&sku, &seller).await.map_err(|e| e.to_string())?;
        let unsold = granted.saturating_sub(sold);
        if unsold > 0 {
            let units = grant(member, &sku, unsold).await?;
            tracing::warn!(%sku, %node, epoch, granted, sold, unsold, units, "reallocated a dead node's unsold allotment");
            let labels = [("member", member.name.clone()), ("reason", "reallocation".to_string())];
            metrics::counter!("seckill_coordinator_granted_units_total", &labels).increment(units);
        }
    }
    Ok(())
}

/// Restores Σ(local remaining of live nodes) ≥ ledger remaining + buffer. While `starting_up`, nodes of
/// the plan that have not registered yet count as holding their starting allotment, so the
/// first node up is not handed everything.
async fn top_up(member: &MemberInner, starting_up: bool) -> Result<(), String> {
    let state = member.store.read().state;
    for (sku, starting) in &state.skus {
        let status = match member.ledger.status(sku).await {
            Ok(status) => status,
            Err(e) => {
                tracing::debug!(%sku, "no top-up: {e}");
                continue;
            }
        };
        let live: u64 = state.live_nodes().map(|(_, record)| record.effective_local(sku)).sum();
        let live_nodes = state.live_nodes().count() as u64;
        let target = match state.terms.get(sku) {
            Some(terms) if !status.closed => terms.target_local(status.remaining, live_nodes),
            Some(_) => 0,
            None => status.remaining,
        };
        let labels = [("member", member.name.clone()), ("sku", sku.to_string())];
        metrics::gauge!("seckill_coordinator_buffer_units", &labels)
            .set(target.saturating_sub(status.remaining) as f64);
        let expected: u64 = if starting_up {
            starting.iter().filter(|(node, _)| !state.nodes.contains_key(*node)).map(|(_, units)| units).sum()
        } else {
            0
        };
        let gap = target.saturating_sub(live + expected);
        if gap > 0 && state.live_nodes().next().is_some() {
            let units = grant(member, sku, gap).await?;
            tracing::info!(%sku, remaining = status.remaining, live, gap, units, "topped up live allotments");
            let labels = [("member", member.name.clone()), ("reason", "top_up".to_string())];
            metrics::counter!("seckill_coordinator_granted_units_total", &labels).increment(units);
        }
    }
    Ok(())
}

/// Splits `units` over the live nodes in proportion to their recent sell rate (evenly if none
/// is selling yet) and writes the grant.
async fn grant(member: &MemberInner, sku: &SkuId, units: u64) -> Result<u64, String> {
    let state = member.store.read().state;
    let live: Vec<(&NodeId, &NodeRecord)> = state.live_nodes().collect();
    let weights: Vec<f64> = live.iter().map(|(_, record)| record.sell_rate(sku)).collect();
    let shares = split(units, &weights);
    let items = live
        .iter()
        .zip(shares)
        .filter(|(_, share)| *share > 0)
        .map(|((node, record), share)| GrantItem { node: (*node).clone(), epoch: record.epoch, units: share })
        .collect();
    match write(member, Command::Grant { sku: sku.clone(), items }).await? {
        Outcome::Granted { units } => Ok(units),
        other => Err(format!("unexpected grant outcome {other:?}")),
    }
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
mod tests {
    use super::split;

    #[test]
    fn split_adds_up_and_follows_the_weights() {
        assert_eq!(split(10, &[1.0, 1.0, 1.0]).iter().sum::<u64>(), 10);
        assert_eq!(split(10, &[3.0, 1.0]), vec![8, 2]);
        assert_eq!(split(7, &[0.0, 0.0]).iter().sum::<u64>(), 7, "no rates yet: even split");
        assert!(split(5, &[]).is_empty());
    }
}
