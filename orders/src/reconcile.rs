//! Reconciliation: the ledger's books against the order store, per SKU (`seckill reconcile`).
//!
//! What must hold once the consumer has caught up and the sweeper has run:
//! - **books**: `sold + remaining == total` in the ledger;
//! - **stream**: every order event (`1..=orders`) is an order in the store. A dead letter
//!   accounts for its event (it is not missing, and `repair` does not replay it) but is still a
//!   problem: a sale with no order, or a corrupt entry, that an operator must look at. And every
//!   event the stream still holds is the order stored at its seq: a row there under another id
//!   is an order for a sale the ledger does not have (stored from an event a Redis failover
//!   undid), and it hides the ledger's own order, which the store skipped as a duplicate seq;
//! - **units**: the ledger's `sold` (units sold and not given back) equals the units of
//!   pending and paid orders plus those of orders that must give units back and have not yet;
//! - **releases**: the ledger's `released` equals the units of orders given back, every release
//!   the ledger logged belongs to an order that ended without a valid payment, and no release
//!   was refused by the ledger (an order it has no record of: an operator must look at it);
//! - **money**: every payment recorded against the SKU's orders either settled one order or is
//!   a refund (owed, pending or refunded): payments = settled + refunds + awaiting; each paid
//!   order has exactly its settling payment; no paid order's units were given back. A refund is
//!   kept per payment reference, so none can be paid twice.
//!
//! `repair` fixes what can be fixed from the ledger's side, which is the source of truth for
//! what sold: it replays stream entries missing from the store and completes interrupted
//! releases. A dead letter or a release of an order the store calls paid needs an operator.

use std::collections::BTreeSet;

use ledger::{OrderFeed, SkuId, SkuTerms};
use serde::Serialize;

use crate::model::{NewOrder, Order, ReleaseCursor};
use crate::store::OrderStore;
use crate::unix_ms;

/// Most dead letters looked at in one check.
const DEAD_LETTERS_MAX: usize = 100_000;

/// Orders read per page when walking the unreleased ones.
const UNRELEASED_PAGE: usize = 1_000;

/// One SKU's figures from both sides, and what does not add up.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SkuReport {
    pub sku: String,
    pub total: u64,
    pub sold: u64,
    pub remaining: u64,
    pub released: u64,
    /// Order events appended to the stream, ever.
    pub events: u64,
    pub stored: u64,
    pub dead_letters: u64,
    pub units_pending: u64,
    pub units_paid: u64,
    pub units_given_back: u64,
    pub units_unreleased: u64,
    /// Units of ended orders whose release the ledger refused: an operator must look at them.
    pub release_refused: u64,
    /// The SKU's payments, counted.
    pub money: crate::model::SkuMoneyCounts,
    pub paid_after_expiry: u64,
    /// Stream seqs with neither an order nor a dead letter (at most the first 100 are listed).
    pub missing_seqs: Vec<u64>,
    pub missing_count: u64,
    /// Events still in the stream whose seq the store holds as another order.
    pub displaced_count: u64,
    pub problems: Vec<String>,
}

impl SkuReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// What a repair did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Repaired {
    pub replayed: u64,
    pub released: u64,
    /// Entries missing from the store whose stream entry was trimmed away: cannot be replayed.
    pub unrepairable: u64,
}

pub async fn check(ledger: &dyn OrderFeed, store: &dyn OrderStore, sku: &SkuId) -> Result<SkuReport, String> {
    let status = ledger.status(sku).await.map_err(|e| format!("{sku}: ledger: {e}"))?;
    let counts = store.counts(sku.as_str()).await.map_err(|e| format!("{sku}: store: {e}"))?;
    let mut report = SkuReport {
        sku: sku.to_string(),
        total: status.total,
        sold: status.sold,
        remaining: status.remaining,
        released: status.released,
        events: status.orders,
        units_pending: counts.units_pending,
        units_paid: counts.units_paid,
        units_given_back: counts.units_expired + counts.units_cancelled + counts.units_paid_after_expiry,
        paid_after_expiry: counts.units_paid_after_expiry,
        ..SkuReport::default()
    };
    if status.sold + status.remaining != status.total {
        report
            .problems
            .push(format!("ledger: sold {} + remaining {} != total {}", status.sold, status.remaining, status.total));
    }
    let stored: BTreeSet<u64> = store
        .stored_seqs(sku.as_str(), 1, status.orders)
        .await
        .map_err(|e| format!("{sku}: store: {e}"))?
        .into_iter()
        .collect();
    report.stored = counts.orders;
    check_stream(&mut report, &stored);
    check_stored_events(ledger, store, sku, &stored, &mut report).await?;
    let unreleased = unreleased_of(store, sku).await?;
    report.units_unreleased = unreleased.iter().map(|order| u64::from(order.new.qty)).sum();
    report.release_refused = counts.units_release_refused;
    check_units(&mut report);
    check_release_log(ledger, store, sku, &mut report).await?;
    check_money(store, sku, &mut report).await?;
    Ok(report)
}

/// The stream side: every order event is stored as an order, or as a dead letter an operator
/// must repair. `stored` is the seqs the store holds, either way.
fn check_stream(report: &mut SkuReport, stored: &BTreeSet<u64>) {
    report.dead_letters = (stored.len() as u64).saturating_sub(report.stored);
    let missing: Vec<u64> = (1..=report.events).filter(|seq| !stored.contains(seq)).collect();
    report.missing_count = missing.len() as u64;
    report.missing_seqs = missing.into_iter().take(100).collect();
    if report.dead_letters > 0 {
        report.problems.push(format!(
            "stream: {} order events are dead letters, not orders: an operator must repair them (see the dead-letter table)",
            report.dead_letters
        ));
    }
    if report.missing_count > 0 {
        report.problems.push(format!(
            "stream: {} of {} order events are not in the store (first: {:?})",
            report.missing_count,
            report.events,
            report.missing_seqs.first()
        ));
    }
}

/// The units side: every unit the ledger sold is pending, paid, or (ended) on its way back,
/// and every unit it released came back from an ended order.
fn check_units(report: &mut SkuReport) {
    if report.units_unreleased > 0 {
        report.problems.push(format!("releases: {} units of ended orders not given back yet", report.units_unreleased));
    }
    if report.release_refused > 0 {
        report.problems.push(format!(
            "releases: the ledger refused to give back {} units of ended orders (it has no record of those sales; \
             each order says why): an operator must look at them",
            report.release_refused
        ));
    }
    let held = report.units_pending + report.units_paid + report.units_unreleased;
    if report.sold != held && report.missing_count == 0 {
        report.problems.push(format!(
            "units: the ledger has {} sold, the store {} (pending {} + paid {} + not yet given back {})",
            report.sold, held, report.units_pending, report.units_paid, report.units_unreleased
        ));
    }
    let not_back = report.units_unreleased + report.release_refused;
    let given_back = report.units_given_back - not_back.min(report.units_given_back);
    if report.released != given_back {
        report.problems.push(format!(
            "releases: the ledger released {} units, the store's ended orders gave back {}",
            report.released, given_back
        ));
    }
}

/// The money side: see the module docs.
async fn check_money(store: &dyn OrderStore, sku: &SkuId, report: &mut SkuReport) -> Result<(), String> {
    let money = store.money_counts(sku.as_str()).await.map_err(|e| format!("{sku}: store: {e}"))?;
    let accounted = money.settled + money.refunds_owed + money.refunds_pending + money.refunded + money.awaiting;
    if money.payments != accounted {
        report.problems.push(format!(
            "money: {} payments recorded, {} accounted for (settled {} + refunds owed {} + pending {} + refunded {} \
             + not yet applied {})",
            money.payments,
            accounted,
            money.settled,
            money.refunds_owed,
            money.refunds_pending,
            money.refunded,
            money.awaiting
        ));
    }
    if money.settled != money.paid_orders {
        report.problems.push(format!(
            "money: {} paid orders, {} payments that settled one: an order is paid without its payment or twice",
            money.paid_orders, money.settled
        ));
    }
    if money.paid_orders_released > 0 {
        report.problems.push(format!("money: {} paid orders had their units given back", money.paid_orders_released));
    }
    if money.awaiting > 0 {
        report.problems.push(format!(
            "money: {} payments wait for orders that are stored (the sweeper applies them next round)",
            money.awaiting
        ));
    }
    report.money = money;
    Ok(())
}

/// Every event the stream still holds that the store has a row for at its seq (and is not a
/// dead letter) must be that very order: the `stream` check counts seqs, so it cannot tell.
async fn check_stored_events(
    ledger: &dyn OrderFeed,
    store: &dyn OrderStore,
    sku: &SkuId,
    stored: &BTreeSet<u64>,
    report: &mut SkuReport,
) -> Result<(), String> {
    let dead: BTreeSet<u64> = store
        .dead_letters(DEAD_LETTERS_MAX)
        .await
        .map_err(|e| format!("{sku}: store: {e}"))?
        .into_iter()
        .filter(|letter| letter.sku == sku.as_str())
        .map(|letter| letter.stream_seq)
        .collect();
    let mut displaced = Vec::new();
    let mut after = 0;
    loop {
        let page = ledger.orders(sku, after, 1000).await.map_err(|e| format!("{sku}: ledger: {e}"))?;
        let Some(last) = page.last().map(|event| event.seq) else { break };
        for event in page {
            if !stored.contains(&event.seq) || dead.contains(&event.seq) {
                continue;
            }
            let order = store.get(&event.order_id.0).await.map_err(|e| format!("{sku}: store: {e}"))?;
            if !order.is_some_and(|order| order.new.sku == sku.as_str() && order.new.stream_seq == event.seq) {
                displaced.push(event.seq);
            }
        }
        after = last;
    }
    report.displaced_count = displaced.len() as u64;
    if let Some(first) = displaced.first() {
        report.problems.push(format!(
            "stream: {} order events are not the order the store holds at their seq (first: {first}): those rows \
             are orders for sales the ledger does not have, and the ledger's own orders are missing; an operator \
             must look at them",
            displaced.len()
        ));
    }
    Ok(())
}

/// Every release the ledger logged must belong to an order that ended without a valid payment.
async fn check_release_log(
    ledger: &dyn OrderFeed,
    store: &dyn OrderStore,
    sku: &SkuId,
    report: &mut SkuReport,
) -> Result<(), String> {
    let mut after = 0;
    loop {
        let page = ledger.releases(sku, after, 1000).await.map_err(|e| format!("{sku}: ledger: {e}"))?;
        let Some(last) = page.last().map(|release| release.seq) else { return Ok(()) };
        for release in page {
            match store.get(&release.order_id.0).await.map_err(|e| format!("{sku}: store: {e}"))? {
                Some(order) if order.state.gives_units_back() => {}
                Some(order) => report.problems.push(format!(
                    "releases: order {} was released by the ledger but is {} in the store",
                    release.order_id,
                    order.state.as_str()
                )),
                None => report.problems.push(format!(
                    "releases: order {} was released by the ledger and is not in the store",
                    release.order_id
                )),
            }
        }
        after = last;
    }
}

/// Replays stream entries missing from the store and completes interrupted releases.
pub async fn repair(
    ledger: &dyn OrderFeed,
    store: &dyn OrderStore,
    sku: &SkuId,
    terms: &SkuTerms,
) -> Result<Repaired, String> {
    let mut repaired = Repaired::default();
    let status = ledger.status(sku).await.map_err(|e| format!("{sku}: ledger: {e}"))?;
    let stored: BTreeSet<u64> = store
        .stored_seqs(sku.as_str(), 1, status.orders)
        .await
        .map_err(|e| format!("{sku}: store: {e}"))?
        .into_iter()
        .collect();
    let now = unix_ms();
    for seq in (1..=status.orders).filter(|seq| !stored.contains(seq)) {
        let events = ledger.orders(sku, seq - 1, 1).await.map_err(|e| format!("{sku}: ledger: {e}"))?;
        let Some(event) = events.into_iter().next().filter(|event| event.seq == seq) else {
            repaired.unrepairable += 1;
            continue;
        };
        let sold_at = if event.at_ms > 0 { event.at_ms } else { now };
        let pricing = event.pricing.clone().unwrap_or_else(|| ledger::Pricing::of(terms));
        let order = NewOrder {
            id: event.order_id.0,
            sku: sku.to_string(),
            user: event.user.to_string(),
            qty: event.qty,
            node: event.node.to_string(),
            idempotency_key: event.key.to_string(),
            stream_seq: event.seq,
            unit_price: pricing.price,
            currency: pricing.currency,
            created_at_ms: sold_at,
            pay_deadline_ms: sold_at.saturating_add(pricing.pay_timeout_s.saturating_mul(1000)),
        };
        repaired.replayed += store.insert_batch(&[order]).await.map_err(|e| format!("{sku}: store: {e}"))?;
    }
    for order in &unreleased_of(store, sku).await? {
        if matches!(
            crate::sweeper::release(ledger, store, order).await?,
            ledger::ReleaseOutcome::Released { .. } | ledger::ReleaseOutcome::AlreadyReleased
        ) {
            repaired.released += 1;
        }
    }
    Ok(repaired)
}

/// Every order of `sku` whose units must go back and have not yet (refused ones left out).
pub async fn unreleased_of(store: &dyn OrderStore, sku: &SkuId) -> Result<Vec<Order>, String> {
    let mut found = Vec::new();
    let mut cursor: Option<ReleaseCursor> = None;
    loop {
        let page =
            store.unreleased(cursor.as_ref(), UNRELEASED_PAGE).await.map_err(|e| format!("{sku}: store: {e}"))?;
        cursor = page.last().map(ReleaseCursor::after);
        let last_page = page.len() < UNRELEASED_PAGE;
        found.extend(page.into_iter().filter(|order| order.new.sku == sku.as_str()));
        if last_page {
            return Ok(found);
        }
    }
}

/// A fixed-width table of reports, for people.
pub fn table(reports: &[SkuReport]) -> String {
    let mut out = format!(
        "{:<16} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5} {:>8} {:>8} {:>9} {:>6}  {}\n",
        "sku",
        "total",
        "sold",
        "remaining",
        "released",
        "events",
        "stored",
        "dead",
        "pending",
        "paid",
        "given back",
        "late",
        "status"
    );
    for r in reports {
        out.push_str(&format!(
            "{:<16} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5} {:>8} {:>8} {:>9} {:>6}  {}\n",
            r.sku,
            r.total,
            r.sold,
            r.remaining,
            r.released,
            r.events,
            r.stored,
            r.dead_letters,
            r.units_pending,
            r.units_paid,
            r.units_given_back,
            r.paid_after_expiry,
            if r.ok() { "OK" } else { "MISMATCH" }
        ));
        if r.money.payments > 0 {
            let m = &r.money;
            out.push_str(&format!(
                "  money: {} payments: settled {}, refunds owed {}, pending {}, refunded {}, not yet applied {}\n",
                m.payments, m.settled, m.refunds_owed, m.refunds_pending, m.refunded, m.awaiting
            ));
        }
        for problem in &r.problems {
            out.push_str(&format!("  - {problem}\n"));
        }
    }
    out
}
