//! The values an order store keeps and answers with. Times are Unix milliseconds; money is an
//! integer count of the currency's minor unit (cents), never a float.

use serde::{Deserialize, Serialize};

/// Where an order is in its life. Only `PendingPayment` ever changes; every other state is final
/// except that a payment arriving for an `Expired` or `Cancelled` order turns it into
/// `PaidAfterExpiry` (its unit was already given back: the buyer is owed a refund).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    PendingPayment,
    Paid,
    Expired,
    Cancelled,
    PaidAfterExpiry,
}

impl OrderState {
    pub const ALL: [OrderState; 5] = [
        OrderState::PendingPayment,
        OrderState::Paid,
        OrderState::Expired,
        OrderState::Cancelled,
        OrderState::PaidAfterExpiry,
    ];

    /// The name stored in the database and shown in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderState::PendingPayment => "pending_payment",
            OrderState::Paid => "paid",
            OrderState::Expired => "expired",
            OrderState::Cancelled => "cancelled",
            OrderState::PaidAfterExpiry => "paid_after_expiry",
        }
    }

    pub fn parse(text: &str) -> Option<OrderState> {
        OrderState::ALL.into_iter().find(|state| state.as_str() == text)
    }

    /// The order's units went back to the ledger (or must): it ended without a valid payment.
    pub fn gives_units_back(self) -> bool {
        matches!(self, OrderState::Expired | OrderState::Cancelled | OrderState::PaidAfterExpiry)
    }

    /// No event moves the order on: it was paid, in time or too late.
    pub fn is_terminal(self) -> bool {
        matches!(self, OrderState::Paid | OrderState::PaidAfterExpiry)
    }

    /// The state machine's edges ([`crate::lifecycle`]): a pending order is paid, cancelled or
    /// expires; an ended one is paid too late; nothing else moves.
    pub fn may_become(self, to: OrderState) -> bool {
        use OrderState::*;
        let allowed =
            matches!((self, to), (PendingPayment, Paid | Expired | Cancelled) | (Expired | Cancelled, PaidAfterExpiry));
        debug_assert!(!(allowed && self.is_terminal()), "a terminal state {self:?} has an edge to {to:?}");
        allowed
    }
}

/// An order as the consumer first writes it, from one order event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOrder {
    pub id: String,
    pub sku: String,
    pub user: String,
    pub qty: u32,
    pub node: String,
    pub idempotency_key: String,
    /// The event's position in the SKU's order stream (1, 2, …).
    pub stream_seq: u64,
    /// Price of one unit, in minor units, as the SKU's terms said when the order was stored.
    pub unit_price: u64,
    pub currency: String,
    pub created_at_ms: u64,
    pub pay_deadline_ms: u64,
}

impl NewOrder {
    /// What the buyer must pay: unit price × quantity.
    pub fn amount(&self) -> u64 {
        self.unit_price.saturating_mul(u64::from(self.qty))
    }
}

/// An order with its state and the time of every transition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    #[serde(flatten)]
    pub new: NewOrder,
    pub state: OrderState,
    /// The payment provider's reference of the payment that settled (or came too late for) it.
    pub payment_ref: Option<String>,
    pub paid_at_ms: Option<u64>,
    pub expired_at_ms: Option<u64>,
    pub cancelled_at_ms: Option<u64>,
    /// When the ledger confirmed the units went back (expired, cancelled, paid after expiry).
    pub released_at_ms: Option<u64>,
    pub updated_at_ms: u64,
    /// Why the ledger refused to give the units back, once it has: the order leaves the
    /// sweeper's queue and waits for an operator (`seckill reconcile` lists it).
    pub release_refused: Option<String>,
    /// When the buyer started paying (`POST /v1/orders/{id}/pay`); the deadline was extended
    /// by the grace once then.
    pub payment_started_at_ms: Option<u64>,
    /// When the provider is next asked about this order's payment (at the deadline: what became
    /// of it; after an expiry or a cancel: close it); `None` once nothing is left to ask.
    pub payment_check_at_ms: Option<u64>,
    /// Provider checks made so far, for their backoff.
    pub payment_checks: u32,
    /// The payment attempt the provider knows the order by now (see
    /// [`crate::payments::attempts`]): 1 unless the provider held an earlier one for another
    /// amount or currency.
    pub payment_attempt: u32,
}

/// The payment the provider opened for an order when its buyer pressed pay, as the store
/// remembers it: what a later press answers while the provider cannot be reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenedPayment {
    pub order_id: String,
    pub payment_id: String,
    pub pay_url: String,
    pub amount: u64,
    pub currency: String,
    pub created_at_ms: u64,
}

/// Where the sweeper's walk over the orders to release stands: the last one it took, in
/// (deadline, id) order. The walk goes on from there and wraps around at the end, so orders it
/// cannot release this round never keep it from the ones behind them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReleaseCursor {
    pub pay_deadline_ms: u64,
    pub id: String,
}

impl ReleaseCursor {
    pub fn after(order: &Order) -> ReleaseCursor {
        ReleaseCursor { pay_deadline_ms: order.new.pay_deadline_ms, id: order.new.id.clone() }
    }
}

/// A payment notification, checked against its order by the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    pub order_id: String,
    /// The provider's reference: one payment, however often it is notified.
    pub reference: String,
    pub amount: u64,
    pub currency: String,
    pub received_at_ms: u64,
    /// How the order service learned of it.
    #[serde(default)]
    pub source: PaymentSource,
}

/// How the order service learned of a payment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentSource {
    /// The provider's signed notification.
    #[default]
    Callback,
    /// Its own question to the provider, for a payment whose notification never came.
    Query,
}

impl PaymentSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentSource::Callback => "callback",
            PaymentSource::Query => "query",
        }
    }

    pub fn parse(text: &str) -> Option<PaymentSource> {
        [PaymentSource::Callback, PaymentSource::Query].into_iter().find(|s| s.as_str() == text)
    }
}

/// What recording a payment did. Every outcome but `Duplicate` and `ReferenceReused` recorded
/// the payment; those marked "refund owed" did not settle the order and owe the buyer the money
/// back ([`PaymentRecord::refund`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum PaymentOutcome {
    /// The order was pending and is now paid.
    Paid,
    /// The order had already expired or been cancelled: recorded as paid after expiry, refund
    /// owed.
    PaidAfterExpiry,
    /// This reference was recorded before (for this order); nothing changed.
    Duplicate { first: Box<PaymentOutcome> },
    /// The order was already paid by another reference: recorded, refund owed.
    AlreadyPaid,
    /// Amount or currency differ from the order's: recorded, refund owed; the order is unchanged.
    Mismatch { expected_amount: u64, expected_currency: String },
    /// The reference was recorded for a different order; nothing changed.
    ReferenceReused,
    /// The order is not stored yet (the consumer is behind the sale): recorded, and applied
    /// when the order arrives. Until then the sweeper does not expire that order.
    AwaitingOrder,
}

impl PaymentOutcome {
    /// The payment was recorded and did not settle its order: the buyer is owed the money back.
    pub fn refund_owed(&self) -> bool {
        matches!(self, PaymentOutcome::PaidAfterExpiry | PaymentOutcome::AlreadyPaid | PaymentOutcome::Mismatch { .. })
    }

    /// The outcome's name, as metrics and the store call it.
    pub fn label(&self) -> &'static str {
        match self {
            PaymentOutcome::Paid => "paid",
            PaymentOutcome::PaidAfterExpiry => "paid_after_expiry",
            PaymentOutcome::Duplicate { .. } => "duplicate",
            PaymentOutcome::AlreadyPaid => "already_paid",
            PaymentOutcome::Mismatch { .. } => "mismatch",
            PaymentOutcome::ReferenceReused => "reference_reused",
            PaymentOutcome::AwaitingOrder => "awaiting_order",
        }
    }
}

/// Where a refund owed for a payment stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundState {
    /// The money must go back; nobody has asked the provider yet.
    Owed,
    /// Asked of the provider; not yet acknowledged.
    Pending,
    /// The provider acknowledged it: done, once.
    Refunded,
}

impl RefundState {
    pub fn as_str(self) -> &'static str {
        match self {
            RefundState::Owed => "owed",
            RefundState::Pending => "pending",
            RefundState::Refunded => "refunded",
        }
    }

    pub fn parse(text: &str) -> Option<RefundState> {
        [RefundState::Owed, RefundState::Pending, RefundState::Refunded].into_iter().find(|s| s.as_str() == text)
    }

    /// A refund only moves forward: asked (again), then acknowledged once.
    pub fn may_become(self, to: RefundState) -> bool {
        matches!((self, to), (RefundState::Owed | RefundState::Pending, RefundState::Pending | RefundState::Refunded))
    }
}

/// One recorded payment, as the `payments` table keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentRecord {
    pub reference: String,
    pub order_id: String,
    pub amount: u64,
    pub currency: String,
    pub received_at_ms: u64,
    /// What it did to its order: `paid`, `paid_after_expiry`, `already_paid`, `mismatch` or
    /// `awaiting_order`.
    pub outcome: String,
    /// Set when the payment did not settle its order.
    pub refund: Option<RefundState>,
    pub refund_reason: Option<String>,
    pub source: PaymentSource,
    /// Refund attempts made so far, for their backoff.
    pub refund_attempts: u32,
}

impl PaymentRecord {
    /// The id its refund is asked under: one per payment, so however often the refund job
    /// retries, the provider pays it back once.
    pub fn refund_id(&self) -> String {
        debug_assert!(!self.reference.is_empty(), "a payment without a reference has no refund id of its own");
        format!("rf_{}", self.reference)
    }
}

/// What the buyer's "pay" did to the order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartPayment {
    /// The payment is started (now, or before: the deadline was extended only the first time).
    Started(Order),
    /// Paid, expired, cancelled, or past its deadline: no payment can start.
    NotPending(Order),
    /// No such order.
    UnknownOrder,
}

/// What a buyer's cancel did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum CancelOutcome {
    Cancelled,
    /// Already cancelled; nothing changed.
    AlreadyCancelled,
    /// Paid, expired or paid after expiry: no longer the buyer's to cancel.
    NotPending {
        state: OrderState,
    },
    /// The order belongs to another user (answered like an unknown order).
    UnknownOrder,
}

/// What an expiry attempt did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpireOutcome {
    Expired,
    /// Paid, cancelled or already expired in the meantime: nothing changed.
    NotPending,
    /// A sweeper with a newer fencing token has run since: this one's writes are refused.
    StaleFence,
}

/// An order event the consumer could not turn into an order after `max_deliveries` tries: kept
/// with its raw fields so an operator can repair it, and acknowledged so it never blocks the
/// entries behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub sku: String,
    pub stream_seq: u64,
    /// The entry's fields as read from the stream, in order.
    pub fields: Vec<(String, String)>,
    pub reason: String,
    pub deliveries: u64,
    pub at_ms: u64,
}

/// One SKU's money, counted for reconciliation: the payments recorded against its orders.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuMoneyCounts {
    /// Payments recorded against the SKU's orders, whatever they did.
    pub payments: u64,
    /// Payments that settled their order (`outcome = paid`).
    pub settled: u64,
    pub refunds_owed: u64,
    pub refunds_pending: u64,
    pub refunded: u64,
    /// Payments whose order is stored but which are not applied yet.
    pub awaiting: u64,
    /// Orders in state `paid`.
    pub paid_orders: u64,
    /// Orders in state `paid` whose units were given back: must be 0.
    pub paid_orders_released: u64,
    /// Payments the order service found by asking the provider (their notification never came).
    pub found_by_query: u64,
}

/// One SKU's orders, counted for reconciliation and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuOrderCounts {
    pub orders: u64,
    /// Units by state (quantities summed, not orders).
    pub units_pending: u64,
    pub units_paid: u64,
    pub units_expired: u64,
    pub units_cancelled: u64,
    pub units_paid_after_expiry: u64,
    /// Orders whose units must go back (expired, cancelled, paid after expiry) and did not yet,
    /// the ones the ledger refused left out.
    pub orders_unreleased: u64,
    /// Units of orders whose release the ledger refused (see [`Order::release_refused`]).
    pub units_release_refused: u64,
    /// Highest stream seq stored, as an order or a dead letter (0: none), as
    /// [`OrderStore::stored_seqs`](crate::OrderStore::stored_seqs) counts them.
    pub max_stream_seq: u64,
}
