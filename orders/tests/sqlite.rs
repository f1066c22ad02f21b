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
            assert!(message.contains("99") && message.contains("version 3"), "names both versions: {message}")
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
