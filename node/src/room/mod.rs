//! The waiting room at the node: who waits here, and the ticker that keeps them in line. The
//! room itself (line, draw, admissions) is the ledger's ([`ledger::room`]); a node keeps only
//! who is connected to it ([`hub`]), what it last learned of each one's place and what its page
//! is told ([`waiter`]), the queue that batches its joins ([`joins`]) and its [`ticker`]. Its
//! routes are `http::room`; tickets are `ticket`. Inside: ticker → hub → joins, waiter (no
//! circle; `tests/layout.rs` checks folders too).

pub mod hub;
pub mod joins;
pub mod ticker;
pub mod waiter;

use std::sync::Arc;

use dashmap::DashMap;
use ledger::{SalesLedger, SkuId};

use crate::shutdown::Shutdown;
use crate::sku::Sku;
use crate::ticket::TicketKey;

/// The rooms this node serves, by SKU; each started on its first join or stream here.
#[derive(Default)]
pub struct Rooms {
    hubs: DashMap<SkuId, Arc<hub::Hub>>,
}

/// A fresh random seed for a room call (see [`ledger::RoomCall`]): 128 bits in hex.
pub(crate) fn fresh_seed() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // Only the draw's fairness and the tokens' unpredictability rest on it; the tickets
        // stay unforgeable (their MAC) and single-use (the ledger) either way.
        fastrand::fill(&mut bytes);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The header a purchase brings its room ticket in (as the Submit-Token, never in the body).
pub const TICKET_HEADER: &str = "ticket";

impl Rooms {
    /// The room of `sku`, started here on its first use (its ticker runs until `shutdown`);
    /// `None` for a SKU without one.
    pub fn hub(
        &self,
        sku: &Sku,
        key: &TicketKey,
        ledger: Arc<dyn SalesLedger>,
        shutdown: &Shutdown,
    ) -> Option<Arc<hub::Hub>> {
        let terms = &sku.config().terms;
        let rules = terms.waiting_room.clone()?;
        if let Some(hub) = self.hubs.get(sku.id()) {
            return Some(hub.clone());
        }
        let created = self
            .hubs
            .entry(sku.id().clone())
            .or_insert_with(|| {
                let window = (terms.starts_at_ms, terms.ends_at_ms);
                let hub = Arc::new(hub::Hub::new(sku.id().clone(), rules, window, key.clone(), ledger));
                let shutdown = shutdown.clone();
                tokio::spawn(ticker::run(Arc::downgrade(&hub), move || shutdown.is_triggered()));
                hub
            })
            .clone();
        Some(created)
    }
}
