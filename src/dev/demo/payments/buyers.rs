//! The payments demo's buyers after their purchase: the order service's pay route, then the
//! provider's page, each as their role says; and the early buyers, who pay through the shop's
//! checkout before the order service has their order.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use orders::{OrderState, OrderStore};
use serde_json::json;

use super::{BuyerCounts, CALL_TIMEOUT, CURRENCY, PRICE};
use crate::dev::demo::sale::wait_until;

/// Payments started at once by the demo's buyers.
const PAYMENTS_IN_FLIGHT: usize = 16;

/// What a first-wave buyer does once their order exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Pay,
    WalkAway,
    /// Starts a payment and never pays it.
    Abandon,
    /// Pays, and the card is declined.
    Decline,
    /// Starts a payment, waits until the order expired, then pays.
    Late,
}

#[derive(Default)]
pub(super) struct Tally {
    early: AtomicU64,
    paying: AtomicU64,
    declined: AtomicU64,
    abandoned: AtomicU64,
    walked_away: AtomicU64,
    paid_late: AtomicU64,
    too_late: AtomicU64,
}

impl Tally {
    pub(super) fn counts(&self) -> BuyerCounts {
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        BuyerCounts {
            early: read(&self.early),
            paying: read(&self.paying),
            declined: read(&self.declined),
            abandoned: read(&self.abandoned),
            walked_away: read(&self.walked_away),
            paid_late: read(&self.paid_late),
            too_late: read(&self.too_late),
        }
    }
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The buyers after their purchase: the order service's pay route, then the provider's page.
#[derive(Clone)]
pub(super) struct Buyers {
    pub(super) api: SocketAddr,
    pub(super) sandbox: SocketAddr,
    pub(super) nodes: Vec<SocketAddr>,
    pub(super) sku: String,
    /// The order service's notification route, for payments the shop's checkout creates.
    pub(super) callback_url: String,
    pub(super) store: Arc<dyn OrderStore>,
    /// The first wave's roles; anyone else pays.
    pub(super) roles: Arc<HashMap<String, Role>>,
    /// Orders a buyer has acted on already.
    pub(super) handled: Arc<Mutex<HashSet<String>>>,
    pub(super) tally: Arc<Tally>,
}

impl Buyers {
    /// Acts on every new pending order, as its buyer would, until `stop`; then waits for the
    /// late payers.
    pub(super) async fn pay_pending(self, stop: tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
        let mut late = tokio::task::JoinSet::new();
        while !*stop.borrow() {
            // Pending orders whose payment has not started: the ones nobody acted on yet.
            let pending = self.store.due_for_expiry(i64::MAX as u64, 10_000).await?;
            let mut paying = tokio::task::JoinSet::new();
            for order in pending {
                let (id, user) = (order.new.id, order.new.user);
                let fresh = self.handled.lock().map(|mut handled| handled.insert(id.clone())).unwrap_or(false);
                if !fresh {
                    continue;
                }
                let role = self.roles.get(&id).copied().unwrap_or(Role::Pay);
                let buyer = self.clone();
                match role {
                    Role::WalkAway => add(&self.tally.walked_away),
                    // Waits seconds for the expiry: not in the way of the others.
                    Role::Late => {
                        late.spawn(async move { buyer.pay_late(&id, &user).await });
                    }
                    _ => {
                        if paying.len() >= PAYMENTS_IN_FLIGHT {
                            if let Some(done) = paying.join_next().await {
                                done??;
                            }
                        }
                        paying.spawn(async move { buyer.act(role, &id, &user).await });
                    }
                }
            }
            while let Some(done) = paying.join_next().await {
                done??;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while let Some(done) = late.join_next().await {
            done??;
        }
        Ok(())
    }

    async fn act(&self, role: Role, id: &str, user: &str) -> anyhow::Result<()> {
        let Some(payment) = self.start_payment(id, user).await? else { return Ok(()) };
        match role {
            Role::Abandon => add(&self.tally.abandoned),
            Role::Decline => {
                add(&self.tally.declined);
                self.pay_at_provider(&payment, "decline").await?;
            }
            _ => {
                add(&self.tally.paying);
                self.pay_at_provider(&payment, "succeed").await?;
            }
        }
        Ok(())
    }

    /// Starts paying, keeps the provider's page open past the deadline, and pays once the order
    /// service has given the order up, before the query job closes the payment.
    async fn pay_late(&self, id: &str, user: &str) -> anyhow::Result<()> {
        let Some(payment) = self.start_payment(id, user).await? else { return Ok(()) };
        let ended = || async { Ok(self.store.get(id).await?.is_some_and(|o| o.state != OrderState::PendingPayment)) };
        wait_until("a late payer's order ends", Duration::from_secs(20), ended).await?;
        if self.store.get(id).await?.is_none_or(|o| o.state != OrderState::Expired) {
            return Ok(());
        }
        match self.pay_at_provider(&payment, "succeed").await?.as_deref() {
            Some("succeeded") => add(&self.tally.paid_late),
            Some(_) => add(&self.tally.declined),
            None => add(&self.tally.too_late),
        }
        Ok(())
    }

    /// Buys one unit, pays at once through the shop's own checkout (a payment created at the
    /// provider from the purchase receipt, before the order service may even have the order),
    /// then presses "pay" on the order once it exists, so the order service knows a payment
    /// started and asks the provider should its notification never come. The receipt (or none)
    /// goes to `receipts` as soon as the purchase is answered.
    pub(super) async fn early(
        &self,
        run_id: u64,
        n: usize,
        receipts: tokio::sync::mpsc::Sender<Option<String>>,
    ) -> anyhow::Result<()> {
        let user = format!("early-{n}");
        let order_id = self.purchase(&format!("early-{run_id}-{n}"), &user).await;
        if let Some(id) = order_id.as_ref().ok().and_then(Option::as_ref) {
            if let Ok(mut handled) = self.handled.lock() {
                handled.insert(id.clone());
            }
        }
        let _ = receipts.send(order_id.as_ref().ok().and_then(Option::clone)).await;
        let Some(order_id) = order_id? else { return Ok(()) };
        add(&self.tally.early);
        let create = json!({
            "order_id": order_id,
            "amount": PRICE,
            "currency": CURRENCY,
            "callback_url": self.callback_url,
        });
        let payment = retry_unavailable("the checkout's payment", || async {
            testkit::http::post_json(self.sandbox, "/v1/payments", &create, CALL_TIMEOUT).await
        })
        .await?;
        let payment_id = payment["id"].as_str().context("a payment id")?.to_string();
        self.pay_at_provider(&payment_id, "succeed").await?;
        self.start_payment(&order_id, &user).await?;
        Ok(())
    }

    /// One purchase with its own key, retried on 503 and lost connections on the next node; the
    /// order id, or `None` when the sale refused it (sold out).
    async fn purchase(&self, key: &str, user: &str) -> anyhow::Result<Option<String>> {
        let body = Bytes::from(json!({ "sku": self.sku, "user": user, "qty": 1 }).to_string());
        for attempt in 0..10 {
            let node = self.nodes[attempt % self.nodes.len()];
            let headers = [("idempotency-key", key.to_string())];
            match testkit::http::post_raw(node, "/v1/purchase", &headers, body.clone(), CALL_TIMEOUT).await {
                Ok((200, answer)) => return Ok(answer["order_id"].as_str().map(str::to_string)),
                Ok((503, _)) | Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                Ok(_) => return Ok(None),
            }
        }
        anyhow::bail!("purchase {key} unanswered after 10 attempts")
    }

    /// `POST /v1/orders/{id}/pay`: the payment's id, or `None` if the order can no longer be
    /// paid. Pressed again while the provider does not answer, and while the order is not
    /// stored yet (the purchase was just answered).
    async fn start_payment(&self, id: &str, user: &str) -> anyhow::Result<Option<String>> {
        let path = format!("/v1/orders/{id}/pay");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let (status, answer) =
                testkit::http::post_json(self.api, &path, &json!({ "user": user }), CALL_TIMEOUT).await?;
            match status {
                200 => return Ok(Some(answer["payment_id"].as_str().context("a payment id")?.to_string())),
                409 => return Ok(None),
                404 | 503 => tokio::time::sleep(Duration::from_millis(50)).await,
                _ => anyhow::bail!("paying order {id} answered {status}: {answer}"),
            }
        }
        anyhow::bail!("order {id}'s payment did not start within 10 s")
    }

    /// The buyer on the provider's page: what the payment became, or `None` if it was settled
    /// or closed before.
    async fn pay_at_provider(&self, payment_id: &str, outcome: &str) -> anyhow::Result<Option<String>> {
        let path = format!("/v1/payments/{payment_id}/pay");
        let (status, answer) =
            testkit::http::post_json(self.sandbox, &path, &json!({ "outcome": outcome }), CALL_TIMEOUT).await?;
        match status {
            200 => Ok(answer["status"].as_str().map(str::to_string)),
            409 => Ok(None),
            _ => anyhow::bail!("paying {payment_id} at the provider answered {status}: {answer}"),
        }
    }
}

/// A merchant call to the sandbox, asked again while it answers 503 (its faults): the same
/// request gets the same result.
async fn retry_unavailable<F, Fut>(what: &str, mut call: F) -> anyhow::Result<serde_json::Value>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(u16, serde_json::Value)>>,
{
    for _ in 0..50 {
        match call().await? {
            (200, answer) => return Ok(answer),
            (503, _) => tokio::time::sleep(Duration::from_millis(20)).await,
            (status, answer) => anyhow::bail!("{what} answered {status}: {answer}"),
        }
    }
    anyhow::bail!("{what}: the provider answered 503 fifty times")
}
