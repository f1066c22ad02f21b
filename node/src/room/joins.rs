//! A node's joins of one moment go to the ledger in one call. While a call is out, the joins
//! that arrive wait for the next one, which takes them all (up to
//! [`ledger::room::ROOM_TICK_USERS_MAX`]): a lone join goes at once, and a crowd costs the
//! ledger one call per round trip instead of one per buyer, as the confirmer batches sales.
//! Each join is still answered only once the ledger has placed it. This is the queue; the hub
//! makes the calls.

use std::sync::Mutex;

use ledger::room::ROOM_TICK_USERS_MAX;
use ledger::UserId;
use tokio::sync::oneshot;

/// The joins waiting for a ledger call, each with where its answer `A` goes.
pub struct Joins<A> {
    queue: Mutex<Queue<A>>,
}

struct Queue<A> {
    waiting: Vec<(UserId, oneshot::Sender<A>)>,
    /// A task is taking the queue to the ledger; new joins wait for it.
    calling: bool,
}

impl<A> Default for Joins<A> {
    fn default() -> Self {
        Joins { queue: Mutex::new(Queue { waiting: Vec::new(), calling: false }) }
    }
}

/// A batch of joins to place in one call, each with where its answer goes.
pub type Batch<A> = Vec<(UserId, oneshot::Sender<A>)>;

impl<A> Joins<A> {
    /// Queues `user`: where its answer arrives, and whether the caller must start the task
    /// that calls the ledger (no task was calling). `None` if the queue is unusable.
    pub fn enqueue(&self, user: UserId) -> Option<(oneshot::Receiver<A>, bool)> {
        let (tx, rx) = oneshot::channel();
        let mut queue = self.queue.lock().ok()?;
        queue.waiting.push((user, tx));
        let lead = !std::mem::replace(&mut queue.calling, true);
        Some((rx, lead))
    }

    /// The next batch for the calling task; `None` when the queue is empty, and the task stops
    /// (the next join starts another).
    pub fn next_batch(&self) -> Option<Batch<A>> {
        let mut queue = self.queue.lock().ok()?;
        if queue.waiting.is_empty() {
            queue.calling = false;
            return None;
        }
        let take = queue.waiting.len().min(ROOM_TICK_USERS_MAX);
        Some(queue.waiting.drain(..take).collect())
    }
}
