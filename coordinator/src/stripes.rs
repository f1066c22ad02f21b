//! The leader's work on striped SKUs (`protocol::stripes`): moving stock from a stripe that has
//! some to one that sold out, so a buyer routed to an empty stripe is not refused while another
//! stripe still holds units, and the status of a striped SKU as one SKU.
//!
//! Every [`TRANSFER_TICK`], on the leader only, once it has confirmed it still leads a quorum:
//! 1. finish every transfer in flight (a crash, a failed call or an earlier leader may have left
//!    one), replaying its ledger calls under its id, which the ledger answers as the first time;
//! 2. for each open striped SKU whose stripes are all defined: if a stripe has sold out while
//!    another holds units, move half the richest stripe's remaining (rounded up) into it; empty
//!    stripes take turns, so the last units rotate rather than starve one stripe.
//!
//! A transfer is `TransferStarted` → `transfer_out` → `TransferDebited` → `transfer_in` →
//! `TransferDone` (see `crate::state`): each step is durable before the next, so a unit is never
//! lost or counted twice. The catalogue totals follow, and the control loop's top-up grants the
//! units a stripe receives to live nodes as it does a restock's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ledger::{LedgerError, SkuId, SkuStatus};
use serde::Serialize;
use tokio::sync::watch;

use crate::context::{Context, WriteError};
use crate::state::{ClusterState, Command, Outcome, Transfer};

/// How often the leader looks for a sold-out stripe: a buyer on it is refused until then.
pub const TRANSFER_TICK: Duration = Duration::from_millis(200);

/// Why a transfer step stopped; the next tick finishes it from the state.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    #[error("raft write: {0:?}")]
    Write(WriteError),
}

/// Registers the transfer counters of `sku` so they render as 0 before its first transfer.
fn register_metrics(member: &str, sku: &SkuId) {
    let labels = [("member", member.to_string()), ("sku", sku.to_string())];
    metrics::counter!("seckill_coordinator_transfers_total", &labels).increment(0);
    metrics::counter!("seckill_coordinator_transfer_units_total", &labels).increment(0);
}

pub async fn run(member: Arc<Context>, mut stop: watch::Receiver<bool>) {
    let mut turns: BTreeMap<SkuId, u32> = BTreeMap::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(TRANSFER_TICK) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        // Most groups sell no striped SKU: they pay no leadership round for this loop.
        if !member.is_leader() || member.applied_state().stripes == Default::default() {
            continue;
        }
        // Transfers are decided on the state; it must be the latest the group agreed on.
        if let Err(e) = member.raft().ensure_linearizable().await {
            tracing::debug!("not transferring: {e}");
            continue;
        }
        if let Err(e) = tick(&member, &mut turns).await {
            tracing::warn!(member = %member.name(), "stripe transfer stopped: {e}");
        }
    }
}

async fn tick(member: &Context, turns: &mut BTreeMap<SkuId, u32>) -> Result<(), TransferError> {
    let in_flight = member.applied_state().stripes.in_flight;
    for (id, transfer) in in_flight {
        finish(member, id, &transfer).await?;
    }
    for (sku, stripes) in balanced(&member.applied_state()) {
        register_metrics(member.name(), &sku);
        // One SKU's ledger failing (a lost stripe) does not hold the others' units back.
        if let Err(e) = balance(member, &sku, stripes, turns).await {
            tracing::warn!(member = %member.name(), %sku, "no transfer: {e}");
        }
    }
    Ok(())
}

/// The striped SKUs to balance: open, with every stripe defined.
fn balanced(state: &ClusterState) -> Vec<(SkuId, u32)> {
    let open = |sku: &SkuId| state.catalogue.terms(sku).is_some_and(|terms| !terms.closed);
    state
        .stripes
        .skus
        .iter()
        .filter(|(sku, striped)| (0..striped.stripes).all(|index| open(&sku.stripe(index))))
        .map(|(sku, striped)| (sku.clone(), striped.stripes))
        .collect()
}

async fn balance(
    member: &Context,
    sku: &SkuId,
    stripes: u32,
    turns: &mut BTreeMap<SkuId, u32>,
) -> Result<(), TransferError> {
    let mut remaining = Vec::with_capacity(stripes as usize);
    for index in 0..stripes {
        remaining.push(member.ledger().status(&sku.stripe(index)).await?.remaining);
    }
    let Some(Move { from, to, most }) = pick(&remaining, turns.get(sku).copied()) else { return Ok(()) };
    turns.insert(sku.clone(), to);
    let id = member.applied_state().stripes.next_id;
    let command = Command::TransferStarted { id, sku: sku.clone(), from, to, most };
    // Another start took the id first (an operator's restock): the next tick decides again.
    if write(member, command).await? != Outcome::Transferred {
        return Ok(());
    }
    let units = finish(member, id, &Transfer { sku: sku.clone(), from: Some(from), to, most, debited: None }).await?;
    tracing::info!(%sku, id, from, to, most, units, "moved units between stripes");
    Ok(())
}

async fn write(member: &Context, command: Command) -> Result<Outcome, TransferError> {
    member.write(command).await.map_err(TransferError::Write)
}

/// Takes a started transfer to its end, each ledger call before the raft entry that records it,
/// and returns the units it moved. Safe to repeat: the ledger answers a repeated id as the first
/// time, and raft ignores a step already taken.
pub async fn finish(member: &Context, id: u64, transfer: &Transfer) -> Result<u64, TransferError> {
    let units = match (transfer.debited, transfer.from) {
        (Some(units), _) => units,
        (None, Some(from)) => {
            let units = member.ledger().transfer_out(&transfer.sku.stripe(from), id, transfer.most).await?;
            write(member, Command::TransferDebited { id, units }).await?;
            units
        }
        (None, None) => 0,
    };
    if units > 0 {
        member.ledger().transfer_in(&transfer.sku.stripe(transfer.to), id, units).await?;
    }
    let done = write(member, Command::TransferDone { id }).await?;
    if done == Outcome::Transferred && transfer.from.is_some() {
        let labels = [("member", member.name().to_string()), ("sku", transfer.sku.to_string())];
        metrics::counter!("seckill_coordinator_transfers_total", &labels).increment(1);
        metrics::counter!("seckill_coordinator_transfer_units_total", &labels).increment(units);
    }
    Ok(units)
}

/// One transfer to make: up to `most` units from stripe `from` to stripe `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Move {
    from: u32,
    to: u32,
    most: u64,
}

/// The move the stripes' `remaining` call for, if one has sold out while another has units:
/// half the richest's (rounded up, so a last unit moves too) to the first sold-out stripe after
/// `last_to`, the one the previous move filled.
fn pick(remaining: &[u64], last_to: Option<u32>) -> Option<Move> {
    let (from, richest) = remaining.iter().enumerate().max_by_key(|(index, units)| (**units, usize::MAX - index))?;
    if *richest == 0 {
        return None;
    }
    let empty: Vec<u32> = (0..remaining.len()).filter(|index| remaining[*index] == 0).map(|i| i as u32).collect();
    let after = |index: &&u32| last_to.is_none_or(|last| **index > last);
    let to = *empty.iter().find(after).or(empty.first())?;
    Some(Move { from: from as u32, to, most: richest.div_ceil(2) })
}

/// One stripe as the status shows it.
#[derive(Debug, Serialize)]
pub struct StripeStatus {
    pub stripe: u32,
    pub sku: SkuId,
    pub ledger: SkuStatus,
    /// Units taken out of another stripe (or restocked) for this one and not yet put in.
    pub in_flight: u64,
}

/// A SKU as operators read it: the sum of its stripes, each stripe, and the transfers so far.
#[derive(Debug, Serialize)]
pub struct SkuView {
    /// The stripes' ledgers summed (for an unstriped SKU, its ledger).
    pub ledger: SkuStatus,
    pub in_flight: u64,
    pub transfers: u64,
    pub transferred_units: u64,
    pub stripes: Vec<StripeStatus>,
}

/// Reads every stripe of `sku` (one for an unstriped SKU) from the ledger.
pub async fn view(member: &Context, sku: &SkuId) -> Result<SkuView, LedgerError> {
    let state = member.applied_state();
    let striped = state.stripes.skus.get(sku).cloned().unwrap_or_default();
    let mut stripes = Vec::new();
    for index in 0..striped.stripes.max(1) {
        let in_flight = state
            .stripes
            .in_flight
            .values()
            .filter(|transfer| &transfer.sku == sku && transfer.to == index)
            .map(Transfer::in_flight)
            .sum();
        let ledger = member.ledger().status(&sku.stripe(index)).await?;
        stripes.push(StripeStatus { stripe: index, sku: sku.stripe(index), ledger, in_flight });
    }
    Ok(SkuView {
        ledger: SkuStatus::combined(&stripes.iter().map(|stripe| stripe.ledger.clone()).collect::<Vec<_>>()),
        in_flight: state.stripes.in_flight_of(sku),
        transfers: striped.transfers,
        transferred_units: striped.transferred_units,
        stripes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moved(from: u32, to: u32, most: u64) -> Option<Move> {
        Some(Move { from, to, most })
    }

    #[test]
    fn a_sold_out_stripe_gets_half_the_richest_stripes_units() {
        assert_eq!(pick(&[0, 7, 3], None), moved(1, 0, 4));
        assert_eq!(pick(&[5, 0, 5], None), moved(0, 1, 3), "ties go to the first stripe");
        assert_eq!(pick(&[1, 0], None), moved(0, 1, 1), "the last unit moves too");
        assert_eq!(pick(&[2, 1, 3], None), None, "no stripe sold out");
        assert_eq!(pick(&[0, 0, 0], None), None, "nothing left to move");
        assert_eq!(pick(&[], None), None);
    }

    #[test]
    fn sold_out_stripes_take_turns() {
        assert_eq!(pick(&[0, 0, 1], None), moved(2, 0, 1));
        assert_eq!(pick(&[0, 0, 1], Some(0)), moved(2, 1, 1));
        assert_eq!(pick(&[0, 0, 1], Some(1)), moved(2, 0, 1), "after the last, the first again");
    }
}
