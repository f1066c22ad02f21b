//! `seckill bench auth`: what verifying buyers costs the purchase path. The same sale runs under
//! `[auth] mode = "none"`, under `jwt` with HS256 tokens and under `jwt` with ES256 tokens from a
//! JWKS file, alternating over rounds on the same Redis. Every buyer presents a token of its own,
//! so each token is verified once and then answered from the node's cache, as in a real sale.

use serde::Serialize;

use crate::dev::bench::{median, spread};
use crate::dev::buyer_auth::BuyerAuth;
use crate::dev::demo::{run_sale, Approach, SaleReport, SaleSetup};
use crate::dev::scenario::Scenario;

const MODES: [BuyerAuth; 3] = [BuyerAuth::None, BuyerAuth::JwtHs256, BuyerAuth::JwtEs256];

#[derive(Debug, Serialize)]
pub struct AuthCost {
    pub scenario: String,
    pub rounds: usize,
    /// Per mode (`none`, `jwt-hs256`, `jwt-es256`), one report per round.
    pub modes: Vec<(BuyerAuth, Vec<SaleReport>)>,
}

pub async fn measure(scenario: Scenario, redis_url: &str, rounds: usize) -> anyhow::Result<AuthCost> {
    let rounds = rounds.max(1);
    let mut modes: Vec<(BuyerAuth, Vec<SaleReport>)> = MODES.iter().map(|mode| (*mode, Vec::new())).collect();
    let steps = testkit::progress::steps((rounds * MODES.len()) as u64, "bench auth");
    for round in 0..rounds {
        for (mode, reports) in &mut modes {
            steps.set_message(format!("round {}/{rounds}: {}", round + 1, mode.name()));
            let setup = SaleSetup { buyer_auth: *mode, ..SaleSetup::new(scenario, Approach::Cluster, Some(redis_url)) };
            let report = run_sale(setup).await?;
            steps.inc(1);
            anyhow::ensure!(
                report.oversell == 0 && report.duplicates == 0 && report.undersell == 0,
                "the sale under {} broke an invariant",
                mode.name()
            );
            anyhow::ensure!(
                !report.outcomes.contains_key("unauthenticated"),
                "buyers with valid tokens were refused under {}",
                mode.name()
            );
            reports.push(report);
        }
    }
    steps.finish_and_clear();
    Ok(AuthCost { scenario: scenario.name.to_string(), rounds, modes })
}

impl AuthCost {
    pub fn render(&self) -> String {
        let none = &self.modes[0].1;
        let mut out = format!(
            "scenario {} ({} rounds, modes alternating; medians)\n\n\
             | auth       | requests/s | p50 ms  | p99 ms  | requests/s vs none, per round (min / median / max) |\n\
             |------------|-----------:|--------:|--------:|-----------------------------------------------------|\n",
            self.scenario, self.rounds
        );
        for (mode, reports) in &self.modes {
            let (min, mid, max) = spread(reports.iter().zip(none).map(|(on, off)| on.rps / off.rps.max(1e-9)));
            out += &format!(
                "| {:<10} | {:>10.0} | {:>7.3} | {:>7.3} | {min:.3} / {mid:.3} / {max:.3} |\n",
                mode.name(),
                median(reports, &|r| r.rps),
                median(reports, &|r| r.p50_ms),
                median(reports, &|r| r.p99_ms),
            );
        }
        out
    }
}
