//! A striped SKU end to end, without a coordinator: `stripes = 2` in `[[skus]]` creates both
//! stripes' ledgers on Redis, the node sells each buyer on its own stripe, answers 503
//! `stripe_empty` while the other stripe still has a unit, refuses a stripe named by a buyer
//! with a 4xx, and shows the SKU as one on its stock page and metrics; and `seckill demo
//! --stripes 3`, nodes and coordinator in process.

use seckill::cluster::Options;

use crate::harness::{cluster_config, get, purchase, request, start_cluster, RedisServer};

/// Two units over two stripes, one each; bob hashes to stripe 0, alice and dave to stripe 1.
const SKUS: &str = r#"
[[skus]]
id = "hot"
total = 2
stripes = 2
buffer = 0
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_sku_sells_per_stripe_and_retries_an_empty_one() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 1, SKUS, "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];

    let bought = purchase(addr, "k1", "hot", "alice", 1).await;
    assert_eq!(bought.status, 200, "{bought:?}");
    assert_eq!(bought.body["sku"], "hot", "the buyer is told the SKU, not its stripe");
    assert!(bought.body["order_id"].as_str().is_some_and(|id| id.starts_with("hot-1.")), "{bought:?}");

    let retry = purchase(addr, "k2", "hot", "dave", 1).await;
    assert_eq!((retry.status.as_u16(), retry.error()), (503, "stripe_empty"), "{retry:?}");
    assert_eq!(retry.headers.get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));

    assert_eq!(get(addr, "/v1/skus/hot/1").await.status, 404, "a stripe has no stock page of its own");
    let named = purchase(addr, "k3", "hot/1", "carol", 1).await;
    assert_eq!((named.status.as_u16(), named.error()), (400, "bad_request"), "{named:?}");
    let token = request(addr, "POST", "/v1/tokens", &[], r#"{"sku":"hot/1","user":"carol"}"#).await;
    assert_eq!(token.status, 400, "{token:?}");

    let page = get(addr, "/v1/skus/hot").await;
    assert_eq!((page.body["total"].as_u64(), page.body["sold"].as_u64()), (Some(2), Some(1)), "{page:?}");
    assert_eq!(page.body["stripes"].as_array().map(Vec::len), Some(2), "{page:?}");
    assert_eq!(page.body["stripes"][1]["sold"].as_u64(), Some(1), "{page:?}");

    assert_eq!(purchase(addr, "k4", "hot", "bob", 1).await.status, 200);
    let gone = purchase(addr, "k2", "hot", "dave", 1).await;
    assert_eq!((gone.status.as_u16(), gone.error()), (409, "sold_out"), "every stripe is empty: {gone:?}");

    let metrics = get(addr, "/metrics").await;
    let text = String::from_utf8_lossy(&metrics.raw);
    for series in [
        r#"seckill_local_remaining{node="n1",sku="hot"}"#,
        r#"seckill_stripe_local_remaining{node="n1",sku="hot",stripe="1"}"#,
        r#"seckill_purchase_requests_total{node="n1",outcome="stripe_empty"}"#,
    ] {
        assert!(text.contains(series), "/metrics lacks {series}:\n{text}");
    }
    assert!(!text.contains(r#"sku="hot/1""#), "a stripe is no SKU of its own to readers:\n{text}");
    running.stop().await;
}

/// Goal: `seckill demo --stripes 3` sells the scenario's whole stock exactly, through nodes
/// that route each buyer to its stripe and a coordinator that moves units between stripes.
/// Method: the small scenario on the embedded ledger, read back as one SKU over its stripes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_demo_on_a_sku_striped_three_ways_sells_every_unit() {
    let scenario = seckill::dev::scenario::find("small").unwrap();
    let report = seckill::dev::demo::run(scenario, None, seckill::dev::buyer_auth::BuyerAuth::None, 3).await.unwrap();
    assert_eq!((report.oversell, report.undersell, report.duplicates), (0, 0, 0), "{}", report.render());
    assert_eq!((report.told_purchased(), report.ledger_sold), (1000, 1000), "{}", report.render());
    assert_eq!(report.sold_per_node.values().sum::<u64>(), 1000, "per-node sales summed over the stripes");
}
