use super::*;
use crate::monitor::{LedgerFigures, NodeView};
use crate::schedule::FaultKind;
use ledger::{IdempotencyKey, NodeId, OrderId, UserId};

fn request(key: &str, user: &str, node: &str, outcome: &str, order: Option<&str>, replayed: bool, at: u64) -> Request {
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
    assert_eq!(found, [ViolationKind::LostReceipt, ViolationKind::UserLimitExceeded, ViolationKind::DuplicateOrderId]);
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

fn sample(at_ms: u64, remaining: u64, local: [u64; 3], epochs: [(u64, bool); 3], sellers: &[(&str, u64)]) -> Sample {
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
        ledger: Some(LedgerFigures { total: 10, sold: 10 - remaining, remaining, released: 0, ..Default::default() }),
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
