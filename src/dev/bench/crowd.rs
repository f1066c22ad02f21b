//! `seckill bench crowd`: the flash crowd as it arrives, open loop. A closed-loop generator
//! waits for an answer before the next press, so a slow server slows its own load and its
//! queueing never shows; a crowd presses at 10:00:00 whatever the server does.
//!
//! The run first measures the Redis-only approach's saturation rate (closed loop, same Redis),
//! then offers each approach, alternating, a multiple of that rate for a fixed time, and reports
//! per rate: the rate achieved, latency from each press's intended time (p50/p99/p999), when
//! every buyer had an answer and when the last unit sold.

use serde::Serialize;

use crate::dev::demo::{run_sale, Approach, SaleReport, SaleSetup};
use crate::dev::scenario::Scenario;

/// Purchase attempts of the closed-loop run that finds Redis-only's saturation rate: a few
/// seconds of it, enough for a steady rate.
const SATURATION_ATTEMPTS: u64 = 40_000;

/// What to offer.
#[derive(Debug, Clone)]
pub struct CrowdPlan {
    pub scenario: Scenario,
    /// Offered rates, as multiples of Redis-only's saturation rate.
    pub multipliers: Vec<f64>,
    /// How long buyers keep arriving at each rate.
    pub arrival_s: f64,
    /// Connections' worth of buyers the generator keeps (each holds one request in flight).
    pub concurrency: usize,
}

/// One offered rate, both approaches.
#[derive(Debug, Serialize)]
pub struct CrowdPoint {
    pub multiplier: f64,
    pub offered_rps: u64,
    pub cluster: SaleReport,
    pub redis_only: SaleReport,
}

/// What the run measured.
#[derive(Debug, Serialize)]
pub struct Crowd {
    pub scenario: String,
    pub arrival_s: f64,
    pub concurrency: usize,
    /// Redis-only, closed loop, requests/s: the unit of the offered rates.
    pub redis_only_saturation_rps: f64,
    pub points: Vec<CrowdPoint>,
}

/// Runs the plan against Redis at `redis_url`.
pub async fn run(plan: &CrowdPlan, redis_url: &str) -> anyhow::Result<Crowd> {
    anyhow::ensure!(plan.arrival_s > 0.0, "--arrival-s must be above 0");
    anyhow::ensure!(!plan.multipliers.is_empty(), "--rates needs at least one multiple");
    let steps = testkit::progress::steps(1 + plan.multipliers.len() as u64 * 2, "bench crowd");
    steps.set_message("redis-only saturation (closed loop)");
    let saturation = redis_only_saturation(plan.scenario, redis_url).await?;
    steps.inc(1);
    let mut points = Vec::new();
    for &multiplier in &plan.multipliers {
        let offered_rps = (saturation * multiplier).round().max(1.0) as u64;
        let open = Scenario {
            requests: (offered_rps as f64 * plan.arrival_s).round().max(1.0) as u64,
            rate_per_s: Some(offered_rps),
            kill_at_sold: None,
            ..plan.scenario
        };
        let mut reports = Vec::new();
        for approach in [Approach::Cluster, Approach::RedisOnly] {
            steps.set_message(format!("{multiplier}× ({offered_rps}/s): {}", approach.name()));
            reports.push(sale(open, approach, redis_url, plan.concurrency).await?);
            steps.inc(1);
        }
        let (Some(redis_only), Some(cluster)) = (reports.pop(), reports.pop()) else {
            anyhow::bail!("a rate ran without both approaches");
        };
        points.push(CrowdPoint { multiplier, offered_rps, cluster, redis_only });
    }
    steps.finish_and_clear();
    Ok(Crowd {
        scenario: plan.scenario.name.to_string(),
        arrival_s: plan.arrival_s,
        concurrency: plan.concurrency,
        redis_only_saturation_rps: saturation,
        points,
    })
}

/// Redis-only's saturation rate, requests/s: `scenario`'s sale closed loop, a few seconds of it
/// on Redis at `redis_url` (also the unit of `bench crowd --waiting-room`'s rates).
pub(crate) async fn redis_only_saturation(scenario: Scenario, redis_url: &str) -> anyhow::Result<f64> {
    let closed = Scenario { requests: SATURATION_ATTEMPTS, rate_per_s: None, kill_at_sold: None, ..scenario };
    Ok(sale(closed, Approach::RedisOnly, redis_url, scenario.concurrency).await?.rps)
}

async fn sale(
    scenario: Scenario,
    approach: Approach,
    redis_url: &str,
    concurrency: usize,
) -> anyhow::Result<SaleReport> {
    let report =
        run_sale(SaleSetup { concurrency: Some(concurrency), ..SaleSetup::new(scenario, approach, Some(redis_url)) })
            .await?;
    anyhow::ensure!(
        report.oversell == 0 && report.duplicates == 0,
        "{approach:?} broke an invariant: oversell {} duplicates {}",
        report.oversell,
        report.duplicates
    );
    Ok(report)
}

impl Crowd {
    /// The table: one line per (rate, approach).
    pub fn render(&self) -> String {
        let mut out = format!(
            "scenario {}, buyers arriving for {} s, {} buyers in flight at most; redis-only saturation \
             {:.0} req/s (closed loop)\n\
             latency counts from each press's intended time\n\n\
             {:<12} {:<11} {:>9} {:>9} {:>9} {:>9} {:>12} {:>9} {:>10}\n",
            self.scenario,
            self.arrival_s,
            self.concurrency,
            self.redis_only_saturation_rps,
            "offered",
            "approach",
            "achieved",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "answered s",
            "sold s",
            "late sends"
        );
        for point in &self.points {
            for (name, report) in [("cluster", &point.cluster), ("redis-only", &point.redis_only)] {
                let late = report.late_sends as f64 * 100.0 / report.attempts.max(1) as f64;
                out.push_str(&format!(
                    "{:<12} {:<11} {:>9.0} {:>9.2} {:>9.2} {:>9.2} {:>12.2} {:>9} {:>9.1}%\n",
                    format!("{}× {}/s", point.multiplier, point.offered_rps),
                    name,
                    report.rps,
                    report.p50_ms,
                    report.p99_ms,
                    report.p999_ms,
                    report.all_answered_s,
                    report.last_sale_s.map_or("-".to_string(), |s| format!("{s:.2}")),
                    late
                ));
            }
        }
        out.push_str(
            "\nlate sends: presses that left more than 2 ms after their time because every buyer was \
             still waiting for an answer (or the generator fell behind); their wait is in the latency.\n",
        );
        out
    }

    /// p99, achieved rate and time until every buyer had an answer, by offered rate.
    pub fn svg(&self) -> String {
        let groups: Vec<String> =
            self.points.iter().map(|p| format!("{}× ({}/s)", p.multiplier, p.offered_rps)).collect();
        let panel = |title, f: &dyn Fn(&SaleReport) -> f64| testkit::chart::Panel {
            title,
            groups: groups.clone(),
            series: vec![
                ("cluster", "#2b7bb9", self.points.iter().map(|p| f(&p.cluster)).collect()),
                ("redis-only", "#d9822b", self.points.iter().map(|p| f(&p.redis_only)).collect()),
            ],
        };
        testkit::chart::render(
            &format!(
                "Open-loop flash crowd, scenario {}: offered rate as multiples of redis-only's saturation ({:.0}/s)",
                self.scenario, self.redis_only_saturation_rps
            ),
            &[
                panel("p99 latency from intended send, ms", &|r| r.p99_ms),
                panel("achieved requests/s", &|r| r.rps),
                panel("every buyer answered after, s", &|r| r.all_answered_s),
            ],
        )
    }
}
