//! The Compose fleet of `deploy/` across container hosts (issue 34's tests a–f): one fleet
//! brought up by `deploy/up` from images built offline, then six schedules on it in turn, each
//! selling a SKU of its own through nginx while buyers pay, each judged by the nemesis checker
//! over its recorded history (one set of rules, one verdict), with what only a container fleet
//! shows checked on top:
//!
//! - a. 10,000 units; at 30% sold the fleet scales from 3 nodes to 5, and each new node holds
//!   stock within 2 s of being ready; then it scales back to 3 (nodes leave gracefully).
//! - b. at 30% sold a node's container is cut off the network past its lease, then connected
//!   again: it rejoins under a new epoch, and no unit sells twice.
//! - c. the leader's container is cut off, then killed, then brought back: a new leader leases
//!   and reallocates meanwhile.
//! - d. the Redis master's container is killed: the sentinels promote a replica that holds
//!   every answered sale (`durability = "replica"`), and the fleet sells the rest.
//! - e. every node, then every member, replaced one at a time by a fresh container while buyers
//!   buy and pay: buyers hear nothing but decisions and retryable 503s.
//! - f. PostgreSQL's container restarts while buyers pay: no order, payment or refund is lost.
//!
//! Runs when a Docker daemon answers; `SECKILL_REQUIRE_DOCKER=1` (CI) makes a missing one a
//! failure. The images hold the server binary `scripts/test` builds (`cargo build
//! --no-default-features`, at `target/images/server/seckill`, or `SECKILL_SERVER_BINARY`) and,
//! for the sandbox, this test's own `seckill`.

// A test reads as one scenario from its set-up to its last check: the 70-line bound
// (too_many_lines) is for the code under test.
#![allow(clippy::too_many_lines)]

use std::path::PathBuf;
use std::time::Duration;

use nemesis::docker::plan::DockerPlan;
use nemesis::docker::{self, DockerReport};
use testkit::compose::ComposeFleet;

/// The fault phase's bound for schedules that start on time (the hand-written ones start on
/// sales and heal when their steps are done).
const PHASE_MS: u64 = 20_000;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The server binary for the images: `SECKILL_SERVER_BINARY`, else the one `scripts/test`
/// builds.
fn server_binary() -> PathBuf {
    let built = std::env::var("SECKILL_SERVER_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join("target/images/server/seckill"));
    assert!(
        built.is_file(),
        "no server binary at {}: `cargo build --no-default-features --bin seckill` and copy it there (scripts/test \
         does), or set SECKILL_SERVER_BINARY",
        built.display()
    );
    built
}

/// What one schedule must show beyond the checker's verdict; empty: nothing.
type Extra = fn(&DockerReport) -> Vec<String>;

fn no_extra(_: &DockerReport) -> Vec<String> {
    Vec::new()
}

/// a: every node that joined held stock within the bound of being ready.
fn joiners_granted_in_time(report: &DockerReport) -> Vec<String> {
    let bound = docker::inject::GRANT_AFTER_READY_MAX.as_millis() as u64;
    let mut problems = Vec::new();
    if report.joiners.len() != 2 {
        problems.push(format!("2 nodes should have joined, not {}: {:?}", report.joiners.len(), report.joiners));
    }
    for joiner in &report.joiners {
        if joiner.granted_after_ready_ms.is_none_or(|ms| ms > bound) {
            problems.push(format!(
                "node {} held stock {:?} ms after ready (bound {bound} ms)",
                joiner.node, joiner.granted_after_ready_ms
            ));
        }
    }
    problems
}

/// e: a buyer hears a decision or a retryable 503, nothing else.
fn only_retryable_failures(report: &DockerReport) -> Vec<String> {
    if report.not_retryable.is_empty() {
        Vec::new()
    } else {
        vec![format!("answers neither a decision nor a 503: {:?}", report.not_retryable)]
    }
}

/// Goal: the Compose fleet keeps every promise through scale-out and scale-in, a partitioned
/// node, a partitioned then killed leader, a killed Redis master, a rolling replacement of
/// every node and member, and a restarted order store (a–f in the module docs).
/// Method: one fleet, the six schedules in turn, each judged by the nemesis checker (plus its
/// own check); the fleet is brought down (volumes too) whatever happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_compose_fleet_keeps_every_promise_through_scaling_partitions_failovers_and_upgrades() {
    if !testkit::compose::docker_available("the Compose fleet's tests") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let options = docker::DockerOptions {
        repo: repo(),
        server_binary: Some(server_binary()),
        lab_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_seckill"))),
        seed: 34,
        schedules: 6,
        nodes: 3,
        fault_phase: Duration::from_millis(PHASE_MS),
        out: std::env::var_os("SECKILL_DOCKER_OUT").map(PathBuf::from),
    };
    let project = format!("seckill-test-{}", std::process::id());
    let fleet = docker::start_fleet(&options, &project, dir.path()).expect("the Compose fleet comes up");
    let outcome = run_all(&fleet, &options).await;
    if let Some(out) = &options.out {
        let _ = fleet.copy_logs(&out.join("logs"));
    }
    fleet.down().expect("deploy/down --volumes");
    let failures = outcome.unwrap_or_else(|e| vec![format!("the schedules could not run: {e:#}")]);
    assert!(failures.is_empty(), "the Compose fleet broke a promise:\n{}", failures.join("\n"));
}

async fn run_all(fleet: &ComposeFleet, options: &docker::DockerOptions) -> anyhow::Result<Vec<String>> {
    let plans: [(DockerPlan, Extra); 6] = [
        (DockerPlan::scale_out(), joiners_granted_in_time),
        (DockerPlan::partition_node(), no_extra),
        (DockerPlan::partition_then_kill_leader(), no_extra),
        (DockerPlan::kill_redis_master(), no_extra),
        (DockerPlan::rolling_upgrade(), only_retryable_failures),
        (DockerPlan::restart_postgres(), no_extra),
    ];
    let mut failures = Vec::new();
    for (at, (plan, extra)) in plans.into_iter().enumerate() {
        let seed = options.seed + at as u64;
        let report = docker::run_plan(fleet, &plan, seed, PHASE_MS, options.out.as_deref()).await?;
        eprintln!(
            "{}: sold {:?}/{}, {} requests, {} payments, {} faults, {} violations ({} s)",
            plan.name,
            report.schedule.sold,
            report.schedule.total,
            report.schedule.requests,
            report.schedule.payments,
            report.schedule.faults.len(),
            report.schedule.violations.len(),
            report.schedule.wall_ms / 1000
        );
        for violation in &report.schedule.violations {
            failures.push(format!("{}: {}: {}", plan.name, violation.kind.name(), violation.detail));
        }
        if !report.schedule.violations.is_empty() {
            eprintln!("{}", report.schedule.details.join("\n"));
        }
        for problem in extra(&report) {
            failures.push(format!("{}: {problem}", plan.name));
        }
        if plan.name == "a_scale_out" {
            // Back to three: two nodes leave gracefully, handing their leases back.
            fleet.scale_nodes(3)?;
        }
    }
    Ok(failures)
}
