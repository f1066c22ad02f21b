//! The order state machine as scripts (goldenscript, as toydb tests its raft node): each script
//! in `tests/lifecycle/` sells orders, applies events to them (payments, cancels, expiries,
//! releases, refund asks and acknowledgements) on an in-memory SQLite store, and prints what
//! each event answered and where the order and its money stand after it. The expected output
//! sits under each command; `UPDATE_GOLDENFILES=1 cargo test -p seckill-orders --test
//! lifecycle` rewrites it, and the diff is reviewed like code.
//!
//! Commands (times are Unix ms; defaults in brackets):
//! - `sell ORDER [qty=1] [price=250] [currency=EUR] [deadline=1000] [user=ann]`
//! - `start ORDER [at=100] [grace=500]`: the buyer presses pay.
//! - `pay ORDER REFERENCE [amount=the order's] [currency=the order's] [at=200]`: a notification.
//! - `settle`: applies payments that came before their orders.
//! - `cancel ORDER [user=ann] [at=300]`, `expire ORDER [fence=1] [at=1000]`.
//! - `release ORDER [at=1100]`, `refuse ORDER [at=1100]`: the ledger took the units back, or
//!   refused to.
//! - `refund-ask ORDER REFERENCE [next=5000]`, `refund-ack ORDER REFERENCE [at=6000]`.
//! - `money`: the SKU's money counts.

use std::error::Error;
use std::fmt::Write as _;

use orders::{NewOrder, Order, OrderStore, Payment, PaymentSource, SqliteStore};

const SKU: &str = "sku-1";

struct Lifecycle {
    runtime: tokio::runtime::Runtime,
    store: SqliteStore,
    /// Stream seqs handed out so far.
    sold: u64,
}

type Outcome = Result<String, Box<dyn Error>>;

impl Lifecycle {
    fn new() -> Lifecycle {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime for the store");
        let store = runtime.block_on(SqliteStore::in_memory()).expect("an in-memory store");
        Lifecycle { runtime, store, sold: 0 }
    }

    fn order(&self, id: &str) -> Result<Order, Box<dyn Error>> {
        Ok(self.runtime.block_on(self.store.get(id))?.ok_or_else(|| format!("no order {id}"))?)
    }

    /// One line for the order, one per payment recorded for it.
    fn describe(&self, id: &str) -> Outcome {
        let order = self.order(id)?;
        let mut out = format!(
            "{id}: {} {} {} deadline={}",
            order.state.as_str(),
            order.new.amount(),
            order.new.currency,
            order.new.pay_deadline_ms
        );
        let times = [
            ("started", order.payment_started_at_ms),
            ("paid", order.paid_at_ms),
            ("expired", order.expired_at_ms),
            ("cancelled", order.cancelled_at_ms),
            ("released", order.released_at_ms),
        ];
        for (what, at) in times {
            if let Some(at) = at {
                write!(out, " {what}={at}")?;
            }
        }
        if let Some(reference) = &order.payment_ref {
            write!(out, " by={reference}")?;
        }
        if let Some(why) = &order.release_refused {
            write!(out, " release_refused={why:?}")?;
        }
        for payment in self.runtime.block_on(self.store.payments_of(id))? {
            write!(out, "\n  {} {} {} {}", payment.reference, payment.amount, payment.currency, payment.outcome)?;
            if let Some(refund) = payment.refund {
                write!(out, " refund={} attempts={}", refund.as_str(), payment.refund_attempts)?;
            }
        }
        Ok(out + "\n")
    }

    fn sell(&mut self, id: &str, args: &mut goldenscript::ArgumentConsumer<'_>) -> Outcome {
        self.sold += 1;
        let order = NewOrder {
            id: id.to_string(),
            sku: SKU.into(),
            user: args.lookup_parse("user")?.unwrap_or_else(|| "ann".to_string()),
            qty: args.lookup_parse("qty")?.unwrap_or(1),
            node: "node-1".into(),
            idempotency_key: format!("key-{id}"),
            stream_seq: self.sold,
            unit_price: args.lookup_parse("price")?.unwrap_or(250),
            currency: args.lookup_parse("currency")?.unwrap_or_else(|| "EUR".to_string()),
            created_at_ms: 0,
            pay_deadline_ms: args.lookup_parse("deadline")?.unwrap_or(1000),
        };
        args.reject_rest()?;
        let inserted = self.runtime.block_on(self.store.insert_batch(&[order]))?;
        Ok(format!("sell → {inserted} new\n"))
    }

    fn pay(&mut self, id: &str, args: &mut goldenscript::ArgumentConsumer<'_>) -> Outcome {
        let reference = args.next_pos().ok_or("pay ORDER REFERENCE")?.value.clone();
        let order = self.runtime.block_on(self.store.get(id))?;
        let payment = Payment {
            order_id: id.to_string(),
            reference,
            amount: args.lookup_parse("amount")?.or(order.as_ref().map(|o| o.new.amount())).unwrap_or(250),
            currency: args.lookup_parse("currency")?.or(order.map(|o| o.new.currency)).unwrap_or("EUR".into()),
            received_at_ms: args.lookup_parse("at")?.unwrap_or(200),
            source: PaymentSource::Callback,
        };
        args.reject_rest()?;
        let outcome = self.runtime.block_on(self.store.record_payment(&payment))?;
        Ok(format!("pay → {outcome:?} (refund owed: {})\n", outcome.refund_owed()))
    }

    fn event(&mut self, name: &str, id: &str, args: &mut goldenscript::ArgumentConsumer<'_>) -> Outcome {
        let at = |default: u64, args: &mut goldenscript::ArgumentConsumer<'_>| -> Result<u64, Box<dyn Error>> {
            Ok(args.lookup_parse("at")?.unwrap_or(default))
        };
        let answer = match name {
            "start" => {
                let (at, grace) = (at(100, args)?, args.lookup_parse("grace")?.unwrap_or(500));
                match self.runtime.block_on(self.store.start_payment(id, grace, at))? {
                    orders::StartPayment::Started(_) => "started".to_string(),
                    orders::StartPayment::NotPending(_) => "not pending".to_string(),
                    orders::StartPayment::UnknownOrder => "unknown order".to_string(),
                }
            }
            "cancel" => {
                let user: String = args.lookup_parse("user")?.unwrap_or_else(|| "ann".to_string());
                format!("{:?}", self.runtime.block_on(self.store.cancel(id, &user, at(300, args)?))?)
            }
            "expire" => {
                let fence = args.lookup_parse("fence")?.unwrap_or(1);
                let at = at(1000, args)?;
                self.runtime.block_on(self.store.raise_fence(fence))?;
                format!("{:?}", self.runtime.block_on(self.store.expire(id, fence, at))?)
            }
            "release" => format!("{}", self.runtime.block_on(self.store.mark_released(id, at(1100, args)?))?),
            "refuse" => {
                let refused =
                    self.store.mark_release_refused(id, "the ledger has no record of the sale", at(1100, args)?);
                format!("{}", self.runtime.block_on(refused)?)
            }
            other => return Err(format!("unknown command {other}").into()),
        };
        args.reject_rest()?;
        Ok(format!("{name} → {answer}\n"))
    }

    fn refund(&mut self, name: &str, args: &mut goldenscript::ArgumentConsumer<'_>) -> Outcome {
        let reference = args.next_pos().ok_or("refund-… ORDER REFERENCE")?.value.clone();
        let reference = reference.as_str();
        let answer = match name {
            "refund-ask" => {
                let next = args.lookup_parse("next")?.unwrap_or(5000);
                self.runtime.block_on(self.store.refund_pending(reference, next))?;
                "asked".to_string()
            }
            _ => {
                let at = args.lookup_parse("at")?.unwrap_or(6000);
                format!("{}", self.runtime.block_on(self.store.mark_refunded(reference, at))?)
            }
        };
        args.reject_rest()?;
        Ok(format!("{name} → {answer}\n"))
    }

    fn money(&self) -> Outcome {
        let money = self.runtime.block_on(self.store.money_counts(SKU))?;
        let counts = self.runtime.block_on(self.store.counts(SKU))?;
        Ok(format!(
            "money: payments={} settled={} awaiting={} refunds owed={} pending={} refunded={}\n\
             units: pending={} paid={} expired={} cancelled={} paid_after_expiry={} unreleased_orders={}\n",
            money.payments,
            money.settled,
            money.awaiting,
            money.refunds_owed,
            money.refunds_pending,
            money.refunded,
            counts.units_pending,
            counts.units_paid,
            counts.units_expired,
            counts.units_cancelled,
            counts.units_paid_after_expiry,
            counts.orders_unreleased
        ))
    }
}

impl goldenscript::Runner for Lifecycle {
    fn run(&mut self, command: &goldenscript::Command) -> Result<String, Box<dyn Error>> {
        let mut args = command.consume_args();
        let name = command.name.as_str();
        if name == "money" {
            args.reject_rest()?;
            return self.money();
        }
        if name == "settle" {
            args.reject_rest()?;
            let settled = self.runtime.block_on(self.store.settle_awaiting(100))?;
            let settled: Vec<String> =
                settled.iter().map(|(reference, outcome)| format!("{reference} {outcome:?}")).collect();
            return Ok(format!("settle → [{}]\n", settled.join(", ")));
        }
        let subject = args.next_pos().ok_or("the command names an order or a payment reference")?.value.clone();
        match name {
            "refund-ask" | "refund-ack" => Ok(self.refund(name, &mut args)? + &self.describe(&subject)?),
            "sell" => Ok(self.sell(&subject, &mut args)? + &self.describe(&subject)?),
            "pay" => {
                let answer = self.pay(&subject, &mut args)?;
                match self.runtime.block_on(self.store.get(&subject))? {
                    Some(_) => Ok(answer + &self.describe(&subject)?),
                    None => Ok(answer + &format!("{subject}: not stored yet\n")),
                }
            }
            _ => Ok(self.event(name, &subject, &mut args)? + &self.describe(&subject)?),
        }
    }
}

macro_rules! scripts {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lifecycle/", stringify!($name));
            goldenscript::run(&mut Lifecycle::new(), path).expect("the script runs");
        }
    )*};
}

scripts!(
    paid_in_time,
    expired_unpaid,
    paid_after_expiry,
    cancelled,
    wrong_amount,
    paid_before_stored,
    reference_reused,
    started_payment,
    stale_fence,
    refunds,
    terminal_states,
    release_refused,
);
