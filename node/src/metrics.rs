//! Prometheus metrics. One recorder per process (nodes started together in one process share
//! it and are told apart by the `node` label). Handles are registered once per node, so the
//! purchase path pays an atomic add per metric, not a registry lookup.

use std::sync::OnceLock;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::gate::Reason;
use crate::outcome::Code;

/// Ledger call latency buckets, seconds: a Redis round trip on loopback is ~100 µs, a slow one
/// is a few ms, and anything near the call timeout (500 ms) is a fault.
const LEDGER_SECONDS_BUCKETS: &[f64] =
    &[0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
/// Batch size buckets: 1 at low load, up to `ledger::BATCH_MAX` in a burst.
const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Every reason `POST /v1/tokens` can refuse, each counted under its code.
const TOKEN_REFUSALS: [Code; 10] = [
    Code::BadRequest,
    Code::UnknownSku,
    Code::NotStarted,
    Code::Ended,
    Code::SoldOut,
    Code::Blocked,
    Code::RateLimited,
    Code::Unavailable,
    Code::StripeEmpty,
    Code::NoTicket,
];

/// How often histogram samples are folded into buckets.
const UPKEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(5);

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus handle, installing the recorder on first use. `None` if another
/// recorder was installed first; metrics then go there and `/metrics` says so.
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full("seckill_ledger_call_seconds".into()), LEDGER_SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full("seckill_ledger_batch_size".into()), BATCH_SIZE_BUCKETS)
                });
            match builder.and_then(|b| b.install_recorder()) {
                Ok(handle) => {
                    // Histograms are drained into their buckets by upkeep; without it memory grows
                    // with every sample. A thread, so it runs whatever runtime the nodes use.
                    let upkeep = handle.clone();
                    std::thread::Builder::new()
                        .name("metrics-upkeep".into())
                        .spawn(move || loop {
                            std::thread::sleep(UPKEEP_PERIOD);
                            upkeep.run_upkeep();
                        })
                        .map_err(|e| tracing::warn!("metrics upkeep thread not started: {e}"))
                        .ok();
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!("Prometheus recorder not installed: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// A node's metric handles.
pub struct NodeMetrics {
    /// Indexed by `Code as usize`.
    outcomes: Vec<Counter>,
    pub decided_locally: Counter,
    pub decided_by_ledger: Counter,
    pub ledger_call_seconds: Histogram,
    pub ledger_batch_size: Histogram,
    pub ledger_errors: Counter,
    /// Indexed by position in `Reason::ALL`.
    gate_refusals: Vec<Counter>,
    tokens_issued: Counter,
    /// Stock pages sent with their body: behind the generated nginx config, about one per
    /// SKU per second however many buyers refresh.
    pub stock_page_served: Counter,
    /// Stock page requests answered 304 (`If-None-Match` named the current figures).
    pub stock_page_not_modified: Counter,
    pub stock_page_unknown: Counter,
    /// One per code of `TOKEN_REFUSALS`, in its order.
    token_refusals: Vec<Counter>,
}

impl NodeMetrics {
    pub fn new(node: &str) -> Self {
        // Make sure the recorder exists before handles are registered against it.
        let _ = prometheus();
        let node = node.to_string();
        let outcomes = Code::ALL
            .iter()
            .map(|code| metrics::counter!("seckill_purchase_requests_total", "node" => node.clone(), "outcome" => code.as_str()))
            .collect();
        Self {
            outcomes,
            decided_locally: metrics::counter!("seckill_decisions_total", "node" => node.clone(), "by" => "local"),
            decided_by_ledger: metrics::counter!("seckill_decisions_total", "node" => node.clone(), "by" => "ledger"),
            ledger_call_seconds: metrics::histogram!("seckill_ledger_call_seconds", "node" => node.clone()),
            ledger_batch_size: metrics::histogram!("seckill_ledger_batch_size", "node" => node.clone()),
            ledger_errors: metrics::counter!("seckill_ledger_errors_total", "node" => node.clone()),
            gate_refusals: Reason::ALL
                .iter()
                .map(|reason| metrics::counter!("seckill_gate_refusals_total", "node" => node.clone(), "reason" => reason.as_str()))
                .collect(),
            stock_page_served: metrics::counter!("seckill_stock_page_requests_total", "node" => node.clone(), "outcome" => "page"),
            stock_page_not_modified: metrics::counter!("seckill_stock_page_requests_total", "node" => node.clone(), "outcome" => "not_modified"),
            stock_page_unknown: metrics::counter!("seckill_stock_page_requests_total", "node" => node.clone(), "outcome" => Code::UnknownSku.as_str()),
            tokens_issued: metrics::counter!("seckill_token_requests_total", "node" => node.clone(), "outcome" => "issued"),
            token_refusals: TOKEN_REFUSALS
                .iter()
                .map(|code| metrics::counter!("seckill_token_requests_total", "node" => node.clone(), "outcome" => code.as_str()))
                .collect(),
        }
    }

    pub fn gate_refused(&self, reason: Reason) {
        if let Some(at) = Reason::ALL.iter().position(|r| *r == reason) {
            self.gate_refusals[at].increment(1);
        }
    }

    pub fn count(&self, code: Code) {
        self.outcomes[code as usize].increment(1);
    }

    pub fn count_token_issued(&self) {
        self.tokens_issued.increment(1);
    }

    /// Counts a refused token request; a code outside `TOKEN_REFUSALS` is a programmer error,
    /// caught in debug builds and counted nowhere in release.
    pub fn count_token_refused(&self, code: Code) {
        let at = TOKEN_REFUSALS.iter().position(|refusal| *refusal == code);
        debug_assert!(at.is_some(), "{code:?} is not a token refusal");
        if let Some(at) = at {
            self.token_refusals[at].increment(1);
        }
    }
}

/// Sets the allotment figures of one SKU (see `AllotmentStats`); called when `/metrics` is
/// scraped rather than on every sale, so the purchase path only bumps the SKU's own atomics.
pub fn publish_allotment(
    node: &str,
    sku: &str,
    local_remaining: u64,
    exhausted_with_stock_left: u64,
    refused_by_ledger: u64,
) {
    let labels = [("node", node.to_string()), ("sku", sku.to_string())];
    metrics::gauge!("seckill_local_remaining", &labels).set(local_remaining as f64);
    metrics::counter!("seckill_allotment_exhausted_total", &labels).absolute(exhausted_with_stock_left);
    metrics::counter!("seckill_ledger_refused_winners_total", &labels).absolute(refused_by_ledger);
}

/// Sets the units of one stripe of a striped SKU in the node's allotment; the SKU's own
/// `seckill_local_remaining` is their sum.
pub fn publish_stripe(node: &str, sku: &str, stripe: u32, local_remaining: u64) {
    let labels = [("node", node.to_string()), ("sku", sku.to_string()), ("stripe", stripe.to_string())];
    metrics::gauge!("seckill_stripe_local_remaining", &labels).set(local_remaining as f64);
}
