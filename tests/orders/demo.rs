//! The order-lifecycle demos through the binary, as the README shows them: `--scenario orders`
//! on a private Redis as the ledger and a private PostgreSQL as the order store, and
//! `--scenario payments` with nothing set up.

use testkit::postgres::PostgresServer;
use testkit::redis::RedisServer;

/// Goal: the whole order lifecycle (sale, payments, expiries, releases, resales, late payments,
/// reconciliation) holds on Redis and PostgreSQL, not only on the embedded ledger and SQLite.
/// Method: run the demo binary with `--redis` and `--postgres` and read its JSON report.
#[test]
fn the_orders_demo_reconciles_on_redis_and_postgresql() {
    let redis = RedisServer::start().expect("a private redis-server");
    let postgres = PostgresServer::start().expect("a private PostgreSQL");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["demo", "--scenario", "orders", "--json", "--redis", &redis.url(), "--postgres", &postgres.url()])
        .output()
        .expect("seckill demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON report");
    assert_eq!((report["ledger"].as_str(), report["store"].as_str()), (Some("redis"), Some("postgresql")));
    assert_eq!(report["reconciled"], true, "{report}");
    assert_eq!((report["oversell"].as_u64(), report["undersell"].as_u64()), (Some(0), Some(0)), "{report}");
    let (expired, released, resold) =
        (report["expired"].as_u64().unwrap(), report["released"].as_u64().unwrap(), report["resold"].as_u64().unwrap());
    assert!(expired > 0 && released == expired && resold >= released, "{report}");
    assert_eq!(report["paid"].as_u64(), report["stock"].as_u64(), "every unit paid for once in the end: {report}");
    assert_eq!(report["late_payments"], 5, "{report}");
}

/// Goal: `seckill demo --scenario payments` shows, with nothing set up, that no payment is lost
/// when the provider misbehaves: every fault class it claims actually occurs in the run, every
/// payment the sandbox holds as succeeded is a paid order or a refund, and the books reconcile.
/// Method: run the demo binary with `--json` (embedded ledger, SQLite, the sandbox in process)
/// and read its report.
#[test]
fn the_payments_demo_loses_no_payment_under_provider_faults() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["demo", "--scenario", "payments", "--json"])
        .output()
        .expect("seckill demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON report");
    let field = |name: &str| report[name].as_u64().unwrap_or_else(|| panic!("{name} is a count: {report}"));
    assert_eq!((report["ledger"].as_str(), report["store"].as_str()), (Some("embedded"), Some("sqlite")));
    assert_eq!(field("lost_payments"), 0, "{report}");
    assert_eq!(report["reconcile_ok"], true, "{report}");
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
    for happened in ["sold", "paid", "payments_recorded", "early_callbacks", "found_by_query", "expired", "resold"] {
        assert!(field(happened) > 0, "{happened}: {report}");
    }
    assert!(field("refunds_owed") > 0 && field("refunds_done") == field("refunds_owed"), "{report}");
    assert!(field("paid_after_expiry") > 0, "a late payer was refunded: {report}");
    assert!(field("paid") + field("pending_at_end") <= field("stock"), "{report}");
    let provider = &report["provider"];
    for fault in
        ["callbacks_duplicated", "callbacks_dropped", "declined", "closed", "unavailable_answers", "lost_answers"]
    {
        assert!(provider[fault].as_u64().is_some_and(|n| n > 0), "the provider's {fault}: {report}");
    }
}
