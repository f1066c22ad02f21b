//! The statements that persist the state machine's decisions ([`crate::lifecycle`]), written
//! once for both dialects. Each is a compare-and-set on the row it names: its `WHERE` repeats
//! the state the decision was made from, so a writer that lost a race changes nothing, and the
//! number of rows it changed is the store's half of a pair assertion.
//!
//! Placeholders are numbered `?1`, `?2`, …, which SQLite reads as they are and
//! [`for_postgres`] turns into PostgreSQL's `$1`, `$2`, …. Only the reads around them (a row
//! lock, `SKIP LOCKED`) differ by dialect and stay in each store.

/// The states whose units go back to the ledger, as an SQL list (a macro, so that the
/// statements below can `concat!` it).
macro_rules! gives_back_sql {
    () => {
        "('expired', 'cancelled', 'paid_after_expiry')"
    };
}

/// The states whose units go back to the ledger, as an SQL list.
pub(crate) const GIVES_BACK_SQL: &str = gives_back_sql!();

/// Claims a payment's reference, recorded as waiting for its order until it is applied; a
/// reference already claimed changes nothing (0 rows): the first notification decides.
pub(crate) const CLAIM_PAYMENT: &str = "INSERT INTO payments \
     (reference, order_id, amount, currency, outcome, received_at_ms, source) \
     VALUES (?1, ?2, ?3, ?4, 'awaiting_order', ?5, ?6) ON CONFLICT (reference) DO NOTHING";

/// A claimed reference's first record and its order's terms, for a repeat's answer: order id,
/// outcome, unit price, qty, currency (the last three absent while the order is not stored).
pub(crate) const FIRST_PAYMENT: &str = "SELECT p.order_id, p.outcome, o.unit_price, o.qty, o.currency \
     FROM payments p LEFT JOIN orders o ON o.id = p.order_id WHERE p.reference = ?1";

/// What a payment is decided on: the order's state and terms.
pub(crate) const ORDER_FOR_PAYMENT: &str = "SELECT state, unit_price, qty, currency FROM orders WHERE id = ?1";

/// A payment's transition: the order, still in the state the decision was made from (`?5`),
/// takes the new state and the payment's reference and time; nothing is left to ask the
/// provider, unless the order opened earlier payment attempts: those are closed by a check
/// due now.
pub(crate) const SETTLE_ORDER: &str = "UPDATE orders SET state = ?2, payment_ref = ?3, paid_at_ms = ?4, \
     updated_at_ms = ?4, \
     payment_check_at_ms = CASE WHEN payment_attempt > 1 THEN CAST(?4 AS BIGINT) ELSE NULL END \
     WHERE id = ?1 AND state = ?5";

/// A payment's record takes the decided outcome and any refund owed, once: only while it still
/// waits for its order.
pub(crate) const SETTLE_PAYMENT: &str = "UPDATE payments SET outcome = ?2, refund = ?3, refund_reason = ?4 \
     WHERE reference = ?1 AND outcome = 'awaiting_order'";

/// The buyer starts paying: a pending order before its deadline, the first time only, has its
/// deadline extended by the grace (`?3`) and a provider check due at the new deadline.
pub(crate) const START_PAYMENT: &str = "UPDATE orders SET payment_started_at_ms = ?2, \
     pay_deadline_ms = pay_deadline_ms + ?3, payment_check_at_ms = pay_deadline_ms + ?3, updated_at_ms = ?2 \
     WHERE id = ?1 AND state = 'pending_payment' AND payment_started_at_ms IS NULL AND pay_deadline_ms > ?2";

/// A pending order's payment moves to its next attempt, once per attempt (`?2` is the one the
/// caller saw).
pub(crate) const NEXT_PAYMENT_ATTEMPT: &str = "UPDATE orders SET payment_attempt = payment_attempt + 1, \
     updated_at_ms = ?3 WHERE id = ?1 AND payment_attempt = ?2 AND state = 'pending_payment'";

/// An order's payment attempt.
pub(crate) const PAYMENT_ATTEMPT: &str = "SELECT payment_attempt FROM orders WHERE id = ?1";

/// Who owns an order.
pub(crate) const ORDER_OWNER: &str = "SELECT user_id FROM orders WHERE id = ?1";

/// An order's state.
pub(crate) const ORDER_STATE: &str = "SELECT state FROM orders WHERE id = ?1";

/// `pending_payment → cancelled`; a payment already started is to be closed at the provider
/// now (its check becomes due).
pub(crate) const CANCEL: &str = "UPDATE orders SET state = 'cancelled', cancelled_at_ms = ?2, updated_at_ms = ?2, \
     payment_check_at_ms = CASE WHEN payment_check_at_ms IS NULL THEN NULL ELSE CAST(?2 AS BIGINT) END \
     WHERE id = ?1 AND state = 'pending_payment'";

/// `pending_payment → expired`, only under the newest sweeper's fence (`?3`) and while no
/// recorded payment waits for the order.
pub(crate) const EXPIRE: &str = "UPDATE orders SET state = 'expired', expired_at_ms = ?2, updated_at_ms = ?2, \
     expire_fence = ?3 WHERE id = ?1 AND state = 'pending_payment' \
     AND ?3 >= (SELECT value FROM sweeper_fence WHERE id = 1) \
     AND NOT EXISTS (SELECT 1 FROM payments WHERE order_id = ?1 AND outcome = 'awaiting_order')";

/// The store's sweeper fence.
pub(crate) const SWEEPER_FENCE: &str = "SELECT value FROM sweeper_fence WHERE id = 1";

/// Raises the sweeper fence to `?1`, never lowers it.
pub(crate) const RAISE_FENCE: &str =
    "UPDATE sweeper_fence SET value = CASE WHEN value < ?1 THEN ?1 ELSE value END WHERE id = 1";

/// Counts one provider check made and sets the next (`NULL`: nothing more to ask).
pub(crate) const SCHEDULE_PAYMENT_CHECK: &str =
    "UPDATE orders SET payment_check_at_ms = ?2, payment_checks = payment_checks + 1 WHERE id = ?1";

/// A refund asked and not acknowledged: `owed | pending → pending`, one more attempt.
pub(crate) const REFUND_PENDING: &str = "UPDATE payments SET refund = 'pending', \
     refund_attempts = refund_attempts + 1, refund_at_ms = ?2 WHERE reference = ?1 AND refund IN ('owed', 'pending')";

/// A refund acknowledged: `owed | pending → refunded`, once.
pub(crate) const MARK_REFUNDED: &str = "UPDATE payments SET refund = 'refunded', refunded_at_ms = ?2 \
     WHERE reference = ?1 AND refund IN ('owed', 'pending')";

/// Makes every open provider check due at `?1`.
pub(crate) const REDRIVE_CHECKS: &str = "UPDATE orders SET payment_check_at_ms = ?1 WHERE payment_check_at_ms > ?1";

/// Makes every refund not yet acknowledged due at `?1`.
pub(crate) const REDRIVE_REFUNDS: &str =
    "UPDATE payments SET refund_at_ms = ?1 WHERE refund IN ('owed', 'pending') AND refund_at_ms > ?1";

/// The ledger refused an order's release, for the reason `?2`: once, and only for an order
/// whose units go back and were not given back.
pub(crate) const MARK_RELEASE_REFUSED: &str = concat!(
    "UPDATE orders SET release_refused = ?2, updated_at_ms = ?3 WHERE id = ?1 AND released_at_ms IS NULL \
     AND release_refused IS NULL AND state IN ",
    gives_back_sql!()
);

/// The ledger has an order's units back: noted once, and only for an order whose units go back.
pub(crate) const MARK_RELEASED: &str = concat!(
    "UPDATE orders SET released_at_ms = ?2, updated_at_ms = ?2 WHERE id = ?1 AND released_at_ms IS NULL \
     AND release_refused IS NULL AND state IN ",
    gives_back_sql!()
);

/// `sql` with its `?N` placeholders written PostgreSQL's way, `$N`.
pub(crate) fn for_postgres(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('?', Some(next)) if next.is_ascii_digit() => out.push('$'),
            _ => out.push(c),
        }
    }
    out
}

/// Keeps the first payment remembered for an order.
pub(crate) const REMEMBER_OPENED: &str =
    "INSERT INTO payment_starts (order_id, payment_id, pay_url, amount, currency, \
     created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (order_id) DO NOTHING";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_postgres_numbers_and_nothing_else_changes() {
        assert_eq!(for_postgres(MARK_REFUNDED).matches('$').count(), 2);
        assert!(!for_postgres(EXPIRE).contains('?'));
        assert_eq!(for_postgres("a = ?12 AND b = '?'"), "a = $12 AND b = '?'");
        assert!(MARK_RELEASED.ends_with(GIVES_BACK_SQL));
    }
}
