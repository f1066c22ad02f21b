//! The per-SKU confirmer: local winners queue here, and the confirmer sends whatever has queued
//! up as one ledger call. There is no timer: while one call is out, the next batch gathers, so
//! batches grow with load and a lone request goes out at once.
//!
//! The confirmer, not the waiting request, settles local stock: a sale keeps its unit, anything
//! else (refused, replayed, ledger unreachable) gives it back. So a request that gave up waiting,
//! or whose client hung up, can neither lose nor double a unit. A batch holds at most
//! `BATCH_MAX` winners, each settled and answered once (asserted in debug builds).

use std::sync::Arc;
use std::time::Instant;

use ledger::{BatchOutcome, Decision, LedgerError, NodeId, Purchase, SalesLedger, Seller, Verdict, BATCH_MAX};
use tokio::sync::mpsc;
use tracing::{Instrument, Span};

use crate::breaker::Breaker;
use crate::metrics::NodeMetrics;
use crate::shutdown::Shutdown;
use crate::sku::{Allotment, Pending, Selling, Sku, SoldKey};

/// What a confirmer calls and reports to: the ledger, the node's metrics and its breaker.
pub struct LedgerPath {
    pub ledger: Arc<dyn SalesLedger>,
    pub metrics: Arc<NodeMetrics>,
    pub breaker: Arc<Breaker>,
}

/// Confirms queued purchases until shutdown; then refuses new ones (the queue is closed, so
/// requesters get 503 at once) and drains what was already queued before returning.
pub async fn run(
    sku: Arc<Sku>,
    node: NodeId,
    epoch_now: impl Fn() -> u64 + Send + 'static,
    path: LedgerPath,
    mut queue: mpsc::Receiver<Pending>,
    shutdown: Shutdown,
) {
    // Only an allotment SKU has a queue to build a confirmer from.
    let Selling::Allotment(allotment) = sku.selling() else { return };
    let LedgerPath { ledger, metrics, breaker } = path;
    let mut batch = Vec::with_capacity(BATCH_MAX);
    let mut purchases = Vec::with_capacity(BATCH_MAX);
    let mut closing = false;
    loop {
        tokio::select! {
            received = queue.recv_many(&mut batch, BATCH_MAX) => if received == 0 { return },
            () = shutdown.wait(), if !closing => {
                queue.close();
                closing = true;
                continue;
            }
        }
        debug_assert!(batch.len() <= BATCH_MAX, "a confirmation holds at most BATCH_MAX purchases");
        // One call per epoch present in the batch (almost always one): the ledger books each
        // sale under the epoch that held the unit.
        while !batch.is_empty() {
            let epoch = batch[0].epoch;
            let run_len = batch.iter().take_while(|pending: &&Pending| pending.epoch == epoch).count();
            purchases.clear();
            purchases.extend(batch[..run_len].iter().map(|pending| pending.purchase.clone()));
            let seller = Seller::new(node.clone(), epoch);
            let span = batch_span(&batch[..run_len]);
            let outcome =
                confirm(&sku, &seller, &*ledger, &metrics, &breaker, &purchases, &span).instrument(span.clone()).await;
            let current_epoch = epoch_now();
            for (at, pending) in batch.drain(..run_len).enumerate() {
                let verdict = match &outcome {
                    Ok(outcome) => Ok(outcome.verdicts[at].clone()),
                    Err(e) => Err(e.clone()),
                };
                settle(&sku, allotment, &pending, &verdict, current_epoch);
                // The requester may have timed out or hung up; its unit is already settled above.
                let _ = pending.reply.send(verdict);
            }
        }
        debug_assert!(batch.is_empty(), "every winner of the batch was settled and answered");
    }
}

/// One ledger call, measured, with the SKU's cached view and the breaker updated from its
/// answer.
pub async fn confirm(
    sku: &Sku,
    seller: &Seller,
    ledger: &dyn SalesLedger,
    metrics: &NodeMetrics,
    breaker: &Breaker,
    purchases: &[Purchase],
    parent: &Span,
) -> Result<BatchOutcome, LedgerError> {
    debug_assert!(!purchases.is_empty(), "a confirmation of nothing");
    debug_assert!(purchases.len() <= BATCH_MAX, "a confirmation holds at most BATCH_MAX purchases");
    let started = Instant::now();
    let call = telemetry::child_of(parent, "ledger confirm");
    // Guarded: the SKU's name is built only for a traced batch.
    if telemetry::traced(&call) {
        telemetry::record(&call, "seckill.sku", sku.id().to_string());
        telemetry::record(&call, "seckill.batch", purchases.len() as i64);
    }
    let result = ledger.confirm(sku.id(), seller, purchases).instrument(call).await;
    // Only a ledger that did not answer (or replicate) trips the breaker; any answer, a refusal
    // included, shows it is there.
    breaker.record(!matches!(result, Err(LedgerError::Unavailable(_) | LedgerError::NotReplicated { .. })));
    metrics.ledger_call_seconds.record(started.elapsed().as_secs_f64());
    metrics.ledger_batch_size.record(purchases.len() as f64);
    match &result {
        Ok(outcome) => {
            assert_eq!(outcome.verdicts.len(), purchases.len(), "the ledger must answer every purchase of a batch");
            debug_assert!(
                fresh_units(outcome, purchases) <= outcome.sold,
                "a batch sells no more than the ledger sold"
            );
            sku.observe_confirm(outcome);
            sku.observe_reachable(true);
        }
        Err(LedgerError::Missing(_)) => {
            metrics.ledger_errors.increment(1);
            sku.observe_missing();
        }
        Err(e) => {
            metrics.ledger_errors.increment(1);
            if matches!(e, LedgerError::Unavailable(_)) {
                sku.observe_reachable(false);
            }
            tracing::warn!(sku = %sku.id(), batch = purchases.len(), "ledger confirm failed: {e}");
        }
    }
    result
}

/// The span of one batch: under the first traced purchase's decision, and following from the
/// other traced ones (a batch carries many purchases, each maybe of a trace of its own).
fn batch_span(pending: &[Pending]) -> Span {
    if !telemetry::is_on() {
        return Span::none();
    }
    let mut traced = pending.iter().map(|pending| &pending.span).filter(|span| telemetry::traced(span));
    let Some(first) = traced.next() else { return Span::none() };
    let span = telemetry::child_of(first, "confirm batch");
    for other in traced {
        span.follows_from(other);
    }
    telemetry::record(&span, "seckill.batch", pending.len() as i64);
    span
}

/// Units this batch sold now (replays were counted when first sold).
fn fresh_units(outcome: &BatchOutcome, purchases: &[Purchase]) -> u64 {
    let fresh = |verdict: &Verdict| matches!(verdict, Verdict::Fresh(Decision::Purchased(_)));
    outcome.verdicts.iter().zip(purchases).filter(|(verdict, _)| fresh(verdict)).map(|(_, p)| u64::from(p.qty)).sum()
}

/// Keeps the unit for a fresh sale (and remembers the key for replays), returns it for
/// everything else. A unit of an epoch that has ended is neither: that allotment was revoked
/// and reallocated, so it must not come back, and its sale is not this epoch's.
fn settle(
    sku: &Sku,
    allotment: &Allotment,
    pending: &Pending,
    verdict: &Result<Verdict, LedgerError>,
    current_epoch: u64,
) {
    let purchase = &pending.purchase;
    let this_epoch = pending.epoch == current_epoch;
    match verdict {
        Ok(Verdict::Fresh(Decision::Purchased(receipt))) => {
            let sale = SoldKey { user: purchase.user.clone(), qty: purchase.qty, receipt: receipt.clone() };
            sku.record_sale(purchase.key.clone(), sale);
            if this_epoch {
                allotment.sold(purchase.qty);
            } else {
                allotment.dropped_with_epoch(purchase.qty);
            }
        }
        _ if this_epoch => {
            allotment.unsold(purchase.qty, matches!(verdict, Ok(Verdict::Fresh(Decision::SoldOut))));
        }
        _ => allotment.dropped_with_epoch(purchase.qty),
    }
}
