//! What both SQL stores share: the migrations they apply, and the conversions between the model's
//! unsigned integers and enums and the signed 64-bit integers and text that SQL stores.

use super::StoreError;
use crate::lifecycle::{self, OrderFacts};
use crate::model::{OpenedPayment, OrderState, Payment, PaymentOutcome, PaymentRecord, PaymentSource, RefundState};

/// One schema step: its version and the SQL that takes a database from the previous version to
/// this one. Versions start at 1, ascend without gaps, and a released step never changes.
pub(crate) struct Migration {
    pub version: i64,
    pub sql: &'static str,
}

pub(crate) const SQLITE_MIGRATIONS: &[Migration] = &[
    Migration { version: 1, sql: include_str!("migrations/sqlite/0001_orders.sql") },
    Migration { version: 2, sql: include_str!("migrations/sqlite/0002_order_identity.sql") },
    Migration { version: 3, sql: include_str!("migrations/sqlite/0003_payments_recorded.sql") },
    Migration { version: 4, sql: include_str!("migrations/sqlite/0004_payment_lifecycle.sql") },
    Migration { version: 5, sql: include_str!("migrations/sqlite/0005_payment_starts.sql") },
    Migration { version: 6, sql: include_str!("migrations/sqlite/0006_payment_attempts.sql") },
];

pub(crate) const POSTGRES_MIGRATIONS: &[Migration] = &[
    Migration { version: 1, sql: include_str!("migrations/postgres/0001_orders.sql") },
    Migration { version: 2, sql: include_str!("migrations/postgres/0002_order_identity.sql") },
    Migration { version: 3, sql: include_str!("migrations/postgres/0003_payments_recorded.sql") },
    Migration { version: 4, sql: include_str!("migrations/postgres/0004_payment_lifecycle.sql") },
    Migration { version: 5, sql: include_str!("migrations/postgres/0005_payment_starts.sql") },
    Migration { version: 6, sql: include_str!("migrations/postgres/0006_payment_attempts.sql") },
];

/// Refuses a database whose schema is newer than the newest migration this build has: it may
/// hold columns or states this build would misread or overwrite.
pub(crate) fn check_version(found: i64, migrations: &[Migration]) -> Result<(), StoreError> {
    let known = migrations.last().map_or(0, |m| m.version);
    if found > known {
        return Err(StoreError::Corrupt(format!(
            "the database's schema is version {found}, this build knows up to version {known}"
        )));
    }
    Ok(())
}

/// A model integer as SQL stores it; one above `i64::MAX` is refused, never wrapped.
pub(crate) fn to_sql(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::Invalid(format!("{what} {value} is above {}", i64::MAX)))
}

/// A limit as SQL takes it (a larger one means "all").
pub(crate) fn limit_to_sql(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// A stored integer as the model reads it; a negative one means the row is corrupt.
pub(crate) fn from_sql(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("stored {what} is negative: {value}")))
}

pub(crate) fn opt_from_sql(value: Option<i64>, what: &str) -> Result<Option<u64>, StoreError> {
    value.map(|value| from_sql(value, what)).transpose()
}

pub(crate) fn qty_from_sql(value: i64) -> Result<u32, StoreError> {
    u32::try_from(value).map_err(|_| StoreError::Corrupt(format!("stored qty is out of range: {value}")))
}

pub(crate) fn state_from_sql(text: &str) -> Result<OrderState, StoreError> {
    OrderState::parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown order state {text:?}")))
}

/// How `payments.outcome` names what the first notification of a reference did.
pub(crate) fn outcome_to_sql(outcome: &PaymentOutcome) -> &'static str {
    outcome.label()
}

/// The stored outcome of a reference, for its repeats; `order` is its order's (expected amount,
/// currency) where the order is stored, which a mismatch names.
pub(crate) fn outcome_from_sql(text: &str, order: Option<(u64, String)>) -> Result<PaymentOutcome, StoreError> {
    match text {
        "paid" => Ok(PaymentOutcome::Paid),
        "paid_after_expiry" => Ok(PaymentOutcome::PaidAfterExpiry),
        "already_paid" => Ok(PaymentOutcome::AlreadyPaid),
        "awaiting_order" => Ok(PaymentOutcome::AwaitingOrder),
        "mismatch" => {
            let (expected_amount, expected_currency) =
                order.ok_or_else(|| StoreError::Corrupt("a mismatched payment whose order is gone".into()))?;
            Ok(PaymentOutcome::Mismatch { expected_amount, expected_currency })
        }
        other => Err(StoreError::Corrupt(format!("unknown payment outcome {other:?}"))),
    }
}

/// A reference's first record and its order's terms, as a repeat of it reads them: order id,
/// outcome, and the order's unit price, qty and currency (absent while the order is not stored).
pub(crate) type FirstPayment = (String, String, Option<i64>, Option<i64>, Option<String>);

/// What a repeat of a recorded reference answers ([`lifecycle::repeat`]), from its first record.
pub(crate) fn repeat_of(first: FirstPayment, payment: &Payment) -> Result<PaymentOutcome, StoreError> {
    let (first_order, outcome, unit_price, qty, currency) = first;
    lifecycle::repeat(&first_order, payment, || {
        let expected = match (unit_price, qty, currency) {
            (Some(price), Some(qty), Some(currency)) => {
                Some((from_sql(price, "unit_price")?.saturating_mul(u64::from(qty_from_sql(qty)?)), currency))
            }
            _ => None,
        };
        outcome_from_sql(&outcome, expected)
    })
}

/// An order's terms and state as a payment is decided on them ([`lifecycle::settle`]), from
/// its `state, unit_price, qty, currency` columns.
pub(crate) fn facts_from_sql(
    state: &str,
    unit_price: i64,
    qty: i64,
    currency: String,
) -> Result<OrderFacts, StoreError> {
    Ok(OrderFacts {
        state: state_from_sql(state)?,
        unit_price: from_sql(unit_price, "unit_price")?,
        qty: qty_from_sql(qty)?,
        currency,
    })
}

pub(crate) fn refund_from_sql(text: Option<String>) -> Result<Option<RefundState>, StoreError> {
    text.map(|text| RefundState::parse(&text).ok_or_else(|| StoreError::Corrupt(format!("unknown refund {text:?}"))))
        .transpose()
}

/// The payment columns every read selects, in [`payment_from_sql`]'s order.
pub(crate) const PAYMENT_COLUMNS: &str =
    "reference, order_id, amount, currency, received_at_ms, outcome, refund, refund_reason, source, refund_attempts";

/// A payment row's columns, decoded.
pub(crate) type PaymentRow = (String, String, i64, String, i64, String, Option<String>, Option<String>, String, i32);

pub(crate) fn payment_from_sql(row: PaymentRow) -> Result<PaymentRecord, StoreError> {
    let (reference, order_id, amount, currency, received_at_ms, outcome, refund, refund_reason, source, attempts) = row;
    Ok(PaymentRecord {
        source: PaymentSource::parse(&source)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown payment source {source:?}")))?,
        refund_attempts: u32::try_from(attempts)
            .map_err(|_| StoreError::Corrupt(format!("stored refund_attempts is negative: {attempts}")))?,
        reference,
        order_id,
        amount: from_sql(amount, "amount")?,
        currency,
        received_at_ms: from_sql(received_at_ms, "received_at_ms")?,
        outcome,
        refund: refund_from_sql(refund)?,
        refund_reason,
    })
}

/// The SQL of [`SkuMoneyCounts`](crate::model::SkuMoneyCounts): nine counts, in field order,
/// for the SKU bound as the only parameter (`{p}` is its placeholder).
pub(crate) fn money_counts_sql(p: &str) -> String {
    format!(
        "SELECT \
         (SELECT COUNT(*) FROM payments JOIN orders ON orders.id = payments.order_id WHERE orders.sku = {p}), \
         (SELECT COUNT(*) FROM payments JOIN orders ON orders.id = payments.order_id \
             WHERE orders.sku = {p} AND payments.outcome = 'paid'), \
         (SELECT COUNT(*) FROM payments JOIN orders ON orders.id = payments.order_id \
             WHERE orders.sku = {p} AND payments.refund = 'owed'), \
         (SELECT COUNT(*) FROM payments JOIN orders ON orders.id = payments.order_id \
             WHERE orders.sku = {p} AND payments.refund = 'pending'), \
         (SELECT COUNT(*) FROM payments JOIN orders ON orders.id = payments.order_id \
             WHERE orders.sku = {p} AND payments.refund = 'refunded'), \
         (SELECT COUNT(*) FROM payments JOIN orders ON orders.id = payments.order_id \
             WHERE orders.sku = {p} AND payments.outcome = 'awaiting_order'), \
         (SELECT COUNT(*) FROM orders WHERE sku = {p} AND state = 'paid'), \
         (SELECT COUNT(*) FROM orders WHERE sku = {p} AND state = 'paid' AND released_at_ms IS NOT NULL), \
         (SELECT COUNT(*) FROM payments JOIN orders ON orders.id = payments.order_id \
             WHERE orders.sku = {p} AND payments.source = 'query')"
    )
}

pub(crate) fn money_counts_from_sql(values: [i64; 9]) -> Result<crate::model::SkuMoneyCounts, StoreError> {
    let [payments, settled, owed, pending, refunded, awaiting, paid_orders, paid_released, by_query] = values;
    let counts = crate::model::SkuMoneyCounts {
        payments: from_sql(payments, "payments")?,
        settled: from_sql(settled, "settled payments")?,
        refunds_owed: from_sql(owed, "refunds owed")?,
        refunds_pending: from_sql(pending, "refunds pending")?,
        refunded: from_sql(refunded, "refunded")?,
        awaiting: from_sql(awaiting, "awaiting payments")?,
        paid_orders: from_sql(paid_orders, "paid orders")?,
        paid_orders_released: from_sql(paid_released, "paid orders released")?,
        found_by_query: from_sql(by_query, "payments found by query")?,
    };
    lifecycle::check_money(&counts);
    Ok(counts)
}

/// A dead letter's fields as `dead_letters.fields` keeps them: a JSON array of pairs.
pub(crate) fn fields_to_sql(fields: &[(String, String)]) -> Result<String, StoreError> {
    serde_json::to_string(fields).map_err(|e| StoreError::Invalid(format!("dead letter fields: {e}")))
}

pub(crate) fn fields_from_sql(text: &str) -> Result<Vec<(String, String)>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("dead letter fields: {e}")))
}

/// Checks a batch before it touches the database, so a bad order rejects the whole batch.
pub(crate) fn check_batch(orders: &[crate::model::NewOrder]) -> Result<(), StoreError> {
    if orders.len() > super::INSERT_BATCH_MAX {
        return Err(StoreError::Invalid(format!(
            "a batch of {} orders is above INSERT_BATCH_MAX ({})",
            orders.len(),
            super::INSERT_BATCH_MAX
        )));
    }
    for order in orders {
        if order.qty == 0 {
            return Err(StoreError::Invalid(format!("order {} has qty 0", order.id)));
        }
        for (value, what) in [
            (order.stream_seq, "stream_seq"),
            (order.unit_price, "unit_price"),
            (order.created_at_ms, "created_at_ms"),
            (order.pay_deadline_ms, "pay_deadline_ms"),
        ] {
            to_sql(value, what)?;
        }
    }
    Ok(())
}

/// The order columns every read selects, in the order the row decoders expect.
pub(crate) const ORDER_COLUMNS: &str = "id, sku, user_id, qty, node, idempotency_key, stream_seq, unit_price, \
     currency, state, created_at_ms, pay_deadline_ms, payment_ref, paid_at_ms, expired_at_ms, cancelled_at_ms, \
     released_at_ms, updated_at_ms, release_refused, payment_started_at_ms, payment_check_at_ms, payment_checks, \
     payment_attempt";

/// A stored count of attempts as the model reads it.
pub(crate) fn attempts_from_sql(value: i32, what: &str) -> Result<u32, StoreError> {
    u32::try_from(value).map_err(|_| StoreError::Corrupt(format!("stored {what} is negative: {value}")))
}

/// The states in which an order's payment may still need the provider's word: pending (what
/// became of it?), expired or cancelled (close it, so it cannot succeed unseen), and paid after
/// more than one payment attempt (close the earlier ones).
pub(crate) const CHECKED_SQL: &str = "('pending_payment', 'expired', 'cancelled', 'paid', 'paid_after_expiry')";

/// [`SkuOrderCounts`](crate::model::SkuOrderCounts) from its nine SQL values, in field order.
pub(crate) fn counts_from_sql(values: [i64; 9]) -> Result<crate::model::SkuOrderCounts, StoreError> {
    let [orders, pending, paid, expired, cancelled, paid_after_expiry, unreleased, refused, max_seq] = values;
    let counts = crate::model::SkuOrderCounts {
        orders: from_sql(orders, "order count")?,
        units_pending: from_sql(pending, "units pending")?,
        units_paid: from_sql(paid, "units paid")?,
        units_expired: from_sql(expired, "units expired")?,
        units_cancelled: from_sql(cancelled, "units cancelled")?,
        units_paid_after_expiry: from_sql(paid_after_expiry, "units paid after expiry")?,
        orders_unreleased: from_sql(unreleased, "orders unreleased")?,
        units_release_refused: from_sql(refused, "units release refused")?,
        max_stream_seq: from_sql(max_seq, "max stream seq")?,
    };
    lifecycle::check_orders(&counts);
    Ok(counts)
}

/// The columns of `payment_starts`, in [`OpenedPayment`]'s order.
pub(crate) const OPENED_COLUMNS: &str = "order_id, payment_id, pay_url, amount, currency, created_at_ms";

/// A `payment_starts` row's values as read.
pub(crate) type OpenedRow = (String, String, String, i64, String, i64);

pub(crate) fn opened_from_sql(row: OpenedRow) -> Result<OpenedPayment, StoreError> {
    let (order_id, payment_id, pay_url, amount, currency, created_at_ms) = row;
    Ok(OpenedPayment {
        order_id,
        payment_id,
        pay_url,
        amount: from_sql(amount, "amount")?,
        currency,
        created_at_ms: from_sql(created_at_ms, "created_at_ms")?,
    })
}
