//! A closed-loop load generator over keep-alive HTTP/1 connections: `concurrency` virtual
//! buyers, each sending its next purchase when the previous one is answered, spread over the
//! targets the way a round-robin load balancer would. A purchase answered 503 (or lost to a
//! connection error) is retried with the same Idempotency-Key on the next target.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// What to send.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub targets: Vec<SocketAddr>,
    pub sku: String,
    pub purchases: u64,
    pub users: u64,
    pub concurrency: usize,
    /// Retries of one purchase after a 503 or a connection error.
    pub retries_max: u32,
    /// Pause before a retry.
    pub retry_pause: Duration,
    /// Seeds the choice of users, so a run can be repeated.
    pub seed: u64,
    /// Purchase attempts per second across all buyers; `None` sends as fast as answers come.
    /// A paced run spreads demand over time, as a real sale's crowd does.
    pub rate_per_s: Option<u64>,
}

/// What came back.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// HTTP requests sent, retries included.
    pub requests: u64,
    /// Responses by outcome (`purchased`, `replayed`, or the error code), transport errors as
    /// `connection_error`.
    pub outcomes: BTreeMap<String, u64>,
    /// Idempotency key → order id, for every fresh or replayed "purchased" answer.
    pub purchases: Vec<(String, String)>,
    pub latency_us: Option<Histogram<u64>>,
    pub elapsed: Duration,
}

impl LoadReport {
    pub fn count(&self, outcome: &str) -> u64 {
        self.outcomes.get(outcome).copied().unwrap_or(0)
    }

    /// Latency quantile in milliseconds.
    pub fn latency_ms(&self, quantile: f64) -> f64 {
        self.latency_us.as_ref().map(|h| h.value_at_quantile(quantile) as f64 / 1000.0).unwrap_or(0.0)
    }

    fn merge(&mut self, other: LoadReport) {
        self.requests += other.requests;
        for (outcome, n) in other.outcomes {
            *self.outcomes.entry(outcome).or_insert(0) += n;
        }
        self.purchases.extend(other.purchases);
        match (&mut self.latency_us, other.latency_us) {
            (Some(mine), Some(theirs)) => {
                let _ = mine.add(theirs);
            }
            (mine @ None, theirs) => *mine = theirs,
            _ => {}
        }
    }
}

/// Runs the plan to the end and reports.
pub async fn run(plan: LoadPlan) -> anyhow::Result<LoadReport> {
    anyhow::ensure!(!plan.targets.is_empty(), "no targets");
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..plan.concurrency)
        .map(|worker| tokio::spawn(buyer(plan.clone(), next.clone(), worker as u64, started)))
        .collect();
    let mut report = LoadReport::default();
    for worker in workers {
        report.merge(worker.await??);
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// One virtual buyer with a connection to each target.
async fn buyer(plan: Arc<LoadPlan>, next: Arc<AtomicU64>, worker: u64, started: Instant) -> anyhow::Result<LoadReport> {
    let mut rng = fastrand::Rng::with_seed(plan.seed ^ worker.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut connections: Vec<Option<SendRequest<Full<Bytes>>>> = plan.targets.iter().map(|_| None).collect();
    let mut report =
        LoadReport { latency_us: Some(Histogram::new_with_bounds(1, 60_000_000, 3)?), ..LoadReport::default() };
    loop {
        // Relaxed: the counter only hands out distinct purchase numbers.
        let number = next.fetch_add(1, Ordering::Relaxed);
        if number >= plan.purchases {
            return Ok(report);
        }
        if let Some(rate) = plan.rate_per_s.filter(|rate| *rate > 0) {
            tokio::time::sleep_until((started + Duration::from_secs_f64(number as f64 / rate as f64)).into()).await;
        }
        let key = format!("load-{}-{number}", plan.seed);
        let body = Bytes::from(format!(r#"{{"sku":"{}","user":"u{}","qty":1}}"#, plan.sku, rng.u64(0..plan.users)));
        let mut target = (number as usize) % plan.targets.len();
        for attempt in 0..=plan.retries_max {
            let sent = Instant::now();
            let answer = send(&mut connections[target], plan.targets[target], &key, body.clone()).await;
            report.requests += 1;
            if let Some(h) = report.latency_us.as_mut() {
                let _ = h.record(sent.elapsed().as_micros().max(1) as u64);
            }
            let retry = match answer {
                Ok((status, outcome, order_id)) => {
                    if let Some(order_id) = order_id {
                        report.purchases.push((key.clone(), order_id));
                    }
                    *report.outcomes.entry(outcome).or_insert(0) += 1;
                    status == StatusCode::SERVICE_UNAVAILABLE
                }
                Err(_) => {
                    connections[target] = None;
                    *report.outcomes.entry("connection_error".into()).or_insert(0) += 1;
                    true
                }
            };
            if !retry || attempt == plan.retries_max {
                break;
            }
            target = (target + 1) % plan.targets.len();
            tokio::time::sleep(plan.retry_pause).await;
        }
    }
}

/// Sends one purchase; returns the status, the outcome name and the order id if purchased.
async fn send(
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    addr: SocketAddr,
    key: &str,
    body: Bytes,
) -> anyhow::Result<(StatusCode, String, Option<String>)> {
    if slot.as_ref().is_none_or(|sender| sender.is_closed()) {
        *slot = Some(connect(addr).await?);
    }
    let sender = slot.as_mut().ok_or_else(|| anyhow::anyhow!("no connection"))?;
    sender.ready().await?;
    let request = Request::post("/v1/purchase")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(body))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await?.to_bytes();
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let outcome = match (parsed.get("result"), parsed.get("error")) {
        (Some(_), _) if replayed => "replayed".to_string(),
        (Some(result), _) => result.as_str().unwrap_or("?").to_string(),
        (None, Some(code)) => code.as_str().unwrap_or("?").to_string(),
        (None, None) => format!("http_{}", status.as_u16()),
    };
    let order_id = parsed.get("order_id").and_then(|v| v.as_str()).map(str::to_string);
    Ok((status, outcome, order_id))
}

/// Opens a keep-alive HTTP/1 connection.
pub async fn connect(addr: SocketAddr) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await??;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}
