//! A SKU's local allotment: the stock requests race on, the confirmer's queue, the sold-out
//! flag, the keys in flight, and the epoch's figures heartbeats report. Its invariants are the
//! SKU's (see `sku.rs`): units leave the stock only to a request or with an ended epoch, and
//! every unit taken is settled exactly once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dashmap::DashMap;
use ledger::{IdempotencyKey, LedgerError, Purchase, UserId, Verdict};
use tokio::sync::{mpsc, oneshot};

use crate::stock::LocalStock;

/// The two costs a buffer trades against each other, counted per SKU on one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AllotmentStats {
    /// Buyers told `sold_out` from an empty allotment while the ledger still had stock.
    pub exhausted_with_stock_left: u64,
    /// Local winners the ledger refused as sold out (ledger calls that sold nothing).
    pub refused_by_ledger: u64,
}

/// What the next heartbeat reports of one SKU's allotment in the current epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochFigures {
    pub local_remaining: u64,
    /// Units of the coordinator's cumulative grant already in the stock.
    pub applied: u64,
    /// Units sold in this epoch: the coordinator's sell rate.
    pub sold: u64,
    /// Units given back in this epoch at the leader's request (`hold_max`).
    pub returned: u64,
}

/// One SKU's allotment as the node holds it, every figure read separately (so stale and not one
/// snapshot): what the scripted tests print, and a diagnostic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllotmentState {
    pub local_remaining: u64,
    /// Units of the coordinator's cumulative grant already in the stock, this epoch.
    pub applied: u64,
    /// Units sold in this epoch.
    pub sold_in_epoch: u64,
    /// Keys being confirmed by this node right now.
    pub in_flight: u64,
    /// The ledger said nothing is left.
    pub sold_out: bool,
}

/// A local winner handed to the confirmer. It holds `purchase.qty` units of the allotment, which
/// the confirmer settles (keeps for a sale, returns otherwise) whatever becomes of the request.
pub struct Pending {
    pub purchase: Purchase,
    /// The membership epoch its unit was taken in; a unit from an ended epoch is not returned
    /// to the stock (that allotment was revoked and reallocated).
    pub epoch: u64,
    pub reply: oneshot::Sender<Result<Verdict, LedgerError>>,
    /// The purchase's decision span: the confirmer's batch span hangs under it when traced
    /// (`Span::none()` when not, which costs nothing).
    pub span: tracing::Span,
}

/// Why the confirmer did not take a local winner; its units are back in the stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOffRefused {
    /// `confirm_queue_max` winners are already waiting: backpressure.
    QueueFull,
    /// The confirmer stopped (shutdown).
    Closed,
}

/// A SKU's local allotment and everything that exists only because of it.
pub struct Allotment {
    pub(super) stock: LocalStock,
    /// Local winners waiting for the confirmer; bounded by `confirm_queue_max`.
    pub(super) queue: mpsc::Sender<Pending>,
    /// Set once the ledger reports nothing left, so the rest of the burst is answered from
    /// memory. Cleared again if a restock shows remaining units.
    pub(super) sold_out: AtomicBool,
    /// Buyers and keys whose purchase is being confirmed by this node right now.
    pub(super) in_flight: DashMap<(UserId, IdempotencyKey), ()>,
    /// Units of the coordinator's cumulative grant added to `stock` in this epoch.
    pub(super) applied: AtomicU64,
    /// Units this node sold in this epoch, reported by heartbeat (the coordinator's sell rate).
    pub(super) sold_in_epoch: AtomicU64,
    /// Units given back in this epoch because the leader asked for at most some number.
    pub(super) returned_in_epoch: AtomicU64,
    /// Buyers told `sold_out` because this node's allotment was empty while the ledger still
    /// had stock: the cost of too small a buffer (or of a reallocation still under way).
    pub(super) exhausted_with_stock_left: AtomicU64,
    /// Local winners the ledger refused as sold out: the ledger load an over-allocation costs.
    pub(super) refused_by_ledger: AtomicU64,
    /// Units taken by requests and not settled yet, in debug builds only: each settlement
    /// (given back unsent, sold, unsold, dropped with its epoch) must match a take, so a unit
    /// settled twice, or settled without being taken, trips an assertion.
    #[cfg(debug_assertions)]
    pub(super) unsettled: AtomicU64,
}

impl Allotment {
    /// `units` is the configured allotment, or 0 when the coordinator grants it; `queue` is the
    /// sending half of the confirmer's queue.
    pub fn new(units: u64, queue: mpsc::Sender<Pending>) -> Self {
        Self {
            stock: LocalStock::new(units),
            queue,
            sold_out: AtomicBool::new(false),
            in_flight: DashMap::new(),
            applied: AtomicU64::new(0),
            sold_in_epoch: AtomicU64::new(0),
            returned_in_epoch: AtomicU64::new(0),
            exhausted_with_stock_left: AtomicU64::new(0),
            refused_by_ledger: AtomicU64::new(0),
            #[cfg(debug_assertions)]
            unsettled: AtomicU64::new(0),
        }
    }

    /// Units left right now; stale as soon as it returns.
    pub fn remaining(&self) -> u64 {
        self.stock.remaining()
    }

    pub fn is_sold_out(&self) -> bool {
        // Relaxed: the flag is a hint that saves a ledger call; a stale `false` costs one call
        // that the ledger answers sold_out, a stale `true` cannot happen before the ledger said so.
        self.sold_out.load(Ordering::Relaxed)
    }

    /// Takes `qty` units if that many are left; otherwise takes nothing and returns false. A
    /// refusal while the ledger still has stock (the sold-out flag is down) is counted: it is
    /// what too small a buffer costs. The caller now owns the units: it must either
    /// [`hand_off`](Self::hand_off) them or [`give_back_unsent`](Self::give_back_unsent) them
    /// without an `.await` in between, so a cancelled request cannot strand them.
    pub fn take(&self, qty: u32) -> bool {
        if self.stock.take(u64::from(qty)) {
            // Relaxed: a debug count; the hand-off to the confirmer orders it before the settle.
            #[cfg(debug_assertions)]
            self.unsettled.fetch_add(u64::from(qty), Ordering::Relaxed);
            return true;
        }
        if !self.is_sold_out() {
            // Relaxed: a statistic.
            self.exhausted_with_stock_left.fetch_add(1, Ordering::Relaxed);
        }
        false
    }

    /// Returns units a request took and will not hand to the confirmer (it was refused before).
    pub fn give_back_unsent(&self, qty: u32) {
        self.settled(qty);
        self.stock.give_back(u64::from(qty));
    }

    /// Books the settlement of `qty` taken units (debug builds): every unit is settled once, by
    /// exactly one of `give_back_unsent`, `sold`, `unsold` and `dropped_with_epoch`.
    fn settled(&self, qty: u32) {
        debug_assert!(qty > 0, "a settlement of no units: qty is validated to 1..=qty_max");
        #[cfg(debug_assertions)]
        {
            // Relaxed: see `take`.
            let unsettled = self.unsettled.fetch_sub(u64::from(qty), Ordering::Relaxed);
            debug_assert!(
                unsettled >= u64::from(qty),
                "settled {qty} units with {unsettled} taken and unsettled: a unit settled twice or never taken"
            );
        }
    }

    /// Marks `user`'s purchase under `key` as being confirmed by this node until the returned
    /// guard is dropped (also when the request is cancelled); `None` if it already is.
    pub fn claim(&self, user: &UserId, key: &IdempotencyKey) -> Option<InFlight<'_>> {
        let claimed = (user.clone(), key.clone());
        match self.in_flight.entry(claimed.clone()) {
            dashmap::Entry::Occupied(_) => None,
            dashmap::Entry::Vacant(slot) => {
                slot.insert(());
                Some(InFlight { allotment: self, claimed })
            }
        }
    }

    /// Gives a local winner's units to the confirmer, which settles them from now on. If it
    /// refuses (queue full, shutting down) the units go back to the stock here, so either way
    /// the caller holds none afterwards.
    pub fn hand_off(&self, pending: Pending) -> Result<(), HandOffRefused> {
        let qty = pending.purchase.qty;
        self.queue.try_send(pending).map_err(|e| {
            self.give_back_unsent(qty);
            match e {
                mpsc::error::TrySendError::Full(_) => HandOffRefused::QueueFull,
                mpsc::error::TrySendError::Closed(_) => HandOffRefused::Closed,
            }
        })
    }

    /// The confirmer's settlement of a sale of `qty` units taken in the current epoch: they stay
    /// out of the stock and count towards the sell rate the heartbeat reports.
    pub fn sold(&self, qty: u32) {
        self.settled(qty);
        // Relaxed: a statistic for the coordinator's sell rate.
        self.sold_in_epoch.fetch_add(u64::from(qty), Ordering::Relaxed);
    }

    /// The confirmer's settlement of `qty` units taken in the current epoch and not sold
    /// (refused, replayed, ledger unreachable): back to the stock. Returning them when the ledger
    /// was unreachable is the safe side: the ledger caps sales anyway, so an extra local unit
    /// cannot oversell, while a lost one could leave stock unsold. `refused_as_sold_out` counts
    /// the ledger call an over-allocation cost.
    pub fn unsold(&self, qty: u32, refused_as_sold_out: bool) {
        self.settled(qty);
        if refused_as_sold_out {
            // Relaxed: a statistic.
            self.refused_by_ledger.fetch_add(1, Ordering::Relaxed);
        }
        self.stock.give_back(u64::from(qty));
    }

    /// The confirmer's settlement of `qty` units taken in an epoch that has ended: they are
    /// neither this epoch's sale nor stock (that allotment was revoked and reallocated), so
    /// nothing changes but the books of debug builds.
    pub fn dropped_with_epoch(&self, qty: u32) {
        self.settled(qty);
    }

    /// Adds whatever part of the coordinator's cumulative grant `total` (for the current epoch)
    /// is not in the stock yet, and returns how many units that was. A grant never shrinks
    /// within an epoch, so a smaller `total` adds nothing. Only the membership task calls this
    /// and [`end_epoch`](Self::end_epoch), one call at a time.
    pub fn apply_grant(&self, total: u64) -> u64 {
        // Relaxed: only the membership task writes `applied`.
        let applied = self.applied.load(Ordering::Relaxed);
        if total <= applied {
            return 0;
        }
        self.stock.give_back(total - applied);
        let before = self.applied.swap(total, Ordering::Relaxed);
        debug_assert_eq!(before, applied, "`applied` changed under apply_grant: only the membership task writes it");
        total - applied
    }

    /// Gives back every unit above `max`, as the leader asked, and returns how many: they
    /// leave this node's books (reported as `returned`) for the leader to grant elsewhere.
    pub fn hold_at_most(&self, max: u64) -> u64 {
        let returned = self.stock.take_above(max);
        // Relaxed: only the membership task writes it; a heartbeat reads a snapshot.
        self.returned_in_epoch.fetch_add(returned, Ordering::Relaxed);
        returned
    }

    /// Empties the allotment because the epoch that held it ended (its units were revoked and
    /// may already be someone else's), resets the epoch's figures, and returns what it held.
    pub fn end_epoch(&self) -> u64 {
        let dropped = self.stock.take_all();
        // Relaxed: only the membership task writes these, one at a time.
        self.applied.store(0, Ordering::Relaxed);
        self.sold_in_epoch.store(0, Ordering::Relaxed);
        self.returned_in_epoch.store(0, Ordering::Relaxed);
        dropped
    }

    /// The current epoch's figures for the next heartbeat.
    pub fn epoch_figures(&self) -> EpochFigures {
        // Relaxed: a report the coordinator reads as a snapshot seconds old anyway.
        EpochFigures {
            local_remaining: self.stock.remaining(),
            applied: self.applied.load(Ordering::Relaxed),
            sold: self.sold_in_epoch.load(Ordering::Relaxed),
            returned: self.returned_in_epoch.load(Ordering::Relaxed),
        }
    }

    /// Every figure of the allotment, for diagnostics.
    pub fn state(&self) -> AllotmentState {
        let EpochFigures { local_remaining, applied, sold, .. } = self.epoch_figures();
        AllotmentState {
            local_remaining,
            applied,
            sold_in_epoch: sold,
            in_flight: self.in_flight.len() as u64,
            sold_out: self.is_sold_out(),
        }
    }

    /// How well the allotment fits the demand on this node.
    pub fn stats(&self) -> AllotmentStats {
        // Relaxed: statistics.
        AllotmentStats {
            exhausted_with_stock_left: self.exhausted_with_stock_left.load(Ordering::Relaxed),
            refused_by_ledger: self.refused_by_ledger.load(Ordering::Relaxed),
        }
    }
}

/// A key being confirmed by this node (see [`Allotment::claim`]); unmarked when dropped.
pub struct InFlight<'a> {
    allotment: &'a Allotment,
    claimed: (UserId, IdempotencyKey),
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.allotment.in_flight.remove(&self.claimed);
    }
}
