//! Keeping what a node knows of the ledger fresh: every SKU's figures (and so the sold-out flag
//! and readiness), and the order stream's sales, so a retried key that bought elsewhere is
//! replayed from memory.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ledger::{LedgerError, SalesLedger, SkuId, SkuStatus};
use protocol::pace::Pace;

use super::{Inner, ORDER_PAGE, ORDER_PAGES_PER_REFRESH};
use crate::sku::Sku;

/// Pages through order events this node has not seen yet, into the SKU's sold keys; a read that
/// reaches the stream's end vouches for the sale's end seen before it started.
pub(super) async fn read_new_orders(ledger: &dyn SalesLedger, sku: &Sku) {
    let generation = sku.final_generation();
    for _ in 0..ORDER_PAGES_PER_REFRESH {
        match ledger.orders(sku.id(), sku.orders_read(), ORDER_PAGE).await {
            Ok(events) => {
                let full = events.len() == ORDER_PAGE;
                sku.record_orders(events);
                if !full {
                    sku.stream_read_to_end(generation);
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(sku = %sku.id(), "order stream read failed: {e}");
                return;
            }
        }
    }
}

/// Keeps every SKU's cached ledger figures (and so the sold-out flag and readiness) fresh,
/// whether or not this node is selling, reading a quiet SKU less often ([`Pace`], up to
/// `status_refresh_quiet_max` apart). Holds the
/// node weakly so a dropped node stops it.
pub(super) async fn refresh_status(node: std::sync::Weak<Inner>) {
    let mut paces: HashMap<SkuId, Pace<(SkuStatus, u64)>> = HashMap::new();
    loop {
        let Some(inner) = node.upgrade() else { return };
        // A quiet SKU's first change is seen up to this late; the ledger, not this cache,
        // decides every sale.
        let config = &inner.config;
        let quiet_periods = config.status_refresh_quiet_max.as_millis() / config.status_refresh.as_millis().max(1);
        let quiet_periods = u32::try_from(quiet_periods).unwrap_or(u32::MAX);
        let skus: Vec<Arc<Sku>> = inner.skus.iter().map(|entry| entry.value().clone()).collect();
        paces.retain(|id, _| inner.skus.contains_key(id));
        // `None` until a read this period says whether the ledger answers.
        let mut reachable = if skus.is_empty() { Some(inner.ledger.ping().await.is_ok()) } else { None };
        for sku in skus {
            let pace = paces.entry(sku.id().clone()).or_insert_with(|| Pace::new(quiet_periods));
            if !pace.due() {
                continue;
            }
            let (seen, answered) = refresh_one(&inner, &sku).await;
            pace.read(seen);
            *reachable.get_or_insert(false) |= answered;
        }
        // Relaxed: see `is_ready`. A period with no read due keeps the last word.
        if let Some(reachable) = reachable {
            inner.ledger_reachable.store(reachable, Ordering::Relaxed);
        }
        let (period, shutdown) = (inner.config.status_refresh, inner.shutdown.clone());
        drop(inner);
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = shutdown.wait() => return,
        }
    }
}

/// Reads one SKU's status (and its new orders, when the status says there are any): what it
/// found, for its [`Pace`] (the figures and the local units: a change in either means the SKU
/// sells, here or elsewhere), and whether the ledger answered.
async fn refresh_one(inner: &Inner, sku: &Sku) -> (Option<(SkuStatus, u64)>, bool) {
    // Taken before the status read: an order sequence the read shows as all read vouches for
    // every sale made before this generation, as a read of the stream to its end would.
    let generation = sku.final_generation();
    match inner.ledger.status(sku.id()).await {
        Ok(status) => {
            sku.observe_status(&status);
            sku.observe_reachable(true);
            sku.status_read_at(inner.clock.now_unix_ms());
            if status.orders > sku.orders_read() {
                read_new_orders(&*inner.ledger, sku).await;
            } else {
                sku.stream_read_to_end(generation);
            }
            (Some((status, sku.local_remaining())), true)
        }
        Err(LedgerError::Missing(_)) => {
            sku.observe_missing();
            sku.observe_reachable(true);
            (None, true)
        }
        Err(e) => {
            sku.observe_reachable(false);
            tracing::debug!(sku = %sku.id(), "status refresh failed: {e}");
            (None, false)
        }
    }
}
