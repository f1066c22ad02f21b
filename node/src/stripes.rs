//! Striped SKUs on a node (`protocol::stripes`): a hot SKU's stock is split into K ledgers,
//! `s`, `s/1`, …, each of which this node holds as a SKU of its own (its allotment, confirmer,
//! sold-out flag, idempotency memory), granted and refreshed like any other. Buyers only ever
//! name `s`; this module maps a buyer to the stripe it always buys on, tells whether another
//! stripe may still sell when the buyer's is empty, and sums the stripes for readers.
//!
//! Why "another stripe may sell" matters: a buyer is pinned to one stripe (so the per-user
//! limit and the idempotency records, kept per ledger, hold), and the coordinator moves unsold
//! units between stripes at the ledger. A buyer whose stripe is empty while another still has
//! units is told to retry, not "sold out": the units may soon be moved to its stripe.

use std::sync::Arc;

use dashmap::DashMap;
use ledger::{LedgerError, SalesLedger, SkuId};

use crate::clock::Clock;
use crate::config::SkuConfig;
use crate::sku::Sku;

/// Shortest time between two reads on demand of one stripe's status: about the status
/// refresher's default period, so a burst on an empty stripe costs each other stripe at most
/// four reads a second, while a transfer is seen within a retry's second.
const READ_PERIOD_MS: u64 = 250;

/// The SKUs a SKU of the node's static config stands for: a striped SKU's stripes, each with
/// its share of the terms (`SkuTerms::stripe_terms`) and of the starting allotment, split the
/// same way. Under a coordinator they are the catalogue entries it defines too.
pub fn expand(config: SkuConfig) -> Vec<SkuConfig> {
    if config.terms.stripes <= 1 || config.sku.is_stripe() {
        return vec![config];
    }
    let count = u64::from(config.terms.stripes);
    let terms = config.terms.stripe_terms();
    (0..config.terms.stripes)
        .zip(terms)
        .map(|(index, terms)| {
            let allotment = config.allotment / count + u64::from(u64::from(index) < config.allotment % count);
            SkuConfig::new(config.sku.stripe(index), terms, allotment)
        })
        .collect()
}

/// Records every stripe the node holds of the SKU that `added` belongs to in that SKU's stripe
/// 0, whichever of them came first (a coordinator's terms arrive in id order, `s/1` after `s`,
/// but a static config and a later catalogue may come in any order).
pub fn link(skus: &DashMap<SkuId, Arc<Sku>>, added: &Sku) {
    // Cloned out of the map: no guard is held while the map is read again.
    let Some(first) = skus.get(added.buyer_id().as_str()).map(|entry| entry.value().clone()) else { return };
    for index in 1..first.stripe_count() {
        if first.stripe(index).is_some() {
            continue;
        }
        let stripe = skus.get(first.id().stripe(index).as_str()).map(|entry| entry.value().clone());
        if let Some(stripe) = stripe {
            first.link_stripe(index, stripe);
        }
    }
}

/// The stripe `user` buys `sku` on (`sku` itself unless striped): one hash and one load.
/// `None` while this node has not added that stripe yet.
pub fn buyer_stripe<'a>(sku: &'a Arc<Sku>, user: &str) -> Option<&'a Arc<Sku>> {
    match protocol::stripe_for_str(user, sku.stripe_count()) {
        0 => Some(sku),
        index => sku.stripe(index),
    }
}

/// Every stripe of `sku` this node holds, with its index, stripe 0 (`sku` itself) first.
pub fn known(sku: &Arc<Sku>) -> impl Iterator<Item = (u32, &Arc<Sku>)> {
    std::iter::once((0, sku)).chain((1..sku.stripe_count()).filter_map(move |index| Some((index, sku.stripe(index)?))))
}

/// Reads a stripe's status off the refresher's schedule.
pub struct Reader<'a> {
    pub ledger: &'a Arc<dyn SalesLedger>,
    pub clock: &'a Arc<dyn Clock>,
}

impl Reader<'_> {
    /// Whether a stripe of `sku` other than `own` may still sell: one the ledger has not said
    /// is empty (nor closed nor lost), one this node does not hold yet, or units between two
    /// stripes (taken out of one, not yet put into another). Answered from what the node holds;
    /// it also asks for fresh figures of every stripe read [`READ_PERIOD_MS`] ago or more, so
    /// the next buyer's answer is current. Only flags are read while every stripe is empty: the
    /// sold-out burst takes no lock here.
    pub fn others_may_sell(&self, sku: &Arc<Sku>, own: &Sku) -> bool {
        let (mut out, mut into, mut held) = (0u64, 0u64, 0u32);
        let mut may_sell = false;
        let now_ms = self.clock.now_unix_ms();
        for (_, stripe) in known(sku) {
            held += 1;
            self.refresh_at(stripe, now_ms, READ_PERIOD_MS);
            let (moved_out, moved_in) = stripe.transferred();
            (out, into) = (out.saturating_add(moved_out), into.saturating_add(moved_in));
            if !std::ptr::eq(Arc::as_ptr(stripe), own) && !stripe.known_empty() && !stripe.is_closed() {
                may_sell |= !stripe.view().missing;
            }
        }
        may_sell || held < sku.stripe_count() || out != into
    }

    /// Reads `stripe`'s status in the background unless it was read less than `period_ms` ago
    /// or a read is under way; the request that asked does not wait for it.
    pub fn refresh(&self, stripe: &Arc<Sku>, period_ms: u64) {
        self.refresh_at(stripe, self.clock.now_unix_ms(), period_ms);
    }

    fn refresh_at(&self, stripe: &Arc<Sku>, now_ms: u64, period_ms: u64) {
        if !stripe.claim_status_read(now_ms, period_ms) {
            return;
        }
        let (ledger, clock, stripe) = (self.ledger.clone(), self.clock.clone(), stripe.clone());
        tokio::spawn(async move {
            match ledger.status(stripe.id()).await {
                Ok(status) => {
                    stripe.observe_status(&status);
                    stripe.observe_reachable(true);
                }
                Err(LedgerError::Missing(_)) => stripe.observe_missing(),
                Err(e) => tracing::debug!(sku = %stripe.id(), "stripe status read failed: {e}"),
            }
            stripe.status_read_done(clock.now_unix_ms());
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::SkuTerms;

    /// Goal: a static config's striped SKU becomes its stripes, the totals and allotments
    /// adding up to the SKU's. Method: expand 10 units and an allotment of 5 over 3 stripes.
    #[test]
    fn expand_splits_terms_and_allotment() {
        let sku = SkuId::new("hot").unwrap();
        let terms = SkuTerms { stripes: 3, ..SkuTerms::new(10) };
        let stripes = expand(SkuConfig::new(sku.clone(), terms, 5));
        let ids: Vec<&str> = stripes.iter().map(|s| s.sku.as_str()).collect();
        assert_eq!(ids, ["hot", "hot/1", "hot/2"]);
        assert_eq!(stripes.iter().map(|s| s.terms.total).collect::<Vec<_>>(), [4, 3, 3]);
        assert_eq!(stripes.iter().map(|s| s.allotment).collect::<Vec<_>>(), [2, 2, 1]);
        assert!(stripes.iter().all(|s| s.terms.stripes == 3));
        assert_eq!(expand(SkuConfig::new(sku, SkuTerms::new(10), 5)).len(), 1);
    }
}
