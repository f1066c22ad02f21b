//! The sweeper on real Redis and PostgreSQL: unpaid orders expire and their units go back once,
//! whether the sweepers share the lock or not; paid ones keep theirs; released units sell again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ledger::{RedisConnection, RedisLedgerConfig, ReleaseOutcome, SkuId};
use orders::sweeper::{Sweeper, SweeperConfig};
use orders::{OrderState, PaymentOutcome};
use safeguards::{DistributedLock, LocalLockBackend, LockBackend, RedisLockBackend};

use crate::harness::*;

/// A sweeper on `env` with short rounds, not yet running.
fn sweeper_on(env: &Env, backend: Arc<dyn LockBackend>) -> Sweeper {
    Sweeper::new(
        env.ledger.clone(),
        env.store.clone(),
        DistributedLock::new(backend).expect("lock"),
        SweeperConfig { every: Duration::from_millis(100), batch: 50, lock_ttl: Duration::from_secs(5) },
    )
}

fn sweeper(env: &Env, backend: Arc<dyn LockBackend>) -> Running {
    let sweeper = sweeper_on(env, backend);
    Running::spawn(|stop| sweeper.run(stop))
}

fn redis_lock_backend(env: &Env) -> Arc<dyn LockBackend> {
    let connection = RedisConnection::open(&RedisLedgerConfig::new(env.redis.url())).expect("a Redis connection");
    Arc::new(RedisLockBackend::new(connection, PREFIX, Duration::from_millis(500)))
}

/// Waits until no order of `sku` is pending or ended-but-unreleased.
async fn wait_settled(env: &Env, sku: &SkuId) {
    let store = env.store.clone();
    let sku = sku.clone();
    eventually(SETTLE, "every order paid or expired and released", || {
        let (store, sku) = (store.clone(), sku.clone());
        async move {
            let counts = store.counts(sku.as_str()).await.map_err(|e| e.to_string())?;
            match (counts.units_pending, counts.orders_unreleased) {
                (0, 0) => Ok(()),
                (pending, unreleased) => Err(format!("{pending} pending, {unreleased} unreleased")),
            }
        }
    })
    .await;
}

/// Checks, for settled orders of `sales`: those in `paying` are paid (or paid after expiry if
/// the payment lost the race to the deadline), the rest expired; the ledger released exactly
/// the units of the orders that ended without a valid payment, each once, and nothing else.
async fn assert_released_once(env: &Env, sku: &SkuId, sales: &[Sale], paying: &BTreeSet<String>) -> usize {
    let mut given_back = BTreeSet::new();
    for sale in sales {
        let order = env.store.get(&sale.order_id).await.expect("get").expect("order");
        if paying.contains(&sale.order_id) {
            assert!(
                matches!(order.state, OrderState::Paid | OrderState::PaidAfterExpiry),
                "{}: {:?}",
                sale.order_id,
                order.state
            );
        } else {
            assert_eq!(order.state, OrderState::Expired, "{}", sale.order_id);
        }
        if order.state.gives_units_back() {
            assert!(order.released_at_ms.is_some(), "{} noted released", sale.order_id);
            given_back.insert(sale.order_id.clone());
        } else {
            assert_eq!(order.released_at_ms, None, "{} is paid and keeps its unit", sale.order_id);
        }
    }
    let log = env.ledger.releases(sku, 0, 100_000).await.expect("release log");
    let mut logged: BTreeMap<String, u32> = BTreeMap::new();
    for release in &log {
        *logged.entry(release.order_id.0.clone()).or_default() += 1;
    }
    let twice: Vec<_> = logged.iter().filter(|(_, times)| **times > 1).collect();
    assert!(twice.is_empty(), "released more than once: {twice:?}");
    assert_eq!(logged.keys().cloned().collect::<BTreeSet<_>>(), given_back, "the release log is the ended orders");
    let status = env.ledger.status(sku).await.expect("status");
    assert_eq!(status.released, given_back.len() as u64, "released units == units of expired orders");
    given_back.len()
}

/// Sells `count`, waits for their orders, then pays every other one concurrently with `sweepers`
/// running; returns the sales and the orders paid.
async fn sell_and_pay_half(
    env: &Env,
    sku: &SkuId,
    terms: &ledger::SkuTerms,
    count: usize,
) -> (Vec<Sale>, BTreeSet<String>) {
    let sales = sell(&*env.ledger, sku, "buyer", count).await;
    assert_eq!(sales.len(), count);
    assert_one_order_per_sale(env, sku, terms, &sales).await;
    let paying: BTreeSet<String> = sales.iter().step_by(2).map(|sale| sale.order_id.clone()).collect();
    let payments = paying.iter().map(|id| {
        let store = env.store.clone();
        let id = id.clone();
        tokio::spawn(async move { pay(&*store, &id, &format!("ref-{id}")).await })
    });
    for payment in futures_join(payments.collect()).await {
        assert!(matches!(payment, PaymentOutcome::Paid | PaymentOutcome::PaidAfterExpiry), "{payment:?}");
    }
    (sales, paying)
}

async fn futures_join<T: Send + 'static>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.expect("task"));
    }
    out
}

/// Goal: with two sweepers on one Redis lock, each expired order is released exactly once and
/// paid ones never; a payment after expiry is recorded as such and its unit released once;
/// method: 200 orders with a 1 s pay timeout, half paid while both sweepers run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sweepers_on_one_lock_release_each_expired_order_once() {
    let env = Env::start().await;
    let terms = terms(200, 700, 1);
    let sku = env.create("sku-s", &terms).await;
    let consumer = env.consumer(&sku, &terms, "c1", fast_consumer());
    let backend = redis_lock_backend(&env);
    let sweepers = [sweeper(&env, backend.clone()), sweeper(&env, backend)];
    let (sales, paying) = sell_and_pay_half(&env, &sku, &terms, 200).await;
    wait_settled(&env, &sku).await;
    let expired = assert_released_once(&env, &sku, &sales, &paying).await;
    assert!(expired >= 100, "every unpaid order expired: {expired}");
    assert_reconciled(&env, &sku).await;

    // A payment for an expired order: recorded as paid after expiry, its unit not released again.
    let late = sales.iter().find(|sale| !paying.contains(&sale.order_id)).expect("an expired order");
    assert_eq!(pay(&*env.store, &late.order_id, "late-ref").await, PaymentOutcome::PaidAfterExpiry);
    let order = env.store.get(&late.order_id).await.expect("get").expect("order");
    assert_eq!(order.state, OrderState::PaidAfterExpiry);
    assert_eq!(order.payment_ref.as_deref(), Some("late-ref"));
    let released = env.ledger.status(&sku).await.expect("status").released;
    // Give the sweepers a few rounds to (wrongly) release it again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(env.ledger.status(&sku).await.expect("status").released, released);
    let log = env.ledger.releases(&sku, 0, 100_000).await.expect("release log");
    assert_eq!(log.iter().filter(|release| release.order_id.0 == late.order_id).count(), 1);
    for sweeper in sweepers {
        sweeper.stop().await;
    }
    consumer.stop().await;
    let report = assert_reconciled(&env, &sku).await;
    assert_eq!(report.paid_after_expiry, 1 + (expired as u64 - 100));
}

/// Goal: with the lock out of the picture (each sweeper on its own in-process lock, so both
/// sweep at once), the ledger's release marker alone prevents a double release; method: as
/// above, and then every expired order is released once more by hand: the ledger refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_lock_the_ledger_alone_prevents_a_double_release() {
    let env = Env::start().await;
    let terms = terms(200, 700, 1);
    let sku = env.create("sku-n", &terms).await;
    let consumer = env.consumer(&sku, &terms, "c1", fast_consumer());
    let sweepers = [sweeper(&env, Arc::new(LocalLockBackend::new())), sweeper(&env, Arc::new(LocalLockBackend::new()))];
    let (sales, paying) = sell_and_pay_half(&env, &sku, &terms, 200).await;
    wait_settled(&env, &sku).await;
    let expired = assert_released_once(&env, &sku, &sales, &paying).await;
    assert!(expired >= 100);
    for sweeper in sweepers {
        sweeper.stop().await;
    }
    consumer.stop().await;
    let before = env.ledger.status(&sku).await.expect("status");
    // Every ended order once more, straight to the ledger: its marker refuses each. (A paid
    // order's sale is real, so the ledger would release it: the store keeps paid orders out of
    // the release path, not the ledger.)
    for sale in &sales {
        let order = env.store.get(&sale.order_id).await.expect("get").expect("order");
        if order.state.gives_units_back() {
            let outcome = orders::sweeper::release(&*env.ledger, &*env.store, &order).await.expect("release");
            assert_eq!(outcome, ReleaseOutcome::AlreadyReleased, "{}", sale.order_id);
        }
    }
    let after = env.ledger.status(&sku).await.expect("status");
    assert_eq!((after.released, after.remaining), (before.released, before.remaining));
    assert_reconciled(&env, &sku).await;
}

/// Goal: released units sell again and the books still add up; method: 60 orders with a 1 s
/// pay timeout, 20 paid; the 40 expired units show up in `remaining`, new buyers buy exactly
/// those, half of them pay: ledger sold == paid + pending units, reconcile clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn released_units_sell_again() {
    let env = Env::start().await;
    let terms = terms(60, 300, 1);
    let sku = env.create("sku-r", &terms).await;
    let consumer = env.consumer(&sku, &terms, "c1", fast_consumer());
    let sales = sell(&*env.ledger, &sku, "first", 60).await;
    assert_eq!(sales.len(), 60);
    assert_eq!(env.ledger.status(&sku).await.expect("status").remaining, 0, "sold out");
    assert!(sell(&*env.ledger, &sku, "too-late", 5).await.is_empty(), "sold out means sold out");
    assert_one_order_per_sale(&env, &sku, &terms, &sales).await;
    let paying: BTreeSet<String> = sales.iter().take(20).map(|sale| sale.order_id.clone()).collect();
    for id in &paying {
        assert_eq!(pay(&*env.store, id, &format!("ref-{id}")).await, PaymentOutcome::Paid);
    }
    let sweeper = sweeper(&env, Arc::new(LocalLockBackend::new()));
    wait_settled(&env, &sku).await;
    sweeper.stop().await;
    let status = env.ledger.status(&sku).await.expect("status");
    assert_eq!((status.released, status.remaining, status.sold), (40, 40, 20));

    let resold = sell(&*env.ledger, &sku, "second", 50).await;
    assert_eq!(resold.len(), 40, "exactly the released units sell again");
    assert_eq!(env.ledger.status(&sku).await.expect("status").remaining, 0);
    let mut all = sales.clone();
    all.extend(resold.iter().cloned());
    assert_one_order_per_sale(&env, &sku, &terms, &all).await;
    for sale in resold.iter().take(20) {
        assert_eq!(pay(&*env.store, &sale.order_id, &format!("ref-{}", sale.order_id)).await, PaymentOutcome::Paid);
    }
    consumer.stop().await;
    let status = env.ledger.status(&sku).await.expect("status");
    let counts = env.store.counts(sku.as_str()).await.expect("counts");
    assert_eq!((counts.units_paid, counts.units_pending), (40, 20));
    assert_eq!(status.sold, counts.units_paid + counts.units_pending, "ledger sold == paid + pending");
    assert_eq!(status.sold + status.released, 100, "60 sold, 40 released and sold again");
    assert_reconciled(&env, &sku).await;
}

/// Goal: a release the ledger cannot do holds back no other order, of its SKU or another
/// (issue 23: one failing release aborted the whole round for every SKU). Method: an expired
/// order of a SKU the ledger does not hold (as after a lost SKU or a master that is down), due
/// before three expired orders of a live SKU; one sweeper round must release the three and count
/// the other as failed, to be retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_the_ledger_cannot_do_holds_back_no_other() {
    let env = Env::start().await;
    let terms = terms(10, 300, 1);
    let sku = env.create("sku-live", &terms).await;
    let consumer = env.consumer(&sku, &terms, "c1", fast_consumer());
    let now = orders::unix_ms();
    let ghost = orders::NewOrder {
        id: "ghost-1".into(),
        sku: "sku-gone".into(),
        user: "ann".into(),
        qty: 1,
        node: "n1".into(),
        idempotency_key: "ghost-key".into(),
        stream_seq: 1,
        unit_price: 300,
        currency: terms.currency.clone(),
        created_at_ms: now - 60_000,
        pay_deadline_ms: now - 30_000,
    };
    assert_eq!(env.store.insert_batch(std::slice::from_ref(&ghost)).await.expect("insert"), 1);
    let sales = sell(&*env.ledger, &sku, "live", 3).await;
    assert_one_order_per_sale(&env, &sku, &terms, &sales).await;
    consumer.stop().await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    let round = sweeper_on(&env, Arc::new(LocalLockBackend::new()))
        .round()
        .await
        .expect("a round that meets a failing release still completes");
    assert_eq!((round.expired, round.released, round.failed), (4, 3, 1), "{round:?}");
    assert_eq!(env.ledger.status(&sku).await.expect("status").released, 3, "the live SKU's units went back");
    let ghost = env.store.get("ghost-1").await.expect("get").expect("the ghost order");
    assert_eq!((ghost.state, ghost.released_at_ms), (OrderState::Expired, None), "left for the next round");
}

/// Goal: a key reused after its idempotency TTL is a new sale that becomes its own order, and
/// both orders' units come back when they expire (issue 23: the store's `UNIQUE (sku,
/// idempotency_key)` skipped the second order, the consumer acknowledged it anyway, and the
/// first order's release was refused once the key's record had been overwritten). Method: a
/// ledger handle with a 1 s idempotency TTL sells key k to one buyer twice, 1.6 s apart; both
/// orders must be stored and, unpaid past their 1 s pay timeout, both released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_reused_after_its_ttl_becomes_its_own_order_and_both_come_back() {
    let env = Env::start().await;
    let mut short = RedisLedgerConfig::new(env.redis.url());
    short.idempotency_ttl = Duration::from_secs(1);
    let short: Arc<dyn ledger::Ledger> = Arc::new(ledger::RedisLedger::connect(short).expect("a Redis ledger"));
    let terms = terms(2, 300, 1);
    let sku = env.create("sku-reuse", &terms).await;
    let consumer = env.consumer(&sku, &terms, "c1", fast_consumer());
    let first = sell(&*short, &sku, "same", 1).await;
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let second = sell(&*short, &sku, "same", 1).await;
    assert_eq!((first.len(), second.len()), (1, 1));
    assert_eq!(first[0].key, second[0].key, "one key, used twice");
    assert_ne!(first[0].order_id, second[0].order_id, "two sales, two order ids");
    let both = [first[0].clone(), second[0].clone()];
    assert_one_order_per_sale(&env, &sku, &terms, &both).await;
    let sweeper = sweeper(&env, Arc::new(LocalLockBackend::new()));
    wait_settled(&env, &sku).await;
    sweeper.stop().await;
    consumer.stop().await;
    assert_released_once(&env, &sku, &both, &BTreeSet::new()).await;
    let status = env.ledger.status(&sku).await.expect("status");
    assert_eq!((status.sold, status.remaining, status.released), (0, 2, 2));
    assert_reconciled(&env, &sku).await;
}

/// Goal: an order the ledger refuses to release (it has no record of that sale) is marked with
/// the reason once and leaves the work queue, so any number of them hold back no other release
/// (issue 23: 500 such orders, oldest first behind a LIMIT, blocked every release for good).
/// Method: 60 expired orders the ledger never sold, due before 3 real ones, with a sweeper batch
/// of 50: the real ones are released within a few rounds, the 60 are marked refused with a
/// reason, and reconcile reports them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_the_ledger_refuses_are_marked_and_block_nothing() {
    let env = Env::start().await;
    let terms = terms(10, 300, 1);
    let sku = env.create("sku-refused", &terms).await;
    let consumer = env.consumer(&sku, &terms, "c1", fast_consumer());
    let now = orders::unix_ms();
    let never_sold: Vec<orders::NewOrder> = (0..60)
        .map(|at| orders::NewOrder {
            id: format!("never-sold-{at}"),
            sku: sku.to_string(),
            user: format!("ghost-{at}"),
            qty: 1,
            node: "n1".into(),
            idempotency_key: format!("ghost-key-{at}"),
            stream_seq: 1_000 + at,
            unit_price: 300,
            currency: terms.currency.clone(),
            created_at_ms: now - 60_000,
            pay_deadline_ms: now - 30_000,
        })
        .collect();
    assert_eq!(env.store.insert_batch(&never_sold).await.expect("insert"), 60);
    let sales = sell(&*env.ledger, &sku, "real", 3).await;
    assert_one_order_per_sale_among(&env, &sku, &sales).await;
    consumer.stop().await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let sweeper = sweeper_on(&env, Arc::new(LocalLockBackend::new()));
    for _ in 0..4 {
        sweeper.round().await.expect("round");
    }
    assert_eq!(env.ledger.status(&sku).await.expect("status").released, 3, "the real orders' units went back");
    for order in &never_sold {
        let stored = env.store.get(&order.id).await.expect("get").expect("order");
        assert_eq!(stored.released_at_ms, None, "{}", order.id);
        let reason = stored.release_refused.as_deref().unwrap_or_default();
        assert!(reason.contains("no record of this sale"), "{}: {reason:?}", order.id);
    }
    let counts = env.store.counts(sku.as_str()).await.expect("counts");
    assert_eq!((counts.orders_unreleased, counts.units_release_refused), (0, 60));
    let report = orders::reconcile::check(&*env.ledger, &*env.store, &sku).await.expect("reconcile");
    assert_eq!(report.release_refused, 60);
    assert!(!report.ok(), "refused releases are for an operator to see");
}

/// Waits until each of `sales` is an order (the store may hold others of `sku`).
async fn assert_one_order_per_sale_among(env: &Env, sku: &SkuId, sales: &[Sale]) {
    let store = env.store.clone();
    let ids: Vec<String> = sales.iter().map(|sale| sale.order_id.clone()).collect();
    eventually(SETTLE, &format!("the sales of {sku} become orders"), || {
        let (store, ids) = (store.clone(), ids.clone());
        async move {
            for id in &ids {
                if store.get(id).await.map_err(|e| e.to_string())?.is_none() {
                    return Err(format!("{id} not stored"));
                }
            }
            Ok(())
        }
    })
    .await;
}
