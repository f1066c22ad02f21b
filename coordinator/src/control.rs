//! The leader's control loop: the I/O around [`crate::policy`]. Every tick, on the leader only,
//! once it has confirmed it still leads a quorum (`ensure_linearizable`):
//!
//! 1. define the SKUs of `cluster.toml` the group does not know yet, creating their ledgers
//!    first if absent (once in a SKU's life: if Redis later loses its data, nothing here
//!    recreates the stock; nodes refuse to sell instead);
//! 2. write the expiries the policy decides; then, for every ended epoch not settled yet
//!    (expired or left, by this leader or an earlier one), fence it at the ledger, which answers
//!    what it sold, and write the reallocation of the rest, settling it;
//! 3. read each SKU's ledger figures and write the top-ups. A SKU whose figures did not move is
//!    read ever less often, at most [`QUIET_TICKS_MAX`] ticks apart ([`protocol::pace`]); the
//!    ticks between reuse the last figures, so a sold-out or idle SKU costs Redis close to
//!    nothing.
//!
//! Failures end the tick (the next one starts over from the state): every rule recomputes from
//! the replicated state, so nothing is lost by retrying.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ledger::{NodeId, Seller, SkuId, SkuStatus};
use protocol::pace::Pace;
use tokio::sync::watch;

use crate::context::{now_ms, Context, WriteError};
use crate::policy::{self, Leadership, LedgerFigures, Timing};
use crate::state::{Command, Outcome};

/// The longest a quiet SKU goes unread, in ticks: 1 s at the default heartbeat. Stale figures
/// only move grants: units released back at the ledger are granted up to this late, and a grant
/// past what is left is refused by the ledger at confirm, never sold.
const QUIET_TICKS_MAX: u32 = 8;

/// This leader's pace of reads per SKU; dropped with its leadership, since the next term's
/// leader must read figures afresh.
type FigurePaces = BTreeMap<SkuId, Pace<SkuStatus>>;

/// Why a tick stopped early; the next tick starts over.
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error("ledger: {0}")]
    Ledger(#[from] ledger::LedgerError),
    #[error("raft write: {0:?}")]
    Write(WriteError),
}

/// Registers the decision counters so they render as 0 before the first decision.
pub fn register_metrics(member: &str) {
    let member = member.to_string();
    metrics::counter!("seckill_coordinator_expiries_total", "member" => member.clone()).increment(0);
    metrics::counter!("seckill_coordinator_brake_total", "member" => member.clone()).increment(0);
    metrics::counter!("seckill_coordinator_brake_released_total", "member" => member.clone()).increment(0);
    for reason in ["reallocation", "top_up"] {
        metrics::counter!("seckill_coordinator_granted_units_total", "member" => member.clone(), "reason" => reason)
            .increment(0);
    }
}

pub async fn run(member: Arc<Context>, mut stop: watch::Receiver<bool>) {
    let tick = (member.heartbeat() / 2).max(Duration::from_millis(20));
    let mut leadership: Option<Leadership> = None;
    let mut paces = FigurePaces::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        if !member.is_leader() {
            leadership = None;
            paces.clear();
            member.stepped_down();
            continue;
        }
        let leadership = leadership.get_or_insert_with(|| {
            tracing::info!(member = %member.name(), "leading; waiting one lease before expiring anyone");
            let since_ms = now_ms();
            member.took_over(since_ms);
            Leadership { since_ms, brake_since_ms: None }
        });
        // Decisions below read the state; make sure it is the latest the group agreed on, and
        // that this member still leads a quorum (the brake's bound relies on it).
        if let Err(e) = member.raft().ensure_linearizable().await {
            tracing::debug!("not deciding: {e}");
            continue;
        }
        if let Err(e) = step(&member, leadership, &mut paces).await {
            tracing::warn!(member = %member.name(), "control step failed: {e}");
        }
    }
}

fn timing(member: &Context) -> Timing {
    Timing::new(member.lease().as_millis() as u64, member.grace().as_millis() as u64)
}

async fn step(member: &Context, leadership: &mut Leadership, paces: &mut FigurePaces) -> Result<(), StepError> {
    define_planned(member).await?;
    expire(member, leadership).await?;
    if member.reallocates() {
        settle(member).await?;
        top_up(member, leadership, paces).await?;
    }
    Ok(())
}

async fn write(member: &Context, command: Command) -> Result<Outcome, StepError> {
    member.write(command).await.map_err(StepError::Write)
}

async fn define_planned(member: &Context) -> Result<(), StepError> {
    for plan in member.plans() {
        if member.applied_state().catalogue.contains(&plan.sku) {
            continue;
        }
        let created = member.ledger().create_sku(&plan.sku, &plan.terms).await?;
        tracing::info!(sku = %plan.sku, ?created, "defining SKU");
        let command =
            Command::DefineSku { sku: plan.sku.clone(), starting: plan.starting.clone(), terms: plan.terms.clone() };
        write(member, command).await?;
    }
    Ok(())
}

async fn expire(member: &Context, leadership: &mut Leadership) -> Result<(), StepError> {
    let state = member.fleet_view();
    let decided = policy::expiries(&state, now_ms(), leadership, timing(member));
    let labels = [("member", member.name().to_string())];
    if decided.braked {
        metrics::counter!("seckill_coordinator_brake_total", &labels).increment(1);
        tracing::warn!(live = state.live_nodes().count(), "most nodes look dead at once; holding expiries back");
    }
    if decided.brake_released {
        metrics::counter!("seckill_coordinator_brake_released_total", &labels).increment(1);
        tracing::warn!("the brake held for its bound with a quorum behind this leader; expiring the lapsed nodes");
    }
    for command in decided.commands {
        let Command::Expire { node, epoch, now_ms, grace_ms } = &command else { continue };
        let (node, epoch) = (node.clone(), *epoch);
        // A heartbeat may have renewed the lease since the view was taken; from the mark on,
        // none can until the expiry is written (`crate::leases`).
        if !member.begin_expiry(&node, epoch, *now_ms, *grace_ms) {
            continue;
        }
        let written = write(member, command).await;
        member.expiry_done(&node, epoch);
        if let Outcome::Expired { revoked } = written? {
            metrics::counter!("seckill_coordinator_expiries_total", &labels).increment(1);
            tracing::warn!(%node, epoch, ?revoked, "lease expired; node's epoch ended and its allotment revoked");
        }
    }
    Ok(())
}

/// Fences every ended epoch at the ledger and hands its unsold units to the live nodes (rule 3),
/// settling each SKU of it in the same raft entry.
async fn settle(member: &Context) -> Result<(), StepError> {
    let state = member.applied_state();
    let unsettled: Vec<(NodeId, u64, BTreeMap<SkuId, u64>)> =
        state.fleet.unsettled().map(|(node, epoch, skus)| (node.clone(), epoch, skus.clone())).collect();
    for (node, epoch, skus) in unsettled {
        let seller = Seller::new(node.clone(), epoch);
        for (sku, granted) in skus {
            let sold = match member.ledger().end_epoch(&sku, &seller).await {
                Ok(sold) => sold,
                // No ledger, nothing to sell: settle without granting.
                Err(ledger::LedgerError::Missing(_)) => granted,
                Err(e) => return Err(e.into()),
            };
            let state = member.fleet_view();
            let command = policy::reallocation(&state, &node, epoch, &sku, granted, sold);
            let units = granted_units(write(member, command).await?);
            tracing::info!(%sku, %node, epoch, granted, sold, units, "fenced an ended epoch and reallocated its unsold units");
            let labels = [("member", member.name().to_string()), ("reason", "reallocation".to_string())];
            metrics::counter!("seckill_coordinator_granted_units_total", &labels).increment(units);
        }
    }
    Ok(())
}

async fn top_up(member: &Context, leadership: &Leadership, paces: &mut FigurePaces) -> Result<(), StepError> {
    let skus: Vec<_> = member.applied_state().catalogue.skus.keys().cloned().collect();
    paces.retain(|sku, _| skus.contains(sku));
    let mut hold_max: BTreeMap<NodeId, BTreeMap<SkuId, u64>> = BTreeMap::new();
    for sku in skus {
        let Some(status) = figures(member, paces, &sku).await else { continue };
        let state = member.fleet_view();
        let figures = LedgerFigures { remaining: status.remaining, closed: status.closed };
        let top = policy::top_up(&state, &sku, figures, now_ms(), leadership, timing(member));
        for (node, max) in &top.hold_max {
            hold_max.entry(node.clone()).or_default().insert(sku.clone(), *max);
        }
        let labels = [("member", member.name().to_string()), ("sku", sku.to_string())];
        metrics::gauge!("seckill_coordinator_buffer_units", &labels)
            .set(top.target.saturating_sub(status.remaining) as f64);
        if let Some(command) = top.command {
            let units = granted_units(write(member, command).await?);
            tracing::debug!(%sku, remaining = status.remaining, held = top.held, units, "topped up live allotments");
            let labels = [("member", member.name().to_string()), ("reason", "top_up".to_string())];
            metrics::counter!("seckill_coordinator_granted_units_total", &labels).increment(units);
        }
    }
    if !hold_max.is_empty() {
        tracing::debug!(?hold_max, "rebalancing: nodes asked to hold at most");
    }
    member.set_hold_max(hold_max);
    Ok(())
}

/// `sku`'s ledger figures: read when its pace says so, else the last ones read.
async fn figures(member: &Context, paces: &mut FigurePaces, sku: &SkuId) -> Option<SkuStatus> {
    let pace = paces.entry(sku.clone()).or_insert_with(|| Pace::new(QUIET_TICKS_MAX));
    if !pace.due() {
        return pace.seen().cloned();
    }
    match member.ledger().status(sku).await {
        Ok(status) => {
            pace.read(Some(status.clone()));
            Some(status)
        }
        Err(e) => {
            pace.read(None);
            tracing::debug!(%sku, "no top-up: {e}");
            None
        }
    }
}

fn granted_units(outcome: Outcome) -> u64 {
    match outcome {
        Outcome::Granted { units } => units,
        _ => 0,
    }
}
