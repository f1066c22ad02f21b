//! A fleet whose processes are reached by name, and nodes that join it at run time: what a
//! fleet of containers needs (issue 34's "every address is an IP literal" and "nodes cannot
//! join at run time").

use std::time::{Duration, Instant};

use seckill::cluster::{start_node_at, Options};
use seckill::config::Cluster;

use crate::harness::{purchase, start_cluster, RedisServer};

/// Goal: members reach each other and nodes reach members by a DNS name (`localhost`), a node
/// advertises a name, a node missing from `[[nodes]]` joins at run time and sells in the first
/// tick that sees it, and `[coordinator] max_nodes` turns away one node more.
/// Method: three members advertising `localhost:<port>`, one listed node advertising one, then
/// two nodes started by id alone under `max_nodes = 2`: the first sells, the second never
/// registers; `/api/nodes` lists the live nodes at their advertised names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_are_reached_by_name_and_nodes_join_at_run_time_up_to_max_nodes() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let port = || testkit::redis::free_port().expect("free port");
    let members: Vec<String> = (1..=3)
        .map(|at| {
            let port = port();
            format!("{{ name = \"named{at}\", listen = \"127.0.0.1:{port}\", advertise = \"localhost:{port}\" }}")
        })
        .collect();
    let node_port = port();
    let text = format!(
        "[ledger]\nurl = \"{}\"\n\n[[skus]]\nid = \"phone\"\ntotal = 40\nbuffer = 0\n\n\
         [coordinator]\nmembers = [{}]\ndata_dir = {:?}\nmax_nodes = 2\n{}\n\
         [[nodes]]\nid = \"listed\"\nlisten = \"127.0.0.1:{node_port}\"\nadvertise = \"localhost:{node_port}\"\n",
        redis.url(),
        members.join(", "),
        data.path().display().to_string(),
        testkit::fleet::COORDINATOR_TIMINGS,
    );
    let cluster = Cluster::parse(&text).unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"));
    let running = start_cluster(&cluster, Options::default()).await;

    let join = |id: &str| {
        let id = ledger::NodeId::new(id).expect("an id");
        let listen = "127.0.0.1:0".parse().expect("an address");
        cluster.node_config(&id, Some(listen), None).expect("a joining node's settings")
    };
    let (config, place) = join("joined");
    let joined = start_node_at(&cluster, config, &place, running.ledger.clone(), &Options::default()).await.unwrap();
    assert!(ready_within(&joined, Duration::from_secs(10)).await, "the joined node registers and is ready");
    // Its even share arrives with the heartbeat after the tick that first saw it.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut bought = purchase(joined.addr, "joined-1", "phone", "ann", 1).await;
    while bought.status != 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        bought = purchase(joined.addr, "joined-1", "phone", "ann", 1).await;
    }

    let (config, place) = join("one-too-many");
    let refused = start_node_at(&cluster, config, &place, running.ledger.clone(), &Options::default()).await.unwrap();
    let refused_ready = ready_within(&refused, Duration::from_secs(3)).await;

    let client = seckill::cluster::coordinator_client(&cluster, "test").unwrap().expect("a coordinator");
    let mut live: Vec<(String, String)> =
        client.nodes().await.expect("the live nodes").nodes.into_iter().map(|n| (n.id.to_string(), n.addr)).collect();
    live.sort();
    let joined_at = joined.addr.to_string();
    refused.crash();
    joined.stop().await;
    running.stop().await;

    assert_eq!(bought.status, 200, "the joined node sells within its first ticks: {bought:?}");
    assert!(!refused_ready, "a node past max_nodes is never leased");
    let listed = format!("localhost:{node_port}");
    assert_eq!(
        live,
        [("joined".to_string(), joined_at), ("listed".to_string(), listed)],
        "max_nodes = 2 live nodes, each at the address it advertises"
    );
}

/// Whether `node` becomes ready within `within`.
async fn ready_within(node: &seckill::cluster::RunningNode, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while !node.node.is_ready() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.node.is_ready()
}
