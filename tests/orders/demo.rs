//! `seckill demo --scenario orders` on real servers, as the README shows it: the binary, a
//! private Redis as the ledger and a private PostgreSQL as the order store.

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
