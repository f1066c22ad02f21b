//! `seckill reconcile`: the ledger's books against the order store, per SKU, for every SKU the
//! config and the coordinator's catalogue know; with a payment provider, the store against the
//! provider's settlement report for a window (`orders::payments::books`); with `repair`, order
//! events missing from the store are replayed, interrupted releases completed and stuck
//! payments re-driven first. The checks themselves are the order service's; this wires them to
//! a config.

use std::collections::BTreeMap;

use anyhow::Context;
use orders::reconcile::{Repaired, SkuReport};
use serde::Serialize;

use std::time::Duration;

use orders::payments::books::BooksCheck;

use crate::cluster::build_ledger;
use crate::config::Cluster;
use crate::order_service::PaymentsRedriven;

/// What one run found and did. Its JSON is `reconcile --json`'s answer (fields in the order
/// scripts have always read them).
#[derive(Debug, Serialize)]
pub struct Reconciliation {
    /// Every SKU's books agree.
    pub ok: bool,
    /// What the payment re-drive did (`repair` with a provider configured).
    pub payments: Option<PaymentsRedriven>,
    /// What `repair` did, per SKU.
    pub repaired: BTreeMap<String, Repaired>,
    pub skus: Vec<SkuReport>,
    /// The store against the provider's books (with `[payments]`).
    pub books: Option<BooksCheck>,
}

/// What `reconcile` reads the provider's books for.
pub struct BooksWindow {
    /// Payments created this long ago or later.
    pub since: Duration,
    /// How long a callback, a refund or an order may take before its absence is a finding.
    pub bound: Duration,
}

impl Reconciliation {
    /// The report for a person: a line per repaired SKU, the payments' line, then the table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (sku, repaired) in &self.repaired {
            out.push_str(&format!(
                "{sku}: replayed {} order events, completed {} releases, {} not repairable\n",
                repaired.replayed, repaired.released, repaired.unrepairable
            ));
        }
        if let Some(redriven) = &self.payments {
            out.push_str(&format!(
                "payments: asked the provider again about {} payments and {} refunds: {} found paid, {} orders \
                 expired, {} refunded, {} still open{}\n",
                redriven.checks,
                redriven.refunds,
                redriven.found_by_query,
                redriven.expired,
                redriven.refunded,
                redriven.still_open,
                if redriven.busy { " (a sweeper held the lock: nothing asked; run it again)" } else { "" }
            ));
        }
        out.push_str(&orders::reconcile::table(&self.skus));
        if let Some(books) = &self.books {
            out.push_str(&render_books(books));
        }
        out
    }
}

/// The books' lines: a summary, then a row per finding.
fn render_books(books: &BooksCheck) -> String {
    let mut out = format!(
        "\nprovider's books: {} succeeded payments ({} in flight, not judged yet), {} refunds: {}\n",
        books.payments,
        books.in_flight,
        books.refunds,
        if books.ok() { "they agree with the store" } else { "DISAGREE" }
    );
    for (currency, totals) in &books.totals {
        out.push_str(&format!("  {currency}: provider {} net, store {} net\n", totals.provider, totals.store));
    }
    for finding in &books.findings {
        out.push_str(&format!(
            "  {:<18} order {} payment {}: {}\n",
            finding.kind.label(),
            finding.order_id,
            finding.reference,
            finding.detail
        ));
    }
    out
}

/// Checks `sku` (every SKU when `None`), repairing first when asked; with a payment provider,
/// the store against its books for `window`.
pub async fn run(
    cluster: &Cluster,
    sku: Option<&str>,
    repair: bool,
    window: &BooksWindow,
) -> anyhow::Result<Reconciliation> {
    anyhow::ensure!(
        cluster.ledger.url != "embedded",
        "ledger.url = \"embedded\" lives inside another process; reconcile reads the Redis ledger the nodes use"
    );
    // The coordinator's catalogue takes the fleet's cluster token; a drawn one is nobody's.
    crate::cluster::require_cluster_token(cluster)?;
    let ledger = build_ledger(&cluster.ledger).await?;
    let store = crate::order_service::open_store(cluster).await?;
    let catalogue = crate::order_service::current_catalogue(cluster).await?;
    let skus: Vec<_> = match sku {
        Some(sku) => {
            let id = ledger::SkuId::new(sku)?;
            let terms = catalogue.get(&id).cloned().with_context(|| {
                format!("--sku {sku}: neither in the config's [[skus]] nor in the coordinator's catalogue")
            })?;
            // A striped SKU is checked on every stripe's ledger.
            protocol::ledgers_of(&id, &terms)
        }
        None => catalogue.into_iter().collect(),
    };
    let mut repaired = BTreeMap::new();
    let mut payments = None;
    if repair {
        for (id, terms) in &skus {
            let done = orders::reconcile::repair(&*ledger, &*store, id, terms).await.map_err(anyhow::Error::msg)?;
            repaired.insert(id.to_string(), done);
        }
        payments = crate::order_service::redrive_payments(cluster, ledger.clone(), store.clone()).await?;
    }
    let mut reports = Vec::new();
    for (id, _) in &skus {
        reports.push(orders::reconcile::check(&*ledger, &*store, id).await.map_err(anyhow::Error::msg)?);
    }
    let books = match cluster.payments.payments(cluster.orders.reached_at().as_deref())? {
        Some(provider) => {
            let now_ms = orders::unix_ms();
            let from_ms = now_ms.saturating_sub(window.since.as_millis() as u64);
            let books = orders::payments::books::check(&*store, &*provider.provider, from_ms, now_ms, window.bound)
                .await
                .map_err(|e| anyhow::anyhow!("reading the provider's settlement report ([payments] url): {e}"))?;
            Some(books)
        }
        None => None,
    };
    let ok = reports.iter().all(SkuReport::ok) && books.as_ref().is_none_or(BooksCheck::ok);
    Ok(Reconciliation { ok, payments, repaired, skus: reports, books })
}
