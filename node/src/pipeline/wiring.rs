//! Building a node: its parts, its SKUs, and the background tasks it starts (a confirmer per
//! SKU, the status refresher, the membership task).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use auth::Authenticator;
use dashmap::DashMap;
use ledger::SalesLedger;
use tokio::sync::mpsc;

use super::{refresher, Inner, Node};
use crate::breaker::Breaker;
use crate::clock::{Clock, SystemClock};
use crate::config::{Mode, NodeConfig, SkuConfig};
use crate::confirmer;
use crate::gate::{Gate, OpenGate};
use crate::membership::{CoordinatorLink, Membership};
use crate::metrics::NodeMetrics;
use crate::order_ids::OrderIds;
use crate::shutdown::Shutdown;
use crate::sku::{Allotment, KeyMemory, Selling, Sku};
use crate::stripes;

/// What a node is plugged into besides its config and ledger.
pub struct NodeOptions {
    pub clock: Arc<dyn Clock>,
    pub gate: Arc<dyn Gate>,
    /// The coordinator to register with; `None` sells the configured allotment, no leases.
    pub coordinator: Option<CoordinatorLink>,
    /// Who the buyer is (`[auth]`); `none` takes the body's `user`.
    pub authenticator: Authenticator,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            gate: Arc::new(OpenGate),
            coordinator: None,
            authenticator: Authenticator::none(),
        }
    }
}

impl Node {
    /// Builds the node and starts its background tasks (one confirmer per SKU, the status
    /// refresher, the membership task) on the current Tokio runtime; they stop when `shutdown`
    /// fires. With an ids directory it also starts the order-id thread, which ends when the last
    /// clone of the node is dropped.
    pub fn start(
        config: NodeConfig,
        skus: Vec<SkuConfig>,
        ledger: Arc<dyn SalesLedger>,
        options: NodeOptions,
        shutdown: Shutdown,
    ) -> Node {
        let metrics = Arc::new(NodeMetrics::new(config.id.as_str()));
        let membership = options.coordinator.map(|link| Arc::new(Membership::new(link)));
        let order_ids = OrderIds::new(config.id.clone(), config.order_ids_dir.clone());
        let breaker = Arc::new(Breaker::new(config.id.as_str(), config.breaker));
        let ticket_key = config.ticket_key.clone().unwrap_or_else(crate::ticket::TicketKey::random);
        let node = Node {
            inner: Arc::new(Inner {
                skus: DashMap::new(),
                ledger,
                clock: options.clock,
                gate: options.gate,
                metrics,
                ledger_reachable: AtomicBool::new(false),
                breaker,
                shutdown,
                config,
                membership: membership.clone(),
                order_ids,
                authenticator: options.authenticator,
                rooms: crate::room::Rooms::default(),
                ticket_key,
            }),
        };
        for sku in skus.into_iter().flat_map(stripes::expand) {
            node.add_sku(sku);
        }
        if membership.is_none() {
            // Without a coordinator the worker id is the node's place in the config.
            node.inner.order_ids.use_worker(node.inner.config.worker_id);
        }
        tokio::spawn(refresher::refresh_status(Arc::downgrade(&node.inner)));
        if let Some(membership) = membership {
            tokio::spawn(crate::membership::run(node.clone(), membership, node.shutdown_signal().clone()));
        }
        node
    }

    /// Starts selling a SKU: with its configured allotment, or, under a coordinator, with what
    /// the coordinator grants.
    pub fn add_sku(&self, sku: SkuConfig) {
        let inner = &self.inner;
        let initial_units = if inner.membership.is_some() { 0 } else { sku.allotment };
        let memory = KeyMemory { ttl_ms: inner.config.idempotency_ttl.as_millis() as u64, clock: inner.clock.clone() };
        let state = match inner.config.mode {
            Mode::LedgerOnly => Arc::new(Sku::new(sku, Selling::LedgerOnly).with_key_memory(memory)),
            Mode::Allotment => {
                let (tx, rx) = mpsc::channel(inner.config.confirm_queue_max);
                let selling = Selling::Allotment(Allotment::new(initial_units, tx));
                let state = Arc::new(Sku::new(sku, selling).with_key_memory(memory));
                let membership = inner.membership.clone();
                let epoch_now = move || membership.as_ref().map_or(0, |m| m.epoch());
                tokio::spawn(confirmer::run(
                    state.clone(),
                    inner.config.id.clone(),
                    epoch_now,
                    confirmer::LedgerPath {
                        ledger: inner.ledger.clone(),
                        metrics: inner.metrics.clone(),
                        breaker: inner.breaker.clone(),
                    },
                    rx,
                    inner.shutdown.clone(),
                ));
                state
            }
        };
        inner.skus.insert(state.id().clone(), state.clone());
        stripes::link(&inner.skus, &state);
    }
}
