//! Transfers between the stripes of striped SKUs (see `protocol::stripes`): each stripe is a
//! catalogue entry of its own, and this sub-state keeps what the catalogue cannot: the units in
//! flight between two stripes, the transfer ids handed out, and each striped SKU's own total.
//!
//! A transfer is three raft entries around two ledger calls, so a crash or a leader change
//! between any two steps leaves a record the next leader finishes (the ledger calls are
//! idempotent by transfer id):
//! 1. `started`: the id is taken (ids are never reused, so a late ledger call of an old
//!    transfer cannot count for a new one);
//! 2. `debited`: the ledger took `n` units out of the source stripe; they are in flight;
//! 3. `done`: the ledger put them into the destination stripe.
//!
//! A restock of a striped SKU is a transfer with no source: started already debited, with the
//! units it adds, so it too reaches the ledger exactly once.
//!
//! Invariant (asserted on every change, per striped SKU): Σ catalogue totals of its stripes +
//! units in flight (debited, not done) == the SKU's total (created totals + restocks).

use std::collections::BTreeMap;

use protocol::SkuId;
use serde::{Deserialize, Serialize};

/// One transfer not done yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// The striped SKU (stripe 0's id).
    pub sku: SkuId,
    /// The stripe the units leave; `None` for a restock, whose units come from outside.
    pub from: Option<u32>,
    pub to: u32,
    /// Most units the source may give.
    pub most: u64,
    /// Units the ledger took out of the source, once it answered.
    pub debited: Option<u64>,
}

impl Transfer {
    /// Units in flight: taken from the source and not yet put into the destination.
    pub fn in_flight(&self) -> u64 {
        self.debited.unwrap_or(0)
    }
}

/// What the group knows of one striped SKU beyond its stripes' catalogue entries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripedSku {
    pub stripes: u32,
    /// The SKU's total: its stripes' created totals plus restocks. Transfers never change it.
    pub total: u64,
    /// Transfers between stripes done so far, and the units they moved.
    pub transfers: u64,
    pub transferred_units: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stripes {
    /// The id the next transfer takes.
    pub next_id: u64,
    pub in_flight: BTreeMap<u64, Transfer>,
    pub skus: BTreeMap<SkuId, StripedSku>,
}

/// Why a transfer step changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Skipped {
    /// A start that does not carry the next id (a deposed leader's), or a step of a transfer
    /// that is not in flight (done already).
    Stale,
    /// The SKU is not striped, or the stripe is not one of it.
    NotStriped,
}

impl Stripes {
    /// A stripe of a striped SKU was defined with `total` units.
    pub fn defined(&mut self, parent: SkuId, stripes: u32, total: u64) {
        let sku = self.skus.entry(parent).or_default();
        sku.stripes = stripes;
        sku.total += total;
    }

    pub fn is_striped(&self, sku: &SkuId) -> bool {
        self.skus.contains_key(sku)
    }

    /// Takes `id` for a transfer; refused unless it is the next id and the stripes exist.
    pub fn start(&mut self, id: u64, transfer: Transfer) -> Result<(), Skipped> {
        if id != self.next_id {
            return Err(Skipped::Stale);
        }
        let stripes = self.skus.get(&transfer.sku).ok_or(Skipped::NotStriped)?.stripes;
        let within = |stripe: u32| stripe < stripes;
        if !within(transfer.to) || !transfer.from.is_none_or(within) || transfer.from == Some(transfer.to) {
            return Err(Skipped::NotStriped);
        }
        if transfer.from.is_none() {
            // A restock: its units join the SKU's total as they go in flight.
            let sku = self.skus.get_mut(&transfer.sku).ok_or(Skipped::NotStriped)?;
            sku.total += transfer.in_flight();
        }
        self.next_id = id + 1;
        self.in_flight.insert(id, transfer);
        Ok(())
    }

    /// Records the source's answer; returns the SKU and source stripe whose total drops by
    /// `units`, or `None` on a replay (the ledger answers a repeat with the recorded count).
    pub fn debit(&mut self, id: u64, units: u64) -> Result<Option<(SkuId, u32)>, Skipped> {
        let transfer = self.in_flight.get_mut(&id).ok_or(Skipped::Stale)?;
        if transfer.debited.is_some() {
            return Ok(None);
        }
        assert!(units <= transfer.most, "transfer {id}: the ledger took {units} units, more than {}", transfer.most);
        let from = transfer.from.ok_or(Skipped::Stale)?;
        transfer.debited = Some(units);
        Ok(Some((transfer.sku.clone(), from)))
    }

    /// Ends a debited transfer; returns the SKU, the destination stripe and the units it gets.
    pub fn done(&mut self, id: u64) -> Result<(SkuId, u32, u64), Skipped> {
        let units = self.in_flight.get(&id).ok_or(Skipped::Stale)?.debited.ok_or(Skipped::Stale)?;
        let transfer = self.in_flight.remove(&id).ok_or(Skipped::Stale)?;
        if transfer.from.is_some() {
            let sku = self.skus.get_mut(&transfer.sku).ok_or(Skipped::NotStriped)?;
            sku.transfers += 1;
            sku.transferred_units += units;
        }
        Ok((transfer.sku, transfer.to, units))
    }

    /// Units of `sku` in flight.
    pub fn in_flight_of(&self, sku: &SkuId) -> u64 {
        self.in_flight.values().filter(|transfer| &transfer.sku == sku).map(Transfer::in_flight).sum()
    }
}
