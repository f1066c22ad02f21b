//! What a run tells a person or a script: per schedule, the faults as they happened, the
//! requests, the violations (each with the seed, the fault timeline and the offending history
//! lines), and the time to heal; per run, the totals by kind, as a table and as JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::checker::{Violation, ViolationKind};
use crate::faults::Window;
use crate::history::{Event, Request};
use crate::monitor::Sample;

/// Violations of one kind shown in full per schedule; the rest are counted.
const SHOWN_PER_KIND: usize = 3;

/// History lines shown per violation.
const LINES_PER_VIOLATION: usize = 12;

/// One SKU of a schedule.
#[derive(Clone, Debug, Serialize)]
pub struct SaleReport {
    pub sku: String,
    pub total: u64,
    pub sold: Option<u64>,
    /// When the admin API created it; none for the SKU of the fleet's config.
    pub created_ms: Option<u64>,
    pub sold_out_ms: Option<u64>,
}

/// One schedule's result.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleReport {
    pub seed: u64,
    pub faults: Vec<Window>,
    /// How the fleet differed (`schedule::Setup::labels`): a run-time SKU, a short idempotency
    /// TTL, skewed order-service clocks.
    pub setup: Vec<String>,
    pub heal_ms: u64,
    /// From the heal to the first fresh 200 answered after it; none when the sale was sold out
    /// by then.
    pub time_to_heal_ms: Option<u64>,
    /// Per fault that ended before the sale sold out: from its end to the first fresh 200 after.
    pub fault_recovery_ms: Vec<u64>,
    /// Per node fault that ended before the sale sold out: from its end to the first fresh 200
    /// sold by a node it touched.
    pub node_recovery_ms: Vec<u64>,
    pub sold_out_ms: Option<u64>,
    /// The main SKU's total and sold; `sales` has every SKU's.
    pub total: u64,
    pub sold: Option<u64>,
    pub sales: Vec<SaleReport>,
    pub requests: u64,
    pub keys: u64,
    /// Keys used again after the idempotency TTL.
    pub reused_keys: u64,
    /// Payments the sandbox took (its settlement report's succeeded payments).
    pub payments: u64,
    /// What the paying buyers did.
    pub paying: crate::payer::PayCounts,
    pub outcomes: BTreeMap<String, u64>,
    /// Sales in the ledger (every SKU) whose buyer never heard "purchased" (the answer was
    /// lost, or the buyer gave up): allowed, counted.
    pub untold_sales: u64,
    /// Keys that ended without a decision.
    pub unresolved_keys: u64,
    pub violations: Vec<Violation>,
    /// The violations as a person reads them: seed, timeline, history lines.
    pub details: Vec<String>,
    pub wall_ms: u64,
}

impl ScheduleReport {
    pub fn violations_by_kind(&self) -> BTreeMap<ViolationKind, u64> {
        let mut by_kind = BTreeMap::new();
        for violation in &self.violations {
            *by_kind.entry(violation.kind).or_insert(0) += 1;
        }
        by_kind
    }
}

/// Median and maximum of a set of durations.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Spread {
    pub count: usize,
    pub median_ms: Option<u64>,
    pub max_ms: Option<u64>,
}

impl Spread {
    fn of(mut values: Vec<u64>) -> Spread {
        values.sort_unstable();
        Spread { count: values.len(), median_ms: values.get(values.len() / 2).copied(), max_ms: values.last().copied() }
    }

    fn text(&self) -> String {
        match (self.median_ms, self.max_ms) {
            (Some(median), Some(max)) => format!("median {median} ms, max {max} ms (n = {})", self.count),
            _ => "—".to_string(),
        }
    }
}

/// A schedule that could not be run (its fleet would not start or heal).
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleError {
    pub seed: u64,
    pub error: String,
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub seed: u64,
    pub nodes: usize,
    /// The ledger's Redis servers.
    pub redis: testkit::fleet::RedisLayout,
    pub fault_phase_s: u64,
    pub schedules: usize,
    pub faults_by_kind: BTreeMap<String, u64>,
    pub requests: u64,
    pub violations_by_kind: BTreeMap<ViolationKind, u64>,
    pub time_to_heal: Spread,
    pub fault_recovery: Spread,
    pub node_recovery: Spread,
    pub wall_s: f64,
    pub per_schedule: Vec<ScheduleReport>,
    /// Schedules that could not run; a run with any is not a pass.
    pub errors: Vec<ScheduleError>,
}

impl RunReport {
    pub fn new(
        seed: u64,
        nodes: usize,
        redis: testkit::fleet::RedisLayout,
        fault_phase_s: u64,
        per_schedule: Vec<ScheduleReport>,
        wall_s: f64,
    ) -> Self {
        let mut faults_by_kind = BTreeMap::new();
        let mut violations_by_kind = BTreeMap::new();
        for schedule in &per_schedule {
            for fault in schedule.faults.iter().filter(|f| !f.skipped) {
                *faults_by_kind.entry(fault.label.clone()).or_insert(0) += 1;
            }
            for (kind, n) in schedule.violations_by_kind() {
                *violations_by_kind.entry(kind).or_insert(0) += n;
            }
        }
        RunReport {
            seed,
            nodes,
            redis,
            fault_phase_s,
            schedules: per_schedule.len(),
            faults_by_kind,
            requests: per_schedule.iter().map(|s| s.requests).sum(),
            violations_by_kind,
            time_to_heal: Spread::of(per_schedule.iter().filter_map(|s| s.time_to_heal_ms).collect()),
            fault_recovery: Spread::of(per_schedule.iter().flat_map(|s| s.fault_recovery_ms.iter().copied()).collect()),
            node_recovery: Spread::of(per_schedule.iter().flat_map(|s| s.node_recovery_ms.iter().copied()).collect()),
            wall_s,
            per_schedule,
            errors: Vec::new(),
        }
    }

    /// Seeds of the schedules that found a violation of a kind not in `tolerated`.
    pub fn failing_seeds(&self, tolerated: &[ViolationKind]) -> Vec<u64> {
        self.failing_seeds_where(|_, violation| tolerated.contains(&violation.kind))
    }

    /// Seeds of the schedules that found a violation `tolerated` does not excuse (it sees the
    /// schedule too, e.g. to excuse a kind only where some fault ran).
    pub fn failing_seeds_where(&self, tolerated: impl Fn(&ScheduleReport, &Violation) -> bool) -> Vec<u64> {
        self.per_schedule.iter().filter(|s| s.violations.iter().any(|v| !tolerated(s, v))).map(|s| s.seed).collect()
    }

    /// The table a person reads, then the details of every violation.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out += &format!(
            "nemesis: seed {}, {} schedules, {} nodes, Redis {:?}, {} s of faults each, {:.0} s wall\n",
            self.seed, self.schedules, self.nodes, self.redis, self.fault_phase_s, self.wall_s
        );
        out += &format!("requests: {}\n", self.requests);
        out += &format!("time to heal (heal → first 200): {}\n", self.time_to_heal.text());
        out += &format!("fault recovery (fault end → first 200): {}\n", self.fault_recovery.text());
        out += &format!("node recovery (node fault end → first 200 by that node): {}\n\n", self.node_recovery.text());
        out += &format!("{:<44} {:>6}\n", "fault", "count");
        for (kind, n) in &self.faults_by_kind {
            out += &format!("{kind:<44} {n:>6}\n");
        }
        out += &format!("\n{:<44} {:>6}\n", "violation", "count");
        for kind in ViolationKind::ALL {
            let n = self.violations_by_kind.get(&kind).copied().unwrap_or(0);
            out += &format!("{:<44} {n:>6}\n", kind.name());
        }
        out += &format!(
            "\n{:>20} {:>6} {:>8} {:>9} {:>8} {:>10} {:>10}  {}\n",
            "seed", "faults", "requests", "sold", "payments", "heal→200", "violations", "faults"
        );
        for s in &self.per_schedule {
            let labels: Vec<&str> = s.faults.iter().filter(|f| !f.skipped).map(|f| f.label.as_str()).collect();
            let setup = if s.setup.is_empty() { String::new() } else { format!("  [{}]", s.setup.join(", ")) };
            let sold: Vec<String> = s
                .sales
                .iter()
                .map(|sale| sale.sold.map_or("?".to_string(), |sold| format!("{sold}/{}", sale.total)))
                .collect();
            out += &format!(
                "{:>20} {:>6} {:>8} {:>9} {:>8} {:>10} {:>10}  {}{setup}\n",
                s.seed,
                labels.len(),
                s.requests,
                sold.join("+"),
                s.payments,
                s.time_to_heal_ms.map_or("—".to_string(), |ms| format!("{ms} ms")),
                s.violations.len(),
                labels.join(", ")
            );
        }
        for error in &self.errors {
            out += &format!("\nSCHEDULE NOT RUN (seed {}): {}\n", error.seed, error.error);
        }
        for s in self.per_schedule.iter().filter(|s| !s.details.is_empty()) {
            out += "\n";
            for detail in &s.details {
                out += detail;
                out += "\n";
            }
        }
        out
    }
}

/// The first 200 that sold afresh (not a replay) answered at or after `from_ms`, by one of
/// `nodes` (any node when empty): how long after `from_ms`.
fn first_sale_after(requests: &[Request], from_ms: u64, nodes: &[String]) -> Option<u64> {
    requests
        .iter()
        .filter(|r| r.is_purchase() && !r.replayed && r.answered_ms >= from_ms)
        .filter(|r| nodes.is_empty() || nodes.contains(&r.node))
        .map(|r| r.answered_ms - from_ms)
        .min()
}

/// How long stock took to flow again; each figure is left out once the sale was sold out.
#[derive(Clone, Debug, Default)]
pub struct HealTimes {
    /// Heal → the first fresh 200.
    pub heal: Option<u64>,
    /// Each fault's end → the first fresh 200 (any node).
    pub faults: Vec<u64>,
    /// Each node fault's end → the first fresh 200 sold by a node it touched.
    pub nodes: Vec<u64>,
}

pub fn heal_times(requests: &[Request], windows: &[Window], heal_ms: u64, sold_out_ms: Option<u64>) -> HealTimes {
    let open_at = |at: u64| sold_out_ms.is_none_or(|sold_out| at < sold_out);
    let ended: Vec<(u64, &Window)> = windows
        .iter()
        .filter(|w| !w.skipped)
        .filter_map(|w| Some((w.end_ms?, w)))
        .filter(|(end, _)| open_at(*end))
        .collect();
    HealTimes {
        heal: if open_at(heal_ms) { first_sale_after(requests, heal_ms, &[]) } else { None },
        faults: ended.iter().filter_map(|(end, _)| first_sale_after(requests, *end, &[])).collect(),
        nodes: ended
            .iter()
            .filter(|(_, w)| !w.touched_nodes().is_empty())
            .filter_map(|(end, w)| first_sale_after(requests, *end, &w.touched_nodes()))
            .collect(),
    }
}

/// Renders each violation (up to a few per kind) with the seed, the fault timeline and the
/// history lines that show it.
pub fn details(
    seed: u64,
    violations: &[Violation],
    events: &[Event],
    requests: &[Request],
    samples: &[Sample],
) -> Vec<String> {
    let mut shown: BTreeMap<ViolationKind, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for violation in violations {
        let count = shown.entry(violation.kind).or_insert(0);
        *count += 1;
        if *count > SHOWN_PER_KIND {
            continue;
        }
        let mut text = format!(
            "VIOLATION {} (seed {seed}; replay: seckill nemesis --seed {seed} --schedules 1)\n  {}\n  timeline:\n",
            violation.kind.name(),
            violation.detail
        );
        for event in events {
            text += &format!("    {}\n", event.line());
        }
        let lines: Vec<&Request> = if violation.keys.is_empty() {
            let (from, to) = violation.window_ms.unwrap_or((0, u64::MAX));
            requests
                .iter()
                .filter(|r| violation.nodes.contains(&r.node) && r.sent_ms <= to && r.answered_ms >= from)
                .take(LINES_PER_VIOLATION)
                .collect()
        } else {
            requests.iter().filter(|r| violation.keys.contains(&r.key)).take(LINES_PER_VIOLATION).collect()
        };
        text += "  history:\n";
        for request in lines {
            text += &format!("    {}\n", request.line());
        }
        if let Some((from, to)) = violation.window_ms {
            text += "  samples (leader, ledger remaining, local units by node):\n";
            for sample in
                samples.iter().filter(|s| s.at_ms + 1_000 >= from && s.at_ms <= to + 1_000).take(LINES_PER_VIOLATION)
            {
                let local: Vec<String> = sample
                    .local
                    .iter()
                    .map(|(n, l)| format!("{n}={}", l.map_or("?".to_string(), |l| l.to_string())))
                    .collect();
                text += &format!(
                    "    {:>7} ms  leader {:?}  remaining {:?}  {}\n",
                    sample.at_ms,
                    sample.leader,
                    sample.ledger.map(|l| l.remaining),
                    local.join(" ")
                );
            }
        }
        out.push(text);
    }
    for (kind, count) in shown {
        if count > SHOWN_PER_KIND {
            out.push(format!("  … and {} more {} in seed {seed}", count - SHOWN_PER_KIND, kind.name()));
        }
    }
    out
}
