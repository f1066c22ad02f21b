//! Retrying buyers, as a shop's clients behave: each purchase attempt has its own
//! Idempotency-Key and user; an answer that decided nothing (503, 502, 504, 429, 408,
//! `in_progress`, a timeout or a lost connection) is retried with the SAME key on a RANDOM node,
//! and now and then a decided key is sent once more to another node (a double click, or a load
//! balancer retrying a POST whose answer it lost). Every request goes into the history.
//!
//! **Bounds.** At most `keys_max` attempts, paced at a rate the run can change (the fault
//! phase's demand, then the rush after the heal); each request under `request_timeout`; each key
//! retried for at most `key_patience`, and not past the drain deadline once new keys stop.
//! Loopback only: the targets are the fleet's nodes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::Request as HttpRequest;
use tokio::task::JoinHandle;

use crate::history::{History, Request};

/// Pause before a retry, plus up to as much again at random, so retries of many buyers spread.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// How often an idle buyer looks whether it may start a key (pace or stop changed).
const IDLE_TICK: Duration = Duration::from_millis(20);

#[derive(Clone, Debug)]
pub struct WorkloadPlan {
    pub sku: String,
    /// Name and address of every node.
    pub nodes: Vec<(String, SocketAddr)>,
    /// Users `u0`… the attempts are spread over.
    pub users: u64,
    /// Buyers sending at once.
    pub buyers: usize,
    pub keys_max: u64,
    pub request_timeout: Duration,
    pub key_patience: Duration,
    /// Chance that a decided key is sent once more, to a random node.
    pub repeat_chance: f64,
    pub seed: u64,
    /// Signs the buyers' tokens when the fleet verifies buyers: each attempt of a key presents
    /// a token of its own (a fresh `jti`), so the per-user limit is tested against one buyer
    /// holding many valid tokens.
    pub bearer: Option<Arc<auth::mint::Minter>>,
}

/// Buyers at work; see the module docs.
pub struct Workload {
    shared: Arc<Shared>,
    buyers: Vec<JoinHandle<()>>,
}

struct Shared {
    plan: WorkloadPlan,
    history: History,
    /// Attempts started so far.
    next_key: AtomicU64,
    /// Attempts per second; 0 pauses new attempts.
    rate_per_s: AtomicU64,
    /// When the next attempt may start, in ms on the history's clock (pacing across buyers).
    next_start_ms: tokio::sync::Mutex<f64>,
    /// No new keys from now on.
    stopping: AtomicBool,
    /// Ms on the history's clock after which no key is retried (set when stopping).
    drain_until_ms: AtomicU64,
    /// Keys that ended without a decision.
    unresolved: AtomicU64,
}

impl Workload {
    pub fn start(plan: WorkloadPlan, history: History, rate_per_s: u64) -> Workload {
        let buyers = plan.buyers.max(1);
        let shared = Arc::new(Shared {
            plan,
            history,
            next_key: AtomicU64::new(0),
            rate_per_s: AtomicU64::new(rate_per_s),
            next_start_ms: tokio::sync::Mutex::new(0.0),
            stopping: AtomicBool::new(false),
            drain_until_ms: AtomicU64::new(u64::MAX),
            unresolved: AtomicU64::new(0),
        });
        let buyers = (0..buyers).map(|at| tokio::spawn(buyer(shared.clone(), at as u64))).collect();
        Workload { shared, buyers }
    }

    /// Changes the pace of new attempts.
    pub fn set_rate(&self, rate_per_s: u64) {
        // Relaxed: a pace read on each start; a late read starts one attempt at the old pace.
        self.shared.rate_per_s.store(rate_per_s, Ordering::Relaxed);
    }

    /// Attempts started so far.
    pub fn keys(&self) -> u64 {
        // Relaxed: a count for reports.
        self.shared.next_key.load(Ordering::Relaxed).min(self.shared.plan.keys_max)
    }

    /// Whether the attempt budget is spent (demand ended on its own).
    pub fn exhausted(&self) -> bool {
        self.keys() >= self.shared.plan.keys_max
    }

    /// Starts no new key; keys under way are retried until decided or until `drain` has passed,
    /// then the buyers end. Returns the keys left without a decision.
    pub async fn finish(mut self, drain: Duration) -> u64 {
        let clock = self.shared.history.clock();
        // Relaxed: both flags are polled by the buyers; ordering between them does not matter.
        self.shared.drain_until_ms.store(clock.now_ms() + drain.as_millis() as u64, Ordering::Relaxed);
        self.shared.stopping.store(true, Ordering::Relaxed);
        for buyer in std::mem::take(&mut self.buyers) {
            let _ = buyer.await;
        }
        self.shared.unresolved.load(Ordering::Relaxed)
    }
}

impl Drop for Workload {
    /// A schedule that failed midway must not leave its buyers sending at the next one.
    fn drop(&mut self) {
        for buyer in &self.buyers {
            buyer.abort();
        }
    }
}

impl Shared {
    fn stopping(&self) -> bool {
        // Relaxed: see `Workload::finish`.
        self.stopping.load(Ordering::Relaxed)
    }

    /// Waits for this buyer's turn to start a key: `None` once new keys stop.
    async fn next_key(&self) -> Option<u64> {
        let clock = self.history.clock();
        loop {
            if self.stopping() {
                return None;
            }
            // Relaxed: see `Workload::set_rate`.
            let rate = self.rate_per_s.load(Ordering::Relaxed);
            if rate == 0 {
                tokio::time::sleep(IDLE_TICK).await;
                continue;
            }
            let start_ms = {
                let mut next = self.next_start_ms.lock().await;
                let now = clock.now_ms() as f64;
                let start = next.max(now);
                *next = start + 1_000.0 / rate as f64;
                start
            };
            // Sleep in short steps, so a stop is heard while waiting for a far slot.
            while clock.now_ms() < start_ms as u64 {
                let wait = Duration::from_millis((start_ms as u64).saturating_sub(clock.now_ms()));
                tokio::time::sleep(wait.min(IDLE_TICK * 10)).await;
                if self.stopping() {
                    return None;
                }
            }
            // Relaxed: the counter only hands out distinct key numbers.
            let number = self.next_key.fetch_add(1, Ordering::Relaxed);
            return (number < self.plan.keys_max).then_some(number);
        }
    }

    /// Whether a key started at `started` may be retried now.
    fn may_retry(&self, started: Instant) -> bool {
        let clock = self.history.clock();
        // Relaxed: see `Workload::finish`.
        started.elapsed() < self.plan.key_patience && clock.now_ms() < self.drain_until_ms.load(Ordering::Relaxed)
    }
}

/// One buyer: a keep-alive connection per node, opened on demand.
async fn buyer(shared: Arc<Shared>, at: u64) {
    let plan = &shared.plan;
    let mut rng = fastrand::Rng::with_seed(plan.seed ^ (at + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut connections: Vec<Option<SendRequest<Full<Bytes>>>> = plan.nodes.iter().map(|_| None).collect();
    while let Some(number) = shared.next_key().await {
        let key = format!("k{number}");
        let user = format!("u{}", rng.u64(0..plan.users.max(1)));
        let body = Bytes::from(format!(r#"{{"sku":"{}","user":"{user}","qty":1}}"#, plan.sku));
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            let target = rng.usize(0..plan.nodes.len());
            let answer = send(&shared, &mut connections[target], target, &key, &user, body.clone(), attempt).await;
            attempt += 1;
            if answer.is_decision() {
                if rng.f64() < plan.repeat_chance {
                    let again = rng.usize(0..plan.nodes.len());
                    send(&shared, &mut connections[again], again, &key, &user, body.clone(), attempt).await;
                }
                break;
            }
            if !shared.may_retry(started) {
                // Relaxed: a count read after every buyer ended.
                shared.unresolved.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let pause = RETRY_PAUSE + Duration::from_millis(rng.u64(0..=RETRY_PAUSE.as_millis() as u64));
            tokio::time::sleep(pause).await;
        }
    }
}

/// Sends one purchase to node `target` and records it.
async fn send(
    shared: &Shared,
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    target: usize,
    key: &str,
    user: &str,
    body: Bytes,
    attempt: u32,
) -> Request {
    let plan = &shared.plan;
    let (node, addr) = &plan.nodes[target];
    let clock = shared.history.clock();
    let sent_ms = clock.now_ms();
    let credential = plan.bearer.as_ref().map(|minter| format!("Bearer {}", minter.token(user, auth::unix_now_s())));
    let exchanged = exchange(slot, *addr, key, credential.as_deref(), body);
    let answer = tokio::time::timeout(plan.request_timeout, exchanged).await;
    let (status, outcome, order_id, replayed) = match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => {
            *slot = None;
            (None, "connection_error".to_string(), None, false)
        }
        Err(_) => {
            // The request may still be decided; the connection is not reused for another.
            *slot = None;
            (None, "timeout".to_string(), None, false)
        }
    };
    let request = Request {
        key: key.to_string(),
        user: user.to_string(),
        node: node.clone(),
        attempt,
        status,
        outcome,
        order_id,
        replayed,
        sent_ms,
        answered_ms: clock.now_ms(),
    };
    shared.history.record(request.clone());
    request
}

type Answer = (Option<u16>, String, Option<String>, bool);

async fn exchange(
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    addr: SocketAddr,
    key: &str,
    credential: Option<&str>,
    body: Bytes,
) -> anyhow::Result<Answer> {
    if slot.as_ref().is_none_or(|sender| sender.is_closed()) {
        *slot = Some(testkit::load::connect(addr).await?);
    }
    let sender = slot.as_mut().ok_or_else(|| anyhow::anyhow!("no connection"))?;
    sender.ready().await?;
    let mut request = HttpRequest::post("/v1/purchase").body(Full::new(body))?;
    let headers = request.headers_mut();
    headers.insert(HOST, HeaderValue::from_str(&addr.to_string())?);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert("idempotency-key", HeaderValue::from_str(key)?);
    if let Some(credential) = credential {
        headers.insert(hyper::header::AUTHORIZATION, HeaderValue::from_str(credential)?);
    }
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    let body = response.into_body().collect().await?.to_bytes();
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let outcome = match status {
        200 => parsed["result"].as_str().unwrap_or("ok").to_string(),
        502 => "bad_gateway".to_string(),
        504 => "gateway_timeout".to_string(),
        _ => parsed["error"].as_str().unwrap_or("other").to_string(),
    };
    let order_id = parsed["order_id"].as_str().map(str::to_string);
    Ok((Some(status), outcome, order_id, replayed))
}
