//! The embedded ledger behind two switches a script flips: `down` (every call fails as an
//! unreachable Redis would, which is what trips the node's breaker) and `held` (confirmations
//! wait until released, so winners pile up in the confirmer's queue and go out as one batch).
//! It also logs the size of every confirmation, so a script can show how winners were batched.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledger::{
    BatchOutcome, Created, EmbeddedLedger, FeedEntry, FeedLag, IssuedToken, Ledger, LedgerError, OrderEvent, Pricing,
    Purchase, Release, ReleaseEvent, ReleaseOutcome, Seller, SkuId, SkuStatus, SkuTerms, UserId,
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

#[async_trait::async_trait]
impl Ledger for ScriptLedger {
    async fn create_sku(&self, sku: &SkuId, terms: &SkuTerms) -> Result<Created, LedgerError> {
        self.inner.create_sku(sku, terms).await
    }

    async fn restock_to(&self, sku: &SkuId, total: u64) -> Result<SkuStatus, LedgerError> {
        self.inner.restock_to(sku, total).await
    }

    async fn set_pricing(&self, sku: &SkuId, pricing: &Pricing) -> Result<(), LedgerError> {
        self.inner.set_pricing(sku, pricing).await
    }

    async fn close(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        self.inner.close(sku).await
    }

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

    async fn end_epoch(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        self.inner.end_epoch(sku, seller).await
    }

    async fn sold_by(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        self.inner.sold_by(sku, seller).await
    }

    async fn status(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        self.reachable()?;
        self.inner.status(sku).await
    }

    async fn orders(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<OrderEvent>, LedgerError> {
        self.reachable()?;
        self.inner.orders(sku, after, limit).await
    }

    async fn release(&self, sku: &SkuId, release: &Release) -> Result<ReleaseOutcome, LedgerError> {
        self.inner.release(sku, release).await
    }

    async fn releases(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<ReleaseEvent>, LedgerError> {
        self.inner.releases(sku, after, limit).await
    }

    async fn feed_read(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        self.inner.feed_read(sku, group, consumer, count, block).await
    }

    async fn feed_claim(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        self.inner.feed_claim(sku, group, consumer, min_idle, count).await
    }

    async fn feed_ack(&self, sku: &SkuId, group: &str, seqs: &[u64]) -> Result<(), LedgerError> {
        self.inner.feed_ack(sku, group, seqs).await
    }

    async fn feed_lag(&self, sku: &SkuId, group: &str) -> Result<FeedLag, LedgerError> {
        self.inner.feed_lag(sku, group).await
    }

    async fn feed_trim(&self, sku: &SkuId, group: &str, retain: u64) -> Result<u64, LedgerError> {
        self.inner.feed_trim(sku, group, retain).await
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        self.reachable()?;
        self.inner.ping().await
    }
}
