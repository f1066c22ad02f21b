//! Where logs go and how much of them: stderr, quiet by default. Dependencies (openraft, hyper,
//! redis, ...) speak at `warn`. This workspace's crates speak at `info` to an operator running
//! servers (`up`, `node`, `coordinator`, `fleet`, `admin`), and keep that level for what an
//! operator acts on (a node registering or leaving, an admin change, a ledger resumed); to
//! someone waiting for a report (`demo`, `bench`, `load`) only warnings reach the terminal, as
//! the cluster those commands start in process is not theirs to operate; a demo of faults made on
//! purpose (`demo --scenario payments`) shows only errors, since the warnings those faults cause
//! are what its report counts. `-v` turns our crates to
//! `debug`, `-vv` everything; `RUST_LOG`, when set, replaces all of it.
//!
//! stdout is for a command's result (a report, JSON, an nginx config), so scripts can read it
//! whatever the log level.

use std::io::{IsTerminal, Write};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The targets of this workspace's crates (their library names).
const OUR_CRATES: [&str; 9] =
    ["seckill", "node", "coordinator", "ledger", "safeguards", "paysim", "orders", "auth", "nemesis"];

/// Who reads a command's logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// An operator of servers: our crates at `info`.
    Operator,
    /// Someone waiting for a command's report: warnings only.
    Report,
    /// Someone waiting for the report of a run that injects faults on purpose: errors only.
    FaultReport,
}

/// The filter for `verbosity` (the number of `-v`s) when `RUST_LOG` is not set.
pub fn filter(verbosity: u8, audience: Audience) -> String {
    let (ours, others) = match (verbosity, audience) {
        (0, Audience::Operator) => ("info", "warn"),
        (0, Audience::Report) => ("warn", "warn"),
        (0, Audience::FaultReport) => ("error", "error"),
        (1, _) => ("debug", "warn"),
        _ => ("debug", "debug"),
    };
    let mut directives = vec![others.to_string()];
    directives.extend(OUR_CRATES.iter().map(|target| format!("{target}={ours}")));
    directives.join(",")
}

/// Installs the process's subscriber: `RUST_LOG` if set, else [`filter`]; to stderr, around any
/// progress bar; colours only on a terminal (fleet processes log to files). Beside it, the trace
/// layer, which exports once a server read its config and installed an exporter
/// (`telemetry::install`); the log filter is the fmt layer's own, so it never hides a traced
/// span from the exporter.
pub fn init(verbosity: u8, audience: Audience) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter(verbosity, audience)));
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| BarAwareStderr)
        .with_filter(filter);
    tracing_subscriber::registry().with(telemetry::layer()).with(logs).init();
}

/// stderr, written with the progress bars cleared so a log line never lands inside one.
struct BarAwareStderr;

impl Write for BarAwareStderr {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        // Only the lab's commands draw bars; the server build has none to clear.
        #[cfg(feature = "lab")]
        return testkit::progress::suspend(|| std::io::stderr().write(line));
        #[cfg(not(feature = "lab"))]
        std::io::stderr().write(line)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: by default dependencies say only warnings and our crates say info to operators and
    /// only warnings to report readers; each `-v` opens up one step. Method: build and parse each
    /// filter the way `init` does.
    #[test]
    fn verbosity_opens_our_crates_first_then_everything() {
        use Audience::{FaultReport, Operator, Report};
        assert_eq!(
            filter(0, Operator),
            "warn,seckill=info,node=info,coordinator=info,ledger=info,safeguards=info,paysim=info,orders=info,auth=info,nemesis=info"
        );
        assert_eq!(
            filter(0, Report),
            "warn,seckill=warn,node=warn,coordinator=warn,ledger=warn,safeguards=warn,paysim=warn,orders=warn,auth=warn,nemesis=warn"
        );
        assert_eq!(
            filter(0, FaultReport),
            "error,seckill=error,node=error,coordinator=error,ledger=error,safeguards=error,paysim=error,orders=error,auth=error,nemesis=error"
        );
        // The order service is one of ours: its sweeps, payment checks and refunds reach an
        // operator of `seckill orders` at info, as the nodes' events do.
        assert!(filter(0, Operator).contains(",orders=info"));
        let debug = "warn,seckill=debug,node=debug,coordinator=debug,ledger=debug,safeguards=debug,paysim=debug,orders=debug,auth=debug,nemesis=debug";
        assert_eq!((filter(1, Operator).as_str(), filter(1, Report).as_str()), (debug, debug));
        assert_eq!(filter(1, FaultReport), debug);
        assert!(filter(2, Report).starts_with("debug,"));
        assert_eq!(filter(7, Operator), filter(2, Report));
        for verbosity in 0..3 {
            for audience in [Operator, Report, FaultReport] {
                let text = filter(verbosity, audience);
                assert!(EnvFilter::try_new(&text).is_ok(), "{text}");
            }
        }
    }
}
