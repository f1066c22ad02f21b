//! The order store contract on a real PostgreSQL (a private server from testkit, never one
//! already running): the whole suite twice on one database, committed orders surviving a fast
//! restart and a SIGKILL, a newer schema refused, and no password in a connection error.

use std::sync::Arc;

use orders::store::suite;
use orders::{NewOrder, OrderState, OrderStore, PostgresStore, StoreError};
use testkit::postgres::PostgresServer;

fn new_order(id: &str, seq: u64) -> NewOrder {
    NewOrder {
        id: id.into(),
        sku: "sku".into(),
        user: "u".into(),
        qty: 1,
        node: "n".into(),
        idempotency_key: format!("k-{seq}"),
        stream_seq: seq,
        unit_price: 500,
        currency: "EUR".into(),
        created_at_ms: 1,
        pay_deadline_ms: 2,
    }
}

/// The suite, run twice under two tags on one database: a store holding one run's orders keeps
/// every promise, and a second `connect` (migrations already applied) works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_passes_on_postgres_twice() {
    let server = PostgresServer::start().expect("private postgres");
    let store: Arc<dyn OrderStore> = Arc::new(PostgresStore::connect(&server.url()).await.expect("connect"));
    suite::run_all(store, "first").await;
    let again: Arc<dyn OrderStore> = Arc::new(PostgresStore::connect(&server.url()).await.expect("reconnect"));
    suite::run_all(again, "second").await;
}

/// Goal: a committed order survives a fast shutdown and a SIGKILL of every server process;
/// method: insert, restart, read; insert, kill, restart, read, through one store whose pool
/// replaces its broken connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_orders_survive_restart_and_kill() {
    let mut server = PostgresServer::start().expect("private postgres");
    let store = PostgresStore::connect(&server.url()).await.expect("connect");
    assert_eq!(store.insert_batch(&[new_order("before-stop", 1)]).await.expect("insert"), 1);
    server.restart().expect("restart");
    let read_back = |id: &'static str| {
        let store = store.clone();
        async move {
            // The pool may hand out a connection the restart closed; the failed call discards it.
            for _ in 0..3 {
                if let Ok(order) = store.get(id).await {
                    return order;
                }
            }
            panic!("the store did not recover after the restart")
        }
    };
    assert_eq!(read_back("before-stop").await.map(|o| o.state), Some(OrderState::PendingPayment));
    assert_eq!(store.insert_batch(&[new_order("before-kill", 2)]).await.expect("insert"), 1);
    server.kill();
    assert!(matches!(store.ping().await, Err(StoreError::Unavailable(_))), "a killed server is unavailable");
    server.restart().expect("restart after kill");
    assert_eq!(read_back("before-kill").await.map(|o| o.state), Some(OrderState::PendingPayment));
    assert_eq!(read_back("before-stop").await.map(|o| o.new), Some(new_order("before-stop", 1)));
}

/// Goal: a database migrated by a newer build is refused, naming both versions.
#[tokio::test]
async fn a_newer_schema_is_refused() {
    let server = PostgresServer::start().expect("private postgres");
    drop(PostgresStore::connect(&server.url()).await.expect("connect"));
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls).await.expect("raw");
    let driver = tokio::spawn(connection);
    client.execute("INSERT INTO schema_migrations (version) VALUES (99)", &[]).await.expect("a newer migration");
    drop(client);
    let _ = driver.await;
    match PostgresStore::connect(&server.url()).await {
        Err(StoreError::Corrupt(message)) => {
            assert!(message.contains("99") && message.contains("version 6"), "names both versions: {message}")
        }
        Err(other) => panic!("a newer schema must be corrupt, got {other:?}"),
        Ok(_) => panic!("a newer schema must be refused"),
    }
}

/// Goal: a connection error never shows the password; method: connect with a password to a
/// database that does not exist.
#[tokio::test]
async fn a_connection_error_hides_the_password() {
    let server = PostgresServer::start().expect("private postgres");
    let url = format!("postgres://{}:hunter2secret@127.0.0.1:{}/missing", testkit::postgres::SUPERUSER, server.port);
    let error = match PostgresStore::connect(&url).await {
        Err(error) => error.to_string(),
        Ok(_) => panic!("a missing database must fail"),
    };
    assert!(!error.contains("hunter2secret"), "the password leaked: {error}");
    assert!(error.contains("***"), "the URL is named, redacted: {error}");
}
