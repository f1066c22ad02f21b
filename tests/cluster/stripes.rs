//! Striped SKUs on the coordinator: a one-member group in this process over a private Redis,
//! driven through the admin API, with sales made straight on the ledger (no nodes), so the
//! figures only move by what the test sells and what the leader transfers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coordinator::{CoordinatorConfig, Member, MemberAddr, StatusProbe};
use ledger::{LedgerReads, NodeId, RedisLedger, RedisLedgerConfig, SalesLedger, Seller, SkuId, SkuStatus};
use safeguards::blacklist::MemoryBlacklistStore;
use tokio::net::TcpListener;

use crate::admin::{admin, TOKEN};
use crate::harness::{buy, eventually, Answer, RedisServer};

/// How long a one-member group may take to elect itself, and a transfer to land.
const WAIT_MAX: Duration = Duration::from_secs(10);

struct Group {
    member: Member,
    probe: StatusProbe,
    addr: SocketAddr,
    ledger: Arc<RedisLedger>,
    _dir: tempfile::TempDir,
}

impl Group {
    async fn start(redis: &RedisServer) -> Group {
        Group::planned(redis, Vec::new()).await
    }

    /// A group whose leader defines the SKUs of `plans` (`cluster.toml`'s `[[skus]]`).
    async fn planned(redis: &RedisServer, plans: Vec<coordinator::SkuPlan>) -> Group {
        let dir = tempfile::tempdir().expect("a temp dir");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("an address");
        // Named after its port: the metrics recorder is process-wide.
        let name = format!("c{}", addr.port());
        let config = CoordinatorConfig {
            members: vec![MemberAddr { name: name.clone(), listen: addr, addr: addr.to_string() }],
            data_dir: dir.path().to_path_buf(),
            heartbeat: Duration::from_millis(100),
            lease: Duration::from_millis(1000),
            grace: Duration::from_millis(200),
            fence_margin: Duration::from_millis(150),
            election_timeout_min: Duration::from_millis(100),
            election_timeout_max: Duration::from_millis(200),
            reallocate: true,
            admin_token: Some(protocol::Secret::new(TOKEN).expect("a strong token")),
            cluster: protocol::ClusterCredential::generate().expect("a random source"),
            tls: None,
            orders_api: None,
            max_nodes: 64,
        };
        let ledger = Arc::new(RedisLedger::connect(RedisLedgerConfig::new(redis.url())).expect("ledger"));
        let blacklist = Arc::new(MemoryBlacklistStore::default());
        let member =
            Member::start(config, &name, listener, ledger.clone(), plans, None, blacklist).await.expect("a member");
        let deadline = Instant::now() + WAIT_MAX;
        while member.status().leader != Some(1) {
            assert!(Instant::now() < deadline, "no leader after {WAIT_MAX:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Group { probe: member.status_probe(), member, addr, ledger, _dir: dir }
    }

    async fn put(&self, sku: &str, body: &str) -> Answer {
        admin(self.addr, "PUT", &format!("/admin/skus/{sku}"), Some(TOKEN), body).await
    }

    async fn get(&self, sku: &str) -> Answer {
        admin(self.addr, "GET", &format!("/admin/skus/{sku}"), Some(TOKEN), "").await
    }

    async fn stripes(&self, sku: &SkuId, stripes: u32) -> Vec<SkuStatus> {
        let mut statuses = Vec::new();
        for index in 0..stripes {
            statuses.push(self.ledger.status(&sku.stripe(index)).await.expect("a stripe's ledger"));
        }
        statuses
    }

    /// Sells every unit `stripe` has left, one buyer each, as a node would; returns the units
    /// the stripe has sold so far.
    async fn sell_out(&self, stripe: &SkuId, buyers: &mut u64) -> u64 {
        let status = self.ledger.status(stripe).await.expect("a stripe's ledger");
        let remaining = status.remaining;
        let seller = Seller::new(NodeId::new("n1").expect("a node id"), 1);
        let purchases: Vec<_> = (0..remaining)
            .map(|_| {
                *buyers += 1;
                buy(&format!("k{buyers}"), &format!("u{buyers}"))
            })
            .collect();
        if purchases.is_empty() {
            return status.sold;
        }
        self.ledger.confirm(stripe, &seller, &purchases).await.expect("a confirm").sold
    }
}

fn hot() -> SkuId {
    SkuId::new("hot").unwrap()
}

/// Goal: a striped SKU created through the admin API is one ledger and one catalogue entry per
/// stripe, reads as one SKU, and restocks, closes and refuses like one. Method: create `hot`
/// (10 units, 3 stripes), create it again, read it, restock it (twice the same), close it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_sku_is_a_ledger_and_a_catalogue_entry_per_stripe() {
    let redis = RedisServer::start();
    let group = Group::start(&redis).await;
    let create = r#"{"op":"create","total":10,"stripes":3,"per_user_limit":0,"price":0}"#;
    let stripe_name = group.put("hot/1", create).await;
    assert_eq!((stripe_name.status.as_u16(), stripe_name.error()), (400, "bad_sku"), "users never name a stripe");
    let created = group.put("hot", create).await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(
        (created.body["terms"]["total"].as_u64(), created.body["ledger"]["total"].as_u64()),
        (Some(10), Some(10))
    );
    assert_eq!(group.put("hot", create).await.status, 200, "the same create again is a no-op");
    let totals: Vec<u64> = group.stripes(&hot(), 3).await.iter().map(|status| status.total).collect();
    assert_eq!(totals, [4, 3, 3]);
    let state = group.probe.state();
    for (index, total) in (0..).zip(totals) {
        let terms = state.catalogue.terms(&hot().stripe(index)).expect("a catalogue entry per stripe");
        assert_eq!((terms.total, terms.stripes), (total, 3));
    }
    assert_eq!(state.catalogue.skus.len(), 3);

    let read = group.get("hot").await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!((read.body["total"].as_u64(), read.body["remaining"].as_u64()), (Some(10), Some(10)));
    assert_eq!(read.body["stripes"].as_array().map(Vec::len), Some(3));
    assert_eq!(read.body["stripes"][1]["sku"], "hot/1");

    for _ in 0..2 {
        let restocked = group.put("hot", r#"{"op":"restock","total":16}"#).await;
        assert_eq!((restocked.status.as_u16(), restocked.body["terms"]["total"].as_u64()), (200, Some(16)));
    }
    let statuses = group.stripes(&hot(), 3).await;
    assert_eq!(statuses.iter().map(|status| status.total).sum::<u64>(), 16, "a restock adds its units once");
    assert_eq!(statuses[0].total, 10, "into stripe 0");
    let lower = group.put("hot", r#"{"op":"restock","total":12}"#).await;
    assert_eq!((lower.status.as_u16(), lower.error()), (409, "total_below_current"));

    assert_eq!(group.put("hot", r#"{"op":"close"}"#).await.status, 200);
    assert!(group.stripes(&hot(), 3).await.iter().all(|status| status.closed), "every stripe closes");
    let state = group.probe.state();
    assert!((0..3).all(|index| state.catalogue.terms(&hot().stripe(index)).is_some_and(|terms| terms.closed)));
    group.member.stop().await;
}

/// Goal: a stripe that sold out gets units from the others, each transfer exactly once, until
/// the whole SKU has sold through that one stripe. Method: create `hot` (9 units, 3 stripes of
/// 3) and keep selling out stripe 1 straight on the ledger; after each round check that the
/// ledger's stripes add up to 9 and what left one stripe arrived in another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_moves_units_into_a_sold_out_stripe_exactly_once() {
    let redis = RedisServer::start();
    let group = Group::start(&redis).await;
    let create = r#"{"op":"create","total":9,"stripes":3,"per_user_limit":0,"price":0}"#;
    assert_eq!(group.put("hot", create).await.status, 201);
    let (mut buyers, mut sold) = (0, 0);
    let deadline = Instant::now() + WAIT_MAX * 3;
    while sold < 9 {
        assert!(Instant::now() < deadline, "sold {sold} of 9 through stripe 1");
        sold = group.sell_out(&hot().stripe(1), &mut buyers).await;
        eventually("the books add up", WAIT_MAX, || books_add_up(&group)).await;
    }
    assert!(books_add_up(&group).await);
    let statuses = group.stripes(&hot(), 3).await;
    assert_eq!(statuses.iter().map(|status| status.remaining).sum::<u64>(), 0);
    let net_in = statuses[1].transferred_in - statuses[1].transferred_out;
    assert_eq!((statuses[1].sold, net_in), (9, 6), "every unit sold on stripe 1");
    let state = group.probe.state();
    let striped = &state.stripes.skus[&hot()];
    let out: u64 = statuses.iter().map(|status| status.transferred_out).sum();
    assert_eq!((striped.total, striped.transferred_units), (9, out), "raft counted each transfer once");
    let read = group.get("hot").await;
    assert_eq!((read.body["sold"].as_u64(), read.body["total"].as_u64()), (Some(9), Some(9)));
    assert_eq!(read.body["transfers"].as_u64(), Some(striped.transfers));
    group.member.stop().await;
}

/// Whether the books are settled and add up: no transfer in flight, the ledger's stripes hold
/// the SKU's 9 units, every unit that left a stripe arrived in another, and each stripe's
/// catalogue total is its ledger's. The leader may be mid-transfer at any one reading, so
/// callers wait for it (`eventually`).
async fn books_add_up(group: &Group) -> bool {
    let state = group.probe.state();
    let statuses = group.stripes(&hot(), 3).await;
    let total: u64 = statuses.iter().map(|status| status.total).sum();
    let out: u64 = statuses.iter().map(|status| status.transferred_out).sum();
    let into: u64 = statuses.iter().map(|status| status.transferred_in).sum();
    let catalogue: Vec<u64> =
        (0..3).filter_map(|index| state.catalogue.terms(&hot().stripe(index))).map(|terms| terms.total).collect();
    let ledger: Vec<u64> = statuses.iter().map(|status| status.total).collect();
    state.stripes.in_flight.is_empty() && total == 9 && out == into && catalogue == ledger
}

/// Goal: a striped SKU of `cluster.toml` is defined as the admin API defines one: a ledger and a
/// catalogue entry per stripe, each with its stripe's total and starting allotments.
/// Method: start a member with the plans of a config holding `hot` (9 units, 3 stripes, 2 nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_sku_of_cluster_toml_is_defined_stripe_by_stripe() {
    let redis = RedisServer::start();
    let text = format!(
        "[ledger]\nurl = \"{}\"\n\n[[skus]]\nid = \"hot\"\ntotal = 9\nstripes = 3\nbuffer = 0\n\n\
         [[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:0\"\n\n[[nodes]]\nid = \"n2\"\nlisten = \"127.0.0.1:0\"\n",
        redis.url()
    );
    let cluster = seckill::config::Cluster::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let group = Group::planned(&redis, cluster.sku_plans()).await;
    eventually("every stripe defined", WAIT_MAX, || async { group.probe.state().catalogue.skus.len() == 3 }).await;
    let totals: Vec<u64> = group.stripes(&hot(), 3).await.iter().map(|status| status.total).collect();
    assert_eq!(totals, [3, 3, 3]);
    let state = group.probe.state();
    for index in 0..3 {
        let entry = &state.catalogue.skus[&hot().stripe(index)];
        assert_eq!((entry.terms.total, entry.terms.stripes, entry.starting.values().sum::<u64>()), (3, 3, 3));
    }
    assert_eq!(state.stripes.skus[&hot()].total, 9);
    group.member.stop().await;
}
