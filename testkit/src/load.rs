//! A load generator over keep-alive HTTP/1 connections: `concurrency` virtual buyers, spread
//! over the targets the way a round-robin load balancer would. A purchase answered 503, 502 or
//! 504 (or lost to a connection error) is retried with the same Idempotency-Key on the next
//! target.
//!
//! Two arrival models:
//! - **closed loop** (no `rate_per_s`): each buyer sends its next purchase when the previous one
//!   is answered, so the load adapts to the server; latency is from the send.
//! - **open loop** (`rate_per_s`): purchase `n` is due at `n / rate` seconds, whatever the server
//!   does, as a crowd pressing the button is. Latency is counted from that *intended* time, so a
//!   slow answer that delays the next send shows as the queueing it is instead of hiding it
//!   (coordinated omission). A send that leaves more than [`LATE_SEND`] after its time is
//!   counted: many of them mean the server held every buyer busy, or the generator could not
//!   keep up, and the report says so.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
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
    /// Purchase attempts per second across all buyers (open loop); `None` sends as fast as
    /// answers come (closed loop). A paced run spreads demand over time, as a real sale's crowd
    /// does.
    pub rate_per_s: Option<u64>,
    /// Signs each buyer a token (`Authorization: Bearer`), as the shop's identity provider would,
    /// for a fleet under `[auth] mode = "jwt"`; `None`: no credential (`mode = "none"`).
    pub bearer: Option<Arc<auth::mint::Minter>>,
}

/// How late an open-loop send may leave before it counts as late.
pub const LATE_SEND: Duration = Duration::from_millis(2);

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
    /// Per HTTP request: from the intended send time in an open-loop run (first attempts),
    /// from the send otherwise.
    pub latency_us: Option<Histogram<u64>>,
    pub elapsed: Duration,
    /// Open loop: first attempts that left more than [`LATE_SEND`] after their intended time,
    /// and the latest of them.
    pub late_sends: u64,
    pub max_send_lag: Duration,
    /// From the start until the last purchase attempt had its final answer.
    pub all_answered: Duration,
    /// From the start until the last fresh `purchased` answer: when the stock was gone, as the
    /// buyers saw it.
    pub last_sale: Option<Duration>,
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
        self.late_sends += other.late_sends;
        self.max_send_lag = self.max_send_lag.max(other.max_send_lag);
        self.all_answered = self.all_answered.max(other.all_answered);
        self.last_sale = self.last_sale.max(other.last_sale);
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
const OUTCOMES: [&str; 21] = [
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
    "stripe_empty",
    "bad_request",
    "unauthenticated",
    "user_mismatch",
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
    // One token per buyer, minted before the clock starts: a provider hands them out long before.
    let credentials: Arc<Vec<Option<HeaderValue>>> = Arc::new(
        (0..plan.users.max(1))
            .map(|user| {
                let minter = plan.bearer.as_ref()?;
                HeaderValue::from_str(&format!("Bearer {}", minter.token(&format!("u{user}"), auth::unix_now_s()))).ok()
            })
            .collect(),
    );
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicU64::new(0));
    let bar = crate::progress::counter(plan.purchases, "purchase attempts");
    // The bar reads the counter the buyers already share: the hot path does no extra work.
    let following = crate::progress::follow(&bar, next.clone());
    let started = Instant::now();
    let workers: Vec<_> = (0..plan.concurrency)
        .map(|worker| {
            let buyers = Buyers { bodies: bodies.clone(), credentials: credentials.clone() };
            tokio::spawn(buyer(plan.clone(), buyers, next.clone(), worker as u64, started))
        })
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

/// Per user: the purchase body and the credential, built once.
struct Buyers {
    bodies: Arc<Vec<Bytes>>,
    credentials: Arc<Vec<Option<HeaderValue>>>,
}

/// One virtual buyer with a connection to each target.
async fn buyer(
    plan: Arc<LoadPlan>,
    buyers: Buyers,
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
        let due = plan
            .rate_per_s
            .filter(|rate| *rate > 0)
            .map(|rate| started + Duration::from_secs_f64(number as f64 / rate as f64));
        if let Some(due) = due {
            tokio::time::sleep_until(due.into()).await;
            let lag = Instant::now().saturating_duration_since(due);
            if lag > LATE_SEND {
                report.late_sends += 1;
                report.max_send_lag = report.max_send_lag.max(lag);
            }
        }
        let key = HeaderValue::from_str(&format!("load-{}-{number}", plan.seed))?;
        let user = rng.usize(0..buyers.bodies.len());
        let (body, credential) = (buyers.bodies[user].clone(), buyers.credentials[user].as_ref());
        let mut target = (number as usize) % plan.targets.len();
        for attempt in 0..=plan.retries_max {
            // The first attempt's clock starts when the buyer meant to press, not when a free
            // buyer got round to it; a retry's when it is sent.
            let sent = due.filter(|_| attempt == 0).unwrap_or_else(Instant::now);
            let purchase = Purchase { host: &hosts[target], key: &key, credential, body: body.clone() };
            let answer = send(&mut connections[target], plan.targets[target], purchase).await;
            report.requests += 1;
            if let Some(h) = report.latency_us.as_mut() {
                let _ = h.record(sent.elapsed().as_micros().max(1) as u64);
            }
            report.all_answered = report.all_answered.max(started.elapsed());
            let retry = match answer {
                Ok(Answer { status, outcome, order_id }) => {
                    if let Some(order_id) = order_id {
                        report.purchases.push((key.to_str().unwrap_or_default().to_string(), order_id));
                    }
                    if outcome == outcome_index("purchased") {
                        report.last_sale = report.last_sale.max(Some(started.elapsed()));
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

/// One purchase request's parts.
struct Purchase<'a> {
    host: &'a HeaderValue,
    key: &'a HeaderValue,
    credential: Option<&'a HeaderValue>,
    body: Bytes,
}

/// Sends one purchase. Only a 200 is parsed as JSON (it carries the order id); error bodies are
/// classified by their `error` field without parsing.
async fn send(
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    addr: SocketAddr,
    purchase: Purchase<'_>,
) -> anyhow::Result<Answer> {
    if slot.as_ref().is_none_or(|sender| sender.is_closed()) {
        *slot = Some(connect(addr).await?);
    }
    let sender = slot.as_mut().ok_or_else(|| anyhow::anyhow!("no connection"))?;
    match tokio::time::timeout(REQUEST_TIMEOUT, exchange(sender, purchase)).await {
        Ok(answer) => answer,
        Err(_) => {
            // The connection may be wedged mid-response: a fresh one serves the next request.
            *slot = None;
            anyhow::bail!("no answer within {REQUEST_TIMEOUT:?}")
        }
    }
}

/// A request no server answers within this is counted as an error, so a wedged connection can
/// never hang a load run (and the test driving it) forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

async fn exchange(sender: &mut SendRequest<Full<Bytes>>, purchase: Purchase<'_>) -> anyhow::Result<Answer> {
    sender.ready().await?;
    let mut request = Request::post("/v1/purchase").body(Full::new(purchase.body))?;
    let headers = request.headers_mut();
    headers.insert(HOST, purchase.host.clone());
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert("idempotency-key", purchase.key.clone());
    if let Some(credential) = purchase.credential {
        headers.insert(AUTHORIZATION, credential.clone());
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::server::conn::http1 as server;
    use hyper::service::service_fn;
    use tokio::net::TcpListener;

    /// A server that answers every purchase `sold_out` after `delay`, one request at a time per
    /// connection, as a saturated backend would.
    async fn slow_server(delay: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service = service_fn(move |_request| async move {
                        tokio::time::sleep(delay).await;
                        let body = Full::new(Bytes::from_static(br#"{"error":"sold_out"}"#));
                        hyper::Response::builder().status(StatusCode::CONFLICT).body(body)
                    });
                    let _ = server::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        addr
    }

    /// Goal: an open-loop run charges the server for the queue it causes (no coordinated
    /// omission). Method: one buyer, presses due every 5 ms, a server that takes 20 ms each:
    /// press 40 is due at 195 ms but cannot be answered before 800 ms, so the worst latency
    /// counted from intended times is at least 600 ms, while every single send took ~20 ms.
    #[tokio::test]
    async fn open_loop_latency_counts_from_the_intended_send_time() {
        let target = slow_server(Duration::from_millis(20)).await;
        let plan = LoadPlan {
            targets: vec![target],
            sku: "s".into(),
            purchases: 40,
            users: 1,
            concurrency: 1,
            retries_max: 0,
            retry_pause: Duration::ZERO,
            seed: 1,
            rate_per_s: Some(200),
            bearer: None,
        };
        let report = run(plan).await.expect("the run");
        assert_eq!(report.count("sold_out"), 40, "{:?}", report.outcomes);
        assert!(report.latency_ms(1.0) >= 600.0, "max latency {} ms", report.latency_ms(1.0));
        assert!(report.late_sends >= 30, "late sends {}", report.late_sends);
        assert!(report.all_answered >= Duration::from_millis(800), "{:?}", report.all_answered);
        assert_eq!(report.last_sale, None);
    }
}
