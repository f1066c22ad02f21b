//! The catalogue: every SKU the group sells, with the terms it is sold on and each node's
//! starting allotment, in one map (one key set, so terms and plans cannot drift apart).
//!
//! Invariants (asserted on every change):
//! - a SKU, once defined, stays defined, and defining it again changes nothing;
//! - a SKU's total never goes down, but by a transfer out of one stripe of a striped SKU into
//!   another (`super::stripes`, which keeps the striped SKU's own total); a closed SKU never
//!   reopens.

use std::collections::BTreeMap;

use protocol::{Buffer, NodeId, SkuId, SkuTerms};
use serde::{Deserialize, Serialize};

/// One SKU of the catalogue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogueEntry {
    pub terms: SkuTerms,
    /// Each node's starting allotment: live nodes got it when the SKU was defined, others get
    /// it on their first registration; a rejoining node never does.
    pub starting: BTreeMap<NodeId, u64>,
}

/// An operator's change to a defined SKU's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TermsChange {
    SetBuffer(Buffer),
    /// Raises the total (the ledger was restocked first); a lower total changes nothing.
    Restock(u64),
    Close,
    /// The price, currency and pay timeout of later sales (the ledger's pricing was set first).
    SetPricing {
        price: u64,
        currency: String,
        pay_timeout_s: u64,
    },
    /// A transfer took these units out of this stripe's ledger: the only way a total goes down.
    TransferOut(u64),
    /// A transfer (or a restock of a striped SKU) put these units into this stripe's ledger.
    TransferIn(u64),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalogue {
    pub skus: BTreeMap<SkuId, CatalogueEntry>,
}

impl Catalogue {
    pub fn contains(&self, sku: &SkuId) -> bool {
        self.skus.contains_key(sku)
    }

    pub fn terms(&self, sku: &SkuId) -> Option<&SkuTerms> {
        self.skus.get(sku).map(|entry| &entry.terms)
    }

    /// Every SKU's terms, as assignments carry them to nodes.
    pub fn all_terms(&self) -> BTreeMap<SkuId, SkuTerms> {
        self.skus.iter().map(|(sku, entry)| (sku.clone(), entry.terms.clone())).collect()
    }

    /// The starting grants of a node registering for the first time: its share of every SKU.
    pub fn starting_for(&self, node: &NodeId) -> BTreeMap<SkuId, u64> {
        self.skus.iter().map(|(sku, entry)| (sku.clone(), entry.starting.get(node).copied().unwrap_or(0))).collect()
    }

    /// The catalogue totals of the first `stripes` stripes of `parent` defined so far.
    pub fn stripe_totals(&self, parent: &SkuId, stripes: u32) -> u64 {
        (0..stripes).filter_map(|index| self.terms(&parent.stripe(index))).map(|terms| terms.total).sum()
    }

    /// Defines a SKU once; returns whether it is new (a second definition changes nothing).
    pub fn define(&mut self, sku: SkuId, terms: SkuTerms, starting: BTreeMap<NodeId, u64>) -> bool {
        if self.skus.contains_key(&sku) {
            return false;
        }
        self.skus.insert(sku, CatalogueEntry { terms, starting });
        true
    }

    /// Applies an operator's change; `None` if the SKU is not defined.
    pub fn change(&mut self, sku: &SkuId, change: TermsChange) -> Option<SkuTerms> {
        let terms = &mut self.skus.get_mut(sku)?.terms;
        let (total, closed) = (terms.total, terms.closed);
        let lowered_by = match change {
            TermsChange::TransferOut(units) => units,
            _ => 0,
        };
        match change {
            TermsChange::SetBuffer(buffer) => terms.buffer = buffer,
            TermsChange::Restock(total) => terms.total = terms.total.max(total),
            TermsChange::Close => terms.closed = true,
            TermsChange::SetPricing { price, currency, pay_timeout_s } => {
                terms.price = price;
                terms.currency = currency;
                terms.pay_timeout_s = pay_timeout_s;
            }
            TermsChange::TransferOut(units) => {
                assert!(units <= terms.total, "stripe {sku}: a transfer of {units} units out of a total of {total}");
                terms.total -= units;
            }
            TermsChange::TransferIn(units) => terms.total += units,
        }
        assert!(terms.total + lowered_by >= total, "SKU {sku}: the total went down but by a transfer");
        assert!(terms.closed || !closed, "SKU {sku}: a closed sale reopened");
        Some(terms.clone())
    }
}
