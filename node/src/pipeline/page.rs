//! What a node shows of itself from memory: the stock page, readiness, the gauges `/metrics`
//! publishes and the allotment figures tests and the admin view read.

use std::sync::atomic::Ordering;

use ledger::SkuId;

use super::Node;
use crate::breaker::BreakerState;
use crate::sku::{Allotment, AllotmentState, AllotmentStats, LedgerView};
use crate::stripes;

/// What the stock page shows, from memory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StockPage {
    pub sku: SkuId,
    pub total: u64,
    pub sold: u64,
    pub remaining: u64,
    pub local_remaining: u64,
    pub sold_out: bool,
    /// The sale was closed by an operator.
    pub closed: bool,
    /// The buffer the coordinator keeps for this SKU (`"10%"` or units per node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buffer: Option<String>,
    /// A striped SKU's stripes (the figures above are their sums); absent when unstriped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stripes: Option<Vec<StripePage>>,
}

/// One stripe of a striped SKU on the stock page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StripePage {
    pub stripe: u32,
    pub total: u64,
    pub sold: u64,
    pub remaining: u64,
    pub local_remaining: u64,
}

impl Node {
    /// The stock page, from memory: a striped SKU as one SKU, its figures summed over the
    /// stripes this node holds, each stripe's own below them.
    pub fn stock_page(&self, sku: &str) -> Option<StockPage> {
        let state = self.buyer_sku(sku)?;
        let stripes: Vec<StripePage> = stripes::known(&state)
            .map(|(stripe, sku)| {
                let LedgerView { total, sold, remaining, .. } = sku.view();
                StripePage { stripe, total, sold, remaining, local_remaining: sku.local_remaining() }
            })
            .collect();
        let sum = |figure: fn(&StripePage) -> u64| stripes.iter().map(figure).sum::<u64>();
        let remaining = sum(|stripe| stripe.remaining);
        Some(StockPage {
            sku: state.id().clone(),
            total: sum(|stripe| stripe.total),
            sold: sum(|stripe| stripe.sold),
            remaining,
            local_remaining: sum(|stripe| stripe.local_remaining),
            sold_out: remaining == 0,
            closed: state.is_closed(),
            buffer: state.buffer().map(|buffer| buffer.to_string()),
            stripes: (state.stripe_count() > 1).then_some(stripes),
        })
    }

    /// The state of the ledger circuit breaker (`breaker.rs`), for `/ready`.
    pub fn ledger_breaker(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// Ready to sell: the ledger answered the last refresh and knows every SKU, the ledger
    /// circuit breaker is not open, and order ids can be issued.
    pub fn is_ready(&self) -> bool {
        // Relaxed: a readiness probe tolerates a reading one refresh old.
        self.inner.ledger_reachable.load(Ordering::Relaxed)
            && self.inner.breaker.state() != BreakerState::Open
            && self.inner.skus.iter().all(|sku| !sku.view().missing)
            && self.inner.order_ids.is_ready()
            && !self.inner.shutdown.is_triggered()
            && self.inner.membership.as_ref().is_none_or(|m| m.epoch() != 0 && m.can_sell())
    }

    /// Updates per-SKU gauges; called before `/metrics` renders.
    /// A striped SKU is published as one SKU, its stripes summed, and each stripe's units in
    /// `seckill_stripe_local_remaining`.
    pub fn publish_gauges(&self) {
        let node = self.inner.config.id.as_str();
        for sku in self.inner.skus.iter().filter(|sku| !sku.is_stripe()) {
            let (mut local_remaining, mut stats) = (0, AllotmentStats::default());
            for (stripe, state) in stripes::known(sku.value()) {
                let figures = state.allotment().map(Allotment::stats).unwrap_or_default();
                local_remaining += state.local_remaining();
                stats.exhausted_with_stock_left += figures.exhausted_with_stock_left;
                stats.refused_by_ledger += figures.refused_by_ledger;
                if sku.stripe_count() > 1 {
                    crate::metrics::publish_stripe(node, sku.key().as_str(), stripe, state.local_remaining());
                }
            }
            crate::metrics::publish_allotment(
                node,
                sku.key().as_str(),
                local_remaining,
                stats.exhausted_with_stock_left,
                stats.refused_by_ledger,
            );
        }
    }

    /// Every figure of the allotment of `sku`; `None` for an unknown SKU or one sold ledger-only.
    pub fn allotment_state(&self, sku: &str) -> Option<AllotmentState> {
        self.sku(sku)?.allotment().map(Allotment::state)
    }

    /// How well the allotment of `sku` fits the demand on this node (zeros in the baseline mode,
    /// which has none).
    pub fn allotment_stats(&self, sku: &str) -> Option<AllotmentStats> {
        Some(self.sku(sku)?.allotment().map(Allotment::stats).unwrap_or_default())
    }
}
