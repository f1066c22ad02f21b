//! `seckill reconcile`: prints what [`crate::reconcile::run`] found; exits 1 on a mismatch.

use super::ConfigArg;

#[derive(clap::Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Only this SKU [default: every SKU of the config].
    #[arg(long)]
    sku: Option<String>,
    /// Replay order events missing from the store and complete interrupted releases, then
    /// check again.
    #[arg(long)]
    repair: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(super) json: bool,
}

pub async fn run(args: ReconcileArgs) -> anyhow::Result<()> {
    let cluster = args.config.source().load()?;
    let reconciliation = crate::reconcile::run(&cluster, args.sku.as_deref(), args.repair).await?;
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
