//! Buyers paying for what they bought, as shoppers do: most pay at once (often before the order
//! service has stored the order: they press pay until it knows the order), some press pay and
//! pay twice, some start a payment and walk away, some pay at the provider only after their
//! order's deadline has passed, some pay through the shop's own checkout the moment they bought
//! (a payment created at the provider before the order service has the order, so its
//! notification races the order) and press pay once the order is known, some meet a checkout
//! that opened the payment for the wrong amount (and may pay it) before pressing pay, and some
//! never pay. Paying is the order service's
//! `POST /v1/orders/{id}/pay` (any order service: a dead one is passed over) and then the
//! sandbox's `POST /v1/payments/{id}/pay`, which takes the money and notifies the order service.
//!
//! Every receipt's behaviour is drawn from the run's seed and its order id. The payer never
//! judges: the checker compares the sandbox's books with the store's (`checker::money`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orders::unix_ms;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Longest one call may take.
const CALL_MAX: Duration = Duration::from_secs(3);

/// How long a buyer keeps pressing pay while the order service does not know the order yet or
/// cannot answer.
const PAY_PATIENCE: Duration = Duration::from_secs(15);

/// Pause between presses.
const PRESS_PAUSE: Duration = Duration::from_millis(300);

/// A paid-late buyer pays this long after the deadline the pay route named.
const LATE_BY: Duration = Duration::from_secs(1);

/// Where buyers pay.
#[derive(Clone)]
pub struct PayPlan {
    /// Each order service's API.
    pub orders: Vec<(String, SocketAddr)>,
    pub paysim: SocketAddr,
    pub seed: u64,
    /// Signs the buyer's token when the fleet verifies buyers; else the body names the user.
    pub bearer: Option<Arc<auth::mint::Minter>>,
    /// The price of one unit of each SKU on sale, for the shop's own checkout's amount.
    pub prices: std::collections::BTreeMap<String, u64>,
}

/// A receipt the buyers heard: the order to pay, who owns it, and what it costs (qty 1).
#[derive(Clone, Debug)]
pub struct Receipt {
    pub order_id: String,
    pub user: String,
    pub sku: String,
}

/// What one buyer does about one receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Intent {
    Pay,
    PayTwice,
    Abandon,
    PayLate,
    PayEarly,
    /// The shop's checkout opens the payment for the wrong amount (a stale price); the buyer
    /// may pay that one, and then presses pay, which must still open one they can pay.
    CheckoutWrong,
    Never,
}

impl Intent {
    fn draw(rng: &mut fastrand::Rng) -> Intent {
        match rng.u32(0..100) {
            0..=55 => Intent::Pay,
            56..=59 => Intent::CheckoutWrong,
            60..=69 => Intent::PayTwice,
            70..=77 => Intent::Abandon,
            78..=85 => Intent::PayLate,
            86..=91 => Intent::PayEarly,
            _ => Intent::Never,
        }
    }
}

/// What the buyers did, for the report.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PayCounts {
    /// Payments the pay route started (a second press on one order counts once).
    pub started: u64,
    /// Buyer payments the sandbox took (200 from its pay).
    pub paid: u64,
    /// Presses of pay answered 409 `not_pending` (the order had ended).
    pub refused_not_pending: u64,
    /// Payments created and paid through the shop's checkout right after the purchase.
    pub paid_early: u64,
    /// Payments the shop's checkout opened for the wrong amount.
    pub checkout_wrong: u64,
    /// Presses of pay answered 502 `payment_refused` (the provider said no).
    pub refused_by_provider: u64,
    /// Presses of pay, after a wrong-amount checkout, answered with a payment the buyer cannot
    /// pay the order with (the wrong one, or another amount than the price).
    pub answered_wrong_payment: u64,
}

#[derive(Default)]
struct Counters {
    started: AtomicU64,
    paid: AtomicU64,
    refused_not_pending: AtomicU64,
    paid_early: AtomicU64,
    checkout_wrong: AtomicU64,
    refused_by_provider: AtomicU64,
    answered_wrong_payment: AtomicU64,
}

/// The paying buyers; fed receipts by the workload, drained by [`Payer::finish`].
pub struct Payer {
    receipts: mpsc::UnboundedSender<Receipt>,
    task: tokio::task::JoinHandle<()>,
    tasks: Arc<Mutex<JoinSet<()>>>,
    counters: Arc<Counters>,
}

impl Payer {
    pub fn start(plan: PayPlan) -> Payer {
        let (receipts, mut incoming) = mpsc::unbounded_channel::<Receipt>();
        let tasks = Arc::new(Mutex::new(JoinSet::new()));
        let counters = Arc::new(Counters::default());
        let plan = Arc::new(plan);
        let (spawn_into, counted) = (tasks.clone(), counters.clone());
        let task = tokio::spawn(async move {
            let mut seen = BTreeSet::new();
            while let Some(receipt) = incoming.recv().await {
                // A replayed answer names an order already handled.
                if !seen.insert(receipt.order_id.clone()) {
                    continue;
                }
                let (plan, counters) = (plan.clone(), counted.clone());
                spawn_into.lock().unwrap_or_else(|p| p.into_inner()).spawn(pay(plan, counters, receipt));
            }
        });
        Payer { receipts, task, tasks, counters }
    }

    /// Where the workload hands over receipts.
    pub fn receipts(&self) -> mpsc::UnboundedSender<Receipt> {
        self.receipts.clone()
    }

    /// Takes no more receipts; waits up to `within` for the buyers under way, then stops them.
    pub async fn finish(self, within: Duration) -> PayCounts {
        drop(self.receipts);
        // Every other sender belongs to the workload, which has ended.
        let _ = tokio::time::timeout(within, self.task).await;
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::timeout_at(deadline, tasks.join_next()).await.is_ok_and(|joined| joined.is_some()) {}
        tasks.abort_all();
        // Relaxed: every writer has ended.
        PayCounts {
            started: self.counters.started.load(Ordering::Relaxed),
            paid: self.counters.paid.load(Ordering::Relaxed),
            refused_not_pending: self.counters.refused_not_pending.load(Ordering::Relaxed),
            paid_early: self.counters.paid_early.load(Ordering::Relaxed),
            checkout_wrong: self.counters.checkout_wrong.load(Ordering::Relaxed),
            refused_by_provider: self.counters.refused_by_provider.load(Ordering::Relaxed),
            answered_wrong_payment: self.counters.answered_wrong_payment.load(Ordering::Relaxed),
        }
    }
}

/// One buyer's payment of one order, as its drawn intent says.
async fn pay(plan: Arc<PayPlan>, counters: Arc<Counters>, receipt: Receipt) {
    let mut rng = fastrand::Rng::with_seed(plan.seed ^ fnv1a(&receipt.order_id));
    let intent = Intent::draw(&mut rng);
    if intent == Intent::Never {
        return;
    }
    if intent == Intent::PayEarly {
        pay_early(&plan, &counters, &receipt).await;
    }
    let wrong = match intent {
        Intent::CheckoutWrong => checkout_wrong(&plan, &counters, &receipt, &mut rng).await,
        _ => None,
    };
    let Some(started) = press_pay(&plan, &counters, &receipt, &mut rng).await else { return };
    // Relaxed: counts for the report.
    counters.started.fetch_add(1, Ordering::Relaxed);
    let Some(payment) = started["payment_id"].as_str().map(str::to_string) else { return };
    if let Some(wrong) = &wrong {
        let price = plan.prices.get(&receipt.sku).copied();
        if *wrong == payment || started["amount"].as_u64() != price {
            // Relaxed: counts for the checker.
            counters.answered_wrong_payment.fetch_add(1, Ordering::Relaxed);
        }
    }
    match intent {
        Intent::Pay | Intent::CheckoutWrong => pay_at_provider(&plan, &counters, &payment).await,
        Intent::PayTwice => {
            pay_at_provider(&plan, &counters, &payment).await;
            // Pressing pay again answers the same payment (or not_pending once it is paid),
            // and paying it again is refused by the sandbox: no money moves twice.
            if let Some(again) = press_pay(&plan, &counters, &receipt, &mut rng).await {
                if let Some(payment) = again["payment_id"].as_str() {
                    pay_at_provider(&plan, &counters, payment).await;
                }
            }
        }
        Intent::PayLate => {
            let deadline_ms = started["pay_deadline_ms"].as_u64().unwrap_or(0);
            let late_ms = deadline_ms.saturating_add(LATE_BY.as_millis() as u64).saturating_sub(unix_ms());
            tokio::time::sleep(Duration::from_millis(late_ms)).await;
            pay_at_provider(&plan, &counters, &payment).await;
        }
        // Paid already; the press only gave the payment a check behind it.
        Intent::Abandon | Intent::PayEarly | Intent::Never => {}
    }
}

/// The shop's own checkout: the payment created at the sandbox and paid right after the
/// purchase, before the order service has (most likely) stored the order, so the notification
/// arrives first and must wait for it. Creating it again through the pay route afterwards
/// answers this same payment (one per order, same amount), which gives it the order service's
/// provider check should the notification be lost.
async fn pay_early(plan: &PayPlan, counters: &Counters, receipt: &Receipt) {
    let Some(price) = plan.prices.get(&receipt.sku).copied() else { return };
    if let Some(id) = checkout(plan, receipt, price).await {
        pay_at_provider(plan, counters, &id).await;
        // Relaxed: counts for the report.
        counters.paid_early.fetch_add(1, Ordering::Relaxed);
    }
}

/// The shop's checkout at a stale price: one cent more than the order's. Half the buyers pay
/// it (the store records a mismatch and owes it back); the rest leave it open, for the order
/// service to close when its own attempt opens. The wrong payment's id.
async fn checkout_wrong(
    plan: &PayPlan,
    counters: &Counters,
    receipt: &Receipt,
    rng: &mut fastrand::Rng,
) -> Option<String> {
    let price = plan.prices.get(&receipt.sku).copied()?;
    let id = checkout(plan, receipt, price + 1).await?;
    // Relaxed: counts for the report.
    counters.checkout_wrong.fetch_add(1, Ordering::Relaxed);
    if rng.bool() {
        pay_at_provider(plan, counters, &id).await;
    }
    Some(id)
}

/// Creates the order's payment at the sandbox, as a shop's checkout does, under the order's id;
/// its id.
async fn checkout(plan: &PayPlan, receipt: &Receipt, amount: u64) -> Option<String> {
    let (_, orders) = plan.orders.first()?;
    let body = serde_json::json!({
        "order_id": receipt.order_id,
        "amount": amount,
        "currency": crate::sales::CURRENCY,
        "callback_url": format!("http://{orders}/v1/payments/callback"),
    });
    let post = hyper::Method::POST;
    match testkit::http::send_json(post, plan.paysim, "/v1/payments", &body, None, CALL_MAX).await {
        Ok((200, payment)) => payment["id"].as_str().map(str::to_string),
        _ => None,
    }
}

/// Presses pay on an order service until one starts the payment (200) or says the order has
/// ended (409), or patience runs out.
async fn press_pay(
    plan: &PayPlan,
    counters: &Counters,
    receipt: &Receipt,
    rng: &mut fastrand::Rng,
) -> Option<serde_json::Value> {
    let started = Instant::now();
    let path = format!("/v1/orders/{}/pay", receipt.order_id);
    let body = match &plan.bearer {
        Some(_) => serde_json::json!({}),
        None => serde_json::json!({ "user": receipt.user }),
    };
    while started.elapsed() < PAY_PATIENCE && !plan.orders.is_empty() {
        let (_, addr) = &plan.orders[rng.usize(0..plan.orders.len())];
        let token = plan.bearer.as_ref().map(|minter| minter.token(&receipt.user, auth::unix_now_s()));
        let post = hyper::Method::POST;
        match testkit::http::send_json(post, *addr, &path, &body, token.as_deref(), CALL_MAX).await {
            Ok((200, answer)) => return Some(answer),
            Ok((409, _)) => {
                // Relaxed: counts for the report.
                counters.refused_not_pending.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            // The order service's own refusal (a proxy's 502 names no such error).
            Ok((502, answer)) if answer["error"] == "payment_refused" => {
                // Relaxed: counts for the checker.
                counters.refused_by_provider.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            // 404 until the order is stored, 503 while the provider or the store is down, no
            // answer from a dead or frozen service: press again.
            _ => tokio::time::sleep(PRESS_PAUSE).await,
        }
    }
    None
}

/// The buyer pays at the sandbox's page: the money is taken (200) or it was already (409).
async fn pay_at_provider(plan: &PayPlan, counters: &Counters, payment: &str) {
    let path = format!("/v1/payments/{payment}/pay");
    let body = serde_json::json!({ "outcome": "succeed" });
    let post = hyper::Method::POST;
    if let Ok((200, _)) = testkit::http::send_json(post, plan.paysim, &path, &body, None, CALL_MAX).await {
        // Relaxed: counts for the report.
        counters.paid.fetch_add(1, Ordering::Relaxed);
    }
}

/// A stable hash of an order id (FNV-1a), so a receipt's draw does not depend on the order in
/// which receipts arrive.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}
