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
}

impl ViolationKind {
    pub const ALL: [ViolationKind; 27] = [
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

/// A key as its buyer holds it: a key is its buyer's, so another buyer's purchase under it is
/// a purchase of its own, judged apart.
type BuyerKey<'r> = (&'r str, &'r str);

/// How a buyer's key is named in a violation's detail.
fn named((key, user): BuyerKey) -> String {
    format!("{key} of {user}")
}

/// Each buyer's key's requests split into uses (see the module docs), each in send order.
fn uses<'r>(evidence: &Evidence<'r>) -> BTreeMap<BuyerKey<'r>, Vec<Vec<&'r Request>>> {
    let mut by_key: BTreeMap<BuyerKey, Vec<&Request>> = BTreeMap::new();
    for request in evidence.requests {
        by_key.entry((request.key.as_str(), request.user.as_str())).or_default().push(request);
    }
    let gap = evidence.idempotency_ttl_ms.saturating_add(USE_GAP_SLACK_MS);
    by_key
        .into_iter()
        .map(|(key, mut requests)| {
            requests.sort_by_key(|r| r.sent_ms);
            let mut uses: Vec<Vec<&Request>> = Vec::new();
            let mut last_answer: Option<u64> = None;
            for request in requests {
                match (uses.last_mut(), last_answer) {
                    (Some(current), Some(last)) if request.sent_ms <= last.saturating_add(gap) => current.push(request),
                    _ => uses.push(vec![request]),
                }
                last_answer = Some(last_answer.map_or(request.answered_ms, |last| last.max(request.answered_ms)));
            }
            (key, uses)
        })
        .collect()
}

/// The uses of keys that bought, as (user, name): one unit each. A key reused after its TTL may
/// buy again, but a reuse answered with an order id an earlier use of the key already holds (a
/// node replaying the earlier sale from its memory) bought nothing more; a use answered with
/// two ids is one purchase (and an `idempotency_conflict`).
fn bought_uses<'r>(evidence: &Evidence<'r>) -> Vec<(&'r str, String)> {
    let mut bought = Vec::new();
    for (key, uses) in uses(evidence) {
        let mut held: BTreeSet<&str> = BTreeSet::new();
        for (at, requests) in uses.iter().enumerate() {
            let receipts: Vec<&Request> = requests.iter().copied().filter(|r| r.is_purchase()).collect();
            let Some(first) = receipts.first() else { continue };
            let ids: BTreeSet<&str> = receipts.iter().filter_map(|r| r.order_id.as_deref()).collect();
            if !ids.is_empty() && ids.is_subset(&held) {
                continue;
            }
            held.extend(ids);
            let name = if at == 0 { named(key) } else { format!("{} (use {})", named(key), at + 1) };
            bought.push((first.user.as_str(), name));
        }
    }
    bought
}

/// Per key: sold again only after its TTL; per use of a key: one decision, one order id; every
/// receipt in the ledger.
fn keys(evidence: &Evidence, orders: &[OrderEvent], found: &mut Vec<Violation>) {
    let ttl = evidence.idempotency_ttl_ms;
    let mut sold: BTreeMap<BuyerKey, Vec<&OrderEvent>> = BTreeMap::new();
    for order in orders {
        sold.entry((order.key.as_str(), order.user.as_str())).or_default().push(order);
    }
    for (held, events) in &sold {
        let (key, held) = (held.0, named(*held));
        // The record a sale writes lives the TTL by the ledger's clock, which also stamps
        // `at_ms`: a second sale before it lapsed replaced a live decision.
        let early = events.windows(2).filter(|pair| pair[1].at_ms < pair[0].at_ms.saturating_add(ttl)).count();
        if early > 0 {
            let sales: Vec<String> = events.iter().map(|o| format!("{} at {}", o.order_id.0, o.at_ms)).collect();
            found.push(
                Violation::new(
                    ViolationKind::KeySoldTwice,
                    format!(
                        "key {held} is in the order stream {} times ({sales:?}), {early} of them within the \
                         idempotency TTL ({ttl} ms) of the sale before",
                        events.len()
                    ),
                )
                .keys([key.to_string()]),
            );
        }
    }
    let resales = evidence.ledger.status.as_ref().is_ok_and(|status| status.released > 0);
    for (held, uses) in uses(evidence) {
        let events: &[&OrderEvent] = sold.get(&held).map_or(&[], Vec::as_slice);
        let key = held.0;
        let starts: Vec<u64> = uses.iter().map(|requests| requests[0].sent_ms).collect();
        // The use under way when the ledger sold: the last one started by then.
        let use_of = |event: &OrderEvent| {
            let at = event.at_ms.saturating_sub(evidence.clock_origin_unix_ms);
            starts.iter().rposition(|start| *start <= at.saturating_add(USE_GAP_SLACK_MS)).unwrap_or(0)
        };
        for (at, requests) in uses.iter().enumerate() {
            let sales: Vec<&OrderEvent> = events.iter().copied().filter(|event| use_of(event) == at).collect();
            let earlier: BTreeSet<&str> =
                events.iter().filter(|event| use_of(event) < at).map(|event| event.order_id.0.as_str()).collect();
            let (stale, current): (Vec<&Request>, Vec<&Request>) = requests
                .iter()
                .partition(|r| r.is_purchase() && r.order_id.as_deref().is_some_and(|id| earlier.contains(id)));
            for answer in &stale {
                found.push(
                    Violation::new(
                        ViolationKind::StaleReplay,
                        format!(
                            "key {}, used again after its idempotency TTL, answered by {} at {} ms with order {} \
                             of its earlier use",
                            named(held),
                            answer.node,
                            answer.answered_ms,
                            answer.order_id.as_deref().unwrap_or("?")
                        ),
                    )
                    .keys([key.to_string()]),
                );
            }
            one_use(held, &current, &sales, events, resales, found);
        }
    }
    keys_taken(evidence, found);
}

/// `key_taken_by_another_buyer`: the workload sends each buyer's key with one body only, so a
/// `key_reused` answer means another buyer's use of the key was held against this one.
fn keys_taken(evidence: &Evidence, found: &mut Vec<Violation>) {
    let mut buyers_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for request in evidence.requests {
        buyers_of.entry(request.key.as_str()).or_default().insert(request.user.as_str());
    }
    for answer in evidence.requests.iter().filter(|r| r.outcome == "key_reused") {
        let others: Vec<&str> = buyers_of
            .get(answer.key.as_str())
            .into_iter()
            .flatten()
            .copied()
            .filter(|user| *user != answer.user)
            .collect();
        found.push(
            Violation::new(
                ViolationKind::KeyTakenByAnotherBuyer,
                format!(
                    "key {} answered key_reused by {} at {} ms; its buyer never sent it with another body \
                     (other buyers of the key: {others:?})",
                    named((answer.key.as_str(), answer.user.as_str())),
                    answer.node,
                    answer.answered_ms
                ),
            )
            .keys([answer.key.clone()]),
        );
    }
}

/// One use of a buyer's key: its `requests`, the `sales` the ledger made in it, and every sale
/// of the buyer's key.
fn one_use(
    held: BuyerKey,
    requests: &[&Request],
    sales: &[&OrderEvent],
    every_sale: &[&OrderEvent],
    resales: bool,
    found: &mut Vec<Violation>,
) {
    let (key, name) = (held.0, named(held));
    let receipts: BTreeSet<&str> =
        requests.iter().filter(|r| r.is_purchase()).filter_map(|r| r.order_id.as_deref()).collect();
    let others: Vec<&&Request> = requests.iter().filter(|r| r.is_decision() && !r.is_purchase()).collect();
    let bought = !sales.is_empty() || !receipts.is_empty();
    // What the key was decided as, if not a purchase: the first answer that is not memory's
    // sold-out (which the ledger never stored); none if memory's sold-out is all it got.
    let stored = others.iter().find(|r| r.outcome != "sold_out" || r.replayed).map(|r| r.outcome.as_str());
    let decided = if bought { Some("purchased") } else { stored };
    for answer in &others {
        let from_memory = answer.outcome == "sold_out" && !answer.replayed;
        let conflict = match decided {
            // A key the ledger refused, told `sold_out` from memory later: both are final
            // refusals, and the promise (docs/http-api.md) lets memory's sold-out stand in
            // for any stored refusal rather than pay a ledger lookup per sold-out request.
            Some(decision) if decision != "purchased" && from_memory => false,
            Some(decision) => answer.outcome != decision,
            None => false,
        };
        if !conflict {
            continue;
        }
        // Once units were released, "sold out" is true only until they come back: memory's
        // sold-out followed by a fresh purchase of the key sent after it was answered is
        // the resale working, not a lost sale (a fresh purchase means the ledger had not
        // decided the key before; had a hidden sale come first, it would be a replay).
        let bought_afterwards =
            requests.iter().any(|r| r.is_purchase() && !r.replayed && r.sent_ms >= answer.answered_ms);
        if from_memory && resales && decided == Some("purchased") && bought_afterwards {
            continue;
        }
        // Memory's sold-out to the key's very first send came before any decision of it: a
        // premature answer. To a retry or a repeat, the key may have been decided already
        // (a 503 or a lost answer can hide a sale): defect (a).
        let decided_before = requests.iter().any(|r| r.is_decision() && r.answered_ms <= answer.sent_ms);
        let (kind, what) = if !from_memory {
            (ViolationKind::IdempotencyConflict, "answered another decision")
        } else if answer.attempt == 0 && !decided_before {
            (ViolationKind::SoldOutThenDecided, "first answered sold_out from memory")
        } else {
            (ViolationKind::RetryToldSoldOut, "answered sold_out from memory to a retry")
        };
        found.push(
            Violation::new(
                kind,
                format!(
                    "key {name}, decided {}, {what}: {} by {} at {} ms",
                    decided.unwrap_or("?"),
                    answer.outcome,
                    answer.node,
                    answer.answered_ms
                ),
            )
            .keys([key.to_string()]),
        );
    }
    // Two ids in one use are two sales only if the ledger made both in it (their spacing is
    // `key_sold_twice`'s to judge); otherwise one purchase was answered with two ids.
    let sold_in_use: BTreeSet<&str> = sales.iter().map(|o| o.order_id.0.as_str()).collect();
    if receipts.len() > 1 && !receipts.is_subset(&sold_in_use) {
        found.push(
            Violation::new(
                ViolationKind::IdempotencyConflict,
                format!("key {name} got {} order ids: {receipts:?}", receipts.len()),
            )
            .keys([key.to_string()]),
        );
    }
    for receipt in &receipts {
        // A replay from a node's memory may name the key's sale of an earlier use: still a sale.
        if !every_sale.iter().any(|o| o.order_id.0 == *receipt) {
            let ledger_says: Vec<&str> = every_sale.iter().map(|o| o.order_id.0.as_str()).collect();
            found.push(
                Violation::new(
                    ViolationKind::LostReceipt,
                    format!("key {name}: receipt {receipt} but the order stream has {ledger_says:?}"),
                )
                .keys([key.to_string()]),
            );
        }
    }
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
mod tests {
    use super::*;
    use crate::monitor::{LedgerFigures, NodeView};
    use crate::schedule::FaultKind;
    use ledger::{IdempotencyKey, NodeId, OrderId, UserId};

    fn request(
        key: &str,
        user: &str,
        node: &str,
        outcome: &str,
        order: Option<&str>,
        replayed: bool,
        at: u64,
    ) -> Request {
        Request {
            sku: "s".into(),
            key: key.into(),
            reuse: 0,
            user: user.into(),
            node: node.into(),
            attempt: 0,
            status: Some(if outcome == "purchased" { 200 } else { 409 }),
            outcome: outcome.into(),
            order_id: order.map(str::to_string),
            replayed,
            sent_ms: at,
            answered_ms: at + 1,
        }
    }

    fn order(seq: u64, key: &str, user: &str, id: &str, node: &str) -> OrderEvent {
        OrderEvent {
            seq,
            order_id: OrderId(id.into()),
            key: IdempotencyKey::new(key).unwrap(),
            user: UserId::new(user).unwrap(),
            qty: 1,
            node: NodeId::new(node).unwrap(),
            at_ms: 0,
            pricing: None,
        }
    }

    fn status(total: u64, orders: &[OrderEvent]) -> SkuStatus {
        let mut sold_by_node = BTreeMap::new();
        for o in orders {
            *sold_by_node.entry(o.node.clone()).or_insert(0) += u64::from(o.qty);
        }
        let sold = orders.len() as u64;
        SkuStatus {
            total,
            sold,
            remaining: total - sold,
            per_user_limit: 1,
            sold_by_node,
            closed: false,
            require_token: false,
            released: 0,
            orders: sold,
            transferred_out: 0,
            transferred_in: 0,
        }
    }

    /// The ledger's default idempotency TTL.
    const DAY_MS: u64 = 24 * 60 * 60 * 1000;

    const BOUNDS: Bounds = Bounds {
        sell_out_after_heal_ms: 30_000,
        stranded_ms: 4_000,
        release_to_node_ms: 1_000,
        coordinator_settle_ms: 10_000,
        ledger_call_ms: 500,
    };

    fn judge(
        total: u64,
        requests: &[Request],
        orders: Vec<OrderEvent>,
        samples: &[Sample],
        windows: &[Window],
    ) -> Vec<ViolationKind> {
        let ledger = FinalLedger {
            status: Ok(status(total, &orders)),
            orders: Ok(orders),
            releases: Ok(vec![]),
            sellers: None,
            stripes: vec![],
            at_ms: 100_000,
        };
        judge_ledger(total, requests, &ledger, samples, windows)
    }

    fn judge_ledger(
        total: u64,
        requests: &[Request],
        ledger: &FinalLedger,
        samples: &[Sample],
        windows: &[Window],
    ) -> Vec<ViolationKind> {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let evidence = Evidence {
            total,
            per_user_limit: 1,
            nodes: &nodes,
            requests,
            samples,
            windows,
            ledger,
            heal_ms: 10_000,
            sold_out_ms: Some(12_000),
            demand_ended_ms: None,
            truncated: false,
            coordinator: Ok(()),
            bounds: BOUNDS,
            order_books: None,
            idempotency_ttl_ms: DAY_MS,
            clock_origin_unix_ms: 0,
        };
        check(&evidence).into_iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 10),
            request("k1", "u1", "n2", "purchased", Some("o1"), true, 20),
            request("k2", "u1", "n2", "user_limit", None, false, 30),
            request("k3", "u2", "n3", "sold_out", None, false, 40),
        ];
        let orders = vec![order(1, "k1", "u1", "o1", "n1")];
        assert_eq!(judge(1, &requests, orders, &[], &[]), []);
    }

    #[test]
    fn a_key_is_judged_per_buyer() {
        // u2 sends u1's key: a purchase of its own, on its own order; both replay their own.
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 10),
            request("k1", "u2", "n2", "purchased", Some("o2"), false, 20),
            request("k1", "u2", "n3", "purchased", Some("o2"), true, 30),
            request("k1", "u1", "n3", "purchased", Some("o1"), true, 40),
        ];
        let orders = vec![order(1, "k1", "u1", "o1", "n1"), order(2, "k1", "u2", "o2", "n2")];
        assert_eq!(judge(2, &requests, orders.clone(), &[], &[]), []);
        // A ledger that held the key as the first buyer's refuses the second.
        let taken = [
            request("k1", "u2", "n2", "purchased", Some("o2"), false, 10),
            request("k1", "u1", "n1", "key_reused", None, false, 20),
        ];
        let orders = vec![order(1, "k1", "u2", "o2", "n2")];
        assert_eq!(judge(2, &taken, orders, &[], &[]), [ViolationKind::KeyTakenByAnotherBuyer]);
        // One order replayed to the key's other buyer is a receipt that buyer never bought.
        let replayed_to_another = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 10),
            request("k1", "u2", "n2", "purchased", Some("o1"), true, 20),
        ];
        let orders = vec![order(1, "k1", "u1", "o1", "n1")];
        assert!(
            judge(2, &replayed_to_another, orders, &[], &[]).contains(&ViolationKind::LostReceipt),
            "a receipt of another buyer's order is not in the ledger under its buyer's key"
        );
    }

    #[test]
    fn a_bought_key_told_sold_out_by_another_node_is_defect_a() {
        let mut repeat = request("k1", "u1", "n2", "sold_out", None, false, 11);
        repeat.attempt = 1;
        let requests = [request("k1", "u1", "n1", "purchased", Some("o1"), false, 10), repeat];
        let orders = vec![order(1, "k1", "u1", "o1", "n1")];
        assert_eq!(judge(2, &requests, orders, &[], &[]), [ViolationKind::RetryToldSoldOut]);
    }

    #[test]
    fn a_key_refused_user_limit_then_told_sold_out_from_memory_is_one_refusal() {
        let mut repeat = request("k2", "u1", "n2", "sold_out", None, false, 30);
        repeat.attempt = 1;
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 10),
            request("k2", "u1", "n1", "user_limit", None, false, 20),
            repeat,
        ];
        let orders = vec![order(1, "k1", "u1", "o1", "n1")];
        assert_eq!(judge(1, &requests, orders, &[], &[]), []);
    }

    #[test]
    fn a_sale_nobody_heard_then_told_sold_out_is_caught_through_the_ledger() {
        let mut retry = request("k1", "u1", "n2", "sold_out", None, false, 11);
        retry.attempt = 1;
        let requests = [request("k1", "u1", "n1", "timeout", None, false, 5), retry];
        let orders = vec![order(1, "k1", "u1", "o1", "n1")];
        assert_eq!(judge(1, &requests, orders, &[], &[]), [ViolationKind::RetryToldSoldOut]);
    }

    #[test]
    fn a_first_answer_sold_out_from_memory_then_a_sale_is_premature() {
        let mut repeat = request("k1", "u1", "n2", "purchased", Some("o1"), false, 20);
        repeat.attempt = 1;
        let requests = [request("k1", "u1", "n1", "sold_out", None, false, 10), repeat];
        let orders = vec![order(1, "k1", "u1", "o1", "n2")];
        assert_eq!(judge(1, &requests, orders, &[], &[]), [ViolationKind::SoldOutThenDecided]);
    }

    #[test]
    fn a_stored_decision_contradicted_is_an_idempotency_conflict() {
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 10),
            request("k1", "u1", "n2", "user_limit", None, true, 11),
            request("k2", "u2", "n1", "purchased", Some("o2"), false, 12),
            request("k2", "u2", "n3", "purchased", Some("o9"), true, 13),
        ];
        let orders = vec![order(1, "k1", "u1", "o1", "n1"), order(2, "k2", "u2", "o2", "n1")];
        let found = judge(2, &requests, orders, &[], &[]);
        assert_eq!(
            found,
            [ViolationKind::IdempotencyConflict, ViolationKind::IdempotencyConflict, ViolationKind::LostReceipt]
        );
    }

    #[test]
    fn receipts_missing_from_the_ledger_limits_and_ids_are_checked() {
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 10),
            request("k2", "u1", "n1", "purchased", Some("o2"), false, 11),
        ];
        let orders = vec![order(1, "k1", "u1", "o1", "n1"), order(2, "k3", "u3", "o1", "n2")];
        let found = judge(3, &requests, orders, &[], &[]);
        assert_eq!(
            found,
            [ViolationKind::LostReceipt, ViolationKind::UserLimitExceeded, ViolationKind::DuplicateOrderId]
        );
    }

    #[test]
    fn oversell_and_unbalanced_books_are_caught() {
        let orders = vec![order(1, "k1", "u1", "o1", "n1"), order(2, "k2", "u2", "o2", "n1")];
        let bad = SkuStatus { total: 1, sold: 2, remaining: 0, ..status(2, &orders) };
        let ledger = FinalLedger {
            status: Ok(bad),
            orders: Ok(orders),
            releases: Ok(vec![]),
            sellers: None,
            stripes: vec![],
            at_ms: 1,
        };
        let evidence = Evidence {
            total: 1,
            per_user_limit: 0,
            nodes: &[],
            requests: &[],
            samples: &[],
            windows: &[],
            ledger: &ledger,
            heal_ms: 0,
            sold_out_ms: Some(0),
            demand_ended_ms: None,
            truncated: false,
            coordinator: Ok(()),
            bounds: BOUNDS,
            order_books: None,
            idempotency_ttl_ms: DAY_MS,
            clock_origin_unix_ms: 0,
        };
        let kinds: Vec<_> = check(&evidence).into_iter().map(|v| v.kind).collect();
        assert_eq!(kinds, [ViolationKind::BooksUnbalanced, ViolationKind::Oversell, ViolationKind::Oversell]);
    }

    fn release(seq: u64, id: &str, user: &str) -> ReleaseEvent {
        ReleaseEvent { seq, order_id: OrderId(id.into()), user: UserId::new(user).unwrap(), qty: 1 }
    }

    fn stored(key: &str) -> Option<StoredOrder> {
        Some(StoredOrder { key: key.into(), qty: 1, state: "expired".into(), released: true })
    }

    /// o1 sold to u1, released, and its unit sold again to u2 as o2 (also released); then the
    /// order books are judged as `tweak` leaves them.
    fn judge_orders(tweak: impl FnOnce(&mut OrderBooks)) -> Vec<ViolationKind> {
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 10),
            request("k2", "u2", "n2", "purchased", Some("o2"), false, 20),
        ];
        judge_resold(&requests, tweak)
    }

    /// [`judge_orders`]'s sale (units released and sold again) with other requests.
    fn judge_resold(requests: &[Request], tweak: impl FnOnce(&mut OrderBooks)) -> Vec<ViolationKind> {
        let orders = vec![order(1, "k1", "u1", "o1", "n1"), order(2, "k2", "u2", "o2", "n1")];
        let releases = vec![release(1, "o1", "u1"), release(2, "o2", "u2")];
        let mut ledger_status = status(2, &orders);
        (ledger_status.total, ledger_status.sold, ledger_status.remaining, ledger_status.released) = (1, 0, 1, 2);
        let ledger = FinalLedger {
            status: Ok(ledger_status),
            orders: Ok(orders),
            releases: Ok(releases.clone()),
            sellers: None,
            stripes: vec![],
            at_ms: 100_000,
        };
        let mut books = OrderBooks {
            settled: Ok(()),
            receipts: [("o1".to_string(), stored("k1")), ("o2".to_string(), stored("k2"))].into(),
            releases: Ok((releases, 2)),
            given_back: Ok(2),
            reconcile: Ok(vec![]),
        };
        tweak(&mut books);
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let evidence = Evidence {
            total: 1,
            per_user_limit: 1,
            nodes: &nodes,
            requests,
            samples: &[],
            windows: &[],
            ledger: &ledger,
            heal_ms: 10_000,
            sold_out_ms: Some(12_000),
            demand_ended_ms: None,
            truncated: false,
            coordinator: Ok(()),
            bounds: BOUNDS,
            order_books: Some(&books),
            idempotency_ttl_ms: DAY_MS,
            clock_origin_unix_ms: 0,
        };
        check(&evidence).into_iter().map(|v| v.kind).collect()
    }

    #[test]
    fn with_resales_memorys_sold_out_before_a_fresh_purchase_is_the_resale_not_a_lost_sale() {
        let mut told_sold_out = request("k2", "u2", "n3", "sold_out", None, false, 15);
        told_sold_out.attempt = 1;
        let bought_after = request("k2", "u2", "n2", "purchased", Some("o2"), false, 16);
        let requests = [request("k1", "u1", "n1", "purchased", Some("o1"), false, 10), told_sold_out, bought_after];
        assert_eq!(judge_resold(&requests, |_| {}), []);
        // A replayed purchase means the key had bought before memory said sold out: still (a).
        let mut replayed = requests.to_vec();
        replayed[2].replayed = true;
        replayed.push(request("k2", "u2", "n2", "purchased", Some("o2"), false, 5));
        assert_eq!(judge_resold(&replayed, |_| {}), [ViolationKind::RetryToldSoldOut]);
        // Told sold out after its own purchase was answered: (f), whatever came back.
        let mut after = request("k1", "u1", "n3", "sold_out", None, false, 12);
        after.attempt = 1;
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 10),
            after,
            request("k2", "u2", "n2", "purchased", Some("o2"), false, 20),
        ];
        assert_eq!(judge_resold(&requests, |_| {}), [ViolationKind::RetryToldSoldOut]);
    }

    #[test]
    fn a_unit_released_and_sold_again_is_no_oversell_and_the_order_books_pass() {
        assert_eq!(judge_orders(|_| {}), []);
    }

    #[test]
    fn a_receipt_with_no_order_a_double_release_and_a_dirty_reconcile_are_caught() {
        assert_eq!(
            judge_orders(|b| {
                b.receipts.insert("o2".into(), None);
            }),
            [ViolationKind::SaleWithoutOrder]
        );
        assert_eq!(
            judge_orders(|b| {
                b.receipts.insert("o2".into(), stored("k9"));
            }),
            [ViolationKind::SaleWithoutOrder]
        );
        let twice = |b: &mut OrderBooks| {
            let (log, released) = b.releases.as_mut().unwrap();
            log.push(release(3, "o1", "u1"));
            *released = 3;
        };
        assert_eq!(judge_orders(twice), [ViolationKind::ReleasedTwice, ViolationKind::ReleasedTwice]);
        assert_eq!(judge_orders(|b| b.given_back = Ok(1)), [ViolationKind::ReleasedTwice]);
        assert_eq!(judge_orders(|b| b.reconcile = Ok(vec!["units: off".into()])), [ViolationKind::OrdersUnreconciled]);
        assert_eq!(judge_orders(|b| b.settled = Err("left".into())), [ViolationKind::OrdersUnreconciled]);
    }

    #[test]
    fn no_sell_out_within_the_bound_after_heal_is_undersell_unless_demand_ended() {
        let ledger = FinalLedger {
            status: Ok(status(5, &[])),
            orders: Ok(vec![]),
            releases: Ok(vec![]),
            sellers: None,
            stripes: vec![],
            at_ms: 1,
        };
        let mut evidence = Evidence {
            total: 5,
            per_user_limit: 0,
            nodes: &[],
            requests: &[],
            samples: &[],
            windows: &[],
            ledger: &ledger,
            heal_ms: 10_000,
            sold_out_ms: None,
            demand_ended_ms: None,
            truncated: false,
            coordinator: Ok(()),
            bounds: BOUNDS,
            order_books: None,
            idempotency_ttl_ms: DAY_MS,
            clock_origin_unix_ms: 0,
        };
        assert_eq!(check(&evidence).into_iter().map(|v| v.kind).collect::<Vec<_>>(), [ViolationKind::Undersell]);
        evidence.demand_ended_ms = Some(20_000);
        assert!(check(&evidence).is_empty());
    }

    fn sample(
        at_ms: u64,
        remaining: u64,
        local: [u64; 3],
        epochs: [(u64, bool); 3],
        sellers: &[(&str, u64)],
    ) -> Sample {
        Sample {
            at_ms,
            leader: Some("c1".into()),
            nodes: Some(
                ["n1", "n2", "n3"]
                    .iter()
                    .zip(epochs)
                    .map(|(n, (epoch, live))| (n.to_string(), NodeView { epoch, live, worker_id: None }))
                    .collect(),
            ),
            local: ["n1", "n2", "n3"].iter().zip(local).map(|(n, l)| (n.to_string(), Some(l))).collect(),
            ledger: Some(LedgerFigures {
                total: 10,
                sold: 10 - remaining,
                remaining,
                released: 0,
                ..Default::default()
            }),
            sellers: Some(sellers.iter().map(|(s, u)| (s.to_string(), *u)).collect()),
        }
    }

    #[test]
    fn stock_only_a_cut_node_holds_is_a_stranded_allotment() {
        let cut = Window {
            id: 0,
            label: "link_to_redis_blackhole".into(),
            kind: FaultKind::Link {
                node: "n1".into(),
                to: crate::schedule::LinkTarget::Redis,
                fault: crate::schedule::LinkFault::Blackhole,
            },
            member: None,
            start_ms: 1_000,
            end_ms: Some(9_000),
            skipped: false,
        };
        let live = [(1, true); 3];
        // n1 holds 4 of the 6 left; the nodes that can sell hold 3.
        let samples: Vec<Sample> = (0..30).map(|i| sample(2_000 + i * 250, 6, [4, 2, 1], live, &[])).collect();
        let found = judge(10, &[], vec![], &samples, std::slice::from_ref(&cut));
        assert!(found.contains(&ViolationKind::StrandedAllotment), "{found:?}");
        // Shorter than the bound: fine.
        let samples: Vec<Sample> = (0..10).map(|i| sample(2_000 + i * 250, 6, [4, 2, 1], live, &[])).collect();
        let found = judge(10, &[], vec![], &samples, std::slice::from_ref(&cut));
        assert!(!found.contains(&ViolationKind::StrandedAllotment), "{found:?}");
        // The able nodes hold what is left: fine however long.
        let samples: Vec<Sample> = (0..30).map(|i| sample(2_000 + i * 250, 6, [4, 3, 3], live, &[])).collect();
        let found = judge(10, &[], vec![], &samples, std::slice::from_ref(&cut));
        assert!(!found.contains(&ViolationKind::StrandedAllotment), "{found:?}");
    }

    /// Seed 20261131 (issue 23): while expired orders gave units back every sample and buyers
    /// took each at once, the ledger's remaining stayed above what the nodes held for 6.7 s
    /// without a unit waiting more than half a second. Units released within the allowance are
    /// in flight; units that sit unheld past it are stranded however they came back.
    #[test]
    fn units_released_just_now_are_in_flight_not_stranded() {
        let live = [(1, true); 3];
        let releasing = |i: u64, remaining: u64, local: [u64; 3], released: u64| {
            let mut sample = sample(2_000 + i * 250, remaining, local, live, &[]);
            if let Some(ledger) = &mut sample.ledger {
                ledger.released = released;
            }
            sample
        };
        // 5 units come back every sample and are sold the next; the nodes never hold them yet.
        let burst: Vec<Sample> = (0..30).map(|i| releasing(i, 5, [0, 0, 0], 5 * i)).collect();
        let found = judge(10, &[], vec![], &burst, &[]);
        assert!(!found.contains(&ViolationKind::StrandedAllotment), "{found:?}");
        // The same level with no release behind it: units left unheld for 7 s.
        let stuck: Vec<Sample> = (0..30).map(|i| releasing(i, 5, [0, 0, 0], 40)).collect();
        let found = judge(10, &[], vec![], &stuck, &[]);
        assert!(found.contains(&ViolationKind::StrandedAllotment), "{found:?}");
        // Released once and never granted: stranded once the allowance has passed.
        let once: Vec<Sample> = (0..30).map(|i| releasing(i, 5, [0, 0, 0], if i == 0 { 35 } else { 40 })).collect();
        let found = judge(10, &[], vec![], &once, &[]);
        assert!(found.contains(&ViolationKind::StrandedAllotment), "{found:?}");
    }

    /// Unix ms at the history clock's 0 in the reuse tests.
    const ORIGIN: u64 = 1_800_000_000_000;

    /// A short idempotency TTL, as some schedules run.
    const TTL_MS: u64 = 12_000;

    /// `requests` and `orders` (sold at the given clock ms) under a TTL of `TTL_MS`, with a
    /// per-user limit of 2 and three units.
    fn judge_ttl(requests: &[Request], sales: &[(u64, &str, &str, &str)]) -> Vec<ViolationKind> {
        let orders: Vec<OrderEvent> = sales
            .iter()
            .enumerate()
            .map(|(at, (sold_ms, key, user, id))| OrderEvent {
                at_ms: ORIGIN + sold_ms,
                ..order(at as u64 + 1, key, user, id, "n1")
            })
            .collect();
        let ledger = FinalLedger {
            status: Ok(status(3, &orders)),
            orders: Ok(orders),
            releases: Ok(vec![]),
            sellers: None,
            stripes: vec![],
            at_ms: 100_000,
        };
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let evidence = Evidence {
            total: 3,
            per_user_limit: 2,
            nodes: &nodes,
            requests,
            samples: &[],
            windows: &[],
            ledger: &ledger,
            heal_ms: 10_000,
            sold_out_ms: Some(20_000),
            demand_ended_ms: None,
            truncated: false,
            coordinator: Ok(()),
            bounds: BOUNDS,
            order_books: None,
            idempotency_ttl_ms: TTL_MS,
            clock_origin_unix_ms: ORIGIN,
        };
        check(&evidence).into_iter().map(|v| v.kind).collect()
    }

    fn reused(mut request: Request) -> Request {
        request.reuse = 1;
        request
    }

    #[test]
    fn a_key_reused_after_its_ttl_may_buy_again_under_a_new_order_id() {
        let mut retry = request("k1", "u1", "n2", "purchased", Some("o1"), true, 3_000);
        retry.attempt = 1;
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 1_000),
            retry,
            reused(request("k1", "u1", "n3", "purchased", Some("o2"), false, 17_000)),
        ];
        let sales = [(1_000, "k1", "u1", "o1"), (17_000, "k1", "u1", "o2")];
        assert_eq!(judge_ttl(&requests, &sales), []);
        // A reuse a node answers from its memory of the first sale is a stale replay, judged by
        // that rule alone: it holds no second unit (with another key u1 is at its limit of 2, not
        // past it), and a fresh answer in the same use is the use's decision, no conflict.
        let mut stale = requests.clone();
        stale[2] = reused(request("k1", "u1", "n3", "purchased", Some("o1"), true, 17_000));
        assert_eq!(judge_ttl(&stale, &sales[..1]), [ViolationKind::StaleReplay]);
        let mut stale_and_more = stale.to_vec();
        stale_and_more.push(request("k2", "u1", "n1", "purchased", Some("o3"), false, 2_000));
        let found = judge_ttl(&stale_and_more, &[(1_000, "k1", "u1", "o1"), (2_000, "k2", "u1", "o3")]);
        assert_eq!(found, [ViolationKind::StaleReplay]);
        let mut then_refused = stale.to_vec();
        let mut refusal = reused(request("k1", "u1", "n1", "user_limit", None, false, 17_100));
        refusal.attempt = 1;
        then_refused.push(refusal);
        assert_eq!(judge_ttl(&then_refused, &sales[..1]), [ViolationKind::StaleReplay]);
        // Three fresh purchases by one user under a limit of 2 are caught, reuse or not.
        let mut three = requests.to_vec();
        three.push(request("k2", "u1", "n1", "purchased", Some("o3"), false, 2_000));
        let sales3 = [(1_000, "k1", "u1", "o1"), (2_000, "k2", "u1", "o3"), (17_000, "k1", "u1", "o2")];
        assert!(judge_ttl(&three, &sales3).contains(&ViolationKind::UserLimitExceeded));
        // Refused as a new purchase after the TTL: a decision of its own use.
        let mut refused = requests.clone();
        refused[2] = reused(request("k1", "u1", "n3", "user_limit", None, false, 17_000));
        assert_eq!(judge_ttl(&refused, &sales[..1]), []);
    }

    #[test]
    fn a_key_sold_again_within_its_ttl_or_a_retry_answered_with_a_new_id_is_caught() {
        // The ledger sold the key twice 5 s apart, inside the 12 s TTL.
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 1_000),
            reused(request("k1", "u1", "n3", "purchased", Some("o2"), false, 17_000)),
        ];
        let early = [(1_000, "k1", "u1", "o1"), (6_000, "k1", "u1", "o2")];
        assert!(judge_ttl(&requests, &early).contains(&ViolationKind::KeySoldTwice));
        // A retry within the TTL answered with a sale of its own: the ledger sold the key twice.
        let mut retry = request("k1", "u1", "n2", "purchased", Some("o2"), false, 6_000);
        retry.attempt = 1;
        let requests = [request("k1", "u1", "n1", "purchased", Some("o1"), false, 1_000), retry];
        assert_eq!(judge_ttl(&requests, &early), [ViolationKind::KeySoldTwice]);
        // A retry within the TTL answered with an id the ledger never sold.
        let found = judge_ttl(&requests, &early[..1]);
        assert_eq!(found, [ViolationKind::IdempotencyConflict, ViolationKind::LostReceipt], "{found:?}");
        // A retry within the TTL answered with another decision.
        let mut refused = request("k1", "u1", "n2", "user_limit", None, false, 6_000);
        refused.attempt = 1;
        let requests = [request("k1", "u1", "n1", "purchased", Some("o1"), false, 1_000), refused];
        assert_eq!(judge_ttl(&requests, &early[..1]), [ViolationKind::IdempotencyConflict]);
    }

    #[test]
    fn a_reused_keys_second_order_must_be_stored_too() {
        let requests = [
            request("k1", "u1", "n1", "purchased", Some("o1"), false, 10),
            reused(request("k1", "u1", "n2", "purchased", Some("o2"), false, 14_000)),
        ];
        let books = |second: Option<StoredOrder>| OrderBooks {
            settled: Ok(()),
            receipts: [("o1".to_string(), stored("k1")), ("o2".to_string(), second)].into(),
            releases: Ok((vec![], 0)),
            given_back: Ok(0),
            reconcile: Ok(vec![]),
        };
        let orders = vec![
            OrderEvent { at_ms: ORIGIN + 10, ..order(1, "k1", "u1", "o1", "n1") },
            OrderEvent { at_ms: ORIGIN + 14_000, ..order(2, "k1", "u1", "o2", "n2") },
        ];
        let ledger = FinalLedger {
            status: Ok(status(2, &orders)),
            orders: Ok(orders),
            releases: Ok(vec![]),
            sellers: None,
            stripes: vec![],
            at_ms: 100_000,
        };
        let judge = |books: &OrderBooks| {
            let evidence = Evidence {
                total: 2,
                per_user_limit: 2,
                nodes: &[],
                requests: &requests,
                samples: &[],
                windows: &[],
                ledger: &ledger,
                heal_ms: 10_000,
                sold_out_ms: Some(20_000),
                demand_ended_ms: None,
                truncated: false,
                coordinator: Ok(()),
                bounds: BOUNDS,
                order_books: Some(books),
                idempotency_ttl_ms: TTL_MS,
                clock_origin_unix_ms: ORIGIN,
            };
            check(&evidence).into_iter().map(|v| v.kind).collect::<Vec<_>>()
        };
        assert_eq!(judge(&books(stored("k1"))), []);
        assert_eq!(judge(&books(None)), [ViolationKind::SaleWithoutOrder]);
    }

    #[test]
    fn a_seller_growing_after_its_epoch_ended_is_caught() {
        let samples = [
            sample(1_000, 5, [1, 1, 1], [(1, true), (1, true), (1, true)], &[("n1#1", 3)]),
            sample(1_250, 5, [1, 1, 1], [(2, false), (1, true), (1, true)], &[("n1#1", 3)]),
            sample(1_500, 4, [1, 1, 1], [(3, true), (1, true), (1, true)], &[("n1#1", 4)]),
        ];
        let found = judge(10, &[], vec![], &samples, &[]);
        assert!(found.contains(&ViolationKind::SoldUnderEndedEpoch), "{found:?}");
        let calm = [
            sample(1_000, 5, [1, 1, 1], [(1, true), (1, true), (1, true)], &[("n1#1", 3)]),
            sample(1_250, 5, [1, 1, 1], [(2, false), (1, true), (1, true)], &[("n1#1", 3)]),
            sample(1_500, 4, [1, 1, 1], [(3, true), (1, true), (1, true)], &[("n1#1", 3), ("n1#3", 1)]),
        ];
        let found = judge(10, &[], vec![], &calm, &[]);
        assert!(!found.contains(&ViolationKind::SoldUnderEndedEpoch), "{found:?}");
    }

    /// A striped SKU of `total` units, each stripe read as (sold, remaining, transferred_out,
    /// transferred_in): its total is sold + remaining, one unit per order, each to a user of
    /// its own (a buyer buys on one stripe).
    fn striped_ledger(stripes: &[(u64, u64, u64, u64)]) -> FinalLedger {
        let sku = ledger::SkuId::new("s").unwrap();
        let (mut orders, mut books) = (Vec::new(), Vec::new());
        for (index, &(sold, remaining, out, into)) in (0u32..).zip(stripes) {
            let mine: Vec<OrderEvent> = (1..=sold)
                .map(|seq| {
                    let (key, user) = (format!("k{index}-{seq}"), format!("u{index}-{seq}"));
                    order(seq, &key, &user, &format!("s-{index}.{seq}"), "n1")
                })
                .collect();
            let status = SkuStatus { transferred_out: out, transferred_in: into, ..status(sold + remaining, &mine) };
            let ledger = sku.stripe(index).to_string();
            books.push(StripeBooks { ledger, status, streamed: Some(sold), by_seller: None });
            orders.extend(mine);
        }
        let statuses: Vec<SkuStatus> = books.iter().map(|b| b.status.clone()).collect();
        FinalLedger {
            status: Ok(stripes::combine(&statuses).unwrap()),
            orders: Ok(orders),
            releases: Ok(vec![]),
            sellers: None,
            stripes: books,
            at_ms: 100_000,
        }
    }

    fn judge_striped(total: u64, stripes: &[(u64, u64, u64, u64)]) -> Vec<ViolationKind> {
        judge_ledger(total, &[], &striped_ledger(stripes), &[], &[])
    }

    #[test]
    fn a_striped_sku_whose_stripes_add_up_passes() {
        // 9 units on 3 stripes of 3; stripe 2 gave one to stripe 0, which sold it.
        assert_eq!(judge_striped(9, &[(4, 0, 0, 1), (2, 1, 0, 0), (1, 1, 1, 0)]), []);
    }

    #[test]
    fn units_a_transfer_took_and_never_gave_are_lost() {
        // Stripe 2 gave 2 units that reached no stripe: the next leader did not finish it.
        let found = judge_striped(9, &[(3, 0, 0, 0), (3, 0, 0, 0), (1, 0, 2, 0)]);
        assert_eq!(found, [ViolationKind::TransferLostOrDoubled]);
    }

    #[test]
    fn a_transfer_applied_twice_is_caught() {
        // Stripe 2 gave 1 unit, stripe 0 took in 2.
        let found = judge_striped(9, &[(3, 2, 0, 2), (3, 0, 0, 0), (1, 1, 1, 0)]);
        assert_eq!(found, [ViolationKind::TransferLostOrDoubled]);
    }

    #[test]
    fn an_oversell_across_stripes_each_balanced_is_caught() {
        // 6 units on 2 stripes of 3, each stripe's books balanced, but a doubled transfer let
        // them sell 7 between them.
        let found = judge_striped(6, &[(2, 0, 1, 0), (5, 0, 0, 2)]);
        assert_eq!(
            found,
            [ViolationKind::Oversell, ViolationKind::Oversell, ViolationKind::TransferLostOrDoubled],
            "by the ledger and by the order stream, and the transfer that allowed it"
        );
    }

    #[test]
    fn a_stripe_whose_own_books_do_not_balance_is_caught_though_the_sum_does() {
        let mut ledger = striped_ledger(&[(3, 0, 0, 0), (3, 0, 0, 0)]);
        // Stripe 1's stream is one short and stripe 0's one long: the sum hides it.
        ledger.stripes[0].streamed = Some(4);
        ledger.stripes[1].streamed = Some(2);
        assert_eq!(judge_ledger(6, &[], &ledger, &[], &[]), [ViolationKind::BooksUnbalanced]);
    }

    #[test]
    fn a_sample_whose_stripes_do_not_add_up_to_the_sku_is_caught() {
        let ledger = striped_ledger(&[(3, 0, 0, 0), (3, 0, 0, 0)]);
        let figures = |total, transferred_out, transferred_in| LedgerFigures {
            total,
            sold: 4,
            remaining: total - 4,
            released: 0,
            transferred_out,
            transferred_in,
        };
        let mut samples = vec![sample(1_000, 0, [0, 0, 0], [(1, true); 3], &[])];
        // 5 units in the stripes and 1 between them: whole. Then 5 in the stripes and none
        // between them: one lost.
        samples[0].ledger = Some(figures(5, 1, 0));
        assert_eq!(judge_ledger(6, &[], &ledger, &samples, &[]), []);
        samples[0].ledger = Some(figures(5, 1, 1));
        assert_eq!(judge_ledger(6, &[], &ledger, &samples, &[]), [ViolationKind::TransferLostOrDoubled]);
    }
}
