//! `seckill bench durability`: what each `[ledger] durability` costs, so a user can pick one
//! knowing its price. Each mode gets the Redis it promises on: `none` a master with `appendfsync
//! everysec`, `fsync` one with `appendfsync always`, `replica` an `everysec` master with one
//! replica (`WAIT 1` after every write). The modes alternate over rounds; per mode the same sale
//! (cluster approach) and the confirm rate straight through the ledger, batched.

use serde::Serialize;
use testkit::redis::RedisServer;

use crate::dev::demo::{run_sale, Approach, SaleReport, SaleSetup};
use crate::dev::scenario::Scenario;

/// Sales per confirm-rate measurement, as `bench compare`'s engine figure.
const CONFIRM_UNITS: u64 = 51_200;

/// One durability mode's runs.
#[derive(Debug, Serialize)]
pub struct ModeRuns {
    pub mode: &'static str,
    /// The `[ledger]` lines that select it.
    pub settings: &'static str,
    pub sales: Vec<SaleReport>,
    /// Confirmed sales/s through the ledger in batches of `ledger::BATCH_MAX`, per round.
    pub batched_sales_per_s: Vec<f64>,
}

/// What the run measured.
#[derive(Debug, Serialize)]
pub struct DurabilityCost {
    pub scenario: String,
    pub rounds: usize,
    pub modes: Vec<ModeRuns>,
}

/// The modes, their settings, and the Redis each needs: (master fsync policy, replicas).
const MODES: [(&str, &str, &str, usize); 3] = [
    ("none", "durability = \"none\"", "everysec", 0),
    ("fsync", "durability = \"fsync\"", "always", 0),
    ("replica", "durability = \"replica\"\nreplicas = 1", "everysec", 1),
];

/// Runs every mode `rounds` times, alternating, each on its own private Redis.
pub async fn measure(scenario: Scenario, rounds: usize) -> anyhow::Result<DurabilityCost> {
    let rounds = rounds.max(1);
    // Servers live for the whole run: (master, its replicas) per mode.
    let mut servers = Vec::new();
    for (_, _, fsync, replicas) in MODES {
        let master = RedisServer::start_with(fsync)?;
        let copies = (0..replicas).map(|_| RedisServer::start_replica_of(&master)).collect::<Result<Vec<_>, _>>()?;
        servers.push((master, copies));
    }
    let mut modes: Vec<ModeRuns> = MODES
        .iter()
        .map(|(mode, settings, _, _)| ModeRuns { mode, settings, sales: vec![], batched_sales_per_s: vec![] })
        .collect();
    let steps = testkit::progress::steps((rounds * MODES.len()) as u64, "bench durability");
    for round in 0..rounds {
        for (runs, (master, _replicas)) in modes.iter_mut().zip(&servers) {
            steps.set_message(format!("round {}/{rounds}: {}", round + 1, runs.mode));
            let url = master.url();
            let report = run_sale(SaleSetup {
                ledger_settings: Some(runs.settings),
                ..SaleSetup::new(scenario, Approach::Cluster, Some(&url))
            })
            .await?;
            anyhow::ensure!(
                report.oversell == 0 && report.duplicates == 0,
                "durability {} broke an invariant: oversell {} duplicates {}",
                runs.mode,
                report.oversell,
                report.duplicates
            );
            runs.sales.push(report);
            let text =
                crate::dev::demo::with_ledger_settings(&scenario.redis_only_toml("x", &url), &url, Some(runs.settings));
            let ledger = crate::cluster::build_ledger(&crate::config::Cluster::parse(&text)?.ledger).await?;
            let (batched, _single) = crate::dev::bench::confirm_rates(&ledger, CONFIRM_UNITS).await?;
            runs.batched_sales_per_s.push(batched);
            steps.inc(1);
        }
    }
    steps.finish_and_clear();
    Ok(DurabilityCost { scenario: scenario.name.to_string(), rounds, modes })
}

impl DurabilityCost {
    /// One line per mode: medians over rounds, and each against `none` in the same run.
    pub fn render(&self) -> String {
        let median = |values: Vec<f64>| crate::dev::bench::spread(values.into_iter()).1;
        let figures = |runs: &ModeRuns| {
            (
                median(runs.sales.iter().map(|r| r.rps).collect()),
                median(runs.sales.iter().map(|r| r.p50_ms).collect()),
                median(runs.sales.iter().map(|r| r.p99_ms).collect()),
                median(runs.batched_sales_per_s.clone()),
            )
        };
        let baseline = self.modes.first().map(figures).unwrap_or_default();
        let mut out = format!(
            "scenario {}, {} rounds alternating, medians (ratio to none in the same run)\n\n\
             {:<9} {:>18} {:>9} {:>9} {:>26}\n",
            self.scenario, self.rounds, "mode", "requests/s", "p50 ms", "p99 ms", "confirmed sales/s batched"
        );
        for runs in &self.modes {
            let (rps, p50, p99, batched) = figures(runs);
            out.push_str(&format!(
                "{:<9} {:>10.0} ({:>4.2}×) {:>9.2} {:>9.2} {:>17.0} ({:>4.2}×)\n",
                runs.mode,
                rps,
                rps / baseline.0.max(1e-9),
                p50,
                p99,
                batched,
                batched / baseline.3.max(1e-9)
            ));
        }
        out
    }
}
