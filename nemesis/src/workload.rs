//! Retrying buyers, as a shop's clients behave: each purchase attempt has its own
//! Idempotency-Key and user; an answer that decided nothing (503, 502, 504, 429, 408,
//! `in_progress`, a timeout or a lost connection) is retried with the SAME key on a RANDOM node,
//! and now and then a decided key is sent once more to another node (a double click, or a load
//! balancer retrying a POST whose answer it lost). Every request goes into the history.
//!
//! **Several SKUs.** Each new key buys one of the SKUs open at its start, drawn evenly; a SKU
//! created at run time joins when the run says so ([`SkuOpener`]).
//!
//! **Key reuse.** With `reuse_after` set (a short idempotency TTL), a decided key is now and then
//! used once more by its buyer, for the same purchase body, once `reuse_after` has passed since
//! the key's last answer: after the TTL, a new purchase by the documented meaning. The reuse is
//! retried like any key and recorded with `reuse = 1`.
//!
//! **Shared keys.** Now and then (`shared_key_chance`) a new purchase is sent under the key of
//! one of the last `SHARED_KEY_REACH` (20) purchases of another buyer, for the same SKU: a guessed
//! or leaked key. A key is its buyer's, so that is a purchase of its own, and it must take
//! nothing from the key's first buyer (the checker's `key_taken_by_another_buyer`).
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

/// How many of the latest purchases a shared key is drawn from.
const SHARED_KEY_REACH: usize = 20;

/// How often an idle buyer looks whether it may start a key (pace or stop changed).
const IDLE_TICK: Duration = Duration::from_millis(20);

#[derive(Clone, Debug)]
pub struct WorkloadPlan {
    /// The SKUs open from the start.
    pub skus: Vec<String>,
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
    /// Reuse some decided keys this long after their last answer (see the module docs); none:
    /// no reuse.
    pub reuse_after: Option<Duration>,
    /// Chance that a decided key is reused, when `reuse_after` is set.
    pub reuse_chance: f64,
    /// Chance that a new purchase is sent under another buyer's recent key (see the module docs).
    pub shared_key_chance: f64,
    /// Where every purchase answered 200 goes, for its buyer to pay (`crate::payer`).
    pub receipts: Option<tokio::sync::mpsc::UnboundedSender<crate::payer::Receipt>>,
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
    /// The SKUs new keys buy; std lock, held for a copy.
    skus: std::sync::RwLock<Vec<String>>,
    /// Keys reused so far.
    reused: AtomicU64,
    /// Reuses waiting for their time or under way; std lock, held to push or take.
    reuses: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// The latest purchases' SKUs, keys and buyers, for shared keys; std lock, held for a copy.
    recent: std::sync::Mutex<std::collections::VecDeque<Purchase>>,
}

/// What the buyers left once they ended.
#[derive(Clone, Copy, Debug)]
pub struct Finished {
    /// Keys that ended without a decision.
    pub unresolved_keys: u64,
    /// Keys used again after the idempotency TTL.
    pub reused_keys: u64,
}

/// Opens a SKU to the buyers' new keys.
#[derive(Clone)]
pub struct SkuOpener(Arc<Shared>);

impl SkuOpener {
    pub fn open(&self, sku: &str) {
        let mut skus = self.0.skus.write().unwrap_or_else(|p| p.into_inner());
        if !skus.iter().any(|s| s == sku) {
            skus.push(sku.to_string());
        }
    }
}

impl Workload {
    pub fn start(plan: WorkloadPlan, history: History, rate_per_s: u64) -> Workload {
        let buyers = plan.buyers.max(1);
        let skus = std::sync::RwLock::new(plan.skus.clone());
        let shared = Arc::new(Shared {
            plan,
            history,
            next_key: AtomicU64::new(0),
            rate_per_s: AtomicU64::new(rate_per_s),
            next_start_ms: tokio::sync::Mutex::new(0.0),
            stopping: AtomicBool::new(false),
            drain_until_ms: AtomicU64::new(u64::MAX),
            unresolved: AtomicU64::new(0),
            skus,
            reused: AtomicU64::new(0),
            reuses: std::sync::Mutex::new(Vec::new()),
            recent: std::sync::Mutex::new(std::collections::VecDeque::new()),
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

    /// A handle that opens SKUs to new keys while the buyers run.
    pub fn opener(&self) -> SkuOpener {
        SkuOpener(self.shared.clone())
    }

    /// Whether the attempt budget is spent (demand ended on its own).
    pub fn exhausted(&self) -> bool {
        self.keys() >= self.shared.plan.keys_max
    }

    /// Starts no new key; keys under way are retried until decided or until `drain` has passed,
    /// then the buyers end.
    pub async fn finish(mut self, drain: Duration) -> Finished {
        let clock = self.shared.history.clock();
        // Relaxed: both flags are polled by the buyers; ordering between them does not matter.
        self.shared.drain_until_ms.store(clock.now_ms() + drain.as_millis() as u64, Ordering::Relaxed);
        self.shared.stopping.store(true, Ordering::Relaxed);
        for buyer in std::mem::take(&mut self.buyers) {
            let _ = buyer.await;
        }
        // Buyers are done, so no reuse is added any more; each one left ends by the drain.
        let reuses = std::mem::take(&mut *self.shared.reuses.lock().unwrap_or_else(|p| p.into_inner()));
        for reuse in reuses {
            let _ = reuse.await;
        }
        // Relaxed: every writer has ended.
        Finished {
            unresolved_keys: self.shared.unresolved.load(Ordering::Relaxed),
            reused_keys: self.shared.reused.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Workload {
    /// A schedule that failed midway must not leave its buyers sending at the next one.
    fn drop(&mut self) {
        for buyer in &self.buyers {
            buyer.abort();
        }
        for reuse in self.shared.reuses.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            reuse.abort();
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

    /// Now and then, a purchase by `user` under another buyer's recent key, for its SKU.
    fn shared_key(&self, rng: &mut fastrand::Rng, user: &str) -> Option<Purchase> {
        if self.plan.shared_key_chance <= 0.0 || rng.f64() >= self.plan.shared_key_chance {
            return None;
        }
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let others: Vec<&Purchase> = recent.iter().filter(|p| p.user != user).collect();
        let theirs = others.get(rng.usize(0..others.len().max(1)))?;
        Some(Purchase { sku: theirs.sku.clone(), key: theirs.key.clone(), user: user.to_string(), reuse: 0 })
    }

    /// Keeps `purchase` among the latest, for shared keys.
    fn remember(&self, purchase: &Purchase) {
        if self.plan.shared_key_chance <= 0.0 {
            return;
        }
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() == SHARED_KEY_REACH {
            recent.pop_front();
        }
        recent.push_back(purchase.clone());
    }

    /// Whether a key started at `started` may be retried now.
    fn may_retry(&self, started: Instant) -> bool {
        // Relaxed: see `Workload::finish`.
        started.elapsed() < self.plan.key_patience && !self.drained()
    }

    /// Whether the drain deadline has passed: nothing more is sent.
    fn drained(&self) -> bool {
        // Relaxed: see `Workload::finish`.
        self.history.clock().now_ms() >= self.drain_until_ms.load(Ordering::Relaxed)
    }
}

type Connections = Vec<Option<SendRequest<Full<Bytes>>>>;

/// One use of a key: what is sent, and how often it is reused.
#[derive(Clone)]
struct Purchase {
    sku: String,
    key: String,
    user: String,
    reuse: u32,
}

/// One buyer: a keep-alive connection per node, opened on demand.
async fn buyer(shared: Arc<Shared>, at: u64) {
    let plan = &shared.plan;
    let mut rng = fastrand::Rng::with_seed(plan.seed ^ (at + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut connections: Connections = plan.nodes.iter().map(|_| None).collect();
    while let Some(number) = shared.next_key().await {
        let sku = {
            let skus = shared.skus.read().unwrap_or_else(|p| p.into_inner());
            skus.get(rng.usize(0..skus.len().max(1))).cloned().unwrap_or_default()
        };
        let user = format!("u{}", rng.u64(0..plan.users.max(1)));
        let purchase = match shared.shared_key(&mut rng, &user) {
            Some(shared_key) => shared_key,
            None => {
                let own = Purchase { sku, key: format!("k{number}"), user, reuse: 0 };
                shared.remember(&own);
                own
            }
        };
        let decided_ms = use_key(&shared, &mut rng, &mut connections, &purchase).await;
        if let (Some(after), Some(decided_ms)) = (plan.reuse_after, decided_ms) {
            if rng.f64() < plan.reuse_chance {
                let due_ms = decided_ms + after.as_millis() as u64;
                let seed = rng.u64(..);
                let reuse = Purchase { reuse: 1, ..purchase };
                let task = tokio::spawn(reuse_key(shared.clone(), reuse, due_ms, seed));
                shared.reuses.lock().unwrap_or_else(|p| p.into_inner()).push(task);
            }
        }
    }
}

/// Sends `purchase` until it is decided (then maybe once more), or patience or the drain runs
/// out. Returns when its last answer came, if it was decided.
async fn use_key(
    shared: &Shared,
    rng: &mut fastrand::Rng,
    connections: &mut Connections,
    purchase: &Purchase,
) -> Option<u64> {
    let plan = &shared.plan;
    let body = Bytes::from(format!(r#"{{"sku":"{}","user":"{}","qty":1}}"#, purchase.sku, purchase.user));
    let started = Instant::now();
    let mut attempt = 0;
    loop {
        let target = rng.usize(0..plan.nodes.len());
        let answer = send(shared, &mut connections[target], target, purchase, body.clone(), attempt).await;
        attempt += 1;
        if answer.is_decision() {
            let mut last = answer.answered_ms;
            if rng.f64() < plan.repeat_chance {
                let again = rng.usize(0..plan.nodes.len());
                last = send(shared, &mut connections[again], again, purchase, body.clone(), attempt).await.answered_ms;
            }
            return Some(last);
        }
        if !shared.may_retry(started) {
            // Relaxed: a count read after every buyer ended.
            shared.unresolved.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let pause = RETRY_PAUSE + Duration::from_millis(rng.u64(0..=RETRY_PAUSE.as_millis() as u64));
        tokio::time::sleep(pause).await;
    }
}

/// Waits until `due_ms`, then uses the key again, unless the drain ended first.
async fn reuse_key(shared: Arc<Shared>, purchase: Purchase, due_ms: u64, seed: u64) {
    let clock = shared.history.clock();
    while clock.now_ms() < due_ms {
        if shared.drained() {
            return;
        }
        tokio::time::sleep(IDLE_TICK * 10).await;
    }
    if shared.drained() {
        return;
    }
    // Relaxed: a count for reports.
    shared.reused.fetch_add(1, Ordering::Relaxed);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut connections: Connections = shared.plan.nodes.iter().map(|_| None).collect();
    use_key(&shared, &mut rng, &mut connections, &purchase).await;
}

/// Sends one purchase to node `target` and records it.
async fn send(
    shared: &Shared,
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    target: usize,
    purchase: &Purchase,
    body: Bytes,
    attempt: u32,
) -> Request {
    let (key, user) = (purchase.key.as_str(), purchase.user.as_str());
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
        sku: purchase.sku.clone(),
        key: key.to_string(),
        reuse: purchase.reuse,
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
    if let (Some(receipts), Some(order_id)) =
        (&plan.receipts, request.order_id.as_ref().filter(|_| request.is_purchase()))
    {
        // The payer gone (it stops after the buyers) leaves nobody to pay: nothing to do.
        let receipt =
            crate::payer::Receipt { order_id: order_id.clone(), user: user.to_string(), sku: request.sku.clone() };
        let _ = receipts.send(receipt);
    }
    request
}

type Answer = (Option<u16>, String, Option<String>, bool);

async fn send_on(
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    request: HttpRequest<Full<Bytes>>,
) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
    let sender = slot.as_mut().ok_or_else(|| anyhow::anyhow!("no connection"))?;
    sender.ready().await?;
    Ok(sender.send_request(request).await?)
}

/// The server closed the connection before it answered anything: on a kept-alive connection,
/// the request may never have been read.
fn is_stale_connection(error: &anyhow::Error) -> bool {
    error.downcast_ref::<hyper::Error>().is_some_and(|e| e.is_canceled() || e.is_closed() || e.is_incomplete_message())
}

async fn exchange(
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    addr: SocketAddr,
    key: &str,
    credential: Option<&str>,
    body: Bytes,
) -> anyhow::Result<Answer> {
    let reused = slot.as_ref().is_some_and(|sender| !sender.is_closed());
    if !reused {
        *slot = Some(testkit::load::connect(addr).await?);
    }
    let request = || -> anyhow::Result<HttpRequest<Full<Bytes>>> {
        let mut request = HttpRequest::post("/v1/purchase").body(Full::new(body.clone()))?;
        let headers = request.headers_mut();
        headers.insert(HOST, HeaderValue::from_str(&addr.to_string())?);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert("idempotency-key", HeaderValue::from_str(key)?);
        if let Some(credential) = credential {
            headers.insert(hyper::header::AUTHORIZATION, HeaderValue::from_str(credential)?);
        }
        Ok(request)
    };
    let response = match send_on(slot, request()?).await {
        // A kept-alive connection the server closed as the request went out (nginx's old
        // workers close theirs on a reload): as browsers and HTTP libraries do, the request is
        // sent again once on a new connection, before anything is recorded.
        Err(e) if reused && is_stale_connection(&e) => {
            *slot = Some(testkit::load::connect(addr).await?);
            send_on(slot, request()?).await?
        }
        sent => sent?,
    };
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
