//! Payment attempts: the name the provider knows an order's payment by.
//!
//! A provider keeps one payment per merchant reference, and creating one again for another
//! amount is refused (the sandbox's `order_id_reused`, Stripe's idempotency error, Alipay's
//! `ACQ.CONTEXT_INCONSISTENT`, WeChat Pay's `OUT_TRADE_NO_USED`). The order service's first
//! attempt uses the order id itself, so a shop whose checkout opened the payment already gets
//! that payment answered to the buyer's "pay". When the payment held under the current attempt
//! asks for another amount or currency (the checkout got the price wrong), the order moves to
//! its next attempt, `<order id>~2`, which the buyer can pay; the wrong one is closed, or
//! refunded if it was paid, like any payment that cannot settle its order.
//!
//! Order ids never hold a `~` (`ledger::OrderId::is_valid`), so a reference names its order
//! without a lookup: a notification, a query's answer and the provider's settlement report
//! each carry it, and [`order_of`] reads the order back.

use std::borrow::Cow;

/// Attempts an order may open before "pay" answers the provider's refusal: each one is a
/// payment the provider holds for another amount, which only a checkout that keeps getting
/// the price wrong could open.
pub const ATTEMPTS_MAX: u32 = 4;

/// What separates an order id from its attempt's number.
const SEPARATOR: char = '~';

/// The provider's reference of an order's payment attempt: the order id for the first.
pub fn reference(order_id: &str, attempt: u32) -> Cow<'_, str> {
    match attempt {
        0 | 1 => Cow::Borrowed(order_id),
        n => Cow::Owned(format!("{order_id}{SEPARATOR}{n}")),
    }
}

/// The order a provider reference belongs to (itself when it names no later attempt).
pub fn order_of(reference: &str) -> &str {
    match reference.rsplit_once(SEPARATOR) {
        Some((order_id, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => order_id,
        _ => reference,
    }
}

/// The references of an order's attempts 1 to `through` (none for 0), the last one last.
pub fn references(order_id: &str, through: u32) -> impl Iterator<Item = Cow<'_, str>> {
    (1..=through).map(move |n| reference(order_id, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_names_its_order() {
        assert_eq!(reference("sku-7", 1), "sku-7");
        assert_eq!(reference("sku-7", 3), "sku-7~3");
        for attempt in 1..=ATTEMPTS_MAX {
            assert_eq!(order_of(&reference("s-2.41", attempt)), "s-2.41");
        }
        // Not an attempt's suffix: the reference is the order id as it stands.
        assert_eq!(order_of("sku-7~"), "sku-7~");
        assert_eq!(order_of("sku-7~x"), "sku-7~x");
        let all: Vec<_> = references("o", 3).collect();
        assert_eq!(all, ["o", "o~2", "o~3"]);
        assert_eq!(references("o", 0).count(), 0);
    }
}
