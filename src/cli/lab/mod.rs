//! The lab's commands, in a default build only (feature `lab`): `demo`, `load`, `bench`,
//! `nemesis` and the sandbox payment provider `paysim`. They run sales, buyers and faults of
//! their own; an operator's fleet never needs them, so the server build leaves them out, with
//! the test kit, the nemesis and the sandbox they link.

mod bench;
mod dev;
mod paysim;

use clap::Subcommand;

use crate::logging::Audience;

#[derive(Subcommand)]
pub enum LabCommand {
    /// Run the sandbox payment provider until Ctrl-C or SIGTERM: a small Stripe-like API
    /// (create, pay, query, refund) whose successes are notified to the order service signed,
    /// with fault knobs (docs/payments.md). Loopback only; it takes no real money.
    Paysim(paysim::PaysimArgs),
    /// Benchmark the cluster against the Redis-only approach.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
    /// Send a flash sale's buyers at running nodes or a load balancer and print what came back.
    Load(dev::LoadArgs),
    /// Run a complete flash sale in process and print what happened.
    Demo(dev::DemoArgs),
    /// Break a real fleet on purpose: randomized fault schedules, a recorded history, a checker
    /// for every promise (docs/reliability.md). Exits non-zero on any violation.
    Nemesis(dev::NemesisArgs),
}

impl LabCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            LabCommand::Paysim(args) => paysim::run(args).await,
            LabCommand::Bench { what } => bench::run(what).await,
            LabCommand::Load(args) => dev::load(args).await,
            LabCommand::Demo(args) => dev::demo(args).await,
            LabCommand::Nemesis(args) => dev::nemesis(args).await,
        }
    }

    /// Whether the command runs a server someone operates, or reports on a run it made itself.
    pub fn audience(&self) -> Audience {
        match self {
            LabCommand::Paysim(_) => Audience::Operator,
            LabCommand::Demo(args) if args.scenario.name == crate::dev::scenario::PAYMENTS => Audience::FaultReport,
            LabCommand::Demo(_) | LabCommand::Bench { .. } | LabCommand::Load(_) | LabCommand::Nemesis(_) => {
                Audience::Report
            }
        }
    }

    /// The command prints JSON for a script (so no progress bars).
    pub fn json(&self) -> bool {
        match self {
            LabCommand::Load(args) => args.json,
            LabCommand::Demo(args) => args.json,
            LabCommand::Nemesis(args) => args.json,
            LabCommand::Bench { what } => what.json(),
            LabCommand::Paysim(_) => false,
        }
    }
}

/// Prints a benchmark's or demo's report: one JSON object for a script, the table otherwise.
fn print_report<T: serde::Serialize>(json: bool, report: &T, render: impl FnOnce(&T) -> String) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{}", render(report));
    }
    Ok(())
}

fn parse_probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{text:?} is not a probability from 0 to 1")),
    }
}
