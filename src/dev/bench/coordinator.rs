//! `seckill bench coordinator`: what the coordinator group costs as the fleet grows. A real
//! three-member group (`seckill coordinator` processes on a private Redis) and, per size, that
//! many simulated nodes in this process: each registers, then heartbeats every `heartbeat_ms`
//! with a report of the one SKU, as a node does, but serves no purchases.
//!
//! Per size, at steady state (every node registered, the top-ups done): raft entries/s and log
//! fsyncs/s on the leader, the leader process's CPU, heartbeat latency; then one node goes
//! silent and the time from its last answered heartbeat until the leader has expired it and
//! reallocated its units (the bound the lease promises: lease + grace + 1 s).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use protocol::credential::Secret;
use protocol::{CoordinatorClient, HeartbeatRequest, LeaseAnswer, NodeId, RegisterRequest, SkuId, SkuReport};
use serde::Serialize;
use testkit::fleet::{Fleet, FleetSpec};

const SKU: &str = "bench-coord";
/// The lease timings of a default `cluster.toml`: what a user runs.
const HEARTBEAT_MS: u64 = 250;
const LEASE_MS: u64 = 2_000;
const GRACE_MS: u64 = 500;
/// Units per simulated node, so every node holds some and a dead one has units to move.
const UNITS_PER_NODE: u64 = 100;
/// Longest the group may take to register every node and settle its grants.
const SETTLE_MAX: Duration = Duration::from_secs(60);
/// Longest one `/api/state` or `/metrics` read may take.
const PROBE_MAX: Duration = Duration::from_secs(5);
/// Steady windows tried before a size is given up for leader changes.
const WINDOW_TRIES: usize = 3;
/// Longest a dead node's reallocation is waited for before the size is reported as failed.
const REALLOCATION_MAX: Duration = Duration::from_secs(30);

/// What to run.
pub struct CoordinatorPlan {
    /// Simulated nodes per size.
    pub sizes: Vec<usize>,
    /// Seconds of steady state measured per size.
    pub steady_s: f64,
    /// The binary the members run (this one unless told: another build's coordinator, measured
    /// by the same harness).
    pub member_exe: PathBuf,
}

/// One fleet size.
#[derive(Debug, Serialize)]
pub struct SizeReport {
    pub nodes: usize,
    /// Raft log entries appended per second at steady state (the leader's last log index).
    pub raft_writes_per_s: f64,
    /// fsyncs of the leader's raft log and vote per second at steady state (none: the members'
    /// build does not count them).
    pub fsyncs_per_s: Option<f64>,
    /// The leader process's CPU, percent of one core, at steady state.
    pub leader_cpu_percent: f64,
    pub heartbeats_per_s: f64,
    pub heartbeat_p50_ms: f64,
    pub heartbeat_p99_ms: f64,
    /// Heartbeats that failed or were refused at steady state.
    pub heartbeat_failures: u64,
    /// From a node's last answered heartbeat to its units granted to others.
    pub detect_and_reallocate_ms: Option<f64>,
    /// lease + grace + 1 s: what the lease protocol promises.
    pub bound_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct CoordinatorBench {
    pub heartbeat_ms: u64,
    pub lease_ms: u64,
    pub grace_ms: u64,
    pub steady_s: f64,
    pub sizes: Vec<SizeReport>,
}

impl CoordinatorBench {
    pub fn render(&self) -> String {
        let mut out = format!(
            "3 members, heartbeat {} ms, lease {} ms, grace {} ms; {:.0} s of steady state per size\n\n\
             {:>6} {:>12} {:>9} {:>10} {:>12} {:>8} {:>8} {:>6} {:>22}\n",
            self.heartbeat_ms,
            self.lease_ms,
            self.grace_ms,
            self.steady_s,
            "nodes",
            "raft writes/s",
            "fsyncs/s",
            "leader CPU",
            "heartbeats/s",
            "p50 ms",
            "p99 ms",
            "failed",
            "dead node reallocated"
        );
        for size in &self.sizes {
            let reallocated = match size.detect_and_reallocate_ms {
                Some(ms) => format!("{:.0} ms (bound {})", ms, size.bound_ms),
                None => format!("not within {} s", REALLOCATION_MAX.as_secs()),
            };
            let fsyncs = size.fsyncs_per_s.map_or("n/a".to_string(), |fsyncs| format!("{fsyncs:.1}"));
            out.push_str(&format!(
                "{:>6} {:>12.1} {:>9} {:>9.1}% {:>12.0} {:>8.2} {:>8.2} {:>6} {:>22}\n",
                size.nodes,
                size.raft_writes_per_s,
                fsyncs,
                size.leader_cpu_percent,
                size.heartbeats_per_s,
                size.heartbeat_p50_ms,
                size.heartbeat_p99_ms,
                size.heartbeat_failures,
                reallocated
            ));
        }
        out
    }
}

pub async fn run(plan: &CoordinatorPlan) -> anyhow::Result<CoordinatorBench> {
    anyhow::ensure!(!plan.sizes.is_empty(), "--nodes names no size");
    anyhow::ensure!(
        plan.sizes.iter().all(|size| (2..=1_000).contains(size)),
        "--nodes: each size must be 2..=1000 (worker ids are 10 bits)"
    );
    let bar = testkit::progress::steps(plan.sizes.len() as u64, "fleet sizes");
    let mut sizes = Vec::new();
    for &nodes in &plan.sizes {
        bar.set_message(format!("{nodes} nodes"));
        sizes.push(measure_size(plan, nodes).await.with_context(|| format!("{nodes} simulated nodes"))?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(CoordinatorBench {
        heartbeat_ms: HEARTBEAT_MS,
        lease_ms: LEASE_MS,
        grace_ms: GRACE_MS,
        steady_s: plan.steady_s,
        sizes,
    })
}

/// One simulated node's share of the run.
struct Simulated {
    /// Set when the node's units are known to the leader; cleared to silence it.
    beating: AtomicBool,
    /// Instant of its last answered heartbeat's send, as ms since the run's origin.
    last_answered_ms: AtomicU64,
}

/// Heartbeat latencies and failures, recorded only while `recording` is set.
struct Latencies {
    recording: AtomicBool,
    histogram: Mutex<Histogram<u64>>,
    failed: AtomicU64,
}

impl Latencies {
    fn reset(&self) -> anyhow::Result<()> {
        self.histogram.lock().map_err(|_| anyhow::anyhow!("latency histogram poisoned"))?.reset();
        self.failed.store(0, Ordering::Relaxed);
        Ok(())
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one fleet size measured start to end (config, members, nodes, steady state, figures); lab code"
)]
async fn measure_size(plan: &CoordinatorPlan, nodes: usize) -> anyhow::Result<SizeReport> {
    let skus = format!(
        "[[skus]]\nid = \"{SKU}\"\ntotal = {}\nper_user_limit = 1\nbuffer = 0\n",
        nodes as u64 * UNITS_PER_NODE
    );
    // A config names at least one node; `n1` is never started, so after the start-up window
    // (two leases) the top-up grants its planned share to the simulated nodes.
    let mut spec = FleetSpec::new(&plan.member_exe, 3, 1, skus);
    spec.coordinator_toml =
        format!("heartbeat_ms = {HEARTBEAT_MS}\nlease_ms = {LEASE_MS}\ngrace_ms = {GRACE_MS}\nfence_margin_ms = 300\n");
    spec.rust_log = "warn,openraft=error".to_string();
    let mut fleet = Fleet::start(&spec).await?;
    for member in fleet.member_names() {
        fleet.start_process(&member)?;
    }
    let leader = wait_for_leader(&fleet).await?;
    let members: Vec<String> =
        fleet.member_names().iter().filter_map(|m| Some(fleet.addr(m).ok()?.to_string())).collect();
    let token = Secret::new(&spec.cluster_token).map_err(|e| anyhow::anyhow!("the fleet's cluster token: {e}"))?;

    let origin = Instant::now();
    let latencies = Arc::new(Latencies {
        recording: AtomicBool::new(false),
        histogram: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3)?),
        failed: AtomicU64::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let mut simulated = Vec::new();
    let mut tasks = Vec::new();
    for at in 1..=nodes {
        let node = NodeId::new(&format!("sim{at}")).map_err(|e| anyhow::anyhow!("{e}"))?;
        let sim = Arc::new(Simulated { beating: AtomicBool::new(true), last_answered_ms: AtomicU64::new(0) });
        let client = Arc::new(CoordinatorClient::new(members.clone(), token.clone()));
        // Spread the first registrations over one period, as a fleet started by hand would be.
        let offset = Duration::from_millis(HEARTBEAT_MS * at as u64 / nodes as u64);
        tasks.push(tokio::spawn(simulate(node, client, sim.clone(), latencies.clone(), stop.clone(), origin, offset)));
        simulated.push(sim);
    }

    let outcome = async {
        wait_until_settled(&fleet, &leader, nodes).await?;
        // Steady state: everything registered and granted; only heartbeats flow.
        // A leader change mid-window (an election on a busy machine) spoils the sample: measure
        // again, a few times at most.
        let mut attempt = 0;
        let (before, after) = loop {
            attempt += 1;
            let leader = wait_for_leader(&fleet).await?;
            let leader_pid = fleet.pid(&leader).context("the leader's process id")?;
            let before = Sample::take(&fleet, &leader, leader_pid).await?;
            latencies.recording.store(true, Ordering::Release);
            tokio::time::sleep(Duration::from_secs_f64(plan.steady_s)).await;
            latencies.recording.store(false, Ordering::Release);
            let after = Sample::take(&fleet, &leader, leader_pid).await?;
            if wait_for_leader(&fleet).await? == leader {
                break (before, after);
            }
            anyhow::ensure!(attempt < WINDOW_TRIES, "the leader changed in {WINDOW_TRIES} steady windows in a row");
            latencies.reset()?;
        };
        let leader = before.leader.clone();
        let seconds = after.at.duration_since(before.at).as_secs_f64();
        let reallocated = time_reallocation(&fleet, &leader, &simulated[0], origin).await?;
        let histogram = latencies.histogram.lock().map_err(|_| anyhow::anyhow!("latency histogram poisoned"))?;
        let ms = |quantile: f64| histogram.value_at_quantile(quantile) as f64 / 1000.0;
        Ok(SizeReport {
            nodes,
            raft_writes_per_s: after.last_log_index.saturating_sub(before.last_log_index) as f64 / seconds,
            fsyncs_per_s: after.fsyncs.zip(before.fsyncs).map(|(after, before)| (after - before).max(0.0) / seconds),
            leader_cpu_percent: (after.cpu_s - before.cpu_s) / seconds * 100.0,
            heartbeats_per_s: histogram.len() as f64 / seconds,
            heartbeat_p50_ms: ms(0.5),
            heartbeat_p99_ms: ms(0.99),
            heartbeat_failures: latencies.failed.load(Ordering::Relaxed),
            detect_and_reallocate_ms: reallocated,
            bound_ms: LEASE_MS + GRACE_MS + 1_000,
        })
    }
    .await;
    stop.store(true, Ordering::Release);
    for task in tasks {
        let _ = task.await;
    }
    drop(fleet);
    outcome
}

/// One node: register, then heartbeat every period with a report of what it holds.
async fn simulate(
    node: NodeId,
    client: Arc<CoordinatorClient>,
    sim: Arc<Simulated>,
    latencies: Arc<Latencies>,
    stop: Arc<AtomicBool>,
    origin: Instant,
    offset: Duration,
) {
    tokio::time::sleep(offset).await;
    let sku = SkuId::new(SKU).ok();
    let mut epoch = 0;
    let mut granted = 0;
    let mut ticker = tokio::time::interval(Duration::from_millis(HEARTBEAT_MS));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Acquire) {
        ticker.tick().await;
        if !sim.beating.load(Ordering::Acquire) {
            continue;
        }
        let sent = Instant::now();
        let answer = if epoch == 0 {
            let request = RegisterRequest {
                version: protocol::PROTOCOL_VERSION,
                node: node.clone(),
                addr: "127.0.0.1:1".to_string(),
                instance: fastrand::u64(1..),
            };
            client.register(&request).await
        } else {
            let reports: BTreeMap<SkuId, SkuReport> = sku
                .iter()
                .map(|sku| {
                    let report = SkuReport::new(granted, granted, 0);
                    (sku.clone(), report)
                })
                .collect();
            let request = HeartbeatRequest { version: protocol::PROTOCOL_VERSION, node: node.clone(), epoch, reports };
            client.heartbeat(&request).await
        };
        let recording = latencies.recording.load(Ordering::Acquire);
        match answer {
            Ok(LeaseAnswer::Assigned(assignment)) => {
                epoch = assignment.epoch;
                granted = sku.as_ref().and_then(|sku| assignment.granted.get(sku)).copied().unwrap_or(0);
                sim.last_answered_ms.store(sent.duration_since(origin).as_millis() as u64, Ordering::Release);
                if recording {
                    let micros = sent.elapsed().as_micros().max(1) as u64;
                    if let Ok(mut histogram) = latencies.histogram.lock() {
                        let _ = histogram.record(micros);
                    }
                }
            }
            Ok(_) => {
                epoch = 0;
                if recording {
                    latencies.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) if recording => {
                latencies.failed.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }
}

/// What the leader has done and spent so far.
struct Sample {
    leader: String,
    at: Instant,
    last_log_index: u64,
    /// None: the members' build does not count them.
    fsyncs: Option<f64>,
    cpu_s: f64,
}

impl Sample {
    async fn take(fleet: &Fleet, leader: &str, pid: u32) -> anyhow::Result<Sample> {
        let at = Instant::now();
        let cpu_s = process_cpu_seconds(pid)?;
        let status = fleet.member_status(leader).await.context("the leader's /api/state")?;
        let last_log_index = status["last_log_index"].as_u64().unwrap_or(0);
        let addr = fleet.addr(leader)?;
        let fsyncs = metric(addr, &format!("seckill_coordinator_log_fsyncs_total{{member=\"{leader}\"}}")).await?;
        Ok(Sample { leader: leader.to_string(), at, last_log_index, fsyncs, cpu_s })
    }
}

/// A series' value from a member's `/metrics`; none when absent (a build without the series).
async fn metric(addr: SocketAddr, series: &str) -> anyhow::Result<Option<f64>> {
    let (_, body) = testkit::http::get(addr, "/metrics", PROBE_MAX).await?;
    let text = String::from_utf8_lossy(&body);
    Ok(text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok()))
}

/// User + system CPU seconds of a process, from `/proc/<pid>/stat` (fields 14 and 15, in clock
/// ticks of 1/100 s on Linux).
fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    const TICKS_PER_S: f64 = 100.0;
    let stat = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))
        .with_context(|| format!("reading /proc/{pid}/stat (the leader's CPU is read from /proc: Linux only)"))?;
    // The command name is in parentheses and may hold spaces: count fields after its end.
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |at: usize| fields.get(at).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of the whole line are 12 and 13 after the name (field 2).
    Ok((ticks(11) + ticks(12)) / TICKS_PER_S)
}

async fn wait_for_leader(fleet: &Fleet) -> anyhow::Result<String> {
    let deadline = Instant::now() + SETTLE_MAX;
    loop {
        if let Some(leader) = fleet.leader().await {
            return Ok(leader);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the coordinator group elected no leader; c1's log ends:\n{}",
            fleet.log_tail("c1", 10)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every simulated node is live and the SKU's units are all granted, then one more
/// lease so the last top-ups and their sell rates have settled.
async fn wait_until_settled(fleet: &Fleet, leader: &str, nodes: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + SETTLE_MAX;
    loop {
        let state = fleet.member_status(leader).await.unwrap_or_default();
        let fleet_state = &state["applied"]["state"]["fleet"]["nodes"];
        let live = fleet_state.as_object().map(|nodes| nodes.values().filter(|r| r["live"] == true).count());
        let granted: u64 = fleet_state
            .as_object()
            .map(|nodes| nodes.values().map(|r| r["granted"][SKU].as_u64().unwrap_or(0)).sum())
            .unwrap_or(0);
        if live == Some(nodes) && granted >= nodes as u64 * UNITS_PER_NODE {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "after {SETTLE_MAX:?}: {live:?} of {nodes} nodes live, {granted} units granted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(LEASE_MS)).await;
    Ok(())
}

/// Silences `sim1` and waits until the leader has ended its epoch and settled it (its units
/// reallocated): the time from its last answered heartbeat.
async fn time_reallocation(
    fleet: &Fleet,
    leader: &str,
    victim: &Simulated,
    origin: Instant,
) -> anyhow::Result<Option<f64>> {
    victim.beating.store(false, Ordering::Release);
    let deadline = Instant::now() + REALLOCATION_MAX;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Some(state) = fleet.member_status(leader).await else { continue };
        let record = &state["applied"]["state"]["fleet"]["nodes"]["sim1"];
        let settled = record["unsettled"].as_object().is_none_or(|unsettled| unsettled.is_empty());
        if record["live"] == false && settled {
            let last_answered = Duration::from_millis(victim.last_answered_ms.load(Ordering::Acquire));
            return Ok(Some((origin.elapsed() - last_answered).as_secs_f64() * 1000.0));
        }
    }
    Ok(None)
}
