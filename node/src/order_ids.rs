//! Order ids: a Snowflake generator ([`safeguards::IdGenerator`]) under the worker id this node
//! holds: the coordinator's lease, or its place in `cluster.toml` without one. The generator is
//! reopened when the worker id changes (a new epoch may bring another), with its own high-water
//! file per worker id, so ids never repeat across restarts of this node.
//!
//! Without an ids directory the node sends no id and the ledger numbers orders `<sku>-<seq>`.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use ledger::{NodeId, OrderId};
use safeguards::{IdError, IdGenerator, IdGeneratorConfig, SystemClock};

pub struct OrderIds {
    node: NodeId,
    dir: Option<PathBuf>,
    generator: RwLock<Option<Arc<IdGenerator>>>,
}

impl OrderIds {
    pub fn new(node: NodeId, dir: Option<PathBuf>) -> Self {
        Self { node, dir, generator: RwLock::new(None) }
    }

    /// Makes ids under `worker_id` from now on. Opening can block for up to a reserve window (a
    /// restart right after the last reservation), so callers run it off the request path.
    pub fn use_worker(&self, worker_id: u16) {
        let Some(dir) = &self.dir else { return };
        if self.current().is_some_and(|g| g.worker_id() == worker_id) {
            return;
        }
        let path = dir.join(format!("{}-worker-{worker_id}.high-water", self.node));
        if let Err(e) = std::fs::create_dir_all(dir) {
            tracing::error!(dir = %dir.display(), "no order-id directory: {e}");
            return;
        }
        match IdGenerator::open(IdGeneratorConfig::new(worker_id, path), Arc::new(SystemClock)) {
            Ok(generator) => {
                tracing::debug!(node = %self.node, worker_id, "order ids under this worker id");
                *self.generator.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(generator));
            }
            // Sales then stop with 503 rather than fall back to ids that could collide.
            Err(e) => {
                tracing::error!(node = %self.node, worker_id, "cannot make order ids: {e}");
                *self.generator.write().unwrap_or_else(|p| p.into_inner()) = None;
            }
        }
    }

    fn current(&self) -> Option<Arc<IdGenerator>> {
        self.generator.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The id for the next order: `Ok(None)` when this node leaves numbering to the ledger.
    pub fn next(&self) -> Result<Option<OrderId>, String> {
        if self.dir.is_none() {
            return Ok(None);
        }
        let generator = self.current().ok_or("no order-id generator (see the log)")?;
        let id = generator.next_id().map_err(|e: IdError| e.to_string())?;
        Ok(Some(OrderId(id.to_string())))
    }
}
