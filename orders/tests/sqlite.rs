//! The order store contract on SQLite: the whole suite in memory and in a WAL file, a reopened
//! file keeps its orders, and a database newer than this build is refused.

use std::sync::Arc;

use orders::store::suite;
use orders::{NewOrder, OrderState, OrderStore, SqliteStore, StoreError};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_passes_in_memory() {
    let store = SqliteStore::in_memory().await.expect("in-memory store");
    suite::run_all(Arc::new(store), "memory").await;
}

/// The suite on a WAL file, run twice under two tags: a store that already holds one run's
/// orders keeps every promise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_passes_on_a_file_twice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn OrderStore> = Arc::new(SqliteStore::open(dir.path().join("orders.db")).await.expect("open"));
    suite::run_all(store.clone(), "first").await;
    suite::run_all(store, "second").await;
}

/// Goal: orders survive closing and reopening, and reopening applies no migration twice.
#[tokio::test]
async fn a_reopened_file_keeps_its_orders() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("orders.db");
    let order = NewOrder {
        id: "o-1".into(),
        sku: "sku".into(),
        user: "u".into(),
        qty: 2,
        node: "n".into(),
        idempotency_key: "k".into(),
        stream_seq: 1,
        unit_price: 500,
        currency: "EUR".into(),
        created_at_ms: 1,
        pay_deadline_ms: 2,
    };
    {
        let store = SqliteStore::open(&path).await.expect("open");
        assert_eq!(store.insert_batch(std::slice::from_ref(&order)).await.expect("insert"), 1);
    }
    let store = SqliteStore::open(&path).await.expect("reopen");
    let stored = store.get("o-1").await.expect("get").expect("kept");
    assert_eq!((stored.new, stored.state), (order, OrderState::PendingPayment));
    let journal: String = rusqlite::Connection::open(&path)
        .expect("open raw")
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .expect("journal_mode");
    assert_eq!(journal, "wal");
}

/// Goal: a database migrated by a newer build is refused, naming both versions.
#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("orders.db");
    drop(SqliteStore::open(&path).await.expect("open"));
    rusqlite::Connection::open(&path)
        .expect("open raw")
        .execute("INSERT INTO schema_migrations (version) VALUES (99)", [])
        .expect("a newer build's migration");
    match SqliteStore::open(&path).await {
        Err(StoreError::Corrupt(message)) => {
            assert!(message.contains("99") && message.contains("version 6"), "names both versions: {message}")
        }
        Err(other) => panic!("a newer schema must be corrupt, got {other:?}"),
        Ok(_) => panic!("a newer schema must be refused"),
    }
}

/// Goal: a file made by the first schema keeps its orders and payments through migrations 2 and
/// 3 (both tables rebuilt; a late payment now owes its refund), and then takes a second order
/// under a stored key.
#[tokio::test]
async fn a_version_1_file_keeps_its_orders_through_the_identity_migration() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("orders.db");
    {
        let raw = rusqlite::Connection::open(&path).expect("open raw");
        raw.execute_batch(include_str!("../src/store/migrations/sqlite/0001_orders.sql")).expect("schema 1");
        raw.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY NOT NULL);
             INSERT INTO schema_migrations (version) VALUES (1);
             INSERT INTO orders (id, sku, user_id, qty, node, idempotency_key, stream_seq, unit_price, currency, \
                 state, created_at_ms, pay_deadline_ms, released_at_ms, updated_at_ms) \
             VALUES ('o-1', 'sku', 'u', 2, 'n', 'k', 1, 500, 'EUR', 'paid_after_expiry', 1, 2, 3, 3);
             INSERT INTO payments (reference, order_id, amount, currency, outcome, received_at_ms) \
             VALUES ('late', 'o-1', 1000, 'EUR', 'paid_after_expiry', 4);",
        )
        .expect("an order of schema 1");
    }
    let store = SqliteStore::open(&path).await.expect("migrate");
    let kept = store.get("o-1").await.expect("get").expect("kept");
    assert_eq!((kept.state, kept.released_at_ms, kept.release_refused), (OrderState::PaidAfterExpiry, Some(3), None));
    let late = store.payments_of("o-1").await.expect("payments");
    assert_eq!(late.len(), 1);
    assert_eq!((late[0].outcome.as_str(), late[0].refund), ("paid_after_expiry", Some(orders::RefundState::Owed)));
    let again = NewOrder {
        id: "o-2".into(),
        sku: "sku".into(),
        user: "u".into(),
        qty: 1,
        node: "n".into(),
        idempotency_key: "k".into(),
        stream_seq: 2,
        unit_price: 500,
        currency: "EUR".into(),
        created_at_ms: 10,
        pay_deadline_ms: 20,
    };
    assert_eq!(store.insert_batch(&[again]).await.expect("insert"), 1, "the key reused is a new order");
}

/// Goal: reconcile counts the money and names what does not add up: a paid order whose units
/// went back, and a second payment marked as settling an already paid order. Method: a real
/// sale on the embedded ledger, its order stored and paid twice (the second owes a refund, and
/// all is well), then the file is corrupted by hand in the two ways.
#[tokio::test]
async fn reconcile_counts_the_money() {
    use ledger::{
        CatalogueLedger, EmbeddedLedger, IdempotencyKey, LedgerReads, NodeId, Purchase, SalesLedger, Seller, SkuId,
        SkuTerms, UserId,
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("orders.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let ledger = EmbeddedLedger::default();
    let sku = SkuId::new("money").unwrap();
    let terms = SkuTerms { price: 500, currency: "EUR".into(), ..SkuTerms::new(3) };
    ledger.create_sku(&sku, &terms).await.expect("create");
    let buy = Purchase {
        key: IdempotencyKey::new("k1").unwrap(),
        user: UserId::new("ann").unwrap(),
        qty: 1,
        token: None,
        order_id: None,
    };
    ledger.confirm(&sku, &Seller::new(NodeId::new("n1").unwrap(), 0), &[buy]).await.expect("confirm");
    let event = ledger.orders(&sku, 0, 1).await.expect("events").remove(0);
    let order = NewOrder {
        id: event.order_id.0.clone(),
        sku: sku.to_string(),
        user: "ann".into(),
        qty: 1,
        node: "n1".into(),
        idempotency_key: "k1".into(),
        stream_seq: 1,
        unit_price: 500,
        currency: "EUR".into(),
        created_at_ms: event.at_ms,
        pay_deadline_ms: event.at_ms + 900_000,
    };
    assert_eq!(store.insert_batch(std::slice::from_ref(&order)).await.expect("insert"), 1);
    for reference in ["first", "second"] {
        let payment = orders::Payment {
            order_id: order.id.clone(),
            reference: reference.into(),
            amount: 500,
            currency: "EUR".into(),
            received_at_ms: event.at_ms + 1,
            source: orders::PaymentSource::Callback,
        };
        store.record_payment(&payment).await.expect("pay");
    }
    let report = orders::reconcile::check(&ledger, &store, &sku).await.expect("reconcile");
    assert!(report.ok(), "{}", orders::reconcile::table(std::slice::from_ref(&report)));
    assert_eq!((report.money.payments, report.money.settled, report.money.refunds_owed), (2, 1, 1));

    let raw = rusqlite::Connection::open(&path).expect("open raw");
    raw.execute("UPDATE orders SET released_at_ms = 1 WHERE state = 'paid'", []).expect("corrupt");
    raw.execute("UPDATE payments SET outcome = 'paid', refund = NULL WHERE reference = 'second'", []).expect("corrupt");
    let report = orders::reconcile::check(&ledger, &store, &sku).await.expect("reconcile");
    let problems = report.problems.join("\n");
    assert!(problems.contains("paid orders had their units given back"), "{problems}");
    assert!(problems.contains("an order is paid without its payment or twice"), "{problems}");
}
