//! The node's side of membership: the epoch it sells under, the heartbeat's figures, and what
//! the coordinator's answers change (grants, hold limits, terms, the worker id), through
//! [`Leaseholder`], the only way membership reaches the node.

use std::collections::BTreeMap;

use ledger::{NodeId, SkuId};

use super::Node;
use crate::config::SkuConfig;
use crate::membership::{Leaseholder, Reports};
use crate::sku::Allotment;

impl Node {
    /// The membership epoch sales are booked under; 0 without a coordinator.
    pub fn epoch(&self) -> u64 {
        self.inner.membership.as_ref().map_or(0, |m| m.epoch())
    }

    /// Per-SKU figures for the next heartbeat.
    pub fn reports(&self) -> Reports {
        self.inner
            .skus
            .iter()
            .map(|sku| {
                let figures = sku.allotment().map(Allotment::epoch_figures).unwrap_or_default();
                let report = protocol::SkuReport {
                    ledger_reachable: sku.ledger_reachable(),
                    local_remaining: figures.local_remaining,
                    applied: figures.applied,
                    sold: figures.sold,
                    requests: sku.requests(),
                    returned: figures.returned,
                };
                (sku.key().clone(), report)
            })
            .collect()
    }

    /// Hands the lease back to the coordinator (after the server drained), so the unsold
    /// allotment is reallocated at once.
    pub async fn leave(&self) {
        if let Some(membership) = &self.inner.membership {
            crate::membership::leave(self, membership).await;
        }
    }
}

/// Membership reaches the node only through these calls.
impl Leaseholder for Node {
    fn id(&self) -> &NodeId {
        Node::id(self)
    }

    fn reports(&self) -> Reports {
        Node::reports(self)
    }

    /// Empties every local allotment: the epoch that held them ended.
    fn drop_allotments(&self) {
        for sku in self.inner.skus.iter() {
            let Some(allotment) = sku.allotment() else { continue };
            let dropped = allotment.end_epoch();
            if dropped > 0 {
                tracing::warn!(node = %self.id(), sku = %sku.key(), dropped, "dropped the allotment of an ended epoch");
            }
        }
    }

    /// Order ids from now on come under this worker id (the coordinator's lease). Returns at
    /// once; the generator opens on the order-id thread, never on a runtime worker.
    fn use_worker_id(&self, worker_id: u16) {
        self.inner.order_ids.use_worker(worker_id);
    }

    /// Takes in the terms the coordinator holds for every SKU: starts selling SKUs created at run
    /// time, and applies closes and buffer changes to known ones.
    fn apply_terms(&self, terms: &BTreeMap<SkuId, protocol::SkuTerms>) {
        for (sku_id, terms) in terms {
            if self.sku(sku_id.as_str()).is_none() {
                tracing::info!(node = %self.id(), sku = %sku_id, ?terms, "selling a SKU defined by the coordinator");
                self.add_sku(SkuConfig::new(sku_id.clone(), terms.clone(), 0));
            }
            let Some(sku) = self.sku(sku_id.as_str()) else { continue };
            if terms.closed && !sku.is_closed() {
                tracing::info!(node = %self.id(), sku = %sku_id, "the sale was closed");
                sku.close();
            }
            sku.set_buffer(terms.buffer);
        }
    }

    /// Adds whatever part of the coordinator's cumulative grants is new.
    fn apply_grants(&self, granted: &BTreeMap<SkuId, u64>) {
        for (sku_id, total) in granted {
            let Some(sku) = self.sku(sku_id.as_str()) else { continue };
            // The baseline mode holds no allotment: a grant is nothing it could sell from.
            let Some(allotment) = sku.allotment() else { continue };
            let units = allotment.apply_grant(*total);
            if units > 0 {
                tracing::debug!(node = %self.id(), sku = %sku_id, units, "granted units");
            }
            // Units granted on a SKU the ledger said was empty: it was restocked, or units were
            // moved into this stripe. Read it now, so it sells again before the next refresh.
            if units > 0 && sku.is_sold_out() {
                self.stripe_reader().refresh(&sku, 0);
            }
        }
    }

    /// Gives back what an allotment holds beyond the leader's `hold_max` for its SKU.
    fn apply_hold_max(&self, hold_max: &BTreeMap<SkuId, u64>) {
        for (sku_id, max) in hold_max {
            let Some(sku) = self.sku(sku_id.as_str()) else { continue };
            // The baseline mode holds no allotment: nothing to give back.
            let Some(allotment) = sku.allotment() else { continue };
            let returned = allotment.hold_at_most(*max);
            if returned > 0 {
                tracing::debug!(node = %self.id(), sku = %sku_id, returned, hold_max = max, "gave units back");
            }
        }
    }
}
