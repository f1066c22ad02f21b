//! `seckill admin …`: arguments to [`crate::admin`] calls, and their answers printed.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;

use super::{parse_buffer, parse_instant, ConfigArg};
use crate::admin::{self, AdminClient, Call, MemberOp};
use crate::config::Buffer;

/// Where admin calls go and how they authenticate.
#[derive(clap::Args)]
pub struct AdminTarget {
    /// Coordinator members, comma-separated host:port [default: [coordinator] members of the
    /// config]. Writes reaching a follower are sent on to the leader it names.
    #[arg(long, value_delimiter = ',', value_parser = admin::parse_member, global = true)]
    coordinator: Vec<String>,
    #[command(flatten)]
    config: ConfigArg,
    /// A file holding the admin token (instead of SECKILL_ADMIN_TOKEN).
    #[arg(long, value_name = "PATH", global = true)]
    token_file: Option<PathBuf>,
    /// Print the coordinator's JSON answer instead of a summary.
    #[arg(long, global = true)]
    pub(super) json: bool,
}

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Leader, nodes (live, epoch, worker id, grants) and every SKU's figures.
    Cluster,
    /// Create a SKU: its ledger, then its terms in raft; live nodes start selling it.
    Create {
        #[arg(value_parser = admin::parse_sku)]
        sku: String,
        /// Units on sale.
        #[arg(long)]
        total: u64,
        /// Units one user may buy in total; 0 = no limit [server default: 0]
        #[arg(long)]
        per_user_limit: Option<u32>,
        /// Most units in one order [server default: 1]
        #[arg(long)]
        qty_max: Option<u32>,
        /// Extra units per node: a count (50) or a share of its share (10%) [server default: 10%]
        #[arg(long, value_parser = parse_buffer)]
        buffer: Option<Buffer>,
        /// Sale start: a date-time with an offset (2026-11-22T10:00:00+08:00) or Unix ms.
        #[arg(long, value_parser = parse_instant)]
        starts_at: Option<u64>,
        /// Sale end, as `--starts-at`.
        #[arg(long, value_parser = parse_instant)]
        ends_at: Option<u64>,
        /// Every purchase must bring a one-time submit token.
        #[arg(long)]
        require_token: bool,
        /// Seconds a submit token stays usable [server default: 300]
        #[arg(long)]
        token_ttl_s: Option<u64>,
        /// Price of one unit in the currency's minor unit (cents); 0 makes it a giveaway.
        #[arg(long)]
        price: u64,
        /// ISO 4217 code of the price's currency [default: USD]
        #[arg(long)]
        currency: Option<String>,
        /// Seconds a buyer has to pay before the order expires and its units sell again
        /// [default: 900]
        #[arg(long)]
        pay_timeout: Option<u64>,
        /// Split the stock into this many sub-ledgers on different Redis hash slots (1 to 64, at
        /// most --total), for a SKU too hot for one Redis master; the coordinator moves units
        /// from stripe to stripe as they sell out.
        #[arg(long, default_value_t = 1)]
        stripes: u32,
        /// Sell through a waiting room: buyers join a line and buy with the ticket it admits them
        /// with (the default rules; --admit-per-s and --admit-factor change two of them).
        #[arg(long)]
        waiting_room: bool,
        /// With --waiting-room: buyers let through per second, fleet-wide [default: 500]
        #[arg(long, requires = "waiting_room")]
        admit_per_s: Option<u32>,
        /// With --waiting-room: most live tickets per unit left [default: 1.5]
        #[arg(long, requires = "waiting_room")]
        admit_factor: Option<f64>,
    },
    /// Raise a SKU's total to TOTAL (sending it again adds nothing); with --price, --currency or
    /// --pay-timeout, sales from now on are priced so (orders already sold keep their terms).
    Restock {
        #[arg(value_parser = admin::parse_sku)]
        sku: String,
        /// The new total, at least the current one.
        #[arg(long)]
        total: u64,
        /// Price of one unit in minor units, for sales from now on.
        #[arg(long)]
        price: Option<u64>,
        /// ISO 4217 code of the price's currency, for sales from now on.
        #[arg(long)]
        currency: Option<String>,
        /// Seconds to pay, for orders sold from now on.
        #[arg(long)]
        pay_timeout: Option<u64>,
    },
    /// Close a SKU: every later purchase is answered `ended`.
    Close {
        #[arg(value_parser = admin::parse_sku)]
        sku: String,
    },
    /// Change the buffer the leader keeps on top of a SKU's remaining stock.
    SetBuffer {
        #[arg(value_parser = admin::parse_sku)]
        sku: String,
        /// A count (50) or a percentage (25%).
        #[arg(value_parser = parse_buffer)]
        buffer: Buffer,
    },
    /// List, add or remove blocked users and addresses (fleet-wide).
    Blacklist {
        #[command(subcommand)]
        action: BlacklistCommand,
    },
    /// Replace a coordinator member that lost its disk: `remove` it, restart it on its empty
    /// data directory, `add-learner` (returns once it caught up), then `promote`.
    Member {
        #[arg(value_enum)]
        op: MemberOp,
        /// The member's name in [coordinator] members.
        member: String,
    },
}

#[derive(Subcommand)]
pub enum BlacklistCommand {
    /// Every entry, with the time it has left.
    List,
    /// Block user:<id> or ip:<address> on every node.
    Add {
        #[arg(value_parser = admin::parse_entry)]
        entry: String,
        /// Seconds until the entry lapses [default: until removed]
        #[arg(long)]
        ttl_s: Option<u64>,
    },
    /// Unblock user:<id> or ip:<address>.
    Remove {
        #[arg(value_parser = admin::parse_entry)]
        entry: String,
    },
}

/// Load balancers `lb-config` can write a config for.
#[expect(
    clippy::too_many_lines,
    reason = "one arm per admin subcommand, each a call and its summary: the dispatch reads as one table"
)]
pub async fn run(target: AdminTarget, action: AdminCommand) -> anyhow::Result<()> {
    let call = match action {
        AdminCommand::Cluster => Call::Cluster,
        AdminCommand::Create {
            sku,
            total,
            per_user_limit,
            qty_max,
            buffer,
            starts_at,
            ends_at,
            require_token,
            token_ttl_s,
            price,
            currency,
            pay_timeout,
            stripes,
            waiting_room,
            admit_per_s,
            admit_factor,
        } => {
            let defaults = protocol::SkuTerms::new(total);
            let room = waiting_room.then(|| {
                let rules = protocol::RoomRules::default();
                protocol::RoomRules {
                    admit_per_s: admit_per_s.unwrap_or(rules.admit_per_s),
                    admit_factor: admit_factor.unwrap_or(rules.admit_factor),
                    ..rules
                }
            });
            let terms = protocol::SkuTerms {
                per_user_limit: per_user_limit.unwrap_or(defaults.per_user_limit),
                qty_max: qty_max.unwrap_or(defaults.qty_max),
                buffer: buffer.unwrap_or(defaults.buffer),
                starts_at_ms: starts_at,
                ends_at_ms: ends_at,
                require_token,
                token_ttl_s: token_ttl_s.unwrap_or(defaults.token_ttl_s),
                price,
                currency: currency.unwrap_or_else(|| defaults.currency.clone()),
                pay_timeout_s: pay_timeout.unwrap_or(defaults.pay_timeout_s),
                stripes,
                waiting_room: room,
                ..defaults
            };
            // The same rules the server applies, checked before anything is sent.
            terms.validate().map_err(|invalid| {
                let flag = invalid.field.trim_start_matches("waiting_room.").replace('_', "-");
                anyhow::anyhow!("--{flag}: {}", invalid.reason)
            })?;
            Call::Create { sku, terms }
        }
        AdminCommand::Member { op, member } => Call::Member { member, op },
        AdminCommand::Restock { sku, total, price, currency, pay_timeout } => {
            Call::Restock { sku, total, pricing: admin::PricingChange { price, currency, pay_timeout_s: pay_timeout } }
        }
        AdminCommand::Close { sku } => Call::Close { sku },
        AdminCommand::SetBuffer { sku, buffer } => Call::SetBuffer { sku, buffer },
        AdminCommand::Blacklist { action: BlacklistCommand::List } => Call::BlacklistList,
        AdminCommand::Blacklist { action: BlacklistCommand::Add { entry, ttl_s } } => {
            Call::BlacklistAdd { entry, ttl_s }
        }
        AdminCommand::Blacklist { action: BlacklistCommand::Remove { entry } } => Call::BlacklistRemove { entry },
    };
    if let Some(run_dir) = &target.config.run_dir {
        protocol::env_secret::use_secrets_dir(run_dir);
    }
    let token = admin::token(target.token_file.as_deref())?;
    let members = if target.coordinator.is_empty() {
        let source = target.config.source();
        let cluster = source.load()?;
        let group = cluster.coordinator.with_context(|| {
            format!("{source} has no [coordinator] section: pass --coordinator host:port or --config PATH")
        })?;
        group.members.iter().map(|member| member.addr.to_string()).collect()
    } else {
        target.coordinator
    };
    let reply = AdminClient::new(members, &token)?.call(&call).await?;
    if target.json {
        println!("{}", reply.body);
    }
    let reply = reply.success()?;
    if !target.json {
        println!("{}", admin::render(&call, &reply));
    }
    Ok(())
}
