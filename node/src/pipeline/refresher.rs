//! Keeping what a node knows of the ledger fresh: every SKU's figures (and so the sold-out flag
//! and readiness), and the order stream's sales, so a retried key that bought elsewhere is
//! replayed from memory.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ledger::{LedgerError, SalesLedger};

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
/// whether or not this node is selling. Holds the node weakly so a dropped node stops it.
pub(super) async fn refresh_status(node: std::sync::Weak<Inner>) {
    loop {
        let Some(inner) = node.upgrade() else { return };
        let skus: Vec<Arc<Sku>> = inner.skus.iter().map(|entry| entry.value().clone()).collect();
        let mut reachable = skus.is_empty() && inner.ledger.ping().await.is_ok();
        for sku in skus {
            match inner.ledger.status(sku.id()).await {
                Ok(status) => {
                    sku.observe_status(&status);
                    sku.observe_reachable(true);
                    sku.status_read_at(inner.clock.now_unix_ms());
                    reachable = true;
                    read_new_orders(&*inner.ledger, &sku).await;
                }
                Err(LedgerError::Missing(_)) => {
                    sku.observe_missing();
                    sku.observe_reachable(true);
                    reachable = true;
                }
                Err(e) => {
                    sku.observe_reachable(false);
                    tracing::debug!(sku = %sku.id(), "status refresh failed: {e}");
                }
            }
        }
        // Relaxed: see `is_ready`.
        inner.ledger_reachable.store(reachable, Ordering::Relaxed);
        let (period, shutdown) = (inner.config.status_refresh, inner.shutdown.clone());
        drop(inner);
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = shutdown.wait() => return,
        }
    }
}
