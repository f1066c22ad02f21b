//! A closed-loop load generator over keep-alive HTTP/1 connections: `concurrency` virtual
//! buyers, each sending its next purchase when the previous one is answered, spread over the
//! targets the way a round-robin load balancer would. A purchase answered 503, 502 or 504 (or
//! lost to a connection error) is retried with the same Idempotency-Key on the next target.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
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

/// Outcome names the generator counts; anything else is `other`.
const OUTCOMES: [&str; 18] = [
    "purchased",
    "replayed",
    "sold_out",
    "user_limit",
    "in_progress",
    "key_reused",
    "not_started",
    "ended",
    "blocked",
    "rate_limited",
    "unknown_sku",
    "unavailable",
    "bad_request",
    "ok",
    "connection_error",
    "bad_gateway",
    "gateway_timeout",
    "other",
];

fn outcome_index(name: &str) -> usize {
    OUTCOMES.iter().position(|o| *o == name).unwrap_or(OUTCOMES.len() - 1)
}

/// Runs the plan to the end and reports.
pub async fn run(plan: LoadPlan) -> anyhow::Result<LoadReport> {
    anyhow::ensure!(!plan.targets.is_empty(), "no targets");
    // Bodies are built once per user, not per request: the generator shares the CPU with the
    // system it measures, so every allocation it skips is throughput the system keeps.
    let bodies: Arc<Vec<Bytes>> = Arc::new(
        (0..plan.users.max(1))
            .map(|user| Bytes::from(format!(r#"{{"sku":"{}","user":"u{user}","qty":1}}"#, plan.sku)))
            .collect(),
    );
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicU64::new(0));
    let bar = crate::progress::counter(plan.purchases, "purchase attempts");
    // The bar reads the counter the buyers already share: the hot path does no extra work.
    let following = crate::progress::follow(&bar, next.clone());
    let started = Instant::now();
    let workers: Vec<_> = (0..plan.concurrency)
        .map(|worker| tokio::spawn(buyer(plan.clone(), bodies.clone(), next.clone(), worker as u64, started)))
        .collect();
    let mut report = LoadReport::default();
    for worker in workers {
        report.merge(worker.await??);
    }
    report.elapsed = started.elapsed();
    drop(following);
    bar.finish_and_clear();
    Ok(report)
}

/// One virtual buyer with a connection to each target.
async fn buyer(
    plan: Arc<LoadPlan>,
    bodies: Arc<Vec<Bytes>>,
    next: Arc<AtomicU64>,
    worker: u64,
    started: Instant,
) -> anyhow::Result<LoadReport> {
    let mut rng = fastrand::Rng::with_seed(plan.seed ^ worker.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let hosts: Vec<HeaderValue> =
        plan.targets.iter().map(|addr| HeaderValue::from_str(&addr.to_string())).collect::<Result<_, _>>()?;
    let mut connections: Vec<Option<SendRequest<Full<Bytes>>>> = plan.targets.iter().map(|_| None).collect();
    let mut counts = [0u64; OUTCOMES.len()];
    let mut report =
        LoadReport { latency_us: Some(Histogram::new_with_bounds(1, 60_000_000, 3)?), ..LoadReport::default() };
    loop {
        // Relaxed: the counter only hands out distinct purchase numbers.
        let number = next.fetch_add(1, Ordering::Relaxed);
        if number >= plan.purchases {
            report.outcomes =
                OUTCOMES.iter().zip(counts).filter(|(_, n)| *n > 0).map(|(name, n)| (name.to_string(), n)).collect();
            return Ok(report);
        }
        if let Some(rate) = plan.rate_per_s.filter(|rate| *rate > 0) {
            tokio::time::sleep_until((started + Duration::from_secs_f64(number as f64 / rate as f64)).into()).await;
        }
        let key = HeaderValue::from_str(&format!("load-{}-{number}", plan.seed))?;
        let body = bodies[rng.usize(0..bodies.len())].clone();
        let mut target = (number as usize) % plan.targets.len();
        for attempt in 0..=plan.retries_max {
            let sent = Instant::now();
            let answer = send(&mut connections[target], plan.targets[target], &hosts[target], &key, body.clone()).await;
            report.requests += 1;
            if let Some(h) = report.latency_us.as_mut() {
                let _ = h.record(sent.elapsed().as_micros().max(1) as u64);
            }
            let retry = match answer {
                Ok(Answer { status, outcome, order_id }) => {
                    if let Some(order_id) = order_id {
                        report.purchases.push((key.to_str().unwrap_or_default().to_string(), order_id));
                    }
                    counts[outcome] += 1;
                    // 503: nothing decided. 502/504 from a proxy: the node may or may not have
                    // decided. Either way the same key is safe to send again.
                    matches!(
                        status,
                        StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT
                    )
                }
                Err(_) => {
                    connections[target] = None;
                    counts[outcome_index("connection_error")] += 1;
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

struct Answer {
    status: StatusCode,
    /// Index into `OUTCOMES`.
    outcome: usize,
    order_id: Option<String>,
}

/// Sends one purchase. Only a 200 is parsed as JSON (it carries the order id); error bodies are
/// classified by their `error` field without parsing.
async fn send(
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    addr: SocketAddr,
    host: &HeaderValue,
    key: &HeaderValue,
    body: Bytes,
) -> anyhow::Result<Answer> {
    if slot.as_ref().is_none_or(|sender| sender.is_closed()) {
        *slot = Some(connect(addr).await?);
    }
    let sender = slot.as_mut().ok_or_else(|| anyhow::anyhow!("no connection"))?;
    sender.ready().await?;
    let mut request = Request::post("/v1/purchase").body(Full::new(body))?;
    let headers = request.headers_mut();
    headers.insert(HOST, host.clone());
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert("idempotency-key", key.clone());
    let response = sender.send_request(request).await?;
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await?.to_bytes();
    if status == StatusCode::OK {
        let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let order_id = parsed.get("order_id").and_then(|v| v.as_str()).map(str::to_string);
        let outcome = match (&order_id, replayed) {
            (Some(_), true) => outcome_index("replayed"),
            (Some(_), false) => outcome_index("purchased"),
            (None, _) => outcome_index("ok"),
        };
        return Ok(Answer { status, outcome, order_id });
    }
    // A proxy's own errors are HTML; name them by status.
    match status {
        StatusCode::BAD_GATEWAY => return Ok(Answer { status, outcome: outcome_index("bad_gateway"), order_id: None }),
        StatusCode::GATEWAY_TIMEOUT => {
            return Ok(Answer { status, outcome: outcome_index("gateway_timeout"), order_id: None })
        }
        _ => {}
    }
    let code = body
        .strip_prefix(br#"{"error":""#.as_slice())
        .and_then(|rest| rest.split(|b| *b == b'"').next())
        .and_then(|code| std::str::from_utf8(code).ok())
        .unwrap_or("other");
    Ok(Answer { status, outcome: outcome_index(code), order_id: None })
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
