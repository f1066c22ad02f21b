//! The nemesis in CI: a short run of randomized fault schedules against real processes of this
//! binary, judged by its checker (docs/reliability.md); a Redis master's failover on Sentinel and
//! on Redis Cluster, judged the same way; and the one property of its fleet the
//! nemesis depends on and cannot check itself, that a node stays behind its proxies when it
//! follows a follower's hint to a new leader.
//!
//! These tests run one at a time (each starts seven processes whose leases are timed), behind
//! `SERIAL`.

// A test reads as one scenario from its set-up to its last check: the 70-line bound
// (too_many_lines) is for the code under test.
#![allow(clippy::too_many_lines)]

use std::time::{Duration, Instant};

use nemesis::ViolationKind;
use testkit::fleet::{Fleet, FleetSpec};
use testkit::proxy::Fault;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Schedules of the short run: a handful, about a minute each on 2 cores (buyers pay, so the
/// order service settles payments and refunds before the verdict). Seeds 11 to 14 cover the
/// setups: a run-time SKU (11, 13, 14), a short idempotency TTL with key reuse (13), skewed
/// order-service clocks (11, 13). `SECKILL_NEMESIS_SCHEDULES`
/// runs more.
const SCHEDULES: usize = 4;

/// The short run's first seed, so CI replays the same schedules; `SECKILL_NEMESIS_SEED` draws
/// others.
const SEED: u64 = 11;

/// Violation kinds the checker may still report without failing the run: none. Every defect it
/// found is fixed on main, each with its own test; the last, `stale_replay` (seed 101: a node
/// replayed a key's earlier sale after the ledger's idempotency TTL), by nodes forgetting a
/// sold key once the ledger does (`tests/cluster/idempotency.rs`). The short run's seed 13
/// reuses keys after a 12 s TTL.
const KNOWN_DEFECTS: [ViolationKind; 0] = [];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Goal: no schedule of the short run breaks a promise beyond the known defects. Method:
/// `nemesis::run` with the binary under test, a few schedules of 10 s of faults each; the
/// report (every violation with its seed, timeline and history lines) is printed either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_nemesis_breaks_no_promise_beyond_the_known_defects() {
    let _serial = SERIAL.lock().await;
    let options = nemesis::Options {
        exe: env!("CARGO_BIN_EXE_seckill").into(),
        seed: env_or("SECKILL_NEMESIS_SEED", SEED),
        schedules: env_or("SECKILL_NEMESIS_SCHEDULES", SCHEDULES),
        nodes: 3,
        fault_phase: Duration::from_secs(10),
        out: std::env::var_os("SECKILL_NEMESIS_OUT").map(Into::into),
        redis: nemesis::RedisLayout::Single,
        verified_buyers: true,
        stripes: 1,
        waiting_room: true,
    };
    let report = nemesis::run(&options, |_| {}).await.expect("the nemesis ran");
    eprintln!("{}", report.render());
    assert!(report.errors.is_empty(), "schedules that could not run: {:?}", report.errors);
    let failing = report.failing_seeds(&KNOWN_DEFECTS);
    assert!(
        failing.is_empty(),
        "violations beyond the known defects in the schedules with seeds {failing:?} (replay one with `seckill \
         nemesis --seed SEED --schedules 1`); see the report above"
    );
}

/// A seed whose schedule kills the Redis master (and, at once, all nodes but one): on
/// replicated Redis, a failover.
const FAILOVER_SEED: u64 = 31;

/// Goal: with `durability = "replica"`, a failover of the Redis master that takes the SKU's
/// writes breaks no promise, on a Sentinel group and on a Redis Cluster with replicas. Method:
/// the schedule of [`FAILOVER_SEED`] on each layout; its failover must have happened (not
/// been skipped) and the checker find nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_master_failover_breaks_no_promise_on_sentinel_or_cluster() {
    let _serial = SERIAL.lock().await;
    for redis in [nemesis::RedisLayout::Cluster, nemesis::RedisLayout::Sentinel] {
        let options = nemesis::Options {
            exe: env!("CARGO_BIN_EXE_seckill").into(),
            seed: FAILOVER_SEED,
            schedules: 1,
            nodes: 3,
            fault_phase: Duration::from_secs(10),
            out: std::env::var_os("SECKILL_NEMESIS_OUT").map(Into::into),
            redis,
            verified_buyers: true,
            stripes: 1,
            waiting_room: true,
        };
        let report = nemesis::run(&options, |_| {}).await.expect("the nemesis ran");
        eprintln!("{}", report.render());
        assert!(report.errors.is_empty(), "{redis:?}: the schedule could not run: {:?}", report.errors);
        assert_eq!(report.faults_by_kind.get("redis_failover"), Some(&1), "{redis:?}: the schedule fails over once");
        let failing = report.failing_seeds(&KNOWN_DEFECTS);
        assert!(
            failing.is_empty(),
            "{redis:?}: violations (replay with `seckill nemesis --{} --seed {FAILOVER_SEED} --schedules 1 \
             --duration-s 10`); see the report above",
            if redis == nemesis::RedisLayout::Cluster { "redis-cluster" } else { "sentinel" }
        );
    }
}

/// Goal: a node that follows a follower's "the leader is at <addr>" still reaches the new
/// leader through its own proxy, so the nemesis's link faults keep holding after a leader
/// change. Method: a proxied fleet; kill the leader; ask the remaining follower, through n1's
/// proxy, for the leader: the hint must name n1's proxy to it. Then blackhole every member
/// proxy of n1: n1 must lose its lease (`/ready` 503) while n2 keeps its; pass again and n1 is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stays_behind_its_proxies_after_a_leader_change() {
    let _serial = SERIAL.lock().await;
    let skus = "[[skus]]\nid = \"phone\"\ntotal = 100\n";
    let mut spec = FleetSpec::new(env!("CARGO_BIN_EXE_seckill"), 3, 2, skus);
    spec.proxied = true;
    let mut fleet = Fleet::start(&spec).await.expect("fleet");
    fleet.start_all().expect("processes start");
    fleet.wait_ready(Duration::from_secs(30)).await.expect("nodes ready");
    let old = fleet.leader().await.expect("a leader");
    fleet.kill(&old).expect("kill the leader");
    let deadline = Instant::now() + Duration::from_secs(20);
    let new = loop {
        if let Some(leader) = fleet.leader().await.filter(|l| *l != old) {
            break leader;
        }
        assert!(Instant::now() < deadline, "no new leader after killing {old}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // A follower's hint, as n1 receives it through its proxy, names n1's proxy to the leader.
    let links = fleet.links("n1").expect("n1's proxies");
    let follower = fleet.member_names().into_iter().find(|m| *m != old && *m != new).expect("a follower");
    let leave = serde_json::json!({ "version": protocol::PROTOCOL_VERSION, "node": "probe", "epoch": 0 });
    // A member answers `/api/*` only to a caller with the cluster token.
    let via = links.members[&follower].addr();
    let token = Some(testkit::fleet::TEST_CLUSTER_TOKEN);
    let (status, refusal) =
        testkit::http::send_json(hyper::Method::POST, via, "/api/leave", &leave, token, Duration::from_secs(2))
            .await
            .expect("the follower answers through n1's proxy");
    assert_eq!(status, 421, "{refusal}");
    assert_eq!(refusal["leader"], links.members[&new].addr().to_string(), "the hint names n1's proxy to {new}");
    // Both nodes renew with the new leader, and only through their proxies: cut them, and n1
    // loses its lease.
    fleet.wait_ready(Duration::from_secs(20)).await.expect("nodes ready under the new leader");
    for proxy in links.members.values() {
        proxy.set(Fault::Blackhole);
    }
    let n1 = fleet.addr("n1").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = testkit::http::get(n1, "/ready", Duration::from_secs(1)).await.expect("n1 answers");
        if status == 503 {
            break;
        }
        assert!(Instant::now() < deadline, "n1 kept its lease with every coordinator link blackholed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fleet.wait_node_ready("n2", Duration::from_secs(5)).await.expect("n2 keeps its lease");
    for proxy in fleet.links("n1").unwrap().members.values() {
        proxy.set(Fault::Pass);
    }
    fleet.wait_node_ready("n1", Duration::from_secs(20)).await.expect("n1 back once its links pass");
}
