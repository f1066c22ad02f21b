//! The embedded ledger behind two switches a script flips: `down` (every call fails as an
//! unreachable Redis would, which is what trips the node's breaker) and `held` (confirmations
//! wait until released, so winners pile up in the confirmer's queue and go out as one batch).
//! It also logs the size of every confirmation, so a script can show how winners were batched.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledger::{
    Admission, BatchOutcome, EmbeddedLedger, IssuedToken, LedgerError, LedgerReads, OrderEvent, Purchase, RoomCall,
    RoomView, SalesLedger, Seller, SkuId, SkuStatus, UserId,
};
use tokio::sync::watch;

pub struct ScriptLedger {
    inner: Arc<EmbeddedLedger>,
    down: AtomicBool,
    held: watch::Sender<bool>,
    /// The size of each confirmation since the script last looked.
    batches: Mutex<Vec<usize>>,
}

impl ScriptLedger {
    pub fn new(inner: EmbeddedLedger) -> Self {
        Self {
            inner: Arc::new(inner),
            down: AtomicBool::new(false),
            held: watch::channel(false).0,
            batches: Mutex::default(),
        }
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn set_held(&self, held: bool) {
        self.held.send_replace(held);
    }

    /// The ledger itself, past both switches: what the script reads and changes as the
    /// operator or the coordinator would.
    pub fn inner(&self) -> &EmbeddedLedger {
        &self.inner
    }

    /// The confirmations made since the last call, by size.
    pub fn take_batches(&self) -> Vec<usize> {
        std::mem::take(&mut *self.batches.lock().unwrap())
    }

    fn reachable(&self) -> Result<(), LedgerError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(LedgerError::Unavailable("the scripted ledger is down".into()));
        }
        Ok(())
    }
}

// Only what the node holds (`SalesLedger` and its reads): the scripts play the coordinator
// and the order service on `inner()` directly.
#[async_trait::async_trait]
impl LedgerReads for ScriptLedger {
    async fn status(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        self.reachable()?;
        self.inner.status(sku).await
    }

    async fn orders(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<OrderEvent>, LedgerError> {
        self.reachable()?;
        self.inner.orders(sku, after, limit).await
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        self.reachable()?;
        self.inner.ping().await
    }
    async fn room_figures(&self, sku: &SkuId) -> Result<Option<ledger::RoomFigures>, LedgerError> {
        self.reachable()?;
        self.inner.room_figures(sku).await
    }
}

#[async_trait::async_trait]
impl SalesLedger for ScriptLedger {
    async fn issue_token(&self, sku: &SkuId, user: &UserId, ttl: Duration) -> Result<IssuedToken, LedgerError> {
        self.reachable()?;
        self.inner.issue_token(sku, user, ttl).await
    }
    async fn confirm(&self, sku: &SkuId, seller: &Seller, purchases: &[Purchase]) -> Result<BatchOutcome, LedgerError> {
        self.batches.lock().unwrap().push(purchases.len());
        let mut held = self.held.subscribe();
        let _ = held.wait_for(|held| !held).await;
        self.reachable()?;
        self.inner.confirm(sku, seller, purchases).await
    }
    async fn room_join(&self, sku: &SkuId, call: RoomCall<'_>, users: &[UserId]) -> Result<RoomView, LedgerError> {
        self.reachable()?;
        self.inner.room_join(sku, call, users).await
    }
    async fn room_tick(&self, sku: &SkuId, call: RoomCall<'_>, present: &[UserId]) -> Result<RoomView, LedgerError> {
        self.reachable()?;
        self.inner.room_tick(sku, call, present).await
    }
    async fn room_admissions(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<Admission>, LedgerError> {
        self.reachable()?;
        self.inner.room_admissions(sku, after, limit).await
    }
}
