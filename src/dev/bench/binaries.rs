//! `seckill bench binaries --old A --new B`: two builds' `bench compare`, alternating round by
//! round in one run (old first in odd rounds, new first in even ones), so a refactor can be
//! shown to cost nothing. This machine's throughput moves ±20% between runs, so each build's
//! figure is also taken as its share of the bare HTTP stack measured in the same `compare`,
//! which cancels most of the drift; the verdict is whether the new/old ratio's range over the
//! rounds holds 1, or lies above or below it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use serde::Serialize;

/// One build's one `bench compare --rounds 1`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Run {
    pub cluster_rps: f64,
    pub redis_only_rps: f64,
    pub bare_hyper_rps: f64,
}

impl Run {
    fn share_of_ceiling(&self) -> f64 {
        self.cluster_rps / self.bare_hyper_rps.max(1e-9)
    }
}

#[derive(Debug, Serialize)]
pub struct Round {
    pub old: Run,
    pub new: Run,
}

#[derive(Debug, Serialize)]
pub struct Binaries {
    pub old: PathBuf,
    pub new: PathBuf,
    pub scenario: String,
    pub rounds: Vec<Round>,
    /// new / old of the cluster's requests/s: min, median, max over rounds.
    pub rps_ratio: (f64, f64, f64),
    /// new / old of the cluster's share of the bare HTTP stack: min, median, max.
    pub share_ratio: (f64, f64, f64),
}

impl Binaries {
    /// What the rounds say: the share ratio's range holds 1 (no difference they can tell), or
    /// lies wholly above it or below it.
    pub fn verdict(&self) -> &'static str {
        match self.share_ratio {
            (low, _, high) if low <= 1.0 && 1.0 <= high => "within noise: the rounds do not tell the builds apart",
            (low, _, _) if low > 1.0 => "the new build is faster in every round",
            _ => "the new build is SLOWER in every round",
        }
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "old {}\nnew {}\nscenario {}, `bench compare --rounds 1` per build per round, alternating\n\n\
             {:>5} {:>12} {:>12} {:>10} {:>10} {:>10}\n",
            self.old.display(),
            self.new.display(),
            self.scenario,
            "round",
            "old req/s",
            "new req/s",
            "old/bare",
            "new/bare",
            "new/old"
        );
        for (at, round) in self.rounds.iter().enumerate() {
            out.push_str(&format!(
                "{:>5} {:>12.0} {:>12.0} {:>9.0}% {:>9.0}% {:>10.3}\n",
                at + 1,
                round.old.cluster_rps,
                round.new.cluster_rps,
                100.0 * round.old.share_of_ceiling(),
                100.0 * round.new.share_of_ceiling(),
                round.new.cluster_rps / round.old.cluster_rps.max(1e-9)
            ));
        }
        let (low, median, high) = self.share_ratio;
        out.push_str(&format!(
            "\nnew/old, share of the bare stack: {low:.3} / {median:.3} / {high:.3} (min / median / max); \
             requests/s: {:.3} / {:.3} / {:.3}\n{}\n",
            self.rps_ratio.0,
            self.rps_ratio.1,
            self.rps_ratio.2,
            self.verdict()
        ));
        out
    }
}

pub fn run(old: &Path, new: &Path, scenario: &str, rounds: usize) -> anyhow::Result<Binaries> {
    anyhow::ensure!(rounds >= 1, "--rounds must be at least 1");
    let steps = testkit::progress::steps(rounds as u64 * 2, "bench binaries");
    let mut measured = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let old_first = round % 2 == 0;
        let (first, second) = if old_first { (old, new) } else { (new, old) };
        steps.set_message(format!("round {}/{rounds}", round + 1));
        let first = compare_once(first, scenario)?;
        steps.inc(1);
        let second = compare_once(second, scenario)?;
        steps.inc(1);
        let (old, new) = if old_first { (first, second) } else { (second, first) };
        measured.push(Round { old, new });
    }
    steps.finish_and_clear();
    let spread = |ratio: &dyn Fn(&Round) -> f64| crate::dev::bench::spread(measured.iter().map(ratio));
    let rps_ratio = spread(&|r| r.new.cluster_rps / r.old.cluster_rps.max(1e-9));
    let share_ratio = spread(&|r| r.new.share_of_ceiling() / r.old.share_of_ceiling().max(1e-9));
    debug_assert!(share_ratio.0 <= share_ratio.1 && share_ratio.1 <= share_ratio.2, "min ≤ median ≤ max");
    Ok(Binaries {
        old: old.to_path_buf(),
        new: new.to_path_buf(),
        scenario: scenario.to_string(),
        rounds: measured,
        rps_ratio,
        share_ratio,
    })
}

/// `binary bench compare --scenario S --rounds 1 --json`, read for the figures compared.
fn compare_once(binary: &Path, scenario: &str) -> anyhow::Result<Run> {
    let output = Command::new(binary)
        .args(["bench", "compare", "--scenario", scenario, "--rounds", "1", "--json"])
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "{} bench compare failed ({}): {}",
        binary.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or("")
    );
    let line = stdout.lines().rev().find(|line| line.starts_with('{')).context("no JSON line in its output")?;
    let report: serde_json::Value = serde_json::from_str(line).context("its JSON")?;
    let figure = |pointer: &str| {
        report.pointer(pointer).and_then(serde_json::Value::as_f64).with_context(|| format!("no {pointer} in its JSON"))
    };
    Ok(Run {
        cluster_rps: figure("/cluster/0/rps")?,
        redis_only_rps: figure("/redis_only/0/rps")?,
        bare_hyper_rps: figure("/bare_hyper_rps")?,
    })
}
