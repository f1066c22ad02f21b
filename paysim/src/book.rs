//! The sandbox's books: payments by id and by order, refunds by refund id, and the rules a
//! provider keeps (one payment per order, one refund per refund id, never more back than was
//! paid). Plain data behind the server's lock, no I/O, so every rule is tested here.

use std::collections::HashMap;

use protocol::sandbox::{self as wire, PaymentBody, RefundAnswer, RefundBody, RefundState, Status};
use serde::{Deserialize, Serialize};

use crate::callbacks::Target;

/// Most payments one sandbox keeps: it forgets nothing while it runs, so this bounds its memory.
pub const PAYMENTS_MAX: usize = 1_000_000;
/// Why a payment closed by the merchant failed.
pub const CLOSED_REASON: &str = "closed";

/// Longest order id, payment reference and refund id accepted (the order service's bound).
pub const ID_BYTES_MAX: usize = 128;

/// A request the books refuse: an HTTP status (4xx, or 507 when full) and the error body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

fn refused(status: u16, code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal { status, code, message: message.into() }
}

/// One payment.
#[derive(Debug, Clone)]
pub struct Payment {
    pub id: String,
    pub order_id: String,
    pub amount: u64,
    pub currency: String,
    pub status: Status,
    pub reason: Option<String>,
    pub callback: Target,
    pub created_at_ms: u64,
    pub settled_at_ms: Option<u64>,
}

impl Payment {
    /// The payment as the API answers it; the buyer pays at `base_url`'s pay route.
    pub fn body(&self, base_url: &str) -> PaymentBody {
        PaymentBody {
            id: self.id.clone(),
            order_id: self.order_id.clone(),
            amount: self.amount,
            currency: self.currency.clone(),
            status: self.status,
            reason: self.reason.clone(),
            pay_url: format!("{base_url}/v1/payments/{}/pay", self.id),
            created_at_ms: self.created_at_ms,
            settled_at_ms: self.settled_at_ms,
        }
    }
}

/// What the books hold, for `GET /v1/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub payments: u64,
    pub pending: u64,
    pub succeeded: u64,
    pub declined: u64,
    pub refunds: u64,
    pub refunded_amount: u64,
    /// Pending payments closed by the merchant (their order expired or was cancelled).
    #[serde(default)]
    pub closed: u64,
}

/// Every payment and refund since start.
pub struct Book {
    /// Distinguishes this run's payment ids from an earlier run's: a restarted sandbox must not
    /// hand out a reference the order service already recorded for another order.
    run: String,
    next: u64,
    payments: HashMap<String, Payment>,
    by_order: HashMap<String, String>,
    refunds: HashMap<String, RefundAnswer>,
    /// Amount refunded so far per payment id.
    refunded: HashMap<String, u64>,
    counts: Counts,
}

impl Book {
    /// Empty books whose payment ids start with `pay_<run>_`.
    pub fn new(run: impl Into<String>) -> Self {
        Self {
            run: run.into(),
            next: 1,
            payments: HashMap::new(),
            by_order: HashMap::new(),
            refunds: HashMap::new(),
            refunded: HashMap::new(),
            counts: Counts::default(),
        }
    }

    /// Starts a payment for `order_id`, or returns the one it has, if it asked for the same
    /// amount and currency; the second is `true` when it is new.
    pub fn create(
        &mut self,
        body: &wire::CreateBody,
        callback: Target,
        now_ms: u64,
    ) -> Result<(&Payment, bool), Refusal> {
        check_id("order_id", &body.order_id)?;
        check_money(body.amount, &body.currency)?;
        if let Some(id) = self.by_order.get(&body.order_id) {
            let existing = self.payments.get(id).ok_or_else(|| refused(500, "internal", "lost payment"))?;
            if existing.amount != body.amount || existing.currency != body.currency {
                return Err(refused(
                    409,
                    wire::ORDER_ID_REUSED,
                    format!(
                        "order {} already has a payment of {} {}; one order, one payment",
                        body.order_id, existing.amount, existing.currency
                    ),
                ));
            }
            return Ok((existing, false));
        }
        if self.payments.len() >= PAYMENTS_MAX {
            return Err(refused(507, "full", format!("the sandbox keeps at most {PAYMENTS_MAX} payments; restart it")));
        }
        let id = format!("pay_{}_{}", self.run, self.next);
        self.next += 1;
        let payment = Payment {
            id: id.clone(),
            order_id: body.order_id.clone(),
            amount: body.amount,
            currency: body.currency.clone(),
            status: Status::Pending,
            reason: None,
            callback,
            created_at_ms: now_ms,
            settled_at_ms: None,
        };
        self.by_order.insert(body.order_id.clone(), id.clone());
        self.counts.payments += 1;
        self.counts.pending += 1;
        let payment = self.payments.entry(id).or_insert(payment);
        Ok((payment, true))
    }

    /// The books' own invariants, as docs/payments.md states them: every payment is pending,
    /// succeeded, declined or closed; no refund gives back more than its payment took.
    fn assert_counts(&self) {
        let counts = &self.counts;
        debug_assert_eq!(
            counts.pending + counts.succeeded + counts.declined + counts.closed,
            counts.payments,
            "every payment is in exactly one state"
        );
        debug_assert_eq!(counts.payments, self.payments.len() as u64, "a payment is counted once");
        debug_assert_eq!(counts.refunds, self.refunds.len() as u64, "a refund is counted once");
        debug_assert_eq!(
            counts.refunded_amount,
            self.refunded.values().sum::<u64>(),
            "the refunded total is the sum over payments"
        );
    }

    pub fn get(&self, id: &str) -> Option<&Payment> {
        self.payments.get(id)
    }

    pub fn by_order(&self, order_id: &str) -> Option<&Payment> {
        self.by_order.get(order_id).and_then(|id| self.payments.get(id))
    }

    /// Settles a pending payment: succeeded, or failed with `declined` as the reason. A payment
    /// settles once; a second pay is refused with what it became.
    pub fn settle(&mut self, id: &str, declined: Option<&str>, now_ms: u64) -> Result<&Payment, Refusal> {
        let payment =
            self.payments.get_mut(id).ok_or_else(|| refused(404, "unknown_payment", format!("no payment {id}")))?;
        if payment.status != Status::Pending {
            let became = if payment.status == Status::Succeeded { "succeeded" } else { "failed" };
            return Err(refused(409, "already_settled", format!("payment {id} already {became}")));
        }
        self.counts.pending -= 1;
        match declined {
            Some(reason) => {
                payment.status = Status::Failed;
                payment.reason = Some(reason.to_string());
                self.counts.declined += 1;
            }
            None => {
                payment.status = Status::Succeeded;
                self.counts.succeeded += 1;
            }
        }
        payment.settled_at_ms = Some(now_ms);
        Ok(payment)
    }

    /// Closes the order's payment so it can no longer succeed: a pending one fails with the
    /// reason `closed`; a settled one stays as it is, and the merchant reads from the answer
    /// whether it came too late (`succeeded`: the money is taken and must go back).
    pub fn close(&mut self, order_id: &str, now_ms: u64) -> Result<&Payment, Refusal> {
        let id = self
            .by_order
            .get(order_id)
            .cloned()
            .ok_or_else(|| refused(404, wire::NO_PAYMENT, format!("no payment for order {order_id}")))?;
        let payment = self.payments.get_mut(&id).ok_or_else(|| refused(500, "internal", "lost payment"))?;
        if payment.status == Status::Pending {
            payment.status = Status::Failed;
            payment.reason = Some(CLOSED_REASON.into());
            payment.settled_at_ms = Some(now_ms);
            self.counts.pending -= 1;
            self.counts.closed += 1;
        }
        Ok(payment)
    }

    /// Refunds `body.amount` of payment `body.reference`, once per refund id: a refund id seen
    /// before answers what it answered then, if it asks for the same; never more back in all
    /// than the payment took.
    pub fn refund(&mut self, body: &RefundBody) -> Result<RefundAnswer, Refusal> {
        check_id("refund_id", &body.refund_id)?;
        if let Some(done) = self.refunds.get(&body.refund_id) {
            if done.reference != body.reference || done.amount != body.amount || done.currency != body.currency {
                return Err(refused(
                    409,
                    "refund_id_reused",
                    format!(
                        "refund {} was for {} {} of {}",
                        done.refund_id, done.amount, done.currency, done.reference
                    ),
                ));
            }
            return Ok(done.clone());
        }
        check_money(body.amount, &body.currency)?;
        let payment = self
            .payments
            .get(&body.reference)
            .ok_or_else(|| refused(404, "unknown_payment", format!("no payment {}", body.reference)))?;
        if payment.status != Status::Succeeded {
            return Err(refused(409, "not_refundable", format!("payment {} has not succeeded", payment.id)));
        }
        if payment.currency != body.currency {
            return Err(refused(
                422,
                "currency_mismatch",
                format!("payment {} was in {}, not {}", payment.id, payment.currency, body.currency),
            ));
        }
        let refunded = self.refunded.get(&payment.id).copied().unwrap_or(0);
        if refunded.saturating_add(body.amount) > payment.amount {
            return Err(refused(
                422,
                "exceeds_payment",
                format!("payment {} took {}, of which {refunded} is already refunded", payment.id, payment.amount),
            ));
        }
        let answer = RefundAnswer {
            refund_id: body.refund_id.clone(),
            reference: body.reference.clone(),
            amount: body.amount,
            currency: body.currency.clone(),
            status: RefundState::Succeeded,
            reason: None,
        };
        debug_assert!(refunded + body.amount <= payment.amount, "a payment gives back at most what it took");
        self.refunded.insert(payment.id.clone(), refunded + body.amount);
        self.refunds.insert(body.refund_id.clone(), answer.clone());
        self.counts.refunds += 1;
        self.counts.refunded_amount += body.amount;
        self.assert_counts();
        Ok(answer)
    }

    /// Every payment created in `[from_ms, to_ms)` and every refund of those payments, ordered
    /// by id: the provider's settlement report, which an audit compares with the merchant's
    /// books.
    pub fn settlements(&self, base_url: &str, from_ms: u64, to_ms: u64) -> wire::Settlements {
        let mut payments: Vec<PaymentBody> = self
            .payments
            .values()
            .filter(|p| (from_ms..to_ms).contains(&p.created_at_ms))
            .map(|p| p.body(base_url))
            .collect();
        payments.sort_by(|a, b| a.id.cmp(&b.id));
        let listed: std::collections::HashSet<&str> = payments.iter().map(|p| p.id.as_str()).collect();
        let mut refunds: Vec<RefundAnswer> =
            self.refunds.values().filter(|r| listed.contains(r.reference.as_str())).cloned().collect();
        refunds.sort_by(|a, b| a.refund_id.cmp(&b.refund_id));
        wire::Settlements { payments, refunds }
    }

    pub fn counts(&self) -> Counts {
        self.assert_counts();
        self.counts.clone()
    }
}

fn check_id(name: &str, id: &str) -> Result<(), Refusal> {
    if id.is_empty() || id.len() > ID_BYTES_MAX || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(refused(400, "bad_body", format!("{name} is 1-{ID_BYTES_MAX} printable ASCII characters")));
    }
    Ok(())
}

fn check_money(amount: u64, currency: &str) -> Result<(), Refusal> {
    // The order service keeps amounts as signed 64-bit integers of minor units.
    if amount == 0 || i64::try_from(amount).is_err() {
        return Err(refused(400, "bad_amount", "amount is a positive integer of minor units that fits an i64"));
    }
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(refused(400, "bad_currency", "currency is an ISO 4217 code: three capital letters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target::parse("http://127.0.0.1:9/cb").unwrap_or_else(|| unreachable!("a valid URL"))
    }

    fn create(order: &str, amount: u64) -> wire::CreateBody {
        wire::CreateBody {
            order_id: order.into(),
            amount,
            currency: "USD".into(),
            callback_url: "http://127.0.0.1:9/cb".into(),
        }
    }

    fn refund(id: &str, reference: &str, amount: u64) -> RefundBody {
        RefundBody { refund_id: id.into(), reference: reference.into(), amount, currency: "USD".into() }
    }

    #[test]
    fn one_order_one_payment() {
        let mut book = Book::new("t");
        let (first, new) = book.create(&create("o1", 500), target(), 1).map(|(p, n)| (p.id.clone(), n)).unwrap();
        assert!(new);
        let (again, new) = book.create(&create("o1", 500), target(), 2).map(|(p, n)| (p.id.clone(), n)).unwrap();
        assert_eq!((again, new), (first.clone(), false));
        assert_eq!(book.create(&create("o1", 501), target(), 3).unwrap_err().code, "order_id_reused");
        assert_eq!(book.create(&create("o2", 0), target(), 3).unwrap_err().code, "bad_amount");
        assert_eq!(book.create(&create("o2", u64::MAX), target(), 3).unwrap_err().code, "bad_amount");
        assert_eq!(book.create(&create("", 1), target(), 3).unwrap_err().code, "bad_body");
        assert_eq!(book.counts(), Counts { payments: 1, pending: 1, ..Counts::default() });
    }

    #[test]
    fn a_payment_settles_once() {
        let mut book = Book::new("t");
        let id = book.create(&create("o1", 500), target(), 1).unwrap().0.id.clone();
        assert_eq!(book.settle(&id, Some("declined"), 2).unwrap().status, Status::Failed);
        assert_eq!(book.settle(&id, None, 3).unwrap_err().code, "already_settled");
        assert_eq!(book.settle("nope", None, 3).unwrap_err().code, "unknown_payment");
        assert_eq!(book.by_order("o1").map(|p| p.status), Some(Status::Failed));
        assert_eq!(book.counts(), Counts { payments: 1, declined: 1, ..Counts::default() });
    }

    #[test]
    fn a_closed_payment_cannot_succeed_and_a_paid_one_stays_paid() {
        let mut book = Book::new("t");
        let open = book.create(&create("o1", 500), target(), 1).unwrap().0.id.clone();
        let paid = book.create(&create("o2", 500), target(), 1).unwrap().0.id.clone();
        book.settle(&paid, None, 2).unwrap();
        assert_eq!(book.close("o1", 3).unwrap().status, Status::Failed);
        assert_eq!(book.close("o1", 4).unwrap().reason.as_deref(), Some(CLOSED_REASON), "closing twice is a replay");
        assert_eq!(book.settle(&open, None, 5).unwrap_err().code, "already_settled", "a closed payment never succeeds");
        assert_eq!(book.close("o2", 6).unwrap().status, Status::Succeeded, "too late: the money is taken");
        assert_eq!(book.close("o3", 7).unwrap_err().code, wire::NO_PAYMENT);
        let counts = book.counts();
        assert_eq!((counts.closed, counts.pending, counts.succeeded), (1, 0, 1));
    }

    #[test]
    fn refunds_are_once_per_id_and_never_more_than_was_paid() {
        let mut book = Book::new("t");
        let paid = book.create(&create("o1", 1000), target(), 1).unwrap().0.id.clone();
        assert_eq!(book.refund(&refund("r0", &paid, 10)).unwrap_err().code, "not_refundable", "still pending");
        book.settle(&paid, None, 2).unwrap();
        assert_eq!(book.refund(&refund("r1", &paid, 600)).unwrap().status, RefundState::Succeeded);
        assert_eq!(book.refund(&refund("r1", &paid, 600)).unwrap().status, RefundState::Succeeded, "a replay");
        assert_eq!(book.refund(&refund("r1", &paid, 601)).unwrap_err().code, "refund_id_reused");
        assert_eq!(book.refund(&refund("r2", &paid, 401)).unwrap_err().code, "exceeds_payment");
        assert_eq!(book.refund(&refund("r2", &paid, 400)).unwrap().amount, 400);
        assert_eq!(book.refund(&refund("r3", &paid, 1)).unwrap_err().code, "exceeds_payment");
        assert_eq!(book.refund(&refund("r1", &paid, 600)).unwrap().status, RefundState::Succeeded, "still a replay");
        let other_currency = RefundBody { currency: "EUR".into(), ..refund("r4", &paid, 1) };
        assert_eq!(book.refund(&other_currency).unwrap_err().code, "currency_mismatch");
        assert_eq!(book.refund(&refund("r5", "pay_none", 1)).unwrap_err().code, "unknown_payment");
        let counts = book.counts();
        assert_eq!((counts.refunds, counts.refunded_amount), (2, 1000));
    }
}
