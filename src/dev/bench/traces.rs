//! `seckill bench traces`: what tracing costs a sale. The same sale with tracing off and with
//! it on at a sampling ratio (1% by default), alternating in one run, its spans exported to a
//! collector the benchmark runs; the figure is requests/s with tracing on over off, per round.

use serde::Serialize;
use testkit::otlp::Collector;

use crate::dev::bench::spread;
use crate::dev::demo::{run_sale, Approach, SaleSetup};
use crate::dev::scenario::Scenario;

#[derive(Debug, Serialize)]
pub struct TracingCost {
    pub scenario: String,
    pub sample_ratio: f64,
    /// Requests/s per round, tracing off then on.
    pub off_rps: Vec<f64>,
    pub on_rps: Vec<f64>,
    /// on / off per round: min, median, max.
    pub ratio_min: f64,
    pub ratio_median: f64,
    pub ratio_max: f64,
    /// Spans the collector received over the run.
    pub spans_received: usize,
    /// Requests traced (their HTTP spans) over the "on" rounds.
    pub requests_traced: usize,
    pub requests_sent_traced: u64,
}

impl TracingCost {
    pub fn render(&self) -> String {
        let mut text = format!(
            "scenario {}, tracing at {}% of requests, alternating off/on per round:\n",
            self.scenario,
            self.sample_ratio * 100.0
        );
        for (round, (off, on)) in self.off_rps.iter().zip(&self.on_rps).enumerate() {
            text.push_str(&format!(
                "  round {}: off {off:.0} req/s, on {on:.0} req/s, on/off {:.3}\n",
                round + 1,
                on / off.max(1e-9)
            ));
        }
        text.push_str(&format!(
            "on/off {:.3} / {:.3} / {:.3} (min / median / max); {} requests traced of {} sent with tracing on, \
             {} spans exported\n",
            self.ratio_min,
            self.ratio_median,
            self.ratio_max,
            self.requests_traced,
            self.requests_sent_traced,
            self.spans_received
        ));
        text
    }
}

/// Runs `rounds` pairs of sales on the cluster approach against `redis_url`.
pub async fn measure(
    scenario: Scenario,
    redis_url: &str,
    rounds: usize,
    sample_ratio: f64,
) -> anyhow::Result<TracingCost> {
    let collector = Collector::start().await?;
    let settings = telemetry::Settings {
        endpoint: Some(collector.endpoint()),
        sample_ratio,
        service: "seckill-bench".into(),
        instance: "bench".into(),
    };
    let exporting = telemetry::install(&settings)
        .map_err(anyhow::Error::msg)?
        .ok_or_else(|| anyhow::anyhow!("tracing did not start with an endpoint set"))?;
    let (mut off_rps, mut on_rps, mut sent_traced) = (Vec::new(), Vec::new(), 0);
    let steps = testkit::progress::steps(rounds.max(1) as u64 * 2, "bench traces");
    for round in 0..rounds.max(1) {
        // Which goes first alternates, so a machine that drifts favours neither.
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        for on in order {
            steps.set_message(format!(
                "round {}/{}: tracing {}",
                round + 1,
                rounds.max(1),
                if on { "on" } else { "off" }
            ));
            telemetry::set_paused(!on);
            let report = run_sale(SaleSetup::new(scenario, Approach::Cluster, Some(redis_url))).await?;
            anyhow::ensure!(report.oversell == 0 && report.duplicates == 0, "the sale broke an invariant: {report:?}");
            if on {
                on_rps.push(report.rps);
                sent_traced += report.requests;
            } else {
                off_rps.push(report.rps);
            }
            steps.inc(1);
        }
    }
    steps.finish_and_clear();
    telemetry::set_paused(true);
    exporting.shutdown().await;
    let spans = collector.spans();
    let (ratio_min, ratio_median, ratio_max) = spread(off_rps.iter().zip(&on_rps).map(|(off, on)| on / off.max(1e-9)));
    Ok(TracingCost {
        scenario: scenario.name.to_string(),
        sample_ratio,
        off_rps,
        on_rps,
        ratio_min,
        ratio_median,
        ratio_max,
        spans_received: spans.len(),
        requests_traced: spans.iter().filter(|span| span.name == "POST /v1/purchase").count(),
        requests_sent_traced: sent_traced,
    })
}
