//! The sale itself: many buyers, several nodes, one real Redis; the stock is sold exactly.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use ledger::SkuId;
use seckill::cluster::Options;
use testkit::load::{self, LoadPlan};

use crate::harness::{cluster_config, start_cluster, RedisServer};

/// Goal: 64 concurrent buyers on one SKU across 3 nodes buy exactly the stock.
/// Method: 300 units, 6,000 purchase attempts from 64 closed-loop buyers round-robin over the
/// nodes; then compare what buyers were told with the ledger's books and order stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_buyers_across_three_nodes_buy_exactly_the_stock() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 3, "[[skus]]\nid = \"phone\"\ntotal = 300\nbuffer = \"20%\"", "");
    let running = start_cluster(&cluster, Options::default()).await;
    let plan = LoadPlan {
        targets: running.addrs(),
        sku: "phone".into(),
        purchases: 6_000,
        users: 6_000,
        concurrency: 64,
        retries_max: 5,
        retry_pause: Duration::from_millis(20),
        seed: 7,
        rate_per_s: None,
        bearer: None,
    };
    let report = load::run(plan).await.unwrap();
    let sku = SkuId::new("phone").unwrap();
    let status = running.ledger.status(&sku).await.unwrap();
    let orders = running.ledger.orders(&sku, 0, 10_000).await.unwrap();
    running.stop().await;

    assert_eq!(
        report.count("purchased"),
        300,
        "buyers were told 'purchased' exactly stock times: {:?}",
        report.outcomes
    );
    assert_eq!((status.sold, status.remaining), (300, 0));
    assert_eq!(status.sold_by_node.values().sum::<u64>(), 300, "per-node sold adds up to the stock");
    assert_eq!(status.sold_by_node.len(), 3, "every node sold: {:?}", status.sold_by_node);
    let keys: HashSet<_> = orders.iter().map(|o| o.key.as_str()).collect();
    assert_eq!((orders.len(), keys.len()), (300, 300), "one order event per sale and no key sold twice");
    let told: HashMap<&str, &str> = report.purchases.iter().map(|(k, o)| (k.as_str(), o.as_str())).collect();
    for order in &orders {
        assert_eq!(
            told.get(order.key.as_str()),
            Some(&order.order_id.0.as_str()),
            "every sale was reported to its buyer"
        );
    }
}

/// Goal: the per-user limit holds when one user's requests race on every node at once.
/// Method: limit 2, 8 users each sending 30 concurrent purchases spread over 3 nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_limit_holds_under_concurrency() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 3, "[[skus]]\nid = \"limited\"\ntotal = 1000\nper_user_limit = 2", "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addrs = running.addrs();
    let mut tasks = Vec::new();
    for user in 0..8 {
        for attempt in 0..30 {
            let addr = addrs[attempt % addrs.len()];
            tasks.push(tokio::spawn(async move {
                crate::harness::purchase(addr, &format!("u{user}-a{attempt}"), "limited", &format!("u{user}"), 1).await
            }));
        }
    }
    let mut orders_reported = HashSet::new();
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status.as_u16() {
            200 => {
                assert!(orders_reported.insert(answer.body["order_id"].to_string()), "an order id was reported twice")
            }
            409 => assert_eq!(answer.error(), "user_limit", "{answer:?}"),
            other => panic!("unexpected status {other}: {answer:?}"),
        }
    }
    let orders = running.ledger.orders(&SkuId::new("limited").unwrap(), 0, 10_000).await.unwrap();
    running.stop().await;
    let mut bought: HashMap<&str, u32> = HashMap::new();
    for order in &orders {
        *bought.entry(order.user.as_str()).or_insert(0) += order.qty;
    }
    assert_eq!(bought.len(), 8);
    assert!(bought.values().all(|units| *units == 2), "every user gets exactly the limit: {bought:?}");
    assert_eq!(orders_reported.len(), 16, "8 users x limit 2 orders were reported");
}

/// Goal: the CLI's demo runs the `small` scenario on real Redis and reports it exactly, in the
/// JSON shape the issue fixes. Method: run the built `seckill` binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_small_on_redis_reports_an_exact_sale() {
    let redis = RedisServer::start();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["demo", "--scenario", "small", "--json", "--redis", &redis.url()])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "demo failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object on stdout");
    for key in [
        "scenario",
        "stock",
        "requests",
        "purchased",
        "oversell",
        "undersell",
        "duplicates",
        "rps",
        "p50_ms",
        "p99_ms",
        "sold_per_node",
    ] {
        assert!(report.get(key).is_some(), "demo JSON lacks {key}: {report}");
    }
    assert_eq!(report["scenario"], "small");
    // A buyer whose first answer was a 503 while the ledger had already decided (a slow Redis on
    // a loaded machine) learns its purchase from the retry, as a replay: each sold unit's buyer
    // hears it once, fresh or replayed.
    let replayed = report["outcomes"]["replayed"].as_u64().unwrap_or(0);
    assert_eq!(report["purchased"].as_u64().unwrap() + replayed, 1000, "{report}");
    assert_eq!(report["ledger_sold"], 1000);
    assert_eq!(
        (report["oversell"].as_u64(), report["undersell"].as_u64(), report["duplicates"].as_u64()),
        (Some(0), Some(0), Some(0))
    );
    let per_node: u64 = report["sold_per_node"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(per_node, 1000);
}

/// Goal: the README's first command, `seckill demo` on the embedded ledger, sells exactly the
/// stock. Method: the same code path as the CLI, called as a library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_small_on_the_embedded_ledger_is_exact() {
    let scenario = seckill::dev::scenario::find("small").unwrap();
    let report = seckill::dev::demo::run(scenario, None, seckill::dev::buyer_auth::BuyerAuth::None, 1).await.unwrap();
    assert_eq!((report.told_purchased(), report.ledger_sold), (1000, 1000), "{}", report.render());
    assert_eq!((report.oversell, report.undersell, report.duplicates), (0, 0, 0));
    assert_eq!(report.sold_per_node.values().sum::<u64>(), 1000);
}

/// Goal: the same sale with every buyer verified (`[auth] mode = "jwt"`), HS256 on the embedded
/// ledger and ES256 from a JWKS file on Redis: exact, and no buyer with a valid token refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_small_with_verified_buyers_is_exact() {
    use seckill::dev::buyer_auth::BuyerAuth;
    let scenario = seckill::dev::scenario::find("small").unwrap();
    let redis = crate::harness::RedisServer::start();
    for (redis_url, buyer_auth) in [(None, BuyerAuth::JwtHs256), (Some(redis.url()), BuyerAuth::JwtEs256)] {
        let report = seckill::dev::demo::run(scenario, redis_url.as_deref(), buyer_auth, 1).await.unwrap();
        assert_eq!((report.told_purchased(), report.ledger_sold), (1000, 1000), "{}", report.render());
        assert_eq!((report.oversell, report.undersell, report.duplicates), (0, 0, 0));
        assert!(!report.outcomes.contains_key("unauthenticated"), "{:?}", report.outcomes);
    }
}
