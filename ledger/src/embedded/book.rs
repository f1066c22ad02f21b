//! One SKU's books in the embedded ledger, and every step that changes them: each step asserts
//! the invariants it could break (listed on `Book`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::room;
use crate::types::stored;
use crate::*;

/// Stored decisions beyond this many trigger a sweep of expired ones, so memory stays bounded by
/// the decisions made within one TTL. After a sweep the next one waits until the map has doubled,
/// so sweeping stays amortized O(1) per decision even when nothing has expired yet.
pub(super) const DECISIONS_SWEEP_AT: usize = 100_000;

/// The same rule for unspent submit tokens: memory stays bounded by the tokens issued within one
/// token TTL.
pub(super) const TOKENS_SWEEP_AT: usize = 100_000;

/// One SKU's books. Invariants, each asserted (`debug_assert!`) right after the step that
/// could break it, and the first also around every operation (`EmbeddedLedger::with_book`):
/// - `sold + remaining == total`; `remaining` never goes below zero (it is `u64`: a step that
///   takes more than is left is refused before it subtracts).
/// - every unit sold is counted once in `sold_by_epoch` and stays there:
///   `sum(sold_by_epoch) == sold + released`.
/// - a buyer's count never exceeds the per-user limit through a sale, and a release gives back
///   no more than the buyer's count holds.
/// - a sale's record is released at most once, and `released` is the sum of the release log.
/// - the order stream holds every sale's event from `orders_trimmed + 1` to `order_seq`.
/// - an ended epoch never comes back: `ended` only grows.
/// - a transfer moves unsold units only, once per id and side: `transferred_out` is the sum of
///   `transfers_out`, `transferred_in` of `transfers_in`, and neither touches `sold`.
pub(super) struct Book {
    pub(super) total: u64,
    pub(super) sold: u64,
    pub(super) remaining: u64,
    pub(super) per_user_limit: u32,
    pub(super) closed: bool,
    pub(super) require_token: bool,
    pub(super) order_seq: u64,
    pub(super) sold_by_node: BTreeMap<NodeId, u64>,
    pub(super) sold_by_epoch: HashMap<String, u64>,
    /// Per node, the highest epoch the coordinator ended: batches of it or older are refused.
    pub(super) ended: HashMap<NodeId, u64>,
    pub(super) bought_by_user: HashMap<UserId, u64>,
    /// (buyer, idempotency key) → (fingerprint, encoded decision, expiry). A key is its
    /// buyer's: another buyer's purchase under the same key is a purchase of its own.
    pub(super) decisions: HashMap<(UserId, IdempotencyKey), (String, String, Instant)>,
    /// Size of `decisions` at which the next sweep runs.
    pub(super) next_sweep_at: usize,
    /// Unspent submit tokens → (the user it was issued to, expiry).
    pub(super) tokens: HashMap<SubmitToken, (UserId, Instant)>,
    /// The token each buyer holds → (token, expiry): `token.lua`'s holder keys.
    pub(super) token_holders: HashMap<UserId, (SubmitToken, Instant)>,
    /// Size of `tokens` at which the next sweep runs.
    pub(super) next_token_sweep_at: usize,
    /// The token window being counted and the tokens issued in it (the same bound as Redis').
    pub(super) token_window: (u64, u64),
    /// The order stream from `orders_trimmed + 1` on: seq n sits at index n - 1 - orders_trimmed.
    pub(super) orders: VecDeque<OrderEvent>,
    pub(super) orders_trimmed: u64,
    pub(super) released: u64,
    /// The terms order events carry (pricing.lua).
    pub(super) pricing: Pricing,
    /// The ledger's record of every sale by order id, kept `sale_record_ttl` (on Redis, the
    /// sale's idempotency record, kept as long): what a release is checked against, and
    /// whether it happened.
    pub(super) sales: HashMap<OrderId, SaleRecord>,
    /// Size of `sales` at which the next sweep of expired records runs.
    pub(super) next_sales_sweep_at: usize,
    pub(super) releases: Vec<ReleaseEvent>,
    /// Consumer groups of the order stream, by name.
    pub(super) groups: HashMap<String, FeedGroup>,
    pub(super) transferred_out: u64,
    pub(super) transferred_in: u64,
    /// Transfer id → units it took out (`transfer_out.lua`'s `out:<id>` fields).
    pub(super) transfers_out: HashMap<u64, u64>,
    /// Transfer id → units it put in (`transfer_in.lua`'s `in:<id>` fields).
    pub(super) transfers_in: HashMap<u64, u64>,
    /// The SKU's waiting room (`room.lua`'s keys); empty for a SKU without one.
    pub(super) room: room::Room,
}

/// What a release needs to know about one sale.
pub(super) struct SaleRecord {
    /// The sale's idempotency key: a release names it, as the Redis ledger finds the record
    /// under it.
    pub(super) key: IdempotencyKey,
    pub(super) user: UserId,
    pub(super) qty: u32,
    pub(super) expires_at: Instant,
    pub(super) released: bool,
}

/// One consumer group's place in the order stream, as Redis keeps it.
#[derive(Default)]
pub(super) struct FeedGroup {
    pub(super) last_delivered: u64,
    /// Delivered, not acknowledged: seq → (consumer, last delivery, deliveries).
    pub(super) pending: BTreeMap<u64, (String, Instant, u64)>,
}

impl Book {
    pub(super) fn status(&self) -> SkuStatus {
        SkuStatus {
            total: self.total,
            sold: self.sold,
            remaining: self.remaining,
            per_user_limit: self.per_user_limit,
            sold_by_node: self.sold_by_node.clone(),
            closed: self.closed,
            require_token: self.require_token,
            released: self.released,
            orders: self.order_seq,
            transferred_out: self.transferred_out,
            transferred_in: self.transferred_in,
        }
    }

    /// `transfer_out.lua`: the least of `most` and what remains (nothing once closed), once per id.
    pub(super) fn transfer_out(&mut self, transfer: u64, most: u64) -> u64 {
        if let Some(taken) = self.transfers_out.get(&transfer) {
            return *taken;
        }
        let sold_before = self.sold;
        let taken = if self.closed { 0 } else { most.min(self.remaining) };
        self.remaining -= taken;
        self.total -= taken;
        self.transferred_out += taken;
        self.transfers_out.insert(transfer, taken);
        debug_assert_eq!(self.sold, sold_before, "a transfer never takes a sold unit");
        debug_assert_eq!(
            self.sold + self.remaining,
            self.total,
            "a transfer takes from remaining what it takes from total"
        );
        debug_assert_eq!(
            self.transfers_out.values().sum::<u64>(),
            self.transferred_out,
            "every unit transferred out is recorded under its transfer id, once"
        );
        taken
    }

    /// `transfer_in.lua`: `units` into total and remaining, once per id.
    pub(super) fn transfer_in(&mut self, transfer: u64, units: u64) -> Result<(), LedgerError> {
        if self.transfers_in.contains_key(&transfer) {
            return Ok(());
        }
        let total = self.total.checked_add(units).filter(|total| *total <= TOTAL_MAX);
        let Some(total) = total else {
            return Err(LedgerError::Corrupt(format!(
                "a transfer of {units} units would lift the total past TOTAL_MAX"
            )));
        };
        let sold_before = self.sold;
        self.total = total;
        self.remaining += units;
        self.transferred_in += units;
        self.transfers_in.insert(transfer, units);
        debug_assert_eq!(self.sold, sold_before, "a transfer in never touches sold units");
        debug_assert_eq!(self.sold + self.remaining, self.total, "a transfer adds to remaining what it adds to total");
        debug_assert_eq!(
            self.transfers_in.values().sum::<u64>(),
            self.transferred_in,
            "every unit transferred in is recorded under its transfer id, once"
        );
        Ok(())
    }

    pub(super) fn order(&self, seq: u64) -> Option<&OrderEvent> {
        let at = seq.checked_sub(self.orders_trimmed + 1)?;
        self.orders.get(usize::try_from(at).ok()?)
    }

    pub(super) fn release(&mut self, release: &Release, now: Instant) -> Result<ReleaseOutcome, LedgerError> {
        let Some(record) = self.sales.get_mut(&release.order_id).filter(|record| record.expires_at > now) else {
            return Ok(ReleaseOutcome::NeverSold);
        };
        if record.user != release.user || record.qty != release.qty || record.key != release.key {
            return Ok(ReleaseOutcome::NeverSold);
        }
        if record.released {
            return Ok(ReleaseOutcome::AlreadyReleased);
        }
        let qty = u64::from(release.qty);
        if self.sold < qty {
            return Err(LedgerError::Corrupt("a release larger than what is sold".into()));
        }
        debug_assert!(
            self.bought_by_user.get(&release.user).is_some_and(|bought| *bought >= qty),
            "a release gives back no more than its buyer's count holds"
        );
        self.sold -= qty;
        self.remaining += qty;
        self.released += qty;
        if let Some(bought) = self.bought_by_user.get_mut(&release.user) {
            *bought = bought.saturating_sub(qty);
            if *bought == 0 {
                self.bought_by_user.remove(&release.user);
            }
        }
        debug_assert!(!record.released, "a sale's record is released at most once");
        record.released = true;
        let seq = self.releases.len() as u64 + 1;
        self.releases.push(ReleaseEvent {
            seq,
            order_id: release.order_id.clone(),
            user: release.user.clone(),
            qty: release.qty,
        });
        debug_assert_eq!(self.sold + self.remaining, self.total, "a release moves units from sold to remaining");
        debug_assert_eq!(
            self.releases.iter().map(|logged| u64::from(logged.qty)).sum::<u64>(),
            self.released,
            "every released unit is in the release log, once"
        );
        self.debug_assert_epochs_count_every_sale();
        Ok(ReleaseOutcome::Released { remaining: self.remaining })
    }

    pub(super) fn feed_entry(&self, seq: u64, deliveries: u64) -> Option<FeedEntry> {
        let event = self.order(seq)?;
        let fields = vec![
            ("order_id".to_string(), event.order_id.to_string()),
            ("key".to_string(), event.key.to_string()),
            ("user".to_string(), event.user.to_string()),
            ("qty".to_string(), event.qty.to_string()),
            ("node".to_string(), event.node.to_string()),
            ("at".to_string(), event.at_ms.to_string()),
        ];
        let mut fields = fields;
        if let Some(pricing) = &event.pricing {
            fields.push(("price".to_string(), pricing.price.to_string()));
            fields.push(("currency".to_string(), pricing.currency.clone()));
            fields.push(("pay_timeout_s".to_string(), pricing.pay_timeout_s.to_string()));
        }
        Some(FeedEntry { seq, fields, deliveries, unreadable: None })
    }

    pub(super) fn check_invariant(&self) -> Result<(), LedgerError> {
        if self.sold + self.remaining != self.total {
            return Err(LedgerError::Corrupt("sold + remaining ~= total".into()));
        }
        Ok(())
    }

    /// Every unit sold is in the count of the epoch that sold it, and stays there when it is
    /// released: what `end_epoch` answers the coordinator must add up to the sales. O(epochs),
    /// so debug builds only.
    pub(super) fn debug_assert_epochs_count_every_sale(&self) {
        debug_assert_eq!(
            self.sold_by_epoch.values().sum::<u64>(),
            self.sold + self.released,
            "the epochs' counts add up to every unit sold, released or not"
        );
    }

    /// The order stream holds one event per sale from `orders_trimmed + 1` to `order_seq`.
    pub(super) fn debug_assert_stream_holds_every_sale(&self) {
        debug_assert_eq!(
            self.orders_trimmed + self.orders.len() as u64,
            self.order_seq,
            "the order stream holds every untrimmed sale's event"
        );
    }

    pub(super) fn decide(
        &mut self,
        sku: &SkuId,
        seller: &Seller,
        purchase: &Purchase,
        ttls: Ttls,
        now: Instant,
    ) -> Verdict {
        let fingerprint = purchase.fingerprint();
        let buyer_key = (purchase.user.clone(), purchase.key.clone());
        if let Some((stored_fingerprint, decision, expires_at)) = self.decisions.get(&buyer_key) {
            if *expires_at > now {
                if *stored_fingerprint != fingerprint {
                    return Verdict::KeyReused;
                }
                return match stored::decode(decision) {
                    Some(decision) => Verdict::Replayed(decision),
                    None => unreachable!("the embedded ledger only stores what it encoded"),
                };
            }
        }
        let qty = u64::from(purchase.qty);
        let bought = self.bought_by_user.get(&purchase.user).copied().unwrap_or(0);
        let decision = if self.require_token && !self.spend_token(purchase, now) {
            Decision::TokenInvalid
        } else if self.closed {
            Decision::Ended
        } else if self.per_user_limit > 0 && bought + qty > u64::from(self.per_user_limit) {
            Decision::UserLimit
        } else if self.remaining < qty {
            Decision::SoldOut
        } else {
            Decision::Purchased(self.sell(sku, seller, purchase, ttls, now))
        };
        if self.decisions.len() >= self.next_sweep_at {
            self.decisions.retain(|_, (_, _, expires_at)| *expires_at > now);
            self.next_sweep_at = (self.decisions.len() * 2).max(DECISIONS_SWEEP_AT);
        }
        self.decisions.insert(buyer_key, (fingerprint, stored::encode(&decision), now + ttls.idempotency));
        Verdict::Fresh(decision)
    }

    /// Sells `purchase` (every check passed): moves its units from remaining to sold, counts
    /// them for the seller's epoch and the buyer, appends its order event and records the sale
    /// for its release.
    pub(super) fn sell(
        &mut self,
        sku: &SkuId,
        seller: &Seller,
        purchase: &Purchase,
        ttls: Ttls,
        now: Instant,
    ) -> Receipt {
        let qty = u64::from(purchase.qty);
        debug_assert!(qty <= self.remaining, "a sale takes no more than what remains");
        self.remaining -= qty;
        self.sold += qty;
        self.order_seq += 1;
        let node = &seller.node;
        *self.sold_by_node.entry(node.clone()).or_insert(0) += qty;
        *self.sold_by_epoch.entry(seller.epoch_key()).or_insert(0) += qty;
        let bought = self.bought_by_user.entry(purchase.user.clone()).or_insert(0);
        *bought += qty;
        debug_assert!(
            self.per_user_limit == 0 || *bought <= u64::from(self.per_user_limit),
            "a sale keeps its buyer within the per-user limit"
        );
        debug_assert_eq!(self.sold + self.remaining, self.total, "a sale moves units from remaining to sold");
        self.debug_assert_epochs_count_every_sale();
        let receipt = Receipt {
            order_id: purchase.order_id.clone().unwrap_or_else(|| OrderId::numbered(sku, self.order_seq)),
            node: node.clone(),
            qty: purchase.qty,
        };
        self.orders.push_back(OrderEvent {
            seq: self.order_seq,
            order_id: receipt.order_id.clone(),
            key: purchase.key.clone(),
            user: purchase.user.clone(),
            qty: purchase.qty,
            node: node.clone(),
            at_ms: crate::unix_ms(),
            pricing: Some(self.pricing.clone()),
        });
        self.debug_assert_stream_holds_every_sale();
        if self.sales.len() >= self.next_sales_sweep_at {
            self.sales.retain(|_, record| record.expires_at > now);
            self.next_sales_sweep_at = (self.sales.len() * 2).max(DECISIONS_SWEEP_AT);
        }
        let record = SaleRecord {
            key: purchase.key.clone(),
            user: purchase.user.clone(),
            qty: purchase.qty,
            expires_at: now + ttls.sale_record,
            released: false,
        };
        self.sales.insert(receipt.order_id.clone(), record);
        receipt
    }

    /// Spends the purchase's token if it is live and issued to its user, with the buyer's
    /// holder entry, and says whether it did; another user's token stays with its owner, as in
    /// `confirm.lua`.
    pub(super) fn spend_token(&mut self, purchase: &Purchase, now: Instant) -> bool {
        let Some(token) = &purchase.token else { return false };
        let live_and_theirs =
            self.tokens.get(token).is_some_and(|(user, expires_at)| *expires_at > now && *user == purchase.user);
        if live_and_theirs {
            self.tokens.remove(token);
            self.token_holders.remove(&purchase.user);
            // A room's ticket is such a token: spent, it no longer counts as a live admission.
            self.room.ticket_spent(&purchase.user);
        }
        live_and_theirs
    }

    /// The live token `user` holds and the time it has left.
    pub(super) fn held_token(&self, user: &UserId, now: Instant) -> Option<IssuedToken> {
        let (token, expires_at) = self.token_holders.get(user)?;
        let expires_in = expires_at.checked_duration_since(now).filter(|left| !left.is_zero())?;
        Some(IssuedToken { token: token.clone(), expires_in })
    }

    /// Stores a token, held by `user`, unless one with the same text is live; says whether it
    /// stored it.
    pub(super) fn store_token(
        &mut self,
        token: &SubmitToken,
        user: &UserId,
        expires_at: Instant,
        now: Instant,
    ) -> bool {
        if self.tokens.get(token).is_some_and(|(_, live_until)| *live_until > now) {
            return false;
        }
        if self.tokens.len() >= self.next_token_sweep_at {
            self.tokens.retain(|_, (_, live_until)| *live_until > now);
            self.token_holders.retain(|_, (_, live_until)| *live_until > now);
            self.next_token_sweep_at = (self.tokens.len() * 2).max(TOKENS_SWEEP_AT);
        }
        self.tokens.insert(token.clone(), (user.clone(), expires_at));
        self.token_holders.insert(user.clone(), (token.clone(), expires_at));
        true
    }
}

/// How long the ledger keeps what it keeps per purchase.
#[derive(Clone, Copy)]
pub(super) struct Ttls {
    /// A decision, answering retries of its key.
    pub(super) idempotency: Duration,
    /// A sale's record, against which its release is checked.
    pub(super) sale_record: Duration,
}
