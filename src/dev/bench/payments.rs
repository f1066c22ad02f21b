//! The payment jobs' cost, for `seckill bench orders`: how fast the query job settles payments
//! whose notification never came, closes the payments of ended orders, and how fast the refund
//! job pays back what is owed. Per store, against the sandbox provider in process (every
//! notification dropped, so only the jobs learn anything), with the sweeper's batch and a clock
//! a day ahead so every check is due at once:
//!
//! - **query**: orders whose payment started and was paid at the sandbox: one check each finds
//!   the success (`found_by_query`);
//! - **close**: ended orders (expired, as the query job leaves an order still unknown past
//!   `query_limit`) whose payment was never made: one check each closes it;
//! - **paid late**: ended orders whose buyer paid before the close: the close answers the
//!   success, recorded as paid after expiry with a refund owed;
//! - **refund**: those refunds, asked of the provider and marked refunded.
//!
//! Each job runs one order at a time, as the sweeper runs it; the time a check spends waiting
//! on the provider is measured apart from the rest (the store's reads and writes).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orders::payments::{checks, refunds, PaymentSettings, Payments, Started};
use orders::provider::{
    CreatePayment, PaymentProvider, PaymentStatus, ProviderError, ProviderPayment, RefundRequest, RefundStatus,
    SandboxProvider,
};
use orders::{NewOrder, OrderStore};
use serde::Serialize;

/// Orders per measurement.
pub const JOB_ORDERS: u64 = 2_000;
/// The sweeper's batch: at most this many checks or refunds per pass.
const BATCH: usize = 500;
/// The clock the jobs run on: a day ahead, past every deadline and every backoff set on it.
const AHEAD_MS: u64 = 24 * 60 * 60 * 1000;
/// The benchmark's own sweeper fence.
const FENCE: u64 = 1;
/// Orders being prepared at once (started, paid at the sandbox): setting up is not measured.
const PREPARERS: usize = 16;
const WITHIN: Duration = Duration::from_secs(10);
const PRICE: u64 = 100;

/// One job's rate, and how long its provider calls took. The jobs run their calls
/// `orders::payments::IN_FLIGHT` at once, so the time per order is not provider + store: the
/// rate is what counts.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct JobRate {
    pub per_s: f64,
    /// Mean time of one provider call (loopback HTTP to the in-process sandbox).
    pub provider_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobsCost {
    /// Orders in each measurement.
    pub orders: u64,
    /// The query job finding payments whose notification was dropped.
    pub query: JobRate,
    /// The query job closing the payments of ended orders never paid.
    pub close: JobRate,
    /// The query job closing ended orders paid first: recorded, refund owed.
    pub paid_late: JobRate,
    /// The refund job paying those back.
    pub refund: JobRate,
}

/// Runs the four measurements on the store at `store_url` (a fresh one: every check due in it
/// is taken as the benchmark's).
pub async fn measure(store_url: &str, tag: &str) -> anyhow::Result<JobsCost> {
    let store = orders::store::open(store_url).await?;
    store.raise_fence(FENCE).await?;
    let sandbox = paysim::Paysim::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        paysim::Config {
            secret: Arc::from(crate::dev::payers::PAYMENT_SECRET),
            faults: paysim::Faults { drop_p: 1.0, ..paysim::Faults::default() },
            seed: 1,
            private_network: false,
        },
    )
    .await?;
    let provider = Arc::new(TimedProvider {
        inner: SandboxProvider::new(&format!("http://{}", sandbox.addr))?,
        spent_ns: AtomicU64::new(0),
    });
    let payments = Payments {
        provider: provider.clone(),
        // Never called: every notification is dropped.
        callback_url: "http://127.0.0.1:9/v1/payments/callback".to_string(),
        settings: PaymentSettings::default(),
    };
    let result = async {
        let n = JOB_ORDERS;
        let setup = Setup { store: &store, payments: &payments, sandbox: sandbox.addr };

        setup.prepare(&format!("{tag}-query"), n, Pay::Succeed, false).await?;
        let (query, round) = timed(&provider, n, checks_until_done(&store, &payments)).await?;
        anyhow::ensure!(round.found_by_query == n, "the query job found {} of {n} payments", round.found_by_query);

        setup.prepare(&format!("{tag}-close"), n, Pay::No, true).await?;
        let (close, round) = timed(&provider, n, checks_until_done(&store, &payments)).await?;
        anyhow::ensure!(round.closed == n, "the query job closed {} of {n} payments", round.closed);

        setup.prepare(&format!("{tag}-late"), n, Pay::Succeed, true).await?;
        let (paid_late, round) = timed(&provider, n, checks_until_done(&store, &payments)).await?;
        anyhow::ensure!(round.found_by_query == n, "closing found {} of {n} late payments", round.found_by_query);

        let (refund, refunded) = timed(&provider, n, refunds_until_done(&store, &payments)).await?;
        anyhow::ensure!(refunded == n, "the refund job refunded {refunded} of {n}");
        Ok(JobsCost { orders: n, query, close, paid_late, refund })
    }
    .await;
    sandbox.stop().await;
    result
}

/// Runs `job` over `n` orders: its rate, and its time split between the provider and the rest.
async fn timed<T>(
    provider: &TimedProvider,
    n: u64,
    job: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(JobRate, T)> {
    let before = provider.spent_ns.load(Ordering::Relaxed);
    let started = Instant::now();
    let done = job.await?;
    let elapsed = started.elapsed().as_secs_f64();
    let provider_s = (provider.spent_ns.load(Ordering::Relaxed) - before) as f64 / 1e9;
    let per_order_ms = |seconds: f64| seconds * 1e3 / n as f64;
    Ok((JobRate { per_s: n as f64 / elapsed, provider_ms: per_order_ms(provider_s) }, done))
}

fn ahead() -> impl orders::payments::Clock + Fn() -> u64 + Clone {
    let later = orders::unix_ms() + AHEAD_MS;
    move || later
}

/// Query job passes, as the sweeper makes them, until no check is due.
async fn checks_until_done(store: &Arc<dyn OrderStore>, payments: &Payments) -> anyhow::Result<checks::ChecksRound> {
    let mut total = checks::ChecksRound::default();
    let now = ahead();
    while !store.payment_checks_due(now(), 1).await?.is_empty() {
        let round = checks::run(store.clone(), payments, FENCE, BATCH, now.clone()).await?;
        anyhow::ensure!(round.fenced_out == 0, "the benchmark's fence was raised by someone else");
        total.found_by_query += round.found_by_query;
        total.expired += round.expired;
        total.closed += round.closed;
        total.deferred += round.deferred;
    }
    Ok(total)
}

/// Refund job passes until none is due: how many were refunded.
async fn refunds_until_done(store: &Arc<dyn OrderStore>, payments: &Payments) -> anyhow::Result<u64> {
    let mut refunded = 0;
    let now = ahead();
    while !store.refunds_due(now(), 1).await?.is_empty() {
        refunded += refunds::run(store.clone(), payments, BATCH, now.clone()).await?.refunded;
    }
    Ok(refunded)
}

#[derive(Clone, Copy, PartialEq)]
enum Pay {
    Succeed,
    No,
}

struct Setup<'a> {
    store: &'a Arc<dyn OrderStore>,
    payments: &'a Payments,
    sandbox: SocketAddr,
}

impl Setup<'_> {
    /// Stores `n` orders `{sku}-1` …, starts each one's payment (the store's note, then the
    /// sandbox's create), pays it at the sandbox if `pay`, and expires it if `expire`.
    async fn prepare(&self, sku: &str, n: u64, pay: Pay, expire: bool) -> anyhow::Result<()> {
        let now = orders::unix_ms();
        let new: Vec<NewOrder> = (1..=n)
            .map(|seq| NewOrder {
                id: format!("{sku}-{seq}"),
                sku: sku.to_string(),
                user: format!("buyer-{seq}"),
                qty: 1,
                node: "n1".to_string(),
                idempotency_key: format!("key-{seq}"),
                stream_seq: seq,
                unit_price: PRICE,
                currency: "USD".to_string(),
                created_at_ms: now,
                pay_deadline_ms: now + 15 * 60 * 1000,
            })
            .collect();
        for batch in new.chunks(orders::store::INSERT_BATCH_MAX) {
            self.store.insert_batch(batch).await?;
        }
        let next = Arc::new(AtomicU64::new(1));
        let workers: Vec<_> = (0..PREPARERS)
            .map(|_| {
                let (store, payments, sandbox, next, sku) =
                    (self.store.clone(), self.payments.clone(), self.sandbox, next.clone(), sku.to_string());
                tokio::spawn(async move {
                    loop {
                        let seq = next.fetch_add(1, Ordering::Relaxed);
                        if seq > n {
                            return anyhow::Ok(());
                        }
                        let id = format!("{sku}-{seq}");
                        let started = orders::payments::start(&*store, &payments, &id, orders::unix_ms()).await?;
                        let Started::Payment { payment_id, .. } = started else {
                            anyhow::bail!("the payment of {id} did not start: {started:?}");
                        };
                        if pay == Pay::Succeed {
                            let path = format!("/v1/payments/{payment_id}/pay");
                            let body = serde_json::json!({ "outcome": "succeed" });
                            let (status, answer) = testkit::http::post_json(sandbox, &path, &body, WITHIN).await?;
                            anyhow::ensure!(status == 200, "paying {id} at the sandbox: {status} {answer}");
                        }
                        if expire {
                            let outcome = store.expire(&id, FENCE, orders::unix_ms()).await?;
                            anyhow::ensure!(
                                outcome == orders::ExpireOutcome::Expired,
                                "{id} did not expire: {outcome:?}"
                            );
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await??;
        }
        Ok(())
    }
}

/// The sandbox's client, adding up the time spent in its calls.
struct TimedProvider {
    inner: SandboxProvider,
    spent_ns: AtomicU64,
}

impl TimedProvider {
    async fn time<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        let started = Instant::now();
        let answer = call.await;
        self.spent_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        answer
    }
}

#[async_trait::async_trait]
impl PaymentProvider for TimedProvider {
    async fn create(&self, payment: &CreatePayment) -> Result<ProviderPayment, ProviderError> {
        self.time(self.inner.create(payment)).await
    }

    async fn query(&self, order_id: &str) -> Result<PaymentStatus, ProviderError> {
        self.time(self.inner.query(order_id)).await
    }

    async fn close(&self, order_id: &str) -> Result<PaymentStatus, ProviderError> {
        self.time(self.inner.close(order_id)).await
    }

    async fn refund(&self, refund: &RefundRequest) -> Result<RefundStatus, ProviderError> {
        self.time(self.inner.refund(refund)).await
    }

    async fn settlements(&self, from_ms: u64, to_ms: u64) -> Result<orders::provider::SettlementReport, ProviderError> {
        self.time(self.inner.settlements(from_ms, to_ms)).await
    }
}
