//! The election watchdog. openraft 0.9 draws each member's election timeout once, so two
//! survivors that split a vote can split it again forever. When no leader has been seen for
//! several timeouts, the watchdog waits a random fraction of a timeout and starts an election
//! itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::context::Context;

/// Watches for a leaderless group until `stop`.
pub async fn run(member: Arc<Context>, mut stop: watch::Receiver<bool>) {
    let timeout_max = member.election_timeout_max();
    let patience = timeout_max * 4;
    let mut leaderless_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(timeout_max / 2) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        if member.raft().metrics().borrow().current_leader.is_some() {
            leaderless_since = None;
            continue;
        }
        let since = *leaderless_since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() >= patience {
            let jitter = Duration::from_millis(fastrand::u64(0..timeout_max.as_millis() as u64));
            tokio::time::sleep(jitter).await;
            if member.raft().metrics().borrow().current_leader.is_none() {
                tracing::warn!(member = %member.name(), "no leader for {patience:?}; starting an election");
                let _ = member.raft().trigger().elect().await;
            }
            leaderless_since = None;
        }
    }
}
