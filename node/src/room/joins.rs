//! A node's joins of one moment go to the ledger in one call. While a call is out, the joins
//! that arrive wait for the next one, which takes them all (up to
//! [`ledger::room::ROOM_TICK_USERS_MAX`]): a lone join goes at once, and a crowd costs the
//! ledger one call per round trip instead of one per buyer, as the confirmer batches sales.
//! Each join is still answered only once the ledger has placed it.

use std::sync::{Arc, Mutex};

use ledger::room::ROOM_TICK_USERS_MAX;
use ledger::{Place, UserId};
use tokio::sync::oneshot;

use super::fresh_seed;
use super::hub::{Hub, Snapshot};

type Answer = Result<(Place, Snapshot), String>;

#[derive(Default)]
pub struct Joins {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<(UserId, oneshot::Sender<Answer>)>,
    /// A task is taking the queue to the ledger; new joins wait for it.
    calling: bool,
}

/// Places `user` in `hub`'s room (with whoever else joins here meanwhile): its place and the
/// room's figures, or why the ledger could not be asked.
pub async fn join(hub: &Arc<Hub>, user: UserId) -> Answer {
    let (tx, rx) = oneshot::channel();
    let lead = {
        let Ok(mut queue) = hub.joins().queue.lock() else { return Err("the room's joins are unavailable".into()) };
        queue.waiting.push((user, tx));
        !std::mem::replace(&mut queue.calling, true)
    };
    if lead {
        // Its own task: the join that started it is answered with its batch, not after the
        // batches that arrive behind it.
        tokio::spawn(call_until_empty(hub.clone()));
    }
    rx.await.unwrap_or_else(|_| Err("the room's join was dropped".into()))
}

async fn call_until_empty(hub: Arc<Hub>) {
    loop {
        let batch: Vec<(UserId, oneshot::Sender<Answer>)> = {
            let Ok(mut queue) = hub.joins().queue.lock() else { return };
            if queue.waiting.is_empty() {
                queue.calling = false;
                return;
            }
            let take = queue.waiting.len().min(ROOM_TICK_USERS_MAX);
            queue.waiting.drain(..take).collect()
        };
        let users: Vec<UserId> = batch.iter().map(|(user, _)| user.clone()).collect();
        let seed = fresh_seed();
        match hub.ledger().room_join(hub.sku(), hub.call(&seed), &users).await {
            Ok(view) => {
                let snapshot = hub.observe(&view.figures);
                let mut places = view.places.into_iter();
                for (_, answer) in batch {
                    let place = places.next().unwrap_or(Place::Absent);
                    let _ = answer.send(Ok((place, snapshot.clone())));
                }
            }
            Err(e) => {
                let reason = e.to_string();
                for (_, answer) in batch {
                    let _ = answer.send(Err(reason.clone()));
                }
            }
        }
    }
}
