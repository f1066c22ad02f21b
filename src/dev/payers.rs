//! Buyers paying through the signed callback path, for `seckill bench orders`: each payment is a
//! `POST /v1/payments/callback` signed as the provider signs it, into a real order API. Two
//! uses: every order of a drained backlog paid once ([`pay_all`]), and a pool paying each order
//! of a running sale as soon as the store shows it ([`SalePayers`]), so the callbacks reach the
//! store while the consumer writes the burst.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use serde::Serialize;
use tokio::task::JoinHandle;

/// The payment secret of the benchmark's order APIs.
pub const PAYMENT_SECRET: &[u8] = b"bench-orders-payment-secret";
/// Callers paying at once, each on its own keep-alive connection.
pub const PAYERS: usize = 32;
/// Longest the pool may take, after the store holds every order, to have paid them all.
const PAY_AFTER_MAX: Duration = Duration::from_secs(120);
/// How often an idle payer looks again for a newly visible order.
const IDLE_POLL: Duration = Duration::from_millis(2);
/// Sends of one callback answered 5xx before the run fails, and the pause between them.
const RETRIES_MAX: u32 = 20;
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// Pays `order_id` once (reference `pay-{order_id}`): the answer's status and body.
pub async fn pay(
    sender: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    order_id: &str,
    amount: u64,
) -> anyhow::Result<(u16, Bytes)> {
    let body = serde_json::json!({
        "order_id": order_id,
        "reference": format!("pay-{order_id}"),
        "amount": amount,
        "currency": "USD",
    })
    .to_string();
    let t = orders::unix_ms() / 1000;
    let request = hyper::Request::post("/v1/payments/callback")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header(orders::signature::SIGNATURE_HEADER, orders::signature::sign(PAYMENT_SECRET, t, body.as_bytes()))
        .body(Full::new(Bytes::from(body)))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let answer = http_body_util::BodyExt::collect(response.into_body()).await?.to_bytes();
    Ok((status, answer))
}

/// Pays each of orders `{sku}-1` … `{sku}-{count}` once through the API at `addr`, [`PAYERS`] at
/// once; every payment must answer 200 (the order is stored). Returns payments per second.
pub async fn pay_all(addr: SocketAddr, sku: &str, count: u64, amount: u64) -> anyhow::Result<f64> {
    let started = Instant::now();
    let payers: Vec<_> = (0..PAYERS)
        .map(|payer| {
            let sku = sku.to_string();
            tokio::spawn(async move {
                let mut sender = testkit::load::connect(addr).await?;
                for seq in (1..=count).filter(|seq| *seq as usize % PAYERS == payer) {
                    let order_id = format!("{sku}-{seq}");
                    let (status, answer) = pay(&mut sender, addr, &order_id, amount).await?;
                    anyhow::ensure!(
                        status == 200,
                        "payment of {order_id}: {status} {}",
                        String::from_utf8_lossy(&answer)
                    );
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for payer in payers {
        payer.await??;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// What the pool paid during a sale.
#[derive(Debug, Clone, Serialize)]
pub struct SalePayments {
    /// Orders paid (200 `paid`, or 202: recorded before the order was stored, applied on arrival).
    pub payments: u64,
    /// Of those, answered 202: the store counted the order before it was readable by id.
    pub early: u64,
    /// Callbacks answered 5xx and sent again.
    pub retried: u64,
    /// From the first payment answered to the last.
    pub payments_per_s: f64,
    /// Paid by the time the store held every order of the sale: payments that met the burst.
    pub paid_when_stored: u64,
    /// From an order being visible to its payment answered, over every order (the pool's own
    /// queueing included): p50 and p99.
    pub pay_lag_p50_ms: f64,
    pub pay_lag_p99_ms: f64,
}

/// The orders of the sale the store holds, as its sampler reads them, and when each was first
/// seen there: what the payers wait on, and where each payment's lag starts. Orders are known by
/// their stream seq; their ids come from the order stream.
#[derive(Default)]
pub struct Visible {
    seen: Mutex<Vec<Instant>>,
    /// Order ids by stream seq (index seq - 1).
    ids: Mutex<Vec<String>>,
}

impl Visible {
    /// The store holds `stored` orders now.
    pub fn set(&self, stored: u64) {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while (seen.len() as u64) < stored {
            seen.push(now);
        }
    }

    /// The highest seq whose order id is known: where the next read of the stream starts.
    pub fn known(&self) -> u64 {
        self.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len() as u64
    }

    /// Order ids of the stream, `(seq, id)` in stream order; a seq out of turn is skipped.
    pub fn learn(&self, events: impl Iterator<Item = (u64, String)>) {
        let mut ids = self.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (seq, id) in events {
            if seq == ids.len() as u64 + 1 {
                ids.push(id);
            }
        }
    }

    fn seen(&self, seq: u64) -> Option<Instant> {
        let seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.get((seq as usize).checked_sub(1)?).copied()
    }

    /// The order with stream seq `seq` once the store holds it: when it was seen, and its id.
    fn order(&self, seq: u64) -> Option<(Instant, String)> {
        let seen = self.seen(seq)?;
        let ids = self.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Some((seen, ids.get((seq as usize).checked_sub(1)?)?.clone()))
    }
}

/// A payer's payments: when each order was first seen in the store, and when its payment was
/// answered.
type Paid = Vec<(Instant, Instant)>;

/// What the payers share.
struct Shared {
    visible: Arc<Visible>,
    /// The next stream seq to pay.
    next: AtomicU64,
    stop: AtomicBool,
    paid: AtomicU64,
    early: AtomicU64,
    retried: AtomicU64,
}

/// A pool of [`PAYERS`] paying each order of a sale as soon as the store holds it (orders are
/// taken by their stream seq, which the consumer stores in order).
pub struct SalePayers {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<anyhow::Result<Paid>>>,
}

impl SalePayers {
    /// `visible`: the orders stored, kept current by the caller's sampler.
    pub fn start(addr: SocketAddr, amount: u64, visible: Arc<Visible>) -> SalePayers {
        let shared = Arc::new(Shared {
            visible,
            next: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            paid: AtomicU64::new(0),
            early: AtomicU64::new(0),
            retried: AtomicU64::new(0),
        });
        let tasks = (0..PAYERS)
            .map(|_| {
                let shared = shared.clone();
                tokio::spawn(async move { pay_as_visible(addr, amount, &shared).await })
            })
            .collect();
        SalePayers { shared, tasks }
    }

    /// Called when the store holds all `total` orders: waits until each is paid, then stops
    /// the pool.
    pub async fn finish(self, total: u64) -> anyhow::Result<SalePayments> {
        let deadline = Instant::now() + PAY_AFTER_MAX;
        while self.shared.paid.load(Ordering::Relaxed) < total {
            if self.tasks.iter().all(JoinHandle::is_finished) || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.shared.stop.store(true, Ordering::Relaxed);
        // (seen, answered) of every payment
        let mut paid = Vec::new();
        for task in self.tasks {
            paid.extend(task.await??);
        }
        anyhow::ensure!(
            paid.len() as u64 >= total,
            "the payers paid {} of {total} orders within {PAY_AFTER_MAX:?} of the store holding them",
            paid.len()
        );
        let all_stored = self.shared.visible.seen(total);
        let paid_when_stored = paid.iter().filter(|(_, answered)| all_stored.is_some_and(|at| *answered <= at)).count();
        let mut lags: Vec<Duration> = paid.iter().map(|(seen, answered)| *answered - *seen).collect();
        lags.sort_unstable();
        let quantile = |q: f64| {
            lags.get(((lags.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .map_or(0.0, |lag| lag.as_secs_f64() * 1e3)
        };
        let first = paid.iter().map(|p| p.1).min();
        let last = paid.iter().map(|p| p.1).max();
        let span = match (first, last) {
            (Some(first), Some(last)) => (last - first).as_secs_f64(),
            _ => 0.0,
        };
        Ok(SalePayments {
            payments: paid.len() as u64,
            early: self.shared.early.load(Ordering::Relaxed),
            retried: self.shared.retried.load(Ordering::Relaxed),
            payments_per_s: paid.len() as f64 / span.max(1e-3),
            paid_when_stored: paid_when_stored as u64,
            pay_lag_p50_ms: quantile(0.5),
            pay_lag_p99_ms: quantile(0.99),
        })
    }
}

/// One payer: takes the next seq, waits for the store to show it, pays it. Returns, per payment,
/// when its order was first seen in the store and when the payment was answered.
async fn pay_as_visible(addr: SocketAddr, amount: u64, shared: &Shared) -> anyhow::Result<Paid> {
    let mut sender = testkit::load::connect(addr).await?;
    let mut paid = Vec::new();
    loop {
        let seq = shared.next.fetch_add(1, Ordering::Relaxed);
        let (seen, order_id) = loop {
            if let Some(order) = shared.visible.order(seq) {
                break order;
            }
            if shared.stop.load(Ordering::Relaxed) {
                return Ok(paid);
            }
            tokio::time::sleep(IDLE_POLL).await;
        };
        let mut attempts = 0;
        let answered = loop {
            let (status, answer) = pay(&mut sender, addr, &order_id, amount).await?;
            attempts += 1;
            match status {
                // A 200 also acknowledges a payment that paid nothing (a mismatch, a repeat).
                200 if serde_json::from_slice::<serde_json::Value>(&answer)
                    .is_ok_and(|answer| answer["outcome"] == "paid") =>
                {
                    break Instant::now()
                }
                202 => {
                    shared.early.fetch_add(1, Ordering::Relaxed);
                    break Instant::now();
                }
                // As a provider does: a 5xx leaves the payment unrecorded, so it is sent again.
                500.. if attempts < RETRIES_MAX => {
                    shared.retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                _ => anyhow::bail!("payment of {order_id}: {status} {}", String::from_utf8_lossy(&answer)),
            }
        };
        shared.paid.fetch_add(1, Ordering::Relaxed);
        paid.push((seen, answered));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_is_seen_when_the_store_first_counts_it() {
        let visible = Visible::default();
        assert_eq!(visible.seen(1), None);
        visible.set(2);
        let first = visible.seen(2).expect("seen");
        // A sampler's later, lower read (a count is never taken back) changes nothing.
        visible.set(1);
        visible.set(3);
        assert_eq!((visible.seen(1), visible.seen(2)), (Some(first), Some(first)));
        assert!(visible.seen(3).is_some_and(|third| third >= first));
        assert_eq!((visible.seen(0), visible.seen(4)), (None, None));
        assert_eq!(visible.order(1), None, "no id known yet");
        visible.learn([(1, "a".to_string()), (3, "c".to_string()), (2, "b".to_string())].into_iter());
        assert_eq!(visible.known(), 2, "a seq out of turn is skipped, to be read again");
        assert_eq!(visible.order(2), Some((first, "b".to_string())));
    }
}
