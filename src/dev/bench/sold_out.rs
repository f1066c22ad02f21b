//! `seckill bench sold-out`: the path most of a flash crowd takes. Once a SKU is sold out, a
//! node answers every purchase from memory (`sold_out`, 409) and the ledger never hears of it, so
//! what is left is the node's own work: HTTP, header and body checks, the safeguards, the answer.
//! This measures that path against its ceiling, the same HTTP stack answering a fixed 409 with
//! no work at all (`bench::bare_hyper`), with the same load generator and plan, alternating over
//! rounds so the machine's drift hits both alike.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;
use testkit::load::{self, LoadPlan};

use crate::cluster::{build_ledger, Options, RunningCluster};
use crate::config::Cluster;
use crate::dev::scenario::Scenario;

/// One round: the sold-out cluster and the bare stack, requests/s each.
#[derive(Debug, Serialize)]
pub struct Round {
    pub sold_out_rps: f64,
    pub bare_hyper_rps: f64,
}

#[derive(Debug, Serialize)]
pub struct SoldOutPath {
    pub scenario: String,
    pub requests_per_run: u64,
    pub concurrency: usize,
    pub rounds: Vec<Round>,
    /// Median over rounds of sold-out / bare, each round's pair run back to back.
    pub share_of_ceiling: f64,
}

impl SoldOutPath {
    pub fn render(&self) -> String {
        let mut out = format!(
            "scenario {}, {} requests per run at concurrency {}, alternating\n\n{:>5} {:>16} {:>16} {:>8}\n",
            self.scenario,
            self.requests_per_run,
            self.concurrency,
            "round",
            "sold-out req/s",
            "bare hyper req/s",
            "share"
        );
        for (at, round) in self.rounds.iter().enumerate() {
            out.push_str(&format!(
                "{:>5} {:>16.0} {:>16.0} {:>7.0}%\n",
                at + 1,
                round.sold_out_rps,
                round.bare_hyper_rps,
                100.0 * round.sold_out_rps / round.bare_hyper_rps.max(1e-9)
            ));
        }
        out.push_str(&format!(
            "\nthe sold-out path runs at {:.0}% of the HTTP stack's ceiling (median)\n",
            100.0 * self.share_of_ceiling
        ));
        out
    }
}

pub async fn measure(scenario: Scenario, redis_url: &str, rounds: usize) -> anyhow::Result<SoldOutPath> {
    anyhow::ensure!(rounds >= 1, "--rounds must be at least 1");
    let run_id = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let sku = format!("sold-out-{run_id}");
    let data_dir = std::env::temp_dir().join(format!("seckill-sold-out-{}-{run_id}", std::process::id()));
    let coordinator = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let text = scenario.cluster_toml_with_buffer(&sku, redis_url, coordinator, &data_dir, Default::default());
    let cluster = Cluster::parse(&text).context("scenario config")?;
    let ledger = build_ledger(&cluster.ledger).await?;
    let running = RunningCluster::start(&cluster, ledger, Options::default()).await?;
    running.wait_ready(Duration::from_secs(10)).await?;
    let sku_id = ledger::SkuId::new(&sku)?;
    crate::dev::demo::wait_for_allotments(&running, &sku_id, scenario.stock).await?;
    let plan = |seed: u64| LoadPlan {
        targets: running.addrs(),
        sku: sku.clone(),
        purchases: scenario.requests,
        users: scenario.users,
        concurrency: scenario.concurrency,
        retries_max: 0,
        retry_pause: Duration::ZERO,
        seed,
        rate_per_s: None,
        bearer: None,
    };
    // The sale itself: afterwards every node knows the SKU is sold out.
    let sale = load::run(plan(1)).await?;
    let status = running.ledger.status(&sku_id).await?;
    anyhow::ensure!(status.remaining == 0, "the sale left {} units; the sold-out path needs none", status.remaining);
    let bar = testkit::progress::steps(rounds as u64 * 2, "sold-out path vs bare hyper");
    let mut measured = Vec::new();
    for round in 0..rounds {
        let report = load::run(plan(2 + round as u64)).await?;
        bar.inc(1);
        let sold_out_rps = report.requests as f64 / report.elapsed.as_secs_f64();
        let bare_hyper_rps = crate::dev::bench::bare_hyper(scenario, scenario.concurrency).await?;
        bar.inc(1);
        measured.push(Round { sold_out_rps, bare_hyper_rps });
    }
    bar.finish_and_clear();
    running.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
    tracing::debug!(sold = status.sold, requests = sale.requests, "the sale before the sold-out runs");
    let share =
        crate::dev::bench::spread(measured.iter().map(|round| round.sold_out_rps / round.bare_hyper_rps.max(1e-9))).1;
    Ok(SoldOutPath {
        scenario: scenario.name.to_string(),
        requests_per_run: scenario.requests,
        concurrency: scenario.concurrency,
        rounds: measured,
        share_of_ceiling: share,
    })
}
