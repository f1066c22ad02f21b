//! Everything a node knows about one SKU: its settings, local stock, sold-out flag and the
//! cached ledger figures shown on the stock page.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use dashmap::DashMap;
use ledger::{IdempotencyKey, OrderEvent, Receipt, SkuStatus, UserId};
use tokio::sync::mpsc;

use crate::config::SkuConfig;
use crate::confirmer::Pending;
use crate::stock::LocalStock;

/// The ledger's figures as this node last saw them. Only ever moves forward: a refresh that
/// read older figures than a confirmation already reported is ignored.
#[derive(Debug, Clone)]
pub struct LedgerView {
    pub total: u64,
    pub sold: u64,
    pub remaining: u64,
    /// The ledger said it has no record of the SKU: sales stop until it comes back.
    pub missing: bool,
}

/// What a key bought, enough to replay the answer and to tell a reused key.
#[derive(Debug, Clone)]
pub struct SoldKey {
    pub user: UserId,
    pub qty: u32,
    pub receipt: Receipt,
}

pub struct SkuState {
    pub config: SkuConfig,
    pub stock: LocalStock,
    /// Set once the ledger reports nothing left, so the rest of the burst is answered from
    /// memory. Cleared again if a restock shows remaining units.
    sold_out: AtomicBool,
    /// Closed by an operator (heard from the coordinator or read from the ledger): every purchase
    /// is answered `ended` from memory. Never cleared: a closed sale stays closed.
    closed: AtomicBool,
    /// The buffer the coordinator keeps for this SKU, for the stock page; `None` without one.
    buffer: Mutex<Option<protocol::Buffer>>,
    /// Keys whose purchase is being confirmed by this node right now.
    pub in_flight: DashMap<IdempotencyKey, ()>,
    /// Every key that bought this SKU anywhere in the fleet, as far as this node has read the
    /// ledger's order stream (its own sales go in at once). The sold-out path looks here, so a
    /// buyer retrying a purchase whose answer was lost gets it replayed, not "sold out".
    /// Bounded by the units sold.
    sold_keys: DashMap<IdempotencyKey, SoldKey>,
    /// The last order-stream `seq` read into `sold_keys`.
    orders_read: AtomicU64,
    /// Units of the coordinator's cumulative grant added to `stock` in this epoch.
    pub applied: AtomicU64,
    /// Units this node sold in this epoch, reported by heartbeat (the coordinator's sell rate).
    pub sold_in_epoch: AtomicU64,
    /// Buyers told `sold_out` because this node's allotment was empty while the ledger still
    /// had stock: the cost of too small a buffer (or of a reallocation still under way).
    pub exhausted_with_stock_left: AtomicU64,
    /// Local winners the ledger refused as sold out: the ledger load an over-allocation costs.
    pub refused_by_ledger: AtomicU64,
    /// Local winners waiting for the confirmer (absent in ledger-only mode).
    pub confirm_queue: Option<mpsc::Sender<Pending>>,
    /// std `Mutex`: held for a few field copies, never across an `.await`.
    view: Mutex<LedgerView>,
}

impl SkuState {
    /// `initial_units` is the configured allotment, or 0 when the coordinator grants it.
    pub fn new(config: SkuConfig, initial_units: u64, confirm_queue: Option<mpsc::Sender<Pending>>) -> Self {
        let total = config.terms.total;
        Self {
            stock: LocalStock::new(initial_units),
            applied: AtomicU64::new(0),
            sold_in_epoch: AtomicU64::new(0),
            exhausted_with_stock_left: AtomicU64::new(0),
            refused_by_ledger: AtomicU64::new(0),
            config,
            sold_out: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            buffer: Mutex::new(None),
            in_flight: DashMap::new(),
            sold_keys: DashMap::new(),
            orders_read: AtomicU64::new(0),
            confirm_queue,
            view: Mutex::new(LedgerView { total, sold: 0, remaining: total, missing: false }),
        }
    }

    pub fn is_sold_out(&self) -> bool {
        // Relaxed: the flag is a hint that saves a ledger call; a stale `false` costs one call
        // that the ledger answers sold_out, a stale `true` cannot happen before the ledger said so.
        self.sold_out.load(Ordering::Relaxed)
    }

    pub fn is_closed(&self) -> bool {
        // Relaxed: a stale `false` costs one ledger call, which the ledger answers `ended`.
        self.closed.load(Ordering::Relaxed)
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    pub fn buffer(&self) -> Option<protocol::Buffer> {
        *self.buffer.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn set_buffer(&self, buffer: protocol::Buffer) {
        *self.buffer.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(buffer);
    }

    pub fn view(&self) -> LedgerView {
        self.view.lock().map(|v| v.clone()).unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// Records figures returned by a confirmation. `sold` only grows between restocks, so a
    /// smaller value is an older reading and is dropped.
    pub fn observe_confirm(&self, sold: u64, remaining: u64) {
        self.update_view(|view| {
            if sold >= view.sold || sold + remaining != view.total {
                view.total = sold + remaining;
                view.sold = sold;
                view.remaining = remaining;
            }
            view.missing = false;
        });
    }

    /// Records a full status read (the periodic refresh).
    pub fn observe_status(&self, status: &SkuStatus) {
        if status.closed {
            self.close();
        }
        self.update_view(|view| {
            if status.sold >= view.sold || status.total != view.total {
                view.total = status.total;
                view.sold = status.sold;
                view.remaining = status.remaining;
            }
            view.missing = false;
        });
    }

    /// The purchase recorded under `key`, if that key bought this SKU.
    pub fn sold_key(&self, key: &str) -> Option<SoldKey> {
        self.sold_keys.get(key).map(|entry| entry.value().clone())
    }

    pub fn record_sale(&self, key: IdempotencyKey, sale: SoldKey) {
        self.sold_keys.insert(key, sale);
    }

    /// Where to resume reading the order stream.
    pub fn orders_read(&self) -> u64 {
        // Acquire pairs with the Release in `record_orders`; only the refresher writes it.
        self.orders_read.load(Ordering::Acquire)
    }

    /// Records a page of the order stream.
    pub fn record_orders(&self, events: Vec<OrderEvent>) {
        let Some(last) = events.last().map(|e| e.seq) else { return };
        for event in events {
            let receipt = Receipt { order_id: event.order_id, node: event.node, qty: event.qty };
            self.sold_keys.insert(event.key, SoldKey { user: event.user, qty: event.qty, receipt });
        }
        self.orders_read.fetch_max(last, Ordering::Release);
    }

    pub fn observe_missing(&self) {
        self.update_view(|view| view.missing = true);
    }

    fn update_view(&self, change: impl FnOnce(&mut LedgerView)) {
        let mut view = self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        change(&mut view);
        // Relaxed: see `is_sold_out`.
        self.sold_out.store(view.remaining == 0 && !view.missing, Ordering::Relaxed);
    }
}
