//! The admin API on a coordinator member: bearer-token auth, and changes (create, restock,
//! close, buffer) that go through raft and the ledger and reach every node.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use ledger::{LedgerError, SkuId};
use seckill::cluster::{Options, RunningCluster};
use seckill::config::Cluster;
use testkit::load;

use crate::harness::{eventually, get, one_attempt_per_buyer, purchase, request, start_cluster, Answer, RedisServer};

pub const TOKEN: &str = "test-admin-token-0123456789";
pub(crate) const CHANGE_VISIBLE: Duration = Duration::from_secs(5);

/// A 3-node cluster under a one-member coordinator with an admin token, selling `phone` (30
/// units, no buffer); `extra_toml` is appended (after the nodes, so it may open any table).
/// The member is named after its port: the metrics recorder is process-wide, and tests running
/// side by side must not write the same `member` label.
pub async fn admin_cluster(
    redis: &RedisServer,
    data: &tempfile::TempDir,
    extra_toml: &str,
) -> (RunningCluster, SocketAddr) {
    let (running, member, _) = admin_cluster_and_config(redis, data, extra_toml).await;
    (running, member)
}

/// [`admin_cluster`], with the config it runs.
pub async fn admin_cluster_and_config(
    redis: &RedisServer,
    data: &tempfile::TempDir,
    extra_toml: &str,
) -> (RunningCluster, SocketAddr, Cluster) {
    let port = testkit::redis::free_port().expect("free port");
    let member: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut text = format!(
        "[ledger]\nurl = \"{}\"\n\n[[skus]]\nid = \"phone\"\ntotal = 30\nbuffer = 0\n\n\
         [coordinator]\nmembers = [{{ name = \"c{port}\", listen = \"{member}\" }}]\ndata_dir = {:?}\n\
         heartbeat_ms = 100\nlease_ms = 1000\ngrace_ms = 200\nfence_margin_ms = 150\n\
         election_timeout_min_ms = 100\nelection_timeout_max_ms = 200\nadmin_token = \"{TOKEN}\"\n",
        redis.url(),
        data.path().display().to_string()
    );
    for n in 1..=3 {
        text.push_str(&format!("\n[[nodes]]\nid = \"n{n}\"\nlisten = \"127.0.0.1:0\"\n"));
    }
    text.push_str(extra_toml);
    let cluster = Cluster::parse(&text).unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"));
    (start_cluster(&cluster, Options::default()).await, member, cluster)
}

pub(crate) async fn admin(member: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &str) -> Answer {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer.as_str()));
    }
    request(member, method, path, &headers, Bytes::from(body.to_string())).await
}

/// Goal: without the right token nothing changes, and the caller learns only "401".
/// Method: create, restock and close with no token, a wrong token, a prefix of the token and
/// a non-Bearer scheme; then check the ledger and the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_without_the_token_get_401_and_change_nothing() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let (running, member) = admin_cluster(&redis, &data, "").await;
    let phone = SkuId::new("phone").unwrap();
    let before = running.ledger.status(&phone).await.unwrap();
    let prefix = &TOKEN[..TOKEN.len() - 1];
    let basic = format!("Basic {TOKEN}");
    for token in [None, Some("wrong-token-wrong-token"), Some(prefix)] {
        for (path, body) in [
            ("/admin/skus/gadget", r#"{"op":"create","total":100}"#),
            ("/admin/skus/phone", r#"{"op":"restock","total":1000}"#),
            ("/admin/skus/phone", r#"{"op":"close"}"#),
            ("/admin/skus/phone", r#"{"op":"set_buffer","buffer":"500%"}"#),
        ] {
            let answer = admin(member, "PUT", path, token, body).await;
            assert_eq!(answer.status, 401, "{path} {body} with {token:?}: {answer:?}");
            assert_eq!(answer.headers.get("www-authenticate").map(|v| v.as_bytes()), Some(&b"Bearer"[..]));
        }
        assert_eq!(admin(member, "GET", "/admin/cluster", token, "").await.status, 401);
    }
    let headers = [("authorization", basic.as_str())];
    assert_eq!(request(member, "GET", "/admin/cluster", &headers, Bytes::new()).await.status, 401);

    let gadget = SkuId::new("gadget").unwrap();
    assert!(matches!(running.ledger.status(&gadget).await, Err(LedgerError::Missing(_))), "no SKU was created");
    assert_eq!(running.ledger.status(&phone).await.unwrap(), before, "phone's ledger is untouched");
    let node = running.addrs()[0];
    assert_eq!(get(node, "/v1/skus/gadget").await.status, 404, "no node heard of gadget");
    // A 503 decided nothing (a lease renewal late on a loaded machine): a client resends the key.
    let mut bought = purchase(node, "after-refusals", "phone", "u1", 1).await;
    for _ in 0..50 {
        if bought.status != 503 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        bought = purchase(node, "after-refusals", "phone", "u1", 1).await;
    }
    assert_eq!(bought.status, 200, "phone still sells: {bought:?}");
    running.stop().await;
}

/// Goal: each admin change takes effect across the fleet: a created SKU sells exactly its
/// total on every node, a restock sells exactly the added units, a buffer change grows the
/// allotments and shows on the stock page and in metrics, a close stops every node at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_changes_reach_every_node_and_the_ledger() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let (running, member) = admin_cluster(&redis, &data, "").await;
    let nodes = running.addrs();
    let put = |sku: &'static str, body: &'static str| admin(member, "PUT", sku, Some(TOKEN), body);

    // Bad input: 4xx, nothing created.
    for body in ["{", r#"{"op":"explode"}"#, r#"{"op":"create","total":0}"#, r#"{"op":"create","total":5,"x":1}"#] {
        let answer = put("/admin/skus/drop", body).await;
        assert_eq!(answer.status, 400, "{body}: {answer:?}");
    }
    assert_eq!(put("/admin/skus/a{b}", r#"{"op":"close"}"#).await.status, 400, "bad SKU id");
    assert_eq!(put("/admin/skus/nope", r#"{"op":"close"}"#).await.status, 404);
    assert_eq!(admin(member, "DELETE", "/admin/skus/phone", Some(TOKEN), "").await.status, 405);

    // Create: every node starts selling it, and exactly its total sells.
    let unpriced = put("/admin/skus/drop", r#"{"op":"create","total":60}"#).await;
    assert_eq!((unpriced.status.as_u16(), unpriced.error()), (400, "price_required"), "a price is named, 0 or not");
    let created =
        put("/admin/skus/drop", r#"{"op":"create","total":60,"per_user_limit":0,"buffer":0,"price":0}"#).await;
    assert_eq!(created.status, 201, "{created:?}");
    let again = put("/admin/skus/drop", r#"{"op":"create","total":60,"per_user_limit":0,"buffer":0,"price":0}"#).await;
    assert_eq!(again.status, 200, "the same create again is a no-op: {again:?}");
    let other = put("/admin/skus/drop", r#"{"op":"create","total":70,"price":0}"#).await;
    assert_eq!((other.status.as_u16(), other.error()), (409, "sku_exists"));
    for &node in &nodes {
        eventually("every node sells the new SKU", CHANGE_VISIBLE, || async move {
            get(node, "/v1/skus/drop").await.status == 200
        })
        .await;
    }
    let first = load::run(one_attempt_per_buyer(nodes.clone(), "drop", 300, 1)).await.unwrap();
    let drop_sku = SkuId::new("drop").unwrap();
    let status = running.ledger.status(&drop_sku).await.unwrap();
    assert_eq!((first.count("purchased"), status.sold, status.remaining), (60, 60, 0), "{:?}", first.outcomes);

    // Restock: the total rises once however often it is sent; exactly the new units sell.
    let lower = put("/admin/skus/drop", r#"{"op":"restock","total":50}"#).await;
    assert_eq!((lower.status.as_u16(), lower.error()), (409, "total_below_current"));
    for _ in 0..2 {
        let restocked = put("/admin/skus/drop", r#"{"op":"restock","total":90}"#).await;
        assert_eq!(restocked.status, 200, "{restocked:?}");
        assert_eq!(restocked.body["ledger"]["total"], 90);
    }
    let ledger = running.ledger.clone();
    let sku = drop_sku.clone();
    // Both must have happened: the top-up (heartbeats) and every node's sold-out flag cleared by
    // its next ledger refresh. The top-up alone often lands first; one-attempt buyers sent then
    // are told sold_out by a node still holding units (mostly when the machine is busy).
    eventually("the leader tops the nodes up, and they see the restock", CHANGE_VISIBLE, || {
        let nodes = nodes.clone();
        async move {
            let mut local = 0;
            let mut selling = true;
            for node in nodes {
                let page = get(node, "/v1/skus/drop").await.body;
                local += page["local_remaining"].as_u64().unwrap_or(0);
                selling &= page["sold_out"] == false;
            }
            local >= 30 && selling
        }
    })
    .await;
    let second = load::run(one_attempt_per_buyer(nodes.clone(), "drop", 300, 2)).await.unwrap();
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((second.count("purchased"), status.sold, status.total), (30, 90, 90), "{:?}", second.outcomes);

    // Buffer: the allotments grow to remaining + 50%, shown on every stock page and in metrics.
    let buffered = put("/admin/skus/phone", r#"{"op":"set_buffer","buffer":"50%"}"#).await;
    assert_eq!((buffered.status.as_u16(), buffered.body["terms"]["buffer"].as_str()), (200, Some("50%")));
    eventually("Σ local allotments reach remaining + 50%", CHANGE_VISIBLE, || {
        let nodes = nodes.clone();
        async move {
            let mut local = 0;
            let mut shown = true;
            for node in nodes {
                let page = get(node, "/v1/skus/phone").await.body;
                local += page["local_remaining"].as_u64().unwrap_or(0);
                shown &= page["buffer"] == "50%";
            }
            shown && local >= 45
        }
    })
    .await;
    let metrics = get(member, "/metrics").await;
    let text = String::from_utf8_lossy(&metrics.raw);
    assert!(
        text.lines().any(|l| l.starts_with("seckill_coordinator_buffer_units{")
            && l.contains(&format!("member=\"c{}\"", member.port()))
            && l.contains("sku=\"phone\"")
            && l.ends_with(" 15")),
        "the coordinator exports the buffer it keeps (50% of 30 remaining):\n{text}"
    );

    // Close: every node answers `ended`, the ledger sells nothing more, a restock is refused.
    let closed = put("/admin/skus/phone", r#"{"op":"close"}"#).await;
    assert_eq!((closed.status.as_u16(), closed.body["ledger"]["closed"].as_bool()), (200, Some(true)));
    for (at, &node) in nodes.iter().enumerate() {
        let answer = purchase(node, &format!("after-close-{at}"), "phone", &format!("late{at}"), 1).await;
        assert_eq!((answer.status.as_u16(), answer.error()), (403, "ended"), "node {at}: {answer:?}");
    }
    let phone = SkuId::new("phone").unwrap();
    assert_eq!(running.ledger.status(&phone).await.unwrap().sold, 0, "nothing sold after the close");
    assert_eq!(put("/admin/skus/phone", r#"{"op":"restock","total":100}"#).await.status, 409);

    // The cluster view: every node live with an epoch and a distinct worker id; both SKUs.
    let view = admin(member, "GET", "/admin/cluster", Some(TOKEN), "").await;
    assert_eq!(view.status, 200);
    let live: Vec<_> = view.body["nodes"].as_object().unwrap().values().filter(|n| n["live"] == true).collect();
    assert_eq!(live.len(), 3, "{:?}", view.body);
    let mut workers: Vec<_> = live.iter().map(|n| n["worker_id"].as_u64().unwrap()).collect();
    workers.dedup();
    assert_eq!(workers.len(), 3);
    assert_eq!(view.body["skus"]["drop"]["ledger"]["sold"], 90);
    assert_eq!(view.body["skus"]["phone"]["terms"]["closed"], true);
    running.stop().await;
}

/// Goal: one catalogue (issue 23). A SKU created at run time becomes orders, priced as the sale
/// was, and `reconcile` covers it. Before, the order service built its catalogue from the
/// config's `[[skus]]` once at start: nodes sold `tv-55` and answered order ids, and no order
/// ever existed. Method: an order service started before the SKU exists; create `tv-55` (price
/// 1999 EUR, 120 s to pay) through the admin API, buy 5 through the nodes, change its price, buy
/// the restocked units; every sale must be an order priced as it was sold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sku_created_at_run_time_becomes_orders_priced_as_sold() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let extra = format!("\n[orders]\nstore = \"sqlite:{}\"\n", data.path().join("orders.db").display());
    let (running, member, cluster) = admin_cluster_and_config(&redis, &data, &extra).await;
    let store = seckill::order_service::open_store(&cluster).await.expect("the order store");
    let service = seckill::order_service::start(&cluster, running.ledger.clone(), store.clone())
        .await
        .expect("the order service");
    let nodes = running.addrs();
    let put = |body: &'static str| admin(member, "PUT", "/admin/skus/tv-55", Some(TOKEN), body);
    let created =
        put(r#"{"op":"create","total":5,"buffer":0,"price":1999,"currency":"EUR","pay_timeout_s":120}"#).await;
    assert_eq!(created.status, 201, "{created:?}");
    for &node in &nodes {
        eventually("every node sells the new SKU", CHANGE_VISIBLE, || async move {
            get(node, "/v1/skus/tv-55").await.status == 200
        })
        .await;
    }
    let sold = load::run(one_attempt_per_buyer(nodes.clone(), "tv-55", 40, 1)).await.expect("a load run");
    assert_eq!(sold.count("purchased"), 5, "{:?}", sold.outcomes);
    let sku = SkuId::new("tv-55").unwrap();
    let events = running.ledger.orders(&sku, 0, 100).await.expect("order events");
    assert_eq!(events.len(), 5);
    for event in &events {
        let order = order_once_stored(&store, &event.order_id.0).await;
        assert_eq!((order.new.unit_price, order.new.currency.as_str()), (1999, "EUR"));
        assert_eq!(order.new.pay_deadline_ms, order.new.created_at_ms + 120_000);
    }
    // A price change applies to later sales only: the 3 restocked units sell at the new terms,
    // the 5 sold before keep theirs.
    let repriced = admin(
        member,
        "PUT",
        "/admin/skus/tv-55",
        Some(TOKEN),
        r#"{"op":"restock","total":8,"price":2500,"currency":"USD","pay_timeout_s":300}"#,
    )
    .await;
    assert_eq!((repriced.status.as_u16(), repriced.body["terms"]["price"].as_u64()), (200, Some(2500)), "{repriced:?}");
    let bad =
        admin(member, "PUT", "/admin/skus/tv-55", Some(TOKEN), r#"{"op":"restock","total":8,"currency":"usd"}"#).await;
    assert_eq!(bad.status, 400, "a bad currency is refused: {bad:?}");
    eventually("the nodes see the restock", CHANGE_VISIBLE, || {
        let nodes = nodes.clone();
        async move {
            let (mut local, mut selling) = (0, true);
            for node in nodes {
                let page = get(node, "/v1/skus/tv-55").await.body;
                local += page["local_remaining"].as_u64().unwrap_or(0);
                selling &= page["sold_out"] == false;
            }
            local >= 3 && selling
        }
    })
    .await;
    let resold = load::run(one_attempt_per_buyer(nodes.clone(), "tv-55", 40, 2)).await.expect("a load run");
    assert_eq!(resold.count("purchased"), 3, "{:?}", resold.outcomes);
    let events = running.ledger.orders(&sku, 5, 100).await.expect("later order events");
    assert_eq!(events.len(), 3);
    for event in &events {
        let order = order_once_stored(&store, &event.order_id.0).await;
        assert_eq!((order.new.unit_price, order.new.currency.as_str()), (2500, "USD"));
        assert_eq!(order.new.pay_deadline_ms, order.new.created_at_ms + 300_000);
    }
    let first = running.ledger.orders(&sku, 0, 1).await.expect("first event");
    let kept = store.get(&first[0].order_id.0).await.expect("get").expect("the first order");
    assert_eq!((kept.new.unit_price, kept.new.currency.as_str()), (1999, "EUR"), "sold before: never repriced");
    let catalogue = seckill::order_service::current_catalogue(&cluster).await.expect("the catalogue");
    assert!(catalogue.contains_key(&sku), "reconcile covers the run-time SKU");
    let report = orders::reconcile::check(&*running.ledger, &*store, &sku).await.expect("reconcile");
    assert!(report.ok(), "{}", orders::reconcile::table(std::slice::from_ref(&report)));
    service.stop().await;
}

/// Order `id` once the order service has stored it (within 10 s).
async fn order_once_stored(store: &std::sync::Arc<dyn orders::OrderStore>, id: &str) -> orders::Order {
    eventually("the sale becomes an order", Duration::from_secs(10), || {
        let (store, id) = (store.clone(), id.to_string());
        async move { store.get(&id).await.ok().flatten().is_some() }
    })
    .await;
    store.get(id).await.expect("get").expect("the order")
}
