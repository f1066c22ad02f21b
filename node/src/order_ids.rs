//! Order ids: a Snowflake generator ([`safeguards::IdGenerator`]) under the worker id this node
//! holds: the coordinator's lease, or its place in `cluster.toml` without one. The generator is
//! reopened when the worker id changes (a new epoch may bring another), with its own high-water
//! file per worker id, so ids never repeat across restarts of this node.
//!
//! **Nothing here blocks a request or the runtime.** Everything that touches the disk runs on
//! one thread per node, the keeper: opening a generator (reading its high-water file, waiting
//! up to a reserve window for the clock to pass a mark left by a quick restart, making the first
//! reservation durable) and every later reservation ([`IdGenerator::reserve_ahead`], one fsync
//! about twice a second). A Tokio worker blocked on an fsync stalls every request and timer
//! queued on it (a 2-core machine runs two), and a membership task that opened a generator
//! inline stopped heartbeating for as long as that took. A request only loads the current
//! generator (lock-free, touching no reference count) and takes an id from the reservation that
//! is already durable ([`IdGenerator::next_id_reserved`]); should the keeper fall behind (a disk
//! slower than a quarter window), the request gets 503 rather than wait for the disk.
//!
//! A thread rather than `spawn_blocking`: it runs for the node's life on a timer (the
//! reservation must stay ahead while no request comes, or the first one after a pause would be
//! refused), handles worker-id changes strictly in order, and needs no runtime. It ends when the
//! node is dropped.
//!
//! Without an ids directory the node sends no id and the ledger numbers orders `<sku>-<seq>`.

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use ledger::{NodeId, OrderId};
use safeguards::idgen::RESERVE_WINDOW_DEFAULT;
use safeguards::{IdGenerator, IdGeneratorConfig, SystemClock};

/// How often a failed open (the clock behind a mark, an unwritable directory) is retried: soon
/// enough to resume selling shortly after the fault clears, seldom enough not to flood the log.
const OPEN_RETRY: Duration = Duration::from_secs(1);

pub struct OrderIds {
    /// `None` without an ids directory.
    keeper: Option<Keeper>,
}

/// The request side's handle on the keeper thread.
struct Keeper {
    shared: Arc<Shared>,
    /// Wakes the keeper after a worker-id change. Capacity 1: one pending wake covers any number
    /// of changes, since the keeper reads the latest. Dropped with the node, which ends the
    /// thread.
    wake: mpsc::SyncSender<()>,
}

/// What the keeper thread and the request path share.
struct Shared {
    node: NodeId,
    dir: PathBuf,
    /// The generator for `wanted`, once open; empty while none is (being opened, or failed).
    /// Written only under `wanted`'s lock; read lock-free by every request.
    current: ArcSwapOption<IdGenerator>,
    /// The worker id ids must carry from now on; `None` until the node holds one. A std `Mutex`,
    /// held for a few instructions by `use_worker` and by the keeper installing a generator,
    /// never by a request and never across an `.await`.
    wanted: Mutex<Option<u16>>,
}

impl OrderIds {
    /// Starts the keeper thread when `dir` is set; ids come once [`use_worker`](Self::use_worker)
    /// has named a worker id and the keeper has opened its generator.
    pub fn new(node: NodeId, dir: Option<PathBuf>) -> Self {
        let Some(dir) = dir else { return Self { keeper: None } };
        let shared = Arc::new(Shared { node, dir, current: ArcSwapOption::empty(), wanted: Mutex::new(None) });
        let (wake, woken) = mpsc::sync_channel(1);
        let keeper_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("order-ids-{}", shared.node))
            .spawn(move || keep(&keeper_shared, &woken));
        if let Err(e) = spawned {
            // Without the thread no generator opens: purchases get 503, never an unsafe id.
            tracing::error!(node = %shared.node, "order-id thread not started: {e}");
        }
        Self { keeper: Some(Keeper { shared, wake }) }
    }

    /// Makes ids under `worker_id` from now on. Returns at once: the keeper opens the generator.
    /// Ids of the previous worker id stop before this returns (that id may be leased to another
    /// node now); until the new generator is open, purchases get 503.
    pub fn use_worker(&self, worker_id: u16) {
        let Some(keeper) = &self.keeper else { return };
        {
            let mut wanted = keeper.shared.wanted.lock().unwrap_or_else(|p| p.into_inner());
            if *wanted == Some(worker_id) {
                return; // open, being opened, or retried by the keeper after a failure
            }
            *wanted = Some(worker_id);
            keeper.shared.current.store(None);
        }
        // Full: a wake is pending already, and the keeper reads the latest wanted id.
        if let Err(mpsc::TrySendError::Disconnected(())) = keeper.wake.try_send(()) {
            tracing::error!(node = %keeper.shared.node, worker_id, "the order-id thread is gone; no ids");
        }
    }

    /// Whether a purchase can get an id now: no ids directory, or the generator is open.
    pub fn is_ready(&self) -> bool {
        self.keeper.as_ref().is_none_or(|keeper| keeper.shared.current.load().is_some())
    }

    /// The id for the next order: `Ok(None)` when this node leaves numbering to the ledger. On
    /// the purchase path: no lock, no reference count, no disk.
    pub fn next(&self) -> Result<Option<OrderId>, String> {
        let Some(keeper) = &self.keeper else { return Ok(None) };
        // A guard, not a clone: arc-swap's load takes no lock and, unlike cloning an `Arc`,
        // leaves the reference count's cache line alone, which every request would contend on.
        let current = keeper.shared.current.load();
        let generator = current.as_ref().ok_or("no order-id generator yet (being opened, or see the log)")?;
        let id = generator.next_id_reserved().map_err(|e| e.to_string())?;
        Ok(Some(OrderId(id.to_string())))
    }
}

/// The keeper thread: opens the generator for the wanted worker id, and keeps the open
/// generator's reservation ahead, every quarter reserve window, until the node is dropped.
fn keep(shared: &Shared, woken: &mpsc::Receiver<()>) {
    let mut failed: Option<(u16, Instant)> = None;
    loop {
        let window = shared.current.load().as_ref().map_or(RESERVE_WINDOW_DEFAULT, |g| g.reserve_window());
        match woken.recv_timeout(window / 4) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        shared.open_wanted(&mut failed);
        if let Some(generator) = shared.current.load_full() {
            // A failure is retried next tick; if the mark runs out meanwhile, purchases get 503.
            if let Err(e) = generator.reserve_ahead() {
                tracing::warn!(node = %shared.node, worker_id = generator.worker_id(), "order-id reservation not extended: {e}");
            }
        }
    }
}

impl Shared {
    /// Opens the generator for the wanted worker id unless it is open already (or failed less
    /// than [`OPEN_RETRY`] ago). Blocks: keeper thread only.
    fn open_wanted(&self, failed: &mut Option<(u16, Instant)>) {
        let Some(worker_id) = *self.wanted.lock().unwrap_or_else(|p| p.into_inner()) else { return };
        if self.current.load().as_ref().is_some_and(|g| g.worker_id() == worker_id) {
            return;
        }
        if failed.is_some_and(|(id, at)| id == worker_id && at.elapsed() < OPEN_RETRY) {
            return;
        }
        let opened = std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("no order-id directory {}: {e}", self.dir.display()))
            .and_then(|()| {
                let path = self.dir.join(format!("{}-worker-{worker_id}.high-water", self.node));
                IdGenerator::open(IdGeneratorConfig::new(worker_id, path), Arc::new(SystemClock))
                    .map_err(|e| e.to_string())
            });
        match opened {
            Ok(generator) => {
                *failed = None;
                let wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner());
                // The node may have moved to another worker id while this one opened; then this
                // generator must not issue a single id, and the pending wake opens the other.
                if *wanted == Some(worker_id) {
                    self.current.store(Some(Arc::new(generator)));
                    tracing::debug!(node = %self.node, worker_id, "order ids under this worker id");
                }
            }
            // Sales then stop with 503 rather than fall back to ids that could collide.
            Err(e) => {
                *failed = Some((worker_id, Instant::now()));
                tracing::error!(node = %self.node, worker_id, "cannot make order ids: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `ready` every ms until it holds, failing after `wait_max`.
    fn eventually(what: &str, wait_max: Duration, ready: impl Fn() -> bool) {
        let started = Instant::now();
        while !ready() {
            assert!(started.elapsed() < wait_max, "{what}: not within {wait_max:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn worker_of(id: &OrderId) -> u16 {
        safeguards::decode(safeguards::SnowflakeId(id.0.parse().unwrap())).worker_id
    }

    #[test]
    fn a_worker_change_stops_the_old_ids_at_once_and_opens_the_new_generator_off_the_caller() {
        // Goal: once `use_worker` returns, no id carries the old worker id, and the keeper thread
        // opens the new generator. Method: hold worker 3, take an id, switch to 4: the very next
        // call is refused, or (if the keeper was that quick) carries 4; poll until 4 is open.
        let dir = tempfile::tempdir().unwrap();
        let ids = OrderIds::new(NodeId::new("n1").unwrap(), Some(dir.path().to_path_buf()));
        assert!(!ids.is_ready(), "no worker id yet");
        ids.use_worker(3);
        eventually("worker 3 opened", Duration::from_secs(5), || ids.is_ready());
        assert_eq!(worker_of(&ids.next().unwrap().unwrap()), 3);
        ids.use_worker(4);
        if let Ok(id) = ids.next() {
            assert_eq!(worker_of(&id.unwrap()), 4, "nothing under worker 3 once the node holds 4");
        }
        eventually("worker 4 opened", Duration::from_secs(5), || ids.is_ready());
        assert_eq!(worker_of(&ids.next().unwrap().unwrap()), 4);
        ids.use_worker(4);
        assert!(ids.is_ready(), "the same worker id again keeps the open generator");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "one high-water file per worker id");
    }

    #[test]
    fn the_keeper_keeps_the_reservation_ahead_of_a_steady_trickle_of_ids() {
        // Goal: ids taken without ever writing the file keep coming for longer than one reserve
        // window, because the keeper extends the reservation. Method: one id every 10 ms for 2.5
        // windows (the pause paces the trickle, it synchronizes nothing).
        let dir = tempfile::tempdir().unwrap();
        let ids = OrderIds::new(NodeId::new("n1").unwrap(), Some(dir.path().to_path_buf()));
        ids.use_worker(1);
        eventually("worker 1 opened", Duration::from_secs(5), || ids.is_ready());
        let until = Instant::now() + RESERVE_WINDOW_DEFAULT * 5 / 2;
        let mut last = 0u64;
        while Instant::now() < until {
            let id: u64 = ids.next().unwrap().unwrap().0.parse().unwrap();
            assert!(id > last, "ids keep growing");
            last = id;
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn without_a_directory_the_ledger_numbers_orders() {
        let ids = OrderIds::new(NodeId::new("n1").unwrap(), None);
        ids.use_worker(2);
        assert!(ids.is_ready());
        assert_eq!(ids.next(), Ok(None));
    }
}
