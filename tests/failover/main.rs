//! Failover against real processes: `seckill coordinator` members and `seckill node`s spawned as
//! child processes over a private Redis, killed with SIGKILL or frozen with SIGSTOP.
//!
//! These tests run one at a time (they time leases on a 2-core machine), behind `SERIAL`.

// A test reads as one scenario from its set-up to its last check: the 70-line bound
// (too_many_lines) is for the code under test.
#![allow(clippy::too_many_lines)]

mod browser;
mod credentials;
mod fleet;
#[allow(dead_code)]
#[path = "../cluster/harness.rs"]
mod harness;
mod lb;
mod nginx;
mod orders;
mod traces;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ledger::{NodeId, Seller, SkuId};
use testkit::load::{self, LoadPlan};

use crate::fleet::Fleet;
use crate::harness::{get, purchase};
use crate::nginx::Nginx;

/// One test at a time: each starts half a dozen processes whose leases are timed.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SKU: &str = "phone";

fn sku_toml(total: u64, buffer: &str) -> String {
    format!("[[skus]]\nid = \"{SKU}\"\ntotal = {total}\nper_user_limit = 1\nbuffer = {buffer}")
}

/// What a failover run ended with.
#[derive(Debug)]
struct FailoverRun {
    sold: u64,
    /// Distinct keys whose buyer was told "purchased", fresh or replayed after a retry.
    told_purchased: u64,
    /// Keys told "purchased" that the ledger has no such order for: must be 0.
    told_wrongly: u64,
    /// Sales whose buyer never heard, made by a node that stayed alive: must be 0. (A buyer of
    /// the killed node can miss its answer if its retry lands on a node that has not read the
    /// order stream yet; see docs/internals.md.)
    untold_by_survivors: u64,
    duplicates: u64,
    sold_by_node: std::collections::BTreeMap<NodeId, u64>,
    reallocation: Option<Duration>,
}

/// The `failover`/`small` scenario's buyers: 20,000 attempts from 64 buyers, 2,000 users,
/// retrying 503/502/connection errors with the same key.
fn scenario_plan(targets: Vec<std::net::SocketAddr>, seed: u64, rate_per_s: Option<u64>) -> LoadPlan {
    LoadPlan {
        targets,
        sku: SKU.into(),
        purchases: 20_000,
        users: 2_000,
        concurrency: 64,
        retries_max: 5,
        retry_pause: Duration::from_millis(20),
        seed,
        rate_per_s,
        bearer: None,
    }
}

/// Sums every node's local stock from the stock pages.
async fn local_stock(fleet: &Fleet) -> u64 {
    let mut held = 0;
    for addr in fleet.node_addrs() {
        held += get(addr, &format!("/v1/skus/{SKU}")).await.body["local_remaining"].as_u64().unwrap_or(0);
    }
    held
}

/// A fleet with every process started, ready, and holding the whole stock.
async fn started_fleet(members: usize, nodes: usize, stock: u64, buffer: &str, coordinator_extra: &str) -> Fleet {
    let mut fleet = Fleet::new(members, nodes, &sku_toml(stock, buffer), coordinator_extra).await;
    fleet.start_all();
    fleet.wait_nodes_ready().await;
    wait_for_allotments(&fleet, stock).await;
    fleet
}

async fn wait_for_allotments(fleet: &Fleet, stock: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while local_stock(fleet).await < stock {
        assert!(Instant::now() < deadline, "the nodes never held the whole stock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Units granted to live nodes other than `killed`, as the leader sees it.
async fn granted_to_others(fleet: &Fleet, killed: &str) -> Option<u64> {
    let state = fleet.cluster_state().await?;
    let nodes = state["nodes"].as_object()?;
    Some(
        nodes
            .iter()
            .filter(|(name, record)| name.as_str() != killed && record["live"] == true)
            .map(|(_, record)| record["granted"][SKU].as_u64().unwrap_or(0))
            .sum(),
    )
}

async fn is_revoked(fleet: &Fleet, node: &str) -> bool {
    fleet.cluster_state().await.is_some_and(|state| state["nodes"][node]["live"] == false)
}

/// The `failover` scenario on a started fleet: 20,000 purchase attempts from 64 buyers at
/// 4,000/s, 2,000 users; SIGKILL `victim` at 30% sold. Returns what the ledger and buyers saw.
async fn run_failover(fleet: &mut Fleet, stock: u64, victim: &str) -> FailoverRun {
    let ledger = fleet.ledger();
    let sku = SkuId::new(SKU).unwrap();
    let load = tokio::spawn(load::run(scenario_plan(fleet.node_addrs(), 11, Some(4_000))));
    let threshold = stock * 3 / 10;
    let deadline = Instant::now() + Duration::from_secs(30);
    while ledger.status(&sku).await.map(|s| s.sold).unwrap_or(0) < threshold {
        assert!(Instant::now() < deadline, "the sale never reached 30%");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let before = granted_to_others(fleet, victim).await.unwrap_or(0);
    let killed_at = Instant::now();
    fleet.kill(victim);
    let mut reallocation = None;
    while killed_at.elapsed() < Duration::from_secs(15) && !load.is_finished() {
        if is_revoked(fleet, victim).await && granted_to_others(fleet, victim).await.unwrap_or(0) > before {
            reallocation = Some(killed_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let report = load.await.unwrap().unwrap();
    let status = ledger.status(&sku).await.unwrap();
    let orders = ledger.orders(&sku, 0, 100_000).await.unwrap();
    let keys: HashSet<_> = orders.iter().map(|o| o.key.as_str()).collect();
    let in_ledger: HashSet<(&str, &str)> = orders.iter().map(|o| (o.key.as_str(), o.order_id.0.as_str())).collect();
    let told: HashSet<(&str, &str)> = report.purchases.iter().map(|(k, o)| (k.as_str(), o.as_str())).collect();
    eprintln!(
        "failover: killed {victim} at {threshold} sold; reallocation after {:?}; sold {} of {stock}; per node {:?}; outcomes {:?}",
        reallocation, status.sold, status.sold_by_node, report.outcomes
    );
    FailoverRun {
        sold: status.sold,
        told_purchased: told.len() as u64,
        told_wrongly: told.difference(&in_ledger).count() as u64,
        untold_by_survivors: orders
            .iter()
            .filter(|o| o.node.as_str() != victim && !told.contains(&(o.key.as_str(), o.order_id.0.as_str())))
            .count() as u64,
        duplicates: (orders.len() - keys.len()) as u64,
        sold_by_node: status.sold_by_node,
        reallocation,
    }
}

/// Goal: the `failover` scenario ends with everything sold: a node SIGKILLed at 30% sold has its
/// unsold allotment reallocated to the survivors. Method: 1 coordinator, 3 node processes, the
/// scenario's load; then compare buyers' answers with the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_scenario_sells_the_whole_stock_after_a_node_is_killed() {
    let _serial = SERIAL.lock().await;
    let mut fleet = started_fleet(1, 3, 1000, "\"10%\"", "").await;
    let run = run_failover(&mut fleet, 1000, "n1").await;
    assert!(run.reallocation.is_some(), "the dead node's allotment was never reallocated");
    assert_eq!(run.sold, 1000, "undersell: {run:?}");
    assert_eq!(run.told_wrongly, 0, "every 'purchased' answer matches a ledger order: {run:?}");
    assert_eq!(run.untold_by_survivors, 0, "every sale by a live node reached its buyer: {run:?}");
    // The decision is visible to operators: one expiry, units granted by reallocation.
    let metrics = get(fleet.member_addr("c1"), "/metrics").await;
    let text = String::from_utf8_lossy(&metrics.raw);
    let value = |series: &str| -> f64 {
        text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok()).unwrap_or(-1.0)
    };
    assert_eq!(value(r#"seckill_coordinator_expiries_total{member="c1"}"#), 1.0, "{text}");
    assert!(value(r#"seckill_coordinator_granted_units_total{member="c1",reason="reallocation"}"#) > 0.0, "{text}");
    assert_eq!(value(r#"seckill_coordinator_is_leader{member="c1"}"#), 1.0, "{text}");
    eprintln!("buyers told of {} of 1000 sales (the rest died with the killed node)", run.told_purchased);
    assert_eq!(run.duplicates, 0);
    assert_eq!(run.sold_by_node.values().sum::<u64>(), 1000);
}

/// Goal: killing two of three nodes at once still sells the whole stock. The leader's brake
/// ("most nodes look dead at once: suspect my own network") used to hold such expiries back for
/// good, leaving the dead nodes' units unsold forever; it now holds for one lease, then lets
/// them go. Method: 1 coordinator, 3 node processes, 2,000 units. At 30% sold, freeze the
/// coordinator (SIGSTOP), SIGKILL n1 and n2, and thaw it a lease later: it then finds most nodes
/// lapsed at once, whatever the heartbeat phases, so the brake engages for sure. Buyers keep
/// coming throughout (retrying on the next node); the ledger must end sold out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_two_of_three_nodes_at_once_still_sells_the_whole_stock() {
    let _serial = SERIAL.lock().await;
    let stock = 2_000;
    let mut fleet = started_fleet(1, 3, stock, "\"10%\"", "").await;
    let ledger = fleet.ledger();
    let sku = SkuId::new(SKU).unwrap();
    // 40,000 attempts at 4,000/s: buyers are still there well after the brake's bound.
    let plan = LoadPlan { purchases: 40_000, users: 8_000, ..scenario_plan(fleet.node_addrs(), 23, Some(4_000)) };
    let load = tokio::spawn(load::run(plan));
    let deadline = Instant::now() + Duration::from_secs(30);
    while ledger.status(&sku).await.map(|s| s.sold).unwrap_or(0) < stock * 3 / 10 {
        assert!(Instant::now() < deadline, "the sale never reached 30%");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    fleet.kill("n1");
    fleet.kill("n2");
    let killed_at = Instant::now();
    // Let the last heartbeats the dead nodes sent land first: delivered after the thaw they would
    // renew a dead node's lease, and the two would lapse one at a time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    fleet.signal("c1", "-STOP");
    // Past every lease and grace, so that on waking the leader sees n1 and n2 (and maybe n3) lapsed.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    fleet.signal("c1", "-CONT");
    let report = load.await.unwrap().unwrap();
    let status = ledger.status(&sku).await.unwrap();
    let orders = ledger.orders(&sku, 0, 100_000).await.unwrap();
    let in_ledger: HashSet<(&str, &str)> = orders.iter().map(|o| (o.key.as_str(), o.order_id.0.as_str())).collect();
    let told_wrongly = report.purchases.iter().filter(|(k, o)| !in_ledger.contains(&(k.as_str(), o.as_str()))).count();
    eprintln!(
        "two of three killed: sold {} of {stock} ({:?} after the kill); per node {:?}; outcomes {:?}",
        status.sold,
        killed_at.elapsed(),
        status.sold_by_node,
        report.outcomes
    );
    assert_eq!(status.sold, stock, "undersell after losing two of three nodes: {status:?}");
    assert_eq!(told_wrongly, 0, "every 'purchased' answer matches a ledger order");
    let metrics = get(fleet.member_addr("c1"), "/metrics").await;
    let text = String::from_utf8_lossy(&metrics.raw);
    let value = |series: &str| -> f64 {
        text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok()).unwrap_or(-1.0)
    };
    assert!(value(r#"seckill_coordinator_expiries_total{member="c1"}"#) >= 2.0, "{text}");
    // Whether the brake engaged depends on what the thawed leader saw first (the policy's table
    // tests pin the rule down); if it held, it let go.
    let braked = value(r#"seckill_coordinator_brake_total{member="c1"}"#);
    eprintln!("the brake held for {braked} ticks");
    if braked >= 1.0 {
        assert!(value(r#"seckill_coordinator_brake_released_total{member="c1"}"#) >= 1.0, "then let go: {text}");
    }
}

/// Goal: reallocation is what prevents undersell. With no buffer and reallocation off, the
/// scenario leaves the dead node's stock unsold; with reallocation on, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reallocation_a_dead_node_undersells_and_with_it_nothing_does() {
    let _serial = SERIAL.lock().await;
    let mut off = started_fleet(1, 3, 1000, "0", "reallocate = false\n").await;
    let without = run_failover(&mut off, 1000, "n2").await;
    drop(off);
    assert!(without.sold < 1000, "with buffer 0 and no reallocation the dead node's units stay unsold: {without:?}");
    assert!(without.reallocation.is_none());

    let mut on = started_fleet(1, 3, 1000, "0", "").await;
    let with = run_failover(&mut on, 1000, "n2").await;
    assert_eq!(with.sold, 1000, "reallocation sells the dead node's units: {with:?}");
    eprintln!("undersell without reallocation: {}; with: {}", 1000 - without.sold, 1000 - with.sold);
}

/// Goal: a node frozen past its lease sells nothing from its revoked allotment when it wakes.
/// Method: SIGSTOP n1 until the coordinator has ended its epoch and reallocated, SIGCONT, fire
/// purchases at n1 at once; the ledger's count for n1's first epoch must not move. Then sell out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_sells_nothing_from_its_revoked_allotment() {
    let _serial = SERIAL.lock().await;
    let mut fleet = started_fleet(1, 2, 200, "0", "").await;
    let ledger = fleet.ledger();
    let sku = SkuId::new(SKU).unwrap();
    let (n1, n2) = (fleet.node_addr("n1"), fleet.node_addr("n2"));
    for n in 0..10 {
        assert_eq!(purchase(n1, &format!("early-{n}"), SKU, &format!("early-{n}"), 1).await.status, 200);
    }
    let first_epoch = Seller::new(NodeId::new("n1").unwrap(), 1);
    let sold_in_first_epoch = ledger.sold_by(&sku, &first_epoch).await.unwrap();
    assert_eq!(sold_in_first_epoch, 10);

    let before = granted_to_others(&fleet, "n1").await.unwrap();
    fleet.signal("n1", "-STOP");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(is_revoked(&fleet, "n1").await && granted_to_others(&fleet, "n1").await.unwrap_or(0) > before) {
        assert!(Instant::now() < deadline, "the frozen node's allotment was never reallocated");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fleet.signal("n1", "-CONT");
    let mut woke: Vec<u16> = Vec::new();
    for n in 0..30 {
        woke.push(purchase(n1, &format!("woke-{n}"), SKU, &format!("woke-{n}"), 1).await.status.as_u16());
    }
    assert_eq!(
        ledger.sold_by(&sku, &first_epoch).await.unwrap(),
        sold_in_first_epoch,
        "n1 sold from its revoked allotment after waking; answers were {woke:?}"
    );

    let mut purchased = 10 + woke.iter().filter(|s| **s == 200).count() as u64;
    for n in 0..400 {
        let addr = if n % 2 == 0 { n1 } else { n2 };
        let answer = purchase(addr, &format!("late-{n}"), SKU, &format!("late-{n}"), 1).await;
        if answer.status == 200 {
            purchased += 1;
        }
    }
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, purchased), (200, 200), "everything sold exactly once: {status:?}");
}

/// Goal: winners a node had queued for the ledger when it froze are never confirmed under its
/// ended epoch, even though they passed every check on the node before the freeze. Method: 1
/// member, 2 nodes; a burst of 300 concurrent purchases at n1, SIGSTOP as soon as the first of
/// them sold (others are past the CAS, queued or in flight to the ledger); wait until the leader
/// ended n1's epoch and reallocated (it fences the epoch at the ledger first); SIGCONT. The
/// epoch's count at the ledger must not move after the reallocation read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn winners_queued_when_a_node_froze_are_not_confirmed_under_its_ended_epoch() {
    let _serial = SERIAL.lock().await;
    let mut fleet = started_fleet(1, 2, 1000, "0", "").await;
    let ledger = fleet.ledger();
    let sku = SkuId::new(SKU).unwrap();
    let n1 = fleet.node_addr("n1");
    let first_epoch = Seller::new(NodeId::new("n1").unwrap(), 1);
    let before = granted_to_others(&fleet, "n1").await.unwrap();
    let burst: Vec<_> = (0..300)
        .map(|n| tokio::spawn(async move { purchase(n1, &format!("burst-{n}"), SKU, &format!("burst-{n}"), 1).await }))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ledger.sold_by(&sku, &first_epoch).await.unwrap() == 0 {
        assert!(Instant::now() < deadline, "the burst never sold");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    fleet.signal("n1", "-STOP");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(is_revoked(&fleet, "n1").await && granted_to_others(&fleet, "n1").await.unwrap_or(0) > before) {
        assert!(Instant::now() < deadline, "the frozen node's allotment was never reallocated");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let at_reallocation = ledger.sold_by(&sku, &first_epoch).await.unwrap();
    fleet.signal("n1", "-CONT");
    let mut answers = BTreeMap::new();
    for task in burst {
        let status = task.await.map(|answer| answer.status.as_u16()).unwrap_or(0);
        *answers.entry(status).or_insert(0) += 1;
    }
    let after = ledger.sold_by(&sku, &first_epoch).await.unwrap();
    eprintln!("n1's first epoch sold {at_reallocation} when reallocated, {after} after waking; answers {answers:?}");
    assert_eq!(after, at_reallocation, "n1 confirmed winners under its ended epoch after waking: {answers:?}");
}

/// Goal: a node that cannot reach the ledger says so in its heartbeats (the leader then counts
/// its units as unsellable and grants only to nodes that can confirm), and says so no more once
/// the ledger is back. Method: 1 member, 2 nodes; SIGSTOP Redis, watch the leader's state for
/// both nodes' reports, SIGCONT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_reach_the_ledger_tells_the_coordinator() {
    let _serial = SERIAL.lock().await;
    let fleet = started_fleet(1, 2, 100, "0", "").await;
    let reachable =
        |state: &serde_json::Value, node: &str| state["nodes"][node]["reports"][SKU]["ledger_reachable"].as_bool();
    let all_report = |want: bool| {
        let fleet = &fleet;
        async move {
            let state = fleet.cluster_state().await.unwrap_or_default();
            ["n1", "n2"].iter().all(|node| reachable(&state, node) == Some(want))
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all_report(true).await {
        assert!(Instant::now() < deadline, "the nodes never reported reaching the ledger");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fleet.pause_redis();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all_report(false).await {
        assert!(Instant::now() < deadline, "the nodes never reported losing the ledger");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fleet.resume_redis();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all_report(true).await {
        assert!(Instant::now() < deadline, "the nodes never reported the ledger back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Goal: losing the coordinator leader mid-sale costs nothing: a new leader is elected and a node
/// failure after that is still reallocated. Method: 3 members; SIGKILL the leader during paced
/// load, wait for a new one, then SIGKILL a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_leader_is_killed_a_new_one_still_reallocates() {
    let _serial = SERIAL.lock().await;
    let mut fleet = started_fleet(3, 3, 1000, "0", "").await;
    let old_leader = fleet.leader().await.expect("a leader");
    let killed_at = Instant::now();
    fleet.kill(&old_leader);
    let mut new_leader = None;
    while killed_at.elapsed() < Duration::from_secs(15) {
        if let Some(leader) = fleet.leader().await.filter(|l| *l != old_leader) {
            new_leader = Some(leader);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let new_leader = new_leader.expect("no new leader within 15 s");
    eprintln!("leader {old_leader} killed; {new_leader} leads after {:?}", killed_at.elapsed());
    fleet.wait_nodes_ready().await;
    let run = run_failover(&mut fleet, 1000, "n3").await;
    assert!(run.reallocation.is_some(), "the new leader never reallocated the dead node: {run:?}");
    assert_eq!(run.sold, 1000, "{run:?}");
}

/// Goal: a member that lost its disk is replaced without losing the group's state, and takes its
/// place in the quorum again. Method: 3 members, 2 nodes; SIGKILL c1 (the member that
/// initializes a brand-new group) and wipe its data directory; through the admin API on the new
/// leader `remove` it, restart it on the empty directory (it must not start a group of its own),
/// `add_learner` (answers once it caught up), `promote`. Its state must match the leader's; then
/// SIGKILL the leader: c1 and the last member elect one, and the nodes sell the whole stock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_lost_its_disk_is_replaced_without_losing_the_group_state() {
    let _serial = SERIAL.lock().await;
    const TOKEN: &str = "replace-members-token-0123";
    let mut fleet = started_fleet(3, 2, 500, "0", &format!("admin_token = \"{TOKEN}\"\n")).await;
    fleet.kill("c1");
    std::fs::remove_dir_all(fleet.member_data_dir("c1")).expect("wipe c1's data directory");
    let deadline = Instant::now() + Duration::from_secs(15);
    let leader = loop {
        if let Some(leader) = fleet.leader().await.filter(|l| l != "c1") {
            break leader;
        }
        assert!(Instant::now() < deadline, "no leader among c2 and c3");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let leader_addr = fleet.member_addr(&leader);
    let change = |op: &'static str| {
        let addr = leader_addr;
        async move {
            let body = format!(r#"{{"op":"{op}"}}"#);
            let auth = format!("Bearer {TOKEN}");
            let headers = [("authorization", auth.as_str()), ("content-type", "application/json")];
            harness::request(addr, "PUT", "/admin/members/c1", &headers, body).await
        }
    };
    let removed = change("remove").await;
    assert_eq!(removed.status, 200, "{:?}", removed.body);
    assert_eq!(removed.body["membership"]["voters"], serde_json::json!(["c2", "c3"]));
    fleet.start_member("c1");
    let added = change("add_learner").await;
    assert_eq!(added.status, 200, "{:?}", added.body);
    assert_eq!(added.body["membership"]["learners"], serde_json::json!(["c1"]));
    let promoted = change("promote").await;
    assert_eq!(promoted.status, 200, "{:?}", promoted.body);
    assert_eq!(promoted.body["membership"]["voters"], serde_json::json!(["c1", "c2", "c3"]));
    let catalogue = |state: serde_json::Value| state["applied"]["state"]["catalogue"].clone();
    let expected = catalogue(fleet.member_state(&leader).await.expect("leader answers"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while fleet.member_state("c1").await.map(catalogue) != Some(expected.clone()) {
        assert!(Instant::now() < deadline, "c1 never caught up with the leader's catalogue {expected}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(expected["skus"][SKU].is_object(), "the catalogue survived: {expected}");

    fleet.kill(&leader);
    let deadline = Instant::now() + Duration::from_secs(15);
    while fleet.leader().await.is_none_or(|l| l == leader) {
        assert!(Instant::now() < deadline, "c1 and the last member never elected a leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = load::run(scenario_plan(fleet.node_addrs(), 5, None)).await.unwrap();
    let status = fleet.ledger().status(&SkuId::new(SKU).unwrap()).await.unwrap();
    assert_eq!(status.sold, 500, "the fleet still sells everything: {:?}", report.outcomes);
}

/// Goal: a coordinator member restarted on its data directory comes back with its log and
/// catches up with the group. Method: 3 members; SIGKILL a follower, let the group write on
/// (lock acquisitions: heartbeats renew leases in the leader's memory and write nothing),
/// restart it; its log must start where it left off, then reach the leader's applied index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_member_catches_up_from_its_persisted_log() {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::new(3, 2, &sku_toml(100, "0"), "").await;
    fleet.start_all();
    fleet.wait_nodes_ready().await;
    let leader = fleet.leader().await.expect("a leader");
    let follower = fleet.member_names().into_iter().find(|m| *m != leader).expect("a follower");
    let index_of = |state: &serde_json::Value| state["applied"]["last_applied"]["index"].as_u64().unwrap_or(0);
    let before = index_of(&fleet.member_state(&follower).await.expect("follower answers"));
    assert!(before > 0);
    fleet.kill(&follower);
    let leader_state = fleet.member_state(&leader).await.expect("leader answers");
    let members = fleet.member_names().iter().map(|m| fleet.member_addr(m).to_string()).collect();
    let token = protocol::credential::Secret::new(testkit::fleet::TEST_CLUSTER_TOKEN).expect("the test token");
    let client = protocol::CoordinatorClient::new(members, token);
    for at in 0..12 {
        let request = protocol::locks::LockAcquireRequest {
            name: format!("catch-up-{at}"),
            owner: "failover-test".to_string(),
            hold: 1,
            ttl_ms: 60_000,
        };
        client.acquire_lock(&request).await.expect("the two live members write");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while index_of(&fleet.member_state(&leader).await.expect("leader")) < index_of(&leader_state) + 10 {
        assert!(Instant::now() < deadline, "the group stopped writing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fleet.start_member(&follower);
    let mut restarted = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while restarted.is_none() {
        assert!(Instant::now() < deadline, "the restarted member never answered");
        restarted = fleet.member_state(&follower).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log_at_restart = restarted.expect("state")["last_log_index"].as_u64().unwrap_or(0);
    assert!(log_at_restart >= before, "the member came back with a shorter log ({log_at_restart} < {before})");
    let target = index_of(&fleet.member_state(&leader).await.expect("leader"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while index_of(&fleet.member_state(&follower).await.unwrap_or_default()) < target {
        assert!(Instant::now() < deadline, "the restarted member never caught up to index {target}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let caught_up = fleet.member_state(&follower).await.expect("state");
    let leader_nodes = fleet.member_state(&leader).await.expect("leader")["applied"]["state"]["nodes"].clone();
    assert_eq!(
        caught_up["applied"]["state"]["nodes"].as_object().map(|n| n.len()),
        leader_nodes.as_object().map(|n| n.len()),
        "the restarted member knows every node"
    );
}

/// Goal: a node stopped gracefully (SIGTERM) hands its allotment back: the coordinator revokes
/// and reallocates it at once, without waiting for the lease to run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_gracefully_hands_its_allotment_back_at_once() {
    let _serial = SERIAL.lock().await;
    let mut fleet = started_fleet(1, 2, 100, "0", "").await;
    let before = granted_to_others(&fleet, "n1").await.unwrap();
    let stopped_at = Instant::now();
    fleet.signal("n1", "-TERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(is_revoked(&fleet, "n1").await && granted_to_others(&fleet, "n1").await.unwrap_or(0) > before) {
        assert!(Instant::now() < deadline, "n1's allotment never came back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("graceful stop: allotment reallocated after {:?}", stopped_at.elapsed());
    // The lease it renewed last had not run out when it was revoked, so this was the hand-back,
    // not an expiry (which waits for lease + grace).
    let state = fleet.cluster_state().await.expect("state");
    let lease_until_ms = state["nodes"]["n1"]["lease_until_ms"].as_u64().expect("lease");
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!(lease_until_ms > now_ms, "n1 was revoked only after its lease ran out: it did not hand it back");
    assert_eq!(granted_to_others(&fleet, "n1").await.unwrap(), 100, "n2 now holds the whole stock");
}

/// Runs the `small` scenario's load against `target`.
async fn sell_through(target: std::net::SocketAddr, rate_per_s: Option<u64>) -> load::LoadReport {
    load::run(scenario_plan(vec![target], 13, rate_per_s)).await.unwrap()
}

/// Goal: the `small` scenario through real nginx (configured by `seckill lb-config nginx`) in
/// front of three node processes sells exactly the stock, every sale to the buyer told of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_scenario_through_nginx_sells_exactly_the_stock() {
    let _serial = SERIAL.lock().await;
    let fleet = started_fleet(1, 3, 1000, "\"10%\"", "").await;
    let nginx = Nginx::start(&fleet).await;
    let report = sell_through(nginx.addr, None).await;
    let ledger = fleet.ledger();
    let sku = SkuId::new(SKU).unwrap();
    let status = ledger.status(&sku).await.unwrap();
    let orders = ledger.orders(&sku, 0, 100_000).await.unwrap();
    eprintln!("through nginx: {:?} in {:?}; per node {:?}", report.outcomes, report.elapsed, status.sold_by_node);
    assert_eq!((status.sold, status.remaining), (1000, 0));
    assert_eq!(report.count("purchased"), 1000, "{:?}", report.outcomes);
    assert_eq!(orders.iter().map(|o| o.key.as_str()).collect::<HashSet<_>>().len(), 1000, "no key sold twice");
    assert_eq!(status.sold_by_node.len(), 3, "nginx spread the sale over every node: {:?}", status.sold_by_node);
}

/// Goal: with a node SIGKILLed behind nginx mid-sale, clients keep getting answers (nginx routes
/// around the dead node; a request caught in flight gets 502 and is retried with its key) and,
/// once the coordinator has reallocated, the whole stock sells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_behind_nginx_is_routed_around_and_everything_sells() {
    let _serial = SERIAL.lock().await;
    let mut fleet = started_fleet(1, 3, 1000, "\"10%\"", "").await;
    let nginx = Nginx::start(&fleet).await;
    let ledger = fleet.ledger();
    let sku = SkuId::new(SKU).unwrap();
    let load = tokio::spawn(load::run(scenario_plan(vec![nginx.addr], 17, Some(4_000))));
    let deadline = Instant::now() + Duration::from_secs(30);
    while ledger.status(&sku).await.map(|s| s.sold).unwrap_or(0) < 300 {
        assert!(Instant::now() < deadline, "the sale never reached 30%");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    fleet.kill("n1");
    let report = load.await.unwrap().unwrap();
    let status = ledger.status(&sku).await.unwrap();
    eprintln!("n1 killed behind nginx: {:?}; per node {:?}", report.outcomes, status.sold_by_node);
    assert_eq!(report.count("connection_error"), 0, "nginx answered every request: {:?}", report.outcomes);
    assert_eq!(status.sold, 1000, "undersell after the kill: {status:?}");
}

/// Goal: the Grafana dashboard in `ops/` only queries metrics the system really exports.
/// Method: collect every `seckill_*` name in its expressions and find each in the `/metrics`
/// text of a running node and coordinator member (histograms as `_bucket/_sum/_count`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_queries_only_exported_metrics() {
    let _serial = SERIAL.lock().await;
    let fleet = started_fleet(1, 1, 10, "0", "").await;
    // The order service as its own process, on the fleet's config and Redis.
    let orders_addr = SocketAddr::from(([127, 0, 0, 1], testkit::redis::free_port().unwrap()));
    let config = std::fs::read_to_string(fleet.config_path()).unwrap()
        + &format!("\n[orders]\nlisten = \"{orders_addr}\"\nstore = \"sqlite::memory:\"\n");
    let orders_config = fleet.config_path().with_file_name("orders.toml");
    std::fs::write(&orders_config, config).unwrap();
    let mut orders = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["orders", "--config"])
        .arg(&orders_config)
        .env("SECKILL_PAYMENT_SECRET", "dashboard-test-payment-secret")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert_eq!(purchase(fleet.node_addr("n1"), "k", SKU, "u", 1).await.status, 200, "a sale fills the histograms");
    let deadline = Instant::now() + Duration::from_secs(20);
    let orders_metrics = loop {
        let text = match testkit::load::connect(orders_addr).await {
            Ok(_) => String::from_utf8_lossy(&get(orders_addr, "/metrics").await.raw).into_owned(),
            Err(_) => String::new(),
        };
        // The orders-by-state gauge appears once the sale's order is stored.
        if text.lines().any(|line| line.starts_with("seckill_orders{")) || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = orders.kill();
    let _ = orders.wait();
    let exported = format!(
        "{}\n{}\n{orders_metrics}",
        String::from_utf8_lossy(&get(fleet.node_addr("n1"), "/metrics").await.raw),
        String::from_utf8_lossy(&get(fleet.member_addr("c1"), "/metrics").await.raw)
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../ops/grafana-dashboard.json")).expect("dashboard is JSON");
    let mut queried = HashSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("seckill_") {
                    queried.insert(word.to_string());
                }
            }
        }
    }
    assert!(queried.len() >= 10, "the dashboard covers the system: {queried:?}");
    for metric in &queried {
        assert!(exported.lines().any(|line| line.starts_with(metric.as_str())), "{metric} is queried but not exported");
    }
}

/// A purchase through nginx at `lb`, and its order as the order service shows it once stored
/// (or its last answer after 10 s).
async fn buy_and_read_order(lb: &str, key: &str, user: &str) -> (harness::Answer, harness::Answer) {
    let lb: SocketAddr = lb.parse().unwrap();
    // A fleet just started may not hold its allotments yet: 503, and a client retries the key.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut bought = purchase(lb, key, SKU, user, 1).await;
    while bought.status == 503 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        bought = purchase(lb, key, SKU, user, 1).await;
    }
    let order_path = format!("/v1/orders/{}", bought.body["order_id"].as_str().unwrap_or("none"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut order = get(lb, &order_path).await;
    while order.status != 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        order = get(lb, &order_path).await;
    }
    (bought, order)
}

/// One client (from 127.0.0.2) asks nginx for submit tokens for invented users until it is
/// refused; then a buyer from 127.0.0.3 asks for one. Answers (the flooder's last status, the
/// buyer's status). The nodes limit tokens per client address; behind nginx that is the
/// address nginx names in X-Forwarded-For, if the nodes believe nginx.
async fn token_budgets_behind_nginx(lb: SocketAddr) -> (u16, u16) {
    use std::net::{IpAddr, Ipv4Addr};
    let ask = |from: IpAddr, user: String| async move {
        let mut sender = testkit::hogs::http_from(from, lb).await.ok()?;
        let body = format!(r#"{{"sku":"gated","user":"{user}"}}"#);
        let request = hyper::Request::post("/v1/tokens")
            .header("host", lb.to_string())
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .ok()?;
        Some(sender.send_request(request).await.ok()?.status().as_u16())
    };
    let mut flooded = 0;
    for at in 0..100 {
        flooded = ask(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), format!("invented-{at}")).await.unwrap_or(0);
        if flooded == 429 {
            break;
        }
    }
    let buyer = ask(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)), "real-buyer".into()).await.unwrap_or(0);
    (flooded, buyer)
}

/// The buyer presses pay through nginx and pays at the sandbox on `paysim`; answers the order
/// once it is paid (or as it stands after 10 s). Never panics, so the caller stops the fleet
/// before judging.
async fn pay_through_the_sandbox(lb: &str, order_id: &str, user: &str, paysim: u16) -> harness::Answer {
    let lb: SocketAddr = lb.parse().unwrap();
    let within = Duration::from_secs(5);
    let pay_path = format!("/v1/orders/{order_id}/pay");
    let started = testkit::http::post_json(lb, &pay_path, &serde_json::json!({ "user": user }), within).await;
    let payment = match &started {
        Ok((200, started)) => started["payment_id"].as_str().unwrap_or("none").to_string(),
        other => {
            eprintln!("pay through nginx failed: {other:?}");
            "none".into()
        }
    };
    let sandbox = SocketAddr::from(([127, 0, 0, 1], paysim));
    let pay = serde_json::json!({ "outcome": "succeed" });
    let settled = testkit::http::post_json(sandbox, &format!("/v1/payments/{payment}/pay"), &pay, within).await;
    if !matches!(settled, Ok((200, _))) {
        eprintln!("the buyer's pay at the sandbox failed: {settled:?}");
    }
    let path = format!("/v1/orders/{order_id}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut order = get(lb, &path).await;
    while order.body["state"] != "paid" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        order = get(lb, &path).await;
    }
    order
}

/// Runs the `seckill` binary in `dir`, as an operator would there.
fn seckill_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_seckill")).args(args).current_dir(dir).output().unwrap()
}

/// Asks the sentinel on `port` which port the master `name` is on.
fn sentinel_master(port: u16, name: &str) -> Option<u16> {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?.get_connection().ok()?;
    let (_, master): (String, u16) =
        redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(name).query(&mut con).ok()?;
    Some(master)
}

/// `SKU`'s sold count on the Redis at `port`.
fn sold_on(port: u16) -> Option<u64> {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?.get_connection().ok()?;
    redis::cmd("HGET").arg(format!("seckill:{{{SKU}}}:meta")).arg("sold").query(&mut con).ok()
}

/// Goal: with a `redis+sentinel://` ledger URL naming sentinels on this machine, `seckill fleet
/// up` starts a Sentinel group (two data nodes, three sentinels) before the rest of the fleet
/// and sells through it with `durability = "replica"`; `fleet down` stops it all; and a later
/// `fleet up` on the same run directory brings the group back in the roles a failover left it
/// in, with its sales (its processes start from config files Redis and Sentinel rewrite).
/// Method: up, a purchase through nginx, `SENTINEL FAILOVER` by hand until every sentinel names
/// the other data node, down, up again: the sentinels still name the promoted node, it holds the
/// sale, and a second purchase sells; down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_up_runs_a_sentinel_group_whose_roles_and_sales_outlive_down_and_up() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let port = || testkit::redis::free_port().unwrap();
    let sentinels = [port(), port(), port()];
    let lb = port();
    let urls: Vec<String> = sentinels.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let config = format!(
        "[ledger]\nurl = \"redis+sentinel://{}/ledger\"\ndurability = \"replica\"\nreplicas = 1\n\
         replica_timeout_ms = 300\ncall_timeout_ms = 1000\n\n[node_settings]\nconfirm_timeout_ms = 3000\n\n\
         [[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:{}\"\n\n{}",
        urls.join(","),
        port(),
        sku_toml(100, "0")
    );
    std::fs::write(dir.path().join("cluster.toml"), config).unwrap();
    let lb_addr = format!("127.0.0.1:{lb}");
    let up = || {
        seckill_in(dir.path(), &["fleet", "up", "--config", "cluster.toml", "--run-dir", "run", "--listen", &lb_addr])
    };
    let down = || seckill_in(dir.path(), &["fleet", "down", "--run-dir", "run"]);
    let first = up();
    let pids = std::fs::read_to_string(dir.path().join("run/pids")).unwrap_or_default();
    if !first.status.success() {
        down();
        panic!("fleet up failed: {}", String::from_utf8_lossy(&first.stderr));
    }
    let kinds: Vec<&str> = pids.lines().filter_map(|l| l.split_whitespace().next()).collect();
    let bought = purchase(lb_addr.parse().unwrap(), "first", SKU, "ann", 1).await;
    let old_master = sentinel_master(sentinels[0], "ledger");
    let failover: Result<String, _> = redis::Client::open(format!("redis://127.0.0.1:{}", sentinels[0]))
        .and_then(|client| client.get_connection())
        .and_then(|mut con| redis::cmd("SENTINEL").arg("FAILOVER").arg("ledger").query(&mut con));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut promoted = None;
    while Instant::now() < deadline && promoted.is_none() {
        let named: Vec<Option<u16>> = sentinels.iter().map(|p| sentinel_master(*p, "ledger")).collect();
        if named[0].is_some() && named[0] != old_master && named.iter().all(|n| *n == named[0]) {
            promoted = named[0];
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first_down = down();

    let second = up();
    let second_pids = std::fs::read_to_string(dir.path().join("run/pids")).unwrap_or_default();
    let master_after = sentinel_master(sentinels[0], "ledger");
    let sold_after = master_after.and_then(sold_on);
    let bought_after = purchase(lb_addr.parse().unwrap(), "second", SKU, "bob", 1).await;
    let second_down = down();

    assert_eq!(kinds, ["redis", "redis", "sentinel", "sentinel", "sentinel", "node", "orders", "nginx"], "{pids}");
    assert_eq!(bought.status, 200, "the fleet sells through the Sentinel group: {bought:?}");
    assert!(failover.is_ok(), "SENTINEL FAILOVER: {failover:?}");
    assert!(promoted.is_some(), "the sentinels promoted the replica (the master was {old_master:?})");
    assert!(first_down.status.success(), "fleet down failed: {}", String::from_utf8_lossy(&first_down.stderr));
    assert!(second.status.success(), "the second fleet up failed: {}", String::from_utf8_lossy(&second.stderr));
    assert_eq!(master_after, promoted, "the group comes back in the roles the failover left");
    assert_eq!(sold_after, Some(1), "the promoted master kept the sale");
    assert_eq!(bought_after.status, 200, "the group sells again: {bought_after:?}");
    assert!(second_down.status.success(), "fleet down failed: {}", String::from_utf8_lossy(&second_down.stderr));
    for pid in second_pids.lines().filter_map(|l| l.split_whitespace().nth(2)) {
        let alive =
            std::process::Command::new("kill").args(["-0", pid]).stderr(std::process::Stdio::null()).status().unwrap();
        assert!(!alive.success(), "process {pid} survived fleet down");
    }
}

/// Goal: `seckill fleet up` starts Redis, the coordinator, the nodes, a private PostgreSQL, the
/// order service and nginx from one config, ready to sell through nginx, with the sale's order visible through nginx too;
/// `seckill fleet down` stops every one of them. The config names no password: `fleet up` draws
/// one for Redis and one for PostgreSQL, which refuse anyone without them, and no password shows
/// in a command line, a log or its own output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_up_and_down_run_the_whole_fleet_from_one_config() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let port = || testkit::redis::free_port().unwrap();
    let (redis, member, lb, orders, postgres, paysim) = (port(), port(), port(), port(), port(), port());
    let (n1, n2) = (port(), port());
    let config = format!(
        "[ledger]\nurl = \"redis://127.0.0.1:{redis}\"\n\n[orders]\nstore = \"postgres://seckill@127.0.0.1:{postgres}/seckill\"\nlisten = \"127.0.0.1:{orders}\"\n\n\
         [payments]\nprovider = \"sandbox\"\nurl = \"http://127.0.0.1:{paysim}\"\n\n[coordinator]\nmembers = [{{ name = \"c1\", listen = \"127.0.0.1:{member}\" }}]\n\
         data_dir = {:?}\n{}\n[[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:{}\"\n\n[[nodes]]\nid = \"n2\"\nlisten = \"127.0.0.1:{}\"\n\n{}",
        dir.path().join("run/raft"),
        testkit::fleet::COORDINATOR_TIMINGS,
        n1,
        n2,
        sku_toml(100, "0") + "\nprice = 1999\n\n[[skus]]\nid = \"gated\"\ntotal = 10\nrequire_token = true\n"
    );
    std::fs::write(dir.path().join("cluster.toml"), config).unwrap();
    let seckill = |args: &[&str]| seckill_in(dir.path(), args);
    let lb_addr = format!("127.0.0.1:{lb}");
    let up = seckill(&["fleet", "up", "--config", "cluster.toml", "--run-dir", "run", "--listen", &lb_addr]);
    let pids = std::fs::read_to_string(dir.path().join("run/pids")).unwrap_or_default();
    let stop = || seckill(&["fleet", "down", "--run-dir", "run"]);
    if !up.status.success() {
        stop();
        panic!("fleet up failed: {}", String::from_utf8_lossy(&up.stderr));
    }
    let kinds: Vec<&str> = pids.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(kinds, ["redis", "coordinator", "node", "node", "postgres", "paysim", "orders", "nginx"], "{pids}");

    let (bought, order) = buy_and_read_order(&lb_addr, "via-lb", "ann").await;
    let paid = pay_through_the_sandbox(&lb_addr, order.body["id"].as_str().unwrap_or("none"), "ann", paysim).await;
    let my_orders = get(lb_addr.parse().unwrap(), "/v1/me/orders").await;
    let (flooded, buyer_token) = token_budgets_behind_nginx(lb_addr.parse().unwrap()).await;
    // Twice: the second answer comes from nginx's cache, which its workers write under the run
    // directory (as root they would be nobody, locked out of this test's private temp dir).
    let pages =
        [get(lb_addr.parse().unwrap(), "/v1/skus/phone").await, get(lb_addr.parse().unwrap(), "/v1/skus/phone").await];
    // An operator with nothing exported: told which variable is missing and where `up` keeps
    // it; with --run-dir, reconcile and admin find every secret they need.
    let reconcile_bare = seckill(&["reconcile", "--config", "cluster.toml"]);
    let reconcile = seckill(&["reconcile", "--config", "cluster.toml", "--run-dir", "run"]);
    let admin = seckill(&["admin", "--config", "cluster.toml", "--run-dir", "run", "cluster"]);
    // One node restarted as `up` started it: the pid file follows, and it sells again.
    let before = std::fs::read_to_string(dir.path().join("run/pids")).unwrap_or_default();
    let restart = seckill(&["fleet", "restart", "n1", "--run-dir", "run"]);
    let after = std::fs::read_to_string(dir.path().join("run/pids")).unwrap_or_default();
    // Granted within a control tick or so of being ready: a 503 until then is the retry rule.
    let n1_addr: SocketAddr = format!("127.0.0.1:{n1}").parse().unwrap();
    let mut restarted = purchase(n1_addr, "after-restart", SKU, "cy", 1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while restarted.status == 503 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        restarted = purchase(n1_addr, "after-restart", SKU, "cy", 1).await;
    }
    // As root, the fleet's PostgreSQL keeps its cluster under the temp dir (see src/fleet/mod.rs).
    let postgres_dir =
        [std::env::temp_dir().join(format!("seckill-fleet-postgres-{postgres}")), dir.path().join("run/postgres")]
            .into_iter()
            .find(|dir| dir.join("data").exists());
    let locked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let kept = credentials::kept_passwords(&dir.path().join("run"));
        credentials::assert_redis_locked(redis, &kept.redis);
        let data = postgres_dir.as_ref().expect("the fleet's PostgreSQL cluster").join("data");
        credentials::assert_postgres_locked(postgres, &kept.postgres, &[], &data);
        credentials::assert_no_argv_holds(&after, &[&kept.redis, &kept.postgres]);
        kept
    }));
    let down = stop();
    let kept = locked.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    let secrets = [kept.redis.as_str(), kept.postgres.as_str()];
    let mut logs = vec![dir.path().join("run/logs")];
    logs.extend(postgres_dir.as_ref().map(|dir| dir.join("postgres.log")));
    credentials::assert_no_log_holds(&logs, &secrets);
    for output in [&up, &down] {
        let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(secrets.iter().all(|secret| !said.contains(secret)), "fleet up/down printed a password");
    }
    assert_eq!(bought.status, 200, "the fleet sells through nginx: {bought:?}");
    assert_eq!(order.status, 200, "the order is visible through nginx: {order:?}");
    assert_eq!(order.body["state"], "pending_payment", "{order:?}");
    assert_eq!(order.body["user"], "ann");
    assert_eq!(paid.body["state"], "paid", "the buyer paid through the sandbox fleet up started: {paid:?}");
    // Answered by the order service (no verified buyer under [auth] mode = "none"), not 404
    // from a node: nginx routes the route.
    assert_eq!((my_orders.status.as_u16(), my_orders.error()), (400, "no_buyer"), "{my_orders:?}");
    let said = |output: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
    };
    assert!(!reconcile_bare.status.success(), "reconcile without the token: {}", said(&reconcile_bare));
    assert!(
        said(&reconcile_bare).contains("SECKILL_CLUSTER_TOKEN") && said(&reconcile_bare).contains("--run-dir"),
        "the error names the variable and where to find it: {}",
        said(&reconcile_bare)
    );
    assert!(reconcile.status.success(), "reconcile --run-dir against fleet up: {}", said(&reconcile));
    assert!(admin.status.success(), "admin --run-dir against fleet up: {}", said(&admin));
    assert!(restart.status.success(), "fleet restart n1: {}", said(&restart));
    let pid_of = |pids: &str| pids.lines().find(|line| line.starts_with("node n1 ")).map(str::to_string);
    assert!(pid_of(&after).is_some() && pid_of(&before) != pid_of(&after), "the pid file names the new n1: {after}");
    assert_eq!(restarted.status, 200, "the restarted node sells: {restarted:?}");
    assert_eq!(flooded, 429, "the flooding client ran out of tokens at its own address");
    assert_eq!(buyer_token, 201, "a buyer behind the same nginx keeps a token budget of its own");
    for page in &pages {
        assert_eq!(page.status, 200, "the stock page through nginx: {page:?}");
    }
    assert!(down.status.success(), "fleet down failed: {}", String::from_utf8_lossy(&down.stderr));
    for pid in pids.lines().chain(after.lines()).filter_map(|l| l.split_whitespace().nth(2)) {
        let alive =
            std::process::Command::new("kill").args(["-0", pid]).stderr(std::process::Stdio::null()).status().unwrap();
        assert!(!alive.success(), "process {pid} survived fleet down: {pids}{after}");
    }
    assert!(!dir.path().join("run/pids").exists(), "fleet down forgets the fleet");
    assert!(dir.path().join("run/redis").read_dir().unwrap().next().is_some(), "Redis kept its AOF");

    // Up again on the same run directory, the operator now giving PostgreSQL's password: Redis'
    // kept one is found again, the role takes the new one (the old is refused), orders flow.
    let rotated = "rotated-postgres-password-0123456789";
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["fleet", "up", "--config", "cluster.toml", "--run-dir", "run", "--listen", &lb_addr])
        .env(seckill::config::POSTGRES_PASSWORD_ENV, rotated)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let pids = std::fs::read_to_string(dir.path().join("run/pids")).unwrap_or_default();
    let (bought, order) = buy_and_read_order(&lb_addr, "again", "bob").await;
    let locked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(again.status.success(), "the second fleet up failed: {}", String::from_utf8_lossy(&again.stderr));
        credentials::assert_redis_locked(redis, &kept.redis);
        let data = postgres_dir.as_ref().expect("the fleet's PostgreSQL cluster").join("data");
        credentials::assert_postgres_locked(postgres, rotated, &[&kept.postgres], &data);
        credentials::assert_no_argv_holds(&pids, &[&kept.redis, rotated]);
    }));
    let down = stop();
    locked.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert_eq!(bought.status, 200, "the fleet sells again: {bought:?}");
    assert_eq!(order.status, 200, "the order service stores with the new password: {order:?}");
    assert!(down.status.success(), "fleet down failed: {}", String::from_utf8_lossy(&down.stderr));
    credentials::assert_no_log_holds(&logs, &[&kept.redis, rotated]);
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("seckill-fleet-postgres-{postgres}")));
}

/// Goal: a `fleet up` that fails midway stops what it had started (issue 23: a failure after
/// Redis, the members and the nodes were up left them running with nothing in front). Method: a
/// fleet whose order service cannot open its store, so `up` fails waiting for it after Redis and
/// the node started; then nothing listens on their ports and no fleet is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_up_that_fails_midway_stops_what_it_started() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let port = || testkit::redis::free_port().unwrap();
    let (redis, node, orders, lb) = (port(), port(), port(), port());
    let config = format!(
        "[ledger]\nurl = \"redis://127.0.0.1:{redis}\"\n\n[orders]\nstore = \"sqlite:{}/no/such/dir/orders.db\"\n\
         listen = \"127.0.0.1:{orders}\"\n\n[[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:{node}\"\n\n{}",
        dir.path().display(),
        sku_toml(10, "0")
    );
    std::fs::write(dir.path().join("cluster.toml"), config).unwrap();
    let lb_addr = format!("127.0.0.1:{lb}");
    let up =
        seckill_in(dir.path(), &["fleet", "up", "--config", "cluster.toml", "--run-dir", "run", "--listen", &lb_addr]);
    let said = String::from_utf8_lossy(&up.stderr);
    if up.status.success() {
        seckill_in(dir.path(), &["fleet", "down", "--run-dir", "run"]);
        panic!("fleet up must fail when its order service cannot start");
    }
    assert!(said.contains("stopped what it had started"), "{said}");
    for (what, port) in [("redis", redis), ("node n1", node)] {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "{what} still listens on {port} after the failed up"
        );
    }
    assert!(!dir.path().join("run/pids").exists(), "no fleet is recorded");
    assert!(dir.path().join("run/logs/redis.log").exists(), "Redis had started before the failure");
}
