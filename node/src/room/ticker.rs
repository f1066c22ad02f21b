//! The ticker of one room on one node: every [`TICK`], it names the waiters whose place or
//! heartbeat is due ([`Hub::due`]) to the ledger, which also admits what the rules allow, then
//! pushes each waiter's news ([`Hub::push`]).

use std::sync::Weak;
use std::time::Instant;

use ledger::room::ROOM_TICK_USERS_MAX;
use ledger::UserId;

use super::fresh_seed;
use super::hub::{Hub, TICK};

/// Most ledger calls one tick makes: enough for every waiter of a node at the draw, when all
/// of them learn their place at once; the rest wait for the next tick.
const CALLS_PER_TICK_MAX: usize = 4;

/// Ticks `hub` until the node stops or drops it.
pub async fn run(hub: Weak<Hub>, mut stop: impl FnMut() -> bool) {
    // Nodes' rooms start on the same crowd's first joins; a random phase spreads their ticks
    // over the period instead of emptying the admission bucket all at once.
    tokio::time::sleep(TICK.mul_f64(fastrand::f64())).await;
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(hub) = hub.upgrade() else { return };
        if stop() {
            return;
        }
        let now = Instant::now();
        let due = hub.due(now, ROOM_TICK_USERS_MAX * CALLS_PER_TICK_MAX);
        // Even with nobody due, one call: it admits, and brings the figures every push uses.
        let calls: Vec<&[UserId]> = if due.is_empty() { vec![&[]] } else { due.chunks(ROOM_TICK_USERS_MAX).collect() };
        let seed = fresh_seed();
        for users in calls {
            match hub.ledger().room_tick(hub.sku(), hub.call(&seed), users).await {
                Ok(view) => {
                    hub.read(users, &view.places, &view.figures, now);
                    // After every call, not once per tick: a sell-out goes out with the first.
                    hub.push(&hub.observe(&view.figures), Instant::now());
                }
                Err(e) => {
                    tracing::debug!(sku = %hub.sku(), "room tick failed: {e}");
                    break;
                }
            }
        }
    }
}
