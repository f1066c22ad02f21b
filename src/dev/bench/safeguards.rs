//! `seckill bench safeguards`: what the safeguards cost on the purchase path. The same sale runs
//! with `[safeguards] enabled = false` and with every safeguard on, alternating over rounds on
//! the same Redis. The limits are set high enough that no buyer of the scenario is refused, so
//! the difference is the price of checking, not of refusing.

use serde::Serialize;

use crate::dev::bench::{median, spread};
use crate::dev::demo::{run_sale, Approach, SaleReport, SaleSetup};
use crate::dev::scenario::Scenario;

/// Every safeguard on, none tight enough to refuse the scenario's buyers (at most a few dozen
/// requests per user, all from 127.0.0.1).
pub const ALL_ON: &str = "[safeguards]\n\
    trusted_proxies = [\"127.0.0.1\"]\n\
    [safeguards.limits]\n\
    per_user = { per_s = 1000, burst = 1000 }\n\
    per_ip = { per_s = 10000000, burst = 10000000 }\n\
    fleet_per_user = { per_s = 1000, burst = 1000 }\n\
    fleet_per_ip = { per_s = 10000000, burst = 10000000 }\n\
    lockout = { hits = 10000000, window_s = 10, block_s = 60 }\n\
    [safeguards.auto_ban]\n\
    rejections = 10000000\n\
    window_s = 60\n\
    ban_s = 60\n";

pub const ALL_OFF: &str = "[safeguards]\nenabled = false\n";

#[derive(Debug, Serialize)]
pub struct SafeguardsCost {
    pub scenario: String,
    pub rounds: usize,
    pub off: Vec<SaleReport>,
    pub on: Vec<SaleReport>,
}

pub async fn measure(scenario: Scenario, redis_url: &str, rounds: usize) -> anyhow::Result<SafeguardsCost> {
    let mut off = Vec::new();
    let mut on = Vec::new();
    let steps = testkit::progress::steps(rounds.max(1) as u64 * 2, "bench safeguards");
    for round in 0..rounds.max(1) {
        for (safeguards, reports) in [(ALL_OFF, &mut off), (ALL_ON, &mut on)] {
            let state = if safeguards == ALL_ON { "on" } else { "off" };
            steps.set_message(format!("round {}/{}: safeguards {state}", round + 1, rounds.max(1)));
            let setup = SaleSetup {
                safeguards: Some(safeguards),
                ..SaleSetup::new(scenario, Approach::Cluster, Some(redis_url))
            };
            let report = run_sale(setup).await?;
            tracing::debug!(round, on = safeguards == ALL_ON, rps = report.rps, "round done");
            steps.inc(1);
            anyhow::ensure!(
                report.oversell == 0 && report.duplicates == 0 && report.undersell == 0,
                "a sale broke an invariant"
            );
            reports.push(report);
        }
    }
    steps.finish_and_clear();
    Ok(SafeguardsCost { scenario: scenario.name.to_string(), rounds: rounds.max(1), off, on })
}

impl SafeguardsCost {
    pub fn render(&self) -> String {
        let ratios = |f: &dyn Fn(&SaleReport) -> f64| {
            let (min, median, max) = spread(self.on.iter().zip(&self.off).map(|(on, off)| f(on) / f(off).max(1e-9)));
            format!("{min:.3} / {median:.3} / {max:.3}")
        };
        let refused = |reports: &[SaleReport]| -> u64 {
            reports
                .iter()
                .map(|r| {
                    r.outcomes.get("rate_limited").copied().unwrap_or(0)
                        + r.outcomes.get("blocked").copied().unwrap_or(0)
                })
                .sum()
        };
        let cmds = |r: &SaleReport| r.redis_commands_per_request.unwrap_or(0.0);
        let mut out = format!(
            "scenario {} ({} rounds, off and on alternating; medians)\n\n\
             |                          | off        | on         |\n\
             |--------------------------|-----------:|-----------:|\n",
            self.scenario, self.rounds
        );
        let row = |name: &str, f: &dyn Fn(&SaleReport) -> f64, digits: usize| {
            format!("| {name:<24} | {:>10.digits$} | {:>10.digits$} |\n", median(&self.off, f), median(&self.on, f))
        };
        out += &row("requests/s", &|r| r.rps, 0);
        out += &row("p50 ms", &|r| r.p50_ms, 3);
        out += &row("p99 ms", &|r| r.p99_ms, 3);
        out += &row("Redis commands/request", &cmds, 3);
        out += &format!("| refused (429/403), all   | {:>10} | {:>10} |\n", refused(&self.off), refused(&self.on));
        out += &format!(
            "\non / off per round (min / median / max): requests/s {}, p50 {}, p99 {}\n",
            ratios(&|r| r.rps),
            ratios(&|r| r.p50_ms),
            ratios(&|r| r.p99_ms)
        );
        out
    }
}
