//! One cancellation signal for a node's tasks: the accept loop, confirmers and the status
//! refresher all stop when it fires.

use tokio::sync::watch;

/// Fires once; every clone sees it.
#[derive(Clone, Debug)]
pub struct Shutdown {
    tx: std::sync::Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self { tx: std::sync::Arc::new(watch::channel(false).0) }
    }

    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once `trigger` has been called (at once if it already was).
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        // An error means the sender is gone, which cannot happen while `self` holds it.
        let _ = rx.wait_for(|fired| *fired).await;
    }
}
