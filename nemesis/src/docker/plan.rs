//! What a schedule on the Compose fleet does: container and network faults, and operations a
//! shop runs during a sale (scaling out, a rolling upgrade), each starting at a time or once a
//! share of the stock has sold, and lasting a while. Drawn from a seed for `nemesis --docker`;
//! written out by hand for the Docker tests (issue 34's a–f).

use serde::Serialize;

use crate::schedule::{FaultKind, ProviderFault};

/// When a step starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// Ms after the sale opened.
    AtMs(u64),
    /// Once the ledger has sold this many percent of the stock.
    AtSoldPercent(u64),
}

/// One step: its fault (nodes named by index, `n0`… in the order the fleet lists them when the
/// step starts), when it starts and how long it lasts before it is undone (0: undone at once,
/// an operation that needs no undoing).
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub id: usize,
    pub kind: FaultKind,
    pub start: Start,
    pub hold_ms: u64,
}

/// A schedule for the Compose fleet.
#[derive(Clone, Debug, Serialize)]
pub struct DockerPlan {
    /// What it is called in reports (`a_scale_out`, or the seed).
    pub name: String,
    /// Units of the schedule's own SKU.
    pub units: u64,
    /// Purchase attempts per second through nginx while the steps run.
    pub demand_per_s: u64,
    pub steps: Vec<Step>,
}

/// The lease the Compose fleet's nemesis config gives nodes (`docker::config`); a pause or a
/// partition meant to outlast a lease lasts longer than this plus its grace.
pub const LEASE_MS: u64 = 2_000;
pub const GRACE_MS: u64 = 500;

/// Long enough for a lease to lapse and the leader to expire it, then some selling without it.
const PAST_LEASE_MS: u64 = LEASE_MS + GRACE_MS + 3_000;

impl DockerPlan {
    fn one(name: &str, units: u64, demand_per_s: u64, kind: FaultKind, start: Start, hold_ms: u64) -> DockerPlan {
        DockerPlan { name: name.into(), units, demand_per_s, steps: vec![Step { id: 0, kind, start, hold_ms }] }
    }

    /// a. 10,000 units through nginx; at 30% sold the fleet scales from 3 nodes to 5.
    pub fn scale_out() -> DockerPlan {
        Self::one("a_scale_out", 10_000, 1_000, FaultKind::ScaleNodes { to: 5 }, Start::AtSoldPercent(30), 0)
    }

    /// b. At 30% sold a node's container is cut off from the network past its lease, then
    /// connected again.
    pub fn partition_node() -> DockerPlan {
        let kind = FaultKind::DisconnectNode { node: "n0".into() };
        Self::one("b_partition_node", 1_000, 100, kind, Start::AtSoldPercent(30), PAST_LEASE_MS)
    }

    /// c. At 30% sold the leading member's container is cut off, killed a little later, and
    /// brought back at the end.
    pub fn partition_then_kill_leader() -> DockerPlan {
        let kind = FaultKind::DisconnectLeader { kill_after_ms: Some(3_000) };
        Self::one("c_partition_then_kill_leader", 1_000, 100, kind, Start::AtSoldPercent(30), 8_000)
    }

    /// d. At 30% sold the Redis master's container is killed; the sentinels promote a replica.
    pub fn kill_redis_master() -> DockerPlan {
        Self::one("d_kill_redis_master", 1_000, 100, FaultKind::RedisFailover, Start::AtSoldPercent(30), 10_000)
    }

    /// e. Every node, then every member, replaced one at a time while buyers buy and pay.
    pub fn rolling_upgrade() -> DockerPlan {
        Self::one("e_rolling_upgrade", 2_000, 20, FaultKind::RollFleet, Start::AtMs(2_000), 0)
    }

    /// f. The order store's container restarted while buyers pay.
    pub fn restart_postgres() -> DockerPlan {
        Self::one("f_restart_postgres", 1_000, 100, FaultKind::RestartPostgres, Start::AtSoldPercent(20), 0)
    }

    /// A random schedule for `nemesis --docker`: one to three container or network faults,
    /// on distinct targets, inside a fault phase of `phase_ms`.
    pub fn draw(seed: u64, nodes: usize, phase_ms: u64) -> DockerPlan {
        let mut rng = fastrand::Rng::with_seed(seed);
        let count = rng.usize(1..=3);
        let mut steps: Vec<Step> = Vec::new();
        let mut used: Vec<String> = Vec::new();
        for _ in 0..count * 10 {
            if steps.len() == count {
                break;
            }
            let kind = draw_kind(&mut rng, nodes);
            let target = target_of(&kind);
            if used.contains(&target) {
                continue;
            }
            used.push(target);
            let start_ms = rng.u64(1_000..phase_ms.saturating_sub(4_000).max(1_001));
            let hold_ms = match kind {
                FaultKind::PauseNode { .. } | FaultKind::DisconnectNode { .. } => PAST_LEASE_MS,
                FaultKind::ReplaceNode { .. } | FaultKind::RestartPostgres => 0,
                _ => rng.u64(2_000..=6_000),
            };
            steps.push(Step { id: steps.len(), kind, start: Start::AtMs(start_ms), hold_ms });
        }
        steps.sort_by_key(|step| match step.start {
            Start::AtMs(ms) => ms,
            Start::AtSoldPercent(_) => 0,
        });
        for (id, step) in steps.iter_mut().enumerate() {
            step.id = id;
        }
        let demand_per_s = rng.u64(60..=160);
        DockerPlan { name: format!("seed-{seed}"), units: 600, demand_per_s, steps }
    }
}

fn draw_kind(rng: &mut fastrand::Rng, nodes: usize) -> FaultKind {
    let node = format!("n{}", rng.usize(0..nodes));
    match rng.u32(0..11) {
        0 => FaultKind::KillNodes { nodes: vec![node] },
        1 => FaultKind::PauseNode { node },
        2 | 3 => FaultKind::DisconnectNode { node },
        4 => FaultKind::ReplaceNode { node },
        5 => FaultKind::KillLeader,
        6 => FaultKind::DisconnectLeader { kill_after_ms: rng.bool().then_some(2_000) },
        7 => FaultKind::RedisFailover,
        8 => FaultKind::KillOrders { name: format!("orders-{}", rng.usize(1..=2)) },
        9 => FaultKind::RestartPostgres,
        _ => FaultKind::Provider {
            fault: [ProviderFault::Unavailable, ProviderFault::DropCallbacks, ProviderFault::DuplicateCallbacks]
                [rng.usize(0..3)],
        },
    }
}

/// What a step occupies: one fault at a time per node, per member group, on Redis, on the
/// order store, on an order service and on the sandbox.
fn target_of(kind: &FaultKind) -> String {
    match kind {
        FaultKind::KillNodes { nodes } => format!("node:{}", nodes.join(",")),
        FaultKind::PauseNode { node } | FaultKind::DisconnectNode { node } | FaultKind::ReplaceNode { node } => {
            format!("node:{node}")
        }
        FaultKind::KillLeader | FaultKind::DisconnectLeader { .. } => "members".into(),
        FaultKind::RedisFailover => "redis".into(),
        FaultKind::KillOrders { name } => format!("orders:{name}"),
        FaultKind::RestartPostgres => "postgres".into(),
        FaultKind::Provider { .. } => "paysim".into(),
        _ => "fleet".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a seed draws the same schedule every time, each target takes one fault at a time,
    /// and every fault starts inside the phase.
    #[test]
    fn a_seed_draws_one_schedule_of_faults_on_distinct_targets() {
        for seed in 0..200 {
            let plan = DockerPlan::draw(seed, 3, 20_000);
            assert_eq!(format!("{plan:?}"), format!("{:?}", DockerPlan::draw(seed, 3, 20_000)));
            assert!((1..=3).contains(&plan.steps.len()), "{plan:?}");
            let mut targets: Vec<String> = plan.steps.iter().map(|s| target_of(&s.kind)).collect();
            targets.sort();
            targets.dedup();
            assert_eq!(targets.len(), plan.steps.len(), "{plan:?}");
            for step in &plan.steps {
                assert!(matches!(step.start, Start::AtMs(ms) if (1_000..16_000).contains(&ms)), "{step:?}");
            }
        }
    }
}
