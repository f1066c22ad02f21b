//! The checker: every promise the README makes, judged against one schedule's history, the
//! monitor's samples and the ledger read after the heal.
//!
//! | kind | the promise it checks |
//! |---|---|
//! | `oversell` | the ledger never holds more sold than the total; the order stream and the buyers' distinct receipts hold no more than the total plus the units released (a released unit sells again) |
//! | `undersell` | once healed, with demand left, the ledger's remaining reaches 0 within the stated bound (a striped SKU's: every stripe's, with none in flight between them) |
//! | `stranded_allotment` | while Redis and the coordinator are whole, the nodes able to sell hold, between them, at least the ledger's remaining units, except for at most the bound (the time the coordinator needs to reallocate a dead node's units); units released within `release_to_node_ms` are in flight, not stranded |
//! | `retry_told_sold_out` | a retry or repeat of a key that bought is never answered `sold_out` from a node's memory (a key the ledger refused may be: both are refusals) |
//! | `sold_out_then_decided` | a key whose first send was answered `sold_out` from memory is not sold (or otherwise decided) later under the same key |
//! | `idempotency_conflict` | every other pair of decisions for one use of a key is the same decision, with one order id (a use: see below) |
//! | `user_limit_exceeded` | no user holds more units than the per-user limit, by receipts or in the ledger |
//! | `lost_receipt` | every 200 is in the ledger's order stream under its key with the same order id |
//! | `books_unbalanced` | total = sold + remaining; Σ per node = Σ per seller = Σ order stream = sold + released; for a striped SKU on each stripe and on their sum (whose total counts units in flight between stripes) |
//! | `key_sold_twice` | one key is sold again only after its idempotency TTL: two sales of a key in the order stream are at least the TTL apart by the ledger's clock |
//! | `duplicate_order_id` | order ids are unique across the run |
//! | `sold_under_ended_epoch` | no seller (node, epoch) sells after the coordinator ended that epoch |
//! | `coordinator_unhealthy` | after the heal, every member answers and all agree on one leader and term within the bound |
//! | `history_incomplete` | the run could be judged at all: the history was not truncated and the ledger answered |
//! | `sale_without_order` | once the order service caught up, every 200 receipt's order id is an order in the store, under the receipt's key (called `receipt_without_order` before issue 23) |
//! | `released_twice` | no order id appears twice in the ledger's release log; the log's units = the ledger's `released` = the units of the store's orders marked given back |
//! | `lost_payment` | (`money`) every payment the sandbox took settled a paid order or is a refund (owed, pending or refunded in the store), once the order service settled |
//! | `paid_order_released` | (`money`) no paid order's units went back to the ledger |
//! | `refunded_twice` | (`money`) the sandbox paid back each payment at most once and never more than it took, and never one the store counts as paying its order |
//! | `payment_refused` | (`money`) a buyer's pay is never answered 502 `payment_refused`, and after a checkout opened the payment for the wrong amount it answers a new payment of the order's price: the buyer can always finish |
//! | `stale_replay` | a key reused after its idempotency TTL is a new purchase (README, "Orders"): it is never answered with the sale of an earlier use of the key (a node's memory of sold keys outliving the TTL). Such answers are judged by this rule alone, not as the new use's decision |
//! | `transfer_lost_or_doubled` | a striped SKU's stripes add up to it: Σ remaining + in flight = total − Σ sold, where in flight = Σ `transferred_out` − Σ `transferred_in` (units a transfer took from one stripe and has not yet put into another); once healed and settled nothing is in flight (a transfer a fault interrupted was completed, none applied twice); on every sample that read all stripes, Σ total + in flight = the SKU's total |
//! | `key_taken_by_another_buyer` | an Idempotency-Key is its buyer's (README, "Orders"): a purchase is never answered `key_reused` unless its buyer sent the key with another body before (the workload never does; now and then it sends another buyer's key), so another buyer who sends a buyer's key first takes nothing from it. Per-key rules judge each buyer's use of a key apart |
//! | `orders_unreconciled` | the order service settles (every order stored, every unpaid one expired and given back) within the bound, and `orders::reconcile::check` is clean |
//!
//! **Uses of a key.** A key reused after the ledger's idempotency TTL is a new purchase (README,
//! "Orders"), so per-key rules judge each *use* of a key: its requests split wherever one was
//! sent more than the TTL (plus [`USE_GAP_SLACK_MS`]) after every earlier answer of the key.
//! Within a use every retry meets the record its sale wrote; each sale of the order stream
//! belongs to the use under way when the ledger made it. With the default TTL (a day) a key has
//! one use. Receipts count units by order id, and a user's purchases by use.
//!
//! A decision is `purchased`, `sold_out`, `user_limit`, `ended`, `token_invalid` or
//! `key_reused`; 429, 503 (`stripe_empty` too), 502, 504, `in_progress`, timeouts and
//! connection errors are not (see [`crate::history::DECISIONS`]). The ledger's order for a key counts as that key's
//! `purchased` decision even when no buyer heard it.
//!
//! Known defects (issue 11, fixed by the lead): (a) `retry_told_sold_out`, (b)
//! `stranded_allotment`, (c) `sold_under_ended_epoch`, (d) `duplicate_order_id`.
//! `sold_out_then_decided` is the documented cost of a dry allotment (README, "Choosing the
//! buffer"): a node with no local units says `sold_out` while the ledger still has stock; the
//! strict rule (one key, one decision) counts it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ledger::{OrderEvent, ReleaseEvent, SkuStatus};
use serde::Serialize;

use crate::faults::Window;
use crate::history::Request;
use crate::monitor::Sample;
use crate::stripes::{self, StripeBooks};

mod keys;
use keys::{bought_uses, keys};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    Oversell,
    Undersell,
    StrandedAllotment,
    RetryToldSoldOut,
    SoldOutThenDecided,
    IdempotencyConflict,
    UserLimitExceeded,
    LostReceipt,
    BooksUnbalanced,
    KeySoldTwice,
    DuplicateOrderId,
    SoldUnderEndedEpoch,
    CoordinatorUnhealthy,
    HistoryIncomplete,
    SaleWithoutOrder,
    ReleasedTwice,
    OrdersUnreconciled,
    LostPayment,
    PaidOrderReleased,
    RefundedTwice,
    StaleReplay,
    TransferLostOrDoubled,
    TicketUsedTwice,
    AdmissionBeyondRule,
    LineOrderBroken,
    WaiterLeftWaiting,
    KeyTakenByAnotherBuyer,
    PaymentRefused,
}

impl ViolationKind {
    pub const ALL: [ViolationKind; 28] = [
        ViolationKind::Oversell,
        ViolationKind::Undersell,
        ViolationKind::StrandedAllotment,
        ViolationKind::RetryToldSoldOut,
        ViolationKind::SoldOutThenDecided,
        ViolationKind::IdempotencyConflict,
        ViolationKind::UserLimitExceeded,
        ViolationKind::LostReceipt,
        ViolationKind::BooksUnbalanced,
        ViolationKind::KeySoldTwice,
        ViolationKind::DuplicateOrderId,
        ViolationKind::SoldUnderEndedEpoch,
        ViolationKind::CoordinatorUnhealthy,
        ViolationKind::HistoryIncomplete,
        ViolationKind::SaleWithoutOrder,
        ViolationKind::ReleasedTwice,
        ViolationKind::OrdersUnreconciled,
        ViolationKind::LostPayment,
        ViolationKind::PaidOrderReleased,
        ViolationKind::RefundedTwice,
        ViolationKind::StaleReplay,
        ViolationKind::TransferLostOrDoubled,
        ViolationKind::TicketUsedTwice,
        ViolationKind::AdmissionBeyondRule,
        ViolationKind::LineOrderBroken,
        ViolationKind::WaiterLeftWaiting,
        ViolationKind::KeyTakenByAnotherBuyer,
        ViolationKind::PaymentRefused,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::Oversell => "oversell",
            ViolationKind::Undersell => "undersell",
            ViolationKind::StrandedAllotment => "stranded_allotment",
            ViolationKind::RetryToldSoldOut => "retry_told_sold_out",
            ViolationKind::SoldOutThenDecided => "sold_out_then_decided",
            ViolationKind::IdempotencyConflict => "idempotency_conflict",
            ViolationKind::UserLimitExceeded => "user_limit_exceeded",
            ViolationKind::LostReceipt => "lost_receipt",
            ViolationKind::BooksUnbalanced => "books_unbalanced",
            ViolationKind::KeySoldTwice => "key_sold_twice",
            ViolationKind::DuplicateOrderId => "duplicate_order_id",
            ViolationKind::SoldUnderEndedEpoch => "sold_under_ended_epoch",
            ViolationKind::CoordinatorUnhealthy => "coordinator_unhealthy",
            ViolationKind::HistoryIncomplete => "history_incomplete",
            ViolationKind::SaleWithoutOrder => "sale_without_order",
            ViolationKind::ReleasedTwice => "released_twice",
            ViolationKind::OrdersUnreconciled => "orders_unreconciled",
            ViolationKind::LostPayment => "lost_payment",
            ViolationKind::PaidOrderReleased => "paid_order_released",
            ViolationKind::RefundedTwice => "refunded_twice",
            ViolationKind::StaleReplay => "stale_replay",
            ViolationKind::TransferLostOrDoubled => "transfer_lost_or_doubled",
            ViolationKind::TicketUsedTwice => "ticket_used_twice",
            ViolationKind::AdmissionBeyondRule => "admission_beyond_rule",
            ViolationKind::LineOrderBroken => "line_order_broken",
            ViolationKind::WaiterLeftWaiting => "waiter_left_waiting",
            ViolationKind::KeyTakenByAnotherBuyer => "key_taken_by_another_buyer",
            ViolationKind::PaymentRefused => "payment_refused",
        }
    }

    pub fn parse(name: &str) -> Option<ViolationKind> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    pub kind: ViolationKind,
    pub detail: String,
    /// Keys whose history lines show it.
    pub keys: Vec<String>,
    /// Nodes involved, and the time span, for what no single key shows.
    pub nodes: Vec<String>,
    pub window_ms: Option<(u64, u64)>,
}

impl Violation {
    pub(crate) fn new(kind: ViolationKind, detail: impl Into<String>) -> Self {
        Self { kind, detail: detail.into(), keys: Vec::new(), nodes: Vec::new(), window_ms: None }
    }

    pub(crate) fn keys(mut self, keys: impl IntoIterator<Item = String>) -> Self {
        self.keys = keys.into_iter().collect();
        self
    }
}

/// The ledger as read after the buyers stopped.
#[derive(Clone, Debug)]
pub struct FinalLedger {
    pub status: Result<SkuStatus, String>,
    pub orders: Result<Vec<OrderEvent>, String>,
    /// The release log, read with the orders.
    pub releases: Result<Vec<ReleaseEvent>, String>,
    /// `<node>#<epoch>` → units (see `monitor`).
    pub sellers: Option<BTreeMap<String, u64>>,
    /// A striped SKU's stripes, each as read; the fields above are then their sum (see
    /// [`crate::stripes`]). Empty for an unstriped SKU.
    pub stripes: Vec<StripeBooks>,
    /// When it was read.
    pub at_ms: u64,
}

/// One order of the store, as the checker needs it.
#[derive(Clone, Debug)]
pub struct StoredOrder {
    pub key: String,
    pub qty: u32,
    pub state: String,
    /// The ledger confirmed its units went back.
    pub released: bool,
}

/// The order service's side, read once it settled (or the bound ran out), after the ledger's
/// final read.
#[derive(Clone, Debug)]
pub struct OrderBooks {
    /// Whether every order event was stored and every unpaid order expired and given back
    /// within the bound; if not, what was left.
    pub settled: Result<(), String>,
    /// Every order id a buyer holds a 200 for → the store's order, if any.
    pub receipts: BTreeMap<String, Option<StoredOrder>>,
    /// The ledger's release log and `released`, read after the store settled.
    pub releases: Result<(Vec<ReleaseEvent>, u64), String>,
    /// Units of the store's orders marked given back.
    pub given_back: Result<u64, String>,
    /// `orders::reconcile::check`'s problems (empty: clean), or why it could not run.
    pub reconcile: Result<Vec<String>, String>,
}

/// Bounds the checks state: see `docs/reliability.md`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Bounds {
    /// After the heal, the ledger's remaining must reach 0 within this, while demand lasts.
    pub sell_out_after_heal_ms: u64,
    /// Longest the nodes able to sell may hold fewer units than the ledger has left.
    pub stranded_ms: u64,
    /// Longest a unit an expired order gave back may take to reach a node: units released
    /// within this before a sample are in flight, not stranded.
    pub release_to_node_ms: u64,
    /// A ledger call's deadline (`[ledger] call_timeout_ms`): a node whose Redis link is
    /// slower than this per round trip cannot sell.
    pub ledger_call_ms: u64,
    /// After the heal, the members must agree on one leader and term within this.
    pub coordinator_settle_ms: u64,
}

/// Beyond the TTL, the gap between a key's requests that starts a new use: a record is written
/// between a request's send and its answer, and a request that timed out may still be decided
/// a little after the buyer gave up on it.
pub const USE_GAP_SLACK_MS: u64 = 1_000;

/// Everything one schedule left to judge.
pub struct Evidence<'a> {
    pub total: u64,
    pub per_user_limit: u64,
    pub nodes: &'a [String],
    pub requests: &'a [Request],
    pub samples: &'a [Sample],
    pub windows: &'a [Window],
    pub ledger: &'a FinalLedger,
    pub heal_ms: u64,
    /// When the nemesis first saw the ledger's remaining at 0.
    pub sold_out_ms: Option<u64>,
    /// When the buyers ran out of keys, if they did (demand ended on its own).
    pub demand_ended_ms: Option<u64>,
    pub truncated: bool,
    /// Whether the members agreed on one leader after the heal, or what each said.
    pub coordinator: Result<(), String>,
    pub bounds: Bounds,
    /// The order service's books; none: the fleet ran no order service.
    pub order_books: Option<&'a OrderBooks>,
    /// The ledger's `idempotency_ttl_s`, in ms.
    pub idempotency_ttl_ms: u64,
    /// Unix ms at 0 ms of the history's clock, to place the ledger's sale times on it.
    pub clock_origin_unix_ms: u64,
}

/// Every violation the evidence shows, in check order.
pub fn check(evidence: &Evidence) -> Vec<Violation> {
    let mut found = Vec::new();
    if evidence.truncated {
        found.push(Violation::new(ViolationKind::HistoryIncomplete, "the history reached its bound and was truncated"));
    }
    let orders = match &evidence.ledger.orders {
        Ok(orders) => orders.as_slice(),
        Err(e) => {
            found.push(Violation::new(
                ViolationKind::HistoryIncomplete,
                format!("the order stream was unreadable: {e}"),
            ));
            &[]
        }
    };
    books(evidence, orders, &mut found);
    oversell(evidence, orders, &mut found);
    transfers(evidence, &mut found);
    undersell(evidence, &mut found);
    stranded(evidence, &mut found);
    keys(evidence, orders, &mut found);
    user_limit(evidence, orders, &mut found);
    order_ids(orders, &mut found);
    epochs(evidence, &mut found);
    if let Err(views) = &evidence.coordinator {
        found.push(Violation::new(ViolationKind::CoordinatorUnhealthy, views.clone()));
    }
    if let Some(books) = evidence.order_books {
        order_books(evidence, books, &mut found);
    }
    found
}

/// Units released per user, from the final read's release log (empty if unreadable).
fn released_by_user<'a>(evidence: &Evidence<'a>) -> BTreeMap<&'a str, u64> {
    let mut by_user: BTreeMap<&str, u64> = BTreeMap::new();
    for release in evidence.ledger.releases.iter().flatten() {
        *by_user.entry(release.user.as_str()).or_default() += u64::from(release.qty);
    }
    by_user
}

fn released(evidence: &Evidence) -> u64 {
    evidence.ledger.status.as_ref().map(|s| s.released).unwrap_or(0)
}

fn order_books(evidence: &Evidence, books: &OrderBooks, found: &mut Vec<Violation>) {
    if let Err(left) = &books.settled {
        found.push(Violation::new(
            ViolationKind::OrdersUnreconciled,
            format!("the order service did not settle: {left}"),
        ));
    }
    let mut keys_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for request in evidence.requests.iter().filter(|r| r.is_purchase()) {
        if let Some(id) = request.order_id.as_deref() {
            keys_of.entry(id).or_default().insert(request.key.as_str());
        }
    }
    for (id, keys) in &keys_of {
        let problem = match books.receipts.get(*id) {
            None | Some(None) => Some(format!("receipt {id} is not an order in the store")),
            Some(Some(order)) if !keys.contains(order.key.as_str()) || keys.len() > 1 => {
                Some(format!("receipt {id} for keys {keys:?} is stored under key {}", order.key))
            }
            Some(Some(_)) => None,
        };
        if let Some(problem) = problem {
            found.push(
                Violation::new(ViolationKind::SaleWithoutOrder, problem).keys(keys.iter().map(|k| k.to_string())),
            );
        }
    }
    match &books.releases {
        Ok((log, released)) => {
            let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
            for release in log {
                *seen.entry(release.order_id.0.as_str()).or_default() += 1;
            }
            for (id, times) in seen.iter().filter(|(_, times)| **times > 1) {
                found.push(Violation::new(
                    ViolationKind::ReleasedTwice,
                    format!("order {id} is in the ledger's release log {times} times"),
                ));
            }
            let logged: u64 = log.iter().map(|r| u64::from(r.qty)).sum();
            let mut problems = Vec::new();
            if logged != *released {
                problems.push(format!("the release log holds {logged} units, the ledger's released is {released}"));
            }
            if let Ok(given_back) = &books.given_back {
                if given_back != released {
                    problems.push(format!(
                        "the ledger released {released} units, the store's orders marked given back hold {given_back}"
                    ));
                }
            }
            if !problems.is_empty() {
                found.push(Violation::new(ViolationKind::ReleasedTwice, problems.join("; ")));
            }
        }
        Err(e) => {
            found.push(Violation::new(ViolationKind::HistoryIncomplete, format!("the release log was unreadable: {e}")))
        }
    }
    match &books.reconcile {
        Ok(problems) if problems.is_empty() => {}
        Ok(problems) => {
            found.push(Violation::new(ViolationKind::OrdersUnreconciled, format!("reconcile: {}", problems.join("; "))))
        }
        Err(e) => {
            found.push(Violation::new(ViolationKind::OrdersUnreconciled, format!("reconcile could not run: {e}")))
        }
    }
}

fn books(evidence: &Evidence, orders: &[OrderEvent], found: &mut Vec<Violation>) {
    let status = match &evidence.ledger.status {
        Ok(status) => status,
        Err(e) => {
            found.push(Violation::new(
                ViolationKind::BooksUnbalanced,
                format!("the ledger's status is unreadable: {e}"),
            ));
            return;
        }
    };
    let mut problems = Vec::new();
    // Units between stripes are in no stripe's total: judged by `transfers`, not here.
    let in_flight = stripes::in_flight(status.transferred_out, status.transferred_in);
    if i128::from(status.total) + in_flight != i128::from(evidence.total) {
        let between = if in_flight == 0 { String::new() } else { format!(" with {in_flight} between stripes") };
        problems.push(format!("total {}{between} but {} were put on sale", status.total, evidence.total));
    }
    let streamed = evidence.ledger.orders.is_ok().then(|| orders.iter().map(|o| u64::from(o.qty)).sum());
    let by_seller = evidence.ledger.sellers.as_ref().map(|sellers| sellers.values().sum());
    problems.extend(balance(status, streamed, by_seller));
    for stripe in evidence.ledger.stripes.iter().filter(|_| evidence.ledger.stripes.len() > 1) {
        let own = balance(&stripe.status, stripe.streamed, stripe.by_seller);
        problems.extend(own.into_iter().map(|problem| format!("stripe {}: {problem}", stripe.ledger)));
    }
    if !problems.is_empty() {
        found.push(Violation::new(ViolationKind::BooksUnbalanced, problems.join("; ")));
    }
}

/// One ledger's books: `streamed` and `by_seller` are its order stream's and per-seller
/// books' sums, when read.
fn balance(status: &SkuStatus, streamed: Option<u64>, by_seller: Option<u64>) -> Vec<String> {
    let mut problems = Vec::new();
    if status.sold + status.remaining != status.total {
        problems.push(format!("sold {} + remaining {} != total {}", status.sold, status.remaining, status.total));
    }
    // Per-node, per-seller and stream counts keep what was ever sold; a release takes units
    // out of `sold` only.
    let ever = status.sold + status.released;
    let by_node: u64 = status.sold_by_node.values().sum();
    if by_node != ever {
        problems.push(format!("Σ per node {by_node} != sold {} + released {}", status.sold, status.released));
    }
    if let Some(streamed) = streamed.filter(|streamed| *streamed != ever) {
        problems.push(format!("Σ order stream {streamed} != sold {} + released {}", status.sold, status.released));
    }
    if let Some(by_seller) = by_seller.filter(|by_seller| *by_seller != ever) {
        problems.push(format!("Σ per seller {by_seller} != sold {} + released {}", status.sold, status.released));
    }
    problems
}

/// A striped SKU's stripes add up to it, with nothing between them once settled; and on each
/// sample that read every stripe, their totals with what is between them are the SKU's.
fn transfers(evidence: &Evidence, found: &mut Vec<Violation>) {
    // An unstriped SKU is judged as before stripes: its books by `books` and `oversell`.
    if evidence.ledger.stripes.len() <= 1 {
        return;
    }
    if let Ok(status) = &evidence.ledger.status {
        let in_flight = stripes::in_flight(status.transferred_out, status.transferred_in);
        let unsold = i128::from(status.remaining) + in_flight;
        let mut problems = Vec::new();
        if unsold != i128::from(evidence.total) - i128::from(status.sold) {
            problems.push(format!(
                "Σ remaining {} + {in_flight} in flight != total {} − Σ sold {}",
                status.remaining, evidence.total, status.sold
            ));
        }
        if in_flight != 0 {
            let what = if in_flight > 0 { "taken from a stripe and given to none" } else { "given to a stripe twice" };
            problems.push(format!(
                "after the heal {} units were {what} (transferred out {}, in {})",
                in_flight.abs(),
                status.transferred_out,
                status.transferred_in
            ));
        }
        if !problems.is_empty() {
            found.push(Violation::new(ViolationKind::TransferLostOrDoubled, problems.join("; ")));
        }
    }
    for sample in evidence.samples {
        let Some(ledger) = sample.ledger else { continue };
        let whole = i128::from(ledger.total) + stripes::in_flight(ledger.transferred_out, ledger.transferred_in);
        if whole != i128::from(evidence.total) {
            found.push(Violation {
                window_ms: Some((sample.at_ms, sample.at_ms)),
                ..Violation::new(
                    ViolationKind::TransferLostOrDoubled,
                    format!(
                        "at {} ms the stripes held {} units and {} were between them, of {}",
                        sample.at_ms,
                        ledger.total,
                        whole - i128::from(ledger.total),
                        evidence.total
                    ),
                )
            });
        }
    }
}

fn oversell(evidence: &Evidence, orders: &[OrderEvent], found: &mut Vec<Violation>) {
    if let Ok(status) = &evidence.ledger.status {
        if status.sold > evidence.total {
            found.push(Violation::new(
                ViolationKind::Oversell,
                format!("ledger sold {} of {}", status.sold, evidence.total),
            ));
        }
    }
    // A released unit sells again: the stream and the receipts may exceed the total by it.
    let released = released(evidence);
    let streamed: u64 = orders.iter().map(|o| u64::from(o.qty)).sum();
    if streamed > evidence.total + released {
        found.push(Violation::new(
            ViolationKind::Oversell,
            format!("order stream holds {streamed} of {} + {released} released", evidence.total),
        ));
    }
    let receipts = bought_uses(evidence).len() as u64;
    if receipts > evidence.total + released {
        found.push(Violation::new(
            ViolationKind::Oversell,
            format!("buyers hold {} distinct receipts for {} units + {released} released", receipts, evidence.total),
        ));
    }
}

fn undersell(evidence: &Evidence, found: &mut Vec<Violation>) {
    let deadline = evidence.heal_ms + evidence.bounds.sell_out_after_heal_ms;
    if evidence.sold_out_ms.is_some_and(|at| at <= deadline) {
        return;
    }
    // Demand that ran out before the deadline leaves stock unsold by no fault of the fleet.
    if evidence.demand_ended_ms.is_some_and(|at| at <= deadline) {
        return;
    }
    let remaining = evidence.ledger.status.as_ref().map(|s| s.remaining.to_string()).unwrap_or_else(|e| e.clone());
    found.push(Violation::new(
        ViolationKind::Undersell,
        format!(
            "the ledger did not reach remaining 0 within {} ms of the heal at {} ms (sold out at {:?} ms; remaining at the end: {remaining})",
            evidence.bounds.sell_out_after_heal_ms, evidence.heal_ms, evidence.sold_out_ms
        ),
    ));
}

/// Faults in effect at `at_ms`. A node counts as able to sell again as soon as its fault ends:
/// a restarted node holds nothing yet, so counting it adds no units, and a thawed one still
/// shows its old allotment, which makes the check miss, never invent, stranded units.
fn in_effect(windows: &[Window], at_ms: u64) -> impl Iterator<Item = &Window> {
    windows.iter().filter(move |w| !w.skipped && w.start_ms <= at_ms && w.end_ms.is_none_or(|end| at_ms <= end))
}

fn stranded(evidence: &Evidence, found: &mut Vec<Violation>) {
    let bounds = evidence.bounds;
    // (start, last, most units stranded, nodes unable to sell) of the span under way.
    type Span = (u64, u64, u64, BTreeSet<String>);
    let close = |span: &mut Option<Span>, found: &mut Vec<Violation>| {
        if let Some((start, last, units, holders)) = span.take() {
            if last - start >= bounds.stranded_ms {
                found.push(Violation {
                    nodes: holders.iter().cloned().collect(),
                    window_ms: Some((start, last)),
                    ..Violation::new(
                        ViolationKind::StrandedAllotment,
                        format!(
                            "{start}–{last} ms: up to {units} of the ledger's remaining units were held by no node \
                             able to sell, while Redis and the coordinator were whole; nodes unable to sell: \
                             {holders:?}"
                        ),
                    )
                });
            }
        }
    };
    let mut span: Option<Span> = None;
    // (at, released) of recent samples: what was released within `release_to_node_ms`.
    let mut recent: VecDeque<(u64, u64)> = VecDeque::new();
    for sample in evidence.samples {
        // Units released since the last sample older than the allowance are in flight: the
        // coordinator grants them on its next tick and the node sees them on its next heartbeat.
        // A release burst keeps the level above zero for as long as it lasts, but no unit waits
        // longer than the allowance; one that does still counts.
        let released_now = sample.ledger.map(|ledger| ledger.released);
        while recent.len() > 1 && recent[1].0 + bounds.release_to_node_ms <= sample.at_ms {
            recent.pop_front();
        }
        let in_flight = match (released_now, recent.front()) {
            (Some(now), Some((_, before))) => now.saturating_sub(*before),
            _ => 0,
        };
        if let Some(now) = released_now {
            recent.push_back((sample.at_ms, now));
        }
        let effective: Vec<&Window> = in_effect(evidence.windows, sample.at_ms).collect();
        let fleet_whole = !effective.iter().any(|w| w.impairs_fleet());
        let unable: BTreeSet<String> = effective.iter().flat_map(|w| w.unable_nodes(bounds.ledger_call_ms)).collect();
        let able: Vec<&String> = evidence.nodes.iter().filter(|n| !unable.contains(*n)).collect();
        // A node that did not answer its stock page leaves the sample unjudged.
        let able_local: Option<u64> = able.iter().map(|n| sample.local.get(*n).copied().flatten()).sum();
        let stranded = match (sample.ledger, able_local) {
            (Some(ledger), Some(local)) if fleet_whole && !able.is_empty() => {
                ledger.remaining.saturating_sub(local).saturating_sub(in_flight)
            }
            _ => 0,
        };
        if stranded > 0 {
            match &mut span {
                Some((_, last, units, holders)) => {
                    *last = sample.at_ms;
                    *units = (*units).max(stranded);
                    holders.extend(unable);
                }
                None => span = Some((sample.at_ms, sample.at_ms, stranded, unable)),
            }
        } else {
            close(&mut span, found);
        }
    }
    close(&mut span, found);
}

fn user_limit(evidence: &Evidence, orders: &[OrderEvent], found: &mut Vec<Violation>) {
    let limit = evidence.per_user_limit;
    if limit == 0 {
        return;
    }
    let mut receipts: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (user, name) in bought_uses(evidence) {
        receipts.entry(user).or_default().insert(name);
    }
    // A release lowers the buyer's count, so the buyer may buy again: each unit given back
    // allows one more receipt (a bound, as the release log has no time to order it by).
    let given_back = released_by_user(evidence);
    for (user, keys) in receipts {
        let allowed = limit + given_back.get(user).copied().unwrap_or(0);
        // Every purchase of this workload is one unit.
        if keys.len() as u64 > allowed {
            found.push(
                Violation::new(
                    ViolationKind::UserLimitExceeded,
                    format!(
                        "user {user} holds {} receipts, limit {limit} plus {} given back",
                        keys.len(),
                        allowed - limit
                    ),
                )
                .keys(keys.iter().map(|k| k.to_string())),
            );
        }
    }
    let mut bought: BTreeMap<&str, (u64, Vec<String>)> = BTreeMap::new();
    for order in orders {
        let entry = bought.entry(order.user.as_str()).or_default();
        entry.0 += u64::from(order.qty);
        entry.1.push(order.key.to_string());
    }
    for (user, (units, keys)) in bought {
        // What the user holds at the final read: bought, less what was given back by then.
        let held = units.saturating_sub(given_back.get(user).copied().unwrap_or(0));
        if held > limit {
            found.push(
                Violation::new(
                    ViolationKind::UserLimitExceeded,
                    format!("the ledger sold user {user} {units} units and took back {}, limit {limit}", units - held),
                )
                .keys(keys),
            );
        }
    }
}

fn order_ids(orders: &[OrderEvent], found: &mut Vec<Violation>) {
    let mut by_id: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for order in orders {
        by_id.entry(order.order_id.0.as_str()).or_default().insert(order.key.to_string());
    }
    for (id, keys) in by_id {
        if keys.len() > 1 {
            found.push(
                Violation::new(
                    ViolationKind::DuplicateOrderId,
                    format!("order id {id} was given to {} keys", keys.len()),
                )
                .keys(keys),
            );
        }
    }
}

/// Whether the leader's view in `sample` shows `epoch` of `node` as ended.
fn ended(sample: &Sample, node: &str, epoch: u64) -> bool {
    let Some(view) = sample.nodes.as_ref().and_then(|nodes| nodes.get(node)) else { return false };
    epoch < view.epoch || (epoch == view.epoch && !view.live)
}

fn epochs(evidence: &Evidence, found: &mut Vec<Violation>) {
    // The samples' books, then the final read, in time order.
    let mut books: Vec<(u64, Option<&BTreeMap<String, u64>>)> =
        evidence.samples.iter().map(|s| (s.at_ms, s.sellers.as_ref())).collect();
    books.push((evidence.ledger.at_ms, evidence.ledger.sellers.as_ref()));
    let sellers: BTreeSet<&String> = books.iter().filter_map(|(_, b)| *b).flat_map(|b| b.keys()).collect();
    for seller in sellers {
        let Some((node, epoch)) = seller.rsplit_once('#').and_then(|(n, e)| Some((n, e.parse::<u64>().ok()?))) else {
            continue;
        };
        // The first sample that saw the epoch ended and read the books after: the baseline.
        let Some((at, sample)) =
            evidence.samples.iter().enumerate().find(|(_, s)| s.sellers.is_some() && ended(s, node, epoch))
        else {
            continue;
        };
        let baseline = sample.sellers.as_ref().and_then(|b| b.get(seller)).copied().unwrap_or(0);
        let later = books.iter().skip(at + 1).find_map(|(at_ms, b)| {
            let units = b.and_then(|b| b.get(seller)).copied()?;
            (units > baseline).then_some((*at_ms, units))
        });
        if let Some((grew_at, units)) = later {
            found.push(Violation {
                nodes: vec![node.to_string()],
                window_ms: Some((sample.at_ms, grew_at)),
                ..Violation::new(
                    ViolationKind::SoldUnderEndedEpoch,
                    format!(
                        "seller {seller}: the leader showed the epoch ended at {} ms with {baseline} sold; {units} sold by {grew_at} ms",
                        sample.at_ms
                    ),
                )
            });
        }
    }
}

#[cfg(test)]
mod tests;
