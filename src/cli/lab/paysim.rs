//! `seckill paysim`: the sandbox payment provider, run until Ctrl-C or SIGTERM.

use anyhow::Context;

use super::parse_probability;
use crate::shutdown::stop_requested;

#[derive(clap::Args)]
pub struct PaysimArgs {
    /// Where its API listens: a loopback address (port 0 picks a free one; the line
    /// `paysim on http://ADDR` on stdout names it).
    #[arg(long, default_value = "127.0.0.1:8095")]
    listen: std::net::SocketAddr,
    /// The environment variable holding the secret callbacks are signed with: the order
    /// service's payment secret.
    #[arg(long, value_name = "NAME", default_value = crate::config::PAYMENT_SECRET_ENV)]
    secret_env: String,
    /// Seeds every fault's draws, so the same requests meet the same faults [default:
    /// random, printed]
    #[arg(long)]
    seed: Option<u64>,
    /// Allow --listen on an address other than loopback, on a private network of the fleet's
    /// alone (a container's): whoever reaches the sandbox can settle its payments.
    #[arg(long)]
    private_network: bool,
    #[command(flatten)]
    faults: PaysimFaults,
}

/// The sandbox provider's faults at start; `PUT /v1/faults` changes them while it runs.
#[derive(clap::Args)]
pub struct PaysimFaults {
    /// Wait this long after a payment succeeds before notifying it.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    callback_delay_ms: u64,
    /// Chance that a success is notified twice.
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    duplicate_p: f64,
    /// Chance that a success is never notified (only a query finds it).
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    drop_p: f64,
    /// Hold notifications and send each batch (--reorder-window-ms) in reverse order.
    #[arg(long)]
    reorder: bool,
    /// Under --reorder, a batch is what arrives within this long of its first notification.
    #[arg(long, default_value_t = 250, value_name = "MS")]
    reorder_window_ms: u64,
    /// Chance that a buyer's "succeed" is declined.
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    decline_p: f64,
    /// Chance that a create, query, refund or close answers 503 and does nothing.
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    unavailable_p: f64,
    /// Chance that a create, refund or close is done but answered 503 (a lost answer).
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    answer_lost_p: f64,
}

impl From<PaysimFaults> for paysim::Faults {
    fn from(knobs: PaysimFaults) -> Self {
        paysim::Faults {
            callback_delay_ms: knobs.callback_delay_ms,
            duplicate_p: knobs.duplicate_p,
            drop_p: knobs.drop_p,
            reorder: knobs.reorder,
            reorder_window_ms: knobs.reorder_window_ms,
            decline_p: knobs.decline_p,
            unavailable_p: knobs.unavailable_p,
            answer_lost_p: knobs.answer_lost_p,
        }
    }
}

pub async fn run(args: PaysimArgs) -> anyhow::Result<()> {
    let (listen, secret_env, seed, private_network) = (args.listen, &args.secret_env, args.seed, args.private_network);
    let faults = paysim::Faults::from(args.faults);
    let secret = protocol::env_secret::from_env(secret_env)?.with_context(|| {
        format!("{secret_env} is not set: it holds the secret payment callbacks are signed with (the order service's)")
    })?;
    anyhow::ensure!(
        secret.len() >= paysim::SECRET_BYTES_MIN,
        "{secret_env} must be at least {} characters",
        paysim::SECRET_BYTES_MIN
    );
    let seed = seed.unwrap_or_else(|| fastrand::u64(..));
    let config = paysim::Config { secret: secret.into_bytes().into(), faults, seed, private_network };
    // The sandbox has no config file: the standard OTEL_* variables turn its traces on.
    let traces =
        crate::traces::start(&crate::config::TelemetrySection::default(), "seckill-paysim", &listen.to_string())?;
    let sandbox = paysim::Paysim::start(listen, config).await?;
    tracing::info!(faults = ?sandbox.faults(), "sandbox payment provider running");
    println!("paysim on http://{} (seed {seed})", sandbox.addr);
    stop_requested().await?;
    sandbox.stop().await;
    traces.stop().await;
    Ok(())
}
