//! `seckill reconcile`: prints what [`crate::reconcile::run`] found; exits 1 on a mismatch.

use super::ConfigArg;

#[derive(clap::Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Only this SKU [default: every SKU of the config].
    #[arg(long)]
    sku: Option<String>,
    /// Settle what can be settled, then check again: order events the store lacks are replayed
    /// into it (an order for every sale), interrupted releases of expired or cancelled orders
    /// are completed at the ledger (each unit given back once), and payments and refunds left
    /// open are asked about at the provider and settled. Safe to run while the fleet sells.
    #[arg(long)]
    repair: bool,
    /// With [payments]: hold the store against the provider's books for payments created this
    /// long ago or later (e.g. 24h, 90m, 7d): a cron job's window.
    #[arg(long, default_value = "24h", value_parser = parse_span)]
    since: std::time::Duration,
    /// With [payments]: how long a callback, a refund or an order may take before its absence
    /// is a finding (payments younger than this are in flight, not judged).
    #[arg(long, default_value = "15m", value_parser = parse_span)]
    bound: std::time::Duration,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(super) json: bool,
}

/// `90s`, `15m`, `24h`, `7d`.
fn parse_span(text: &str) -> Result<std::time::Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("{text:?}: a number and a unit, e.g. 24h"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit is s, m, h or d")),
    };
    Ok(std::time::Duration::from_secs(number.saturating_mul(seconds)))
}

pub async fn run(args: ReconcileArgs) -> anyhow::Result<()> {
    let cluster = args.config.source().load()?;
    let window = crate::reconcile::BooksWindow { since: args.since, bound: args.bound };
    let reconciliation = crate::reconcile::run(&cluster, args.sku.as_deref(), args.repair, &window).await?;
    if args.json {
        println!("{}", serde_json::to_string(&reconciliation)?);
    } else {
        print!("{}", reconciliation.render());
    }
    if !reconciliation.ok {
        // A mismatch is a finding, not a failure to run: exit 1 without an `error:` line.
        std::process::exit(1);
    }
    Ok(())
}
