//! Order ids in a running fleet: every sale gets a Snowflake id made by the node that sold it,
//! under the worker id that node holds (leased by the coordinator, or its place in the config).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use ledger::{OrderEvent, SkuId};
use safeguards::{decode, SnowflakeId};
use seckill::cluster::Options;
use testkit::load;

use crate::harness::{cluster_config, one_attempt_per_buyer, purchase, start_cluster, RedisServer};

/// Every order id decodes to the worker id its node held, and no id repeats. (Ids grow in the
/// order requests took them, which concurrent requests may commit in another order.)
fn check_ids(orders: &[OrderEvent], worker_of: &BTreeMap<String, u64>) {
    let mut seen = HashSet::new();
    for order in orders {
        let id: u64 = order.order_id.0.parse().unwrap_or_else(|_| panic!("not a Snowflake id: {}", order.order_id));
        assert!(seen.insert(id), "order id {id} issued twice");
        let parts = decode(SnowflakeId(id));
        let node = order.node.to_string();
        assert_eq!(Some(&u64::from(parts.worker_id)), worker_of.get(&node), "{node}'s id {id} carries its worker id");
    }
}

/// Goal: under a coordinator, ids carry the leased worker ids, distinct per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sales_under_a_coordinator_carry_the_leased_worker_ids() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let ids = data.path().join("ids");
    let extra = format!("\n[node_settings]\norder_ids_dir = {:?}\n", ids.display().to_string());
    let (running, member) = crate::admin::admin_cluster(&redis, &data, &extra).await;
    let report = load::run(one_attempt_per_buyer(running.addrs(), "phone", 300, 3)).await.unwrap();
    assert_eq!(report.count("purchased"), 30);
    let orders = running.ledger.orders(&SkuId::new("phone").unwrap(), 0, 1000).await.unwrap();
    assert_eq!(orders.len(), 30);
    let headers = [("authorization", format!("Bearer {}", crate::admin::TOKEN))];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let view = crate::harness::request(member, "GET", "/admin/cluster", &headers, bytes::Bytes::new()).await;
    let worker_of: BTreeMap<String, u64> = view.body["nodes"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(node, record)| (node.clone(), record["worker_id"].as_u64().unwrap()))
        .collect();
    assert_eq!(worker_of.values().collect::<HashSet<_>>().len(), 3, "distinct worker ids: {worker_of:?}");
    check_ids(&orders, &worker_of);
    let told: HashSet<&str> = report.purchases.iter().map(|(_, order)| order.as_str()).collect();
    assert!(orders.iter().all(|o| told.contains(o.order_id.0.as_str())), "buyers were told the same ids");
    let high_water_files = std::fs::read_dir(&ids).unwrap().count();
    assert_eq!(high_water_files, 3, "one high-water file per node and worker id");
    running.stop().await;
}

/// Goal: without a coordinator the worker id is the node's place in the config, and a replay
/// returns the id of the original sale, not a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_coordinator_the_worker_id_is_the_nodes_place_and_replays_keep_the_id() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let settings = format!("[node_settings]\norder_ids_dir = {:?}", data.path().display().to_string());
    let skus = "[[skus]]\nid = \"phone\"\ntotal = 40\nper_user_limit = 1";
    let running = start_cluster(&cluster_config(&redis.url(), 2, skus, &settings), Options::default()).await;
    let report = load::run(one_attempt_per_buyer(running.addrs(), "phone", 200, 3)).await.unwrap();
    assert_eq!(report.count("purchased"), 40);
    let orders = running.ledger.orders(&SkuId::new("phone").unwrap(), 0, 1000).await.unwrap();
    check_ids(&orders, &BTreeMap::from([("n1".to_string(), 0), ("n2".to_string(), 1)]));
    let first = &orders[0];
    for node in running.addrs() {
        // A node that did not make the sale replays it once it has read the order stream.
        crate::harness::eventually("every node replays the sale", Duration::from_secs(5), || async {
            let replay = purchase(node, first.key.as_str(), "phone", first.user.as_str(), 1).await;
            replay.status == 200
        })
        .await;
        let replay = purchase(node, first.key.as_str(), "phone", first.user.as_str(), 1).await;
        assert_eq!(replay.body["order_id"], first.order_id.0.as_str(), "a retry gets the original id");
    }
    running.stop().await;
}
