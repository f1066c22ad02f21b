//! The crowd: each waiter's join, its place on the event stream, and its purchase with the
//! ticket, timed from the intended send (see the parent module's docs).

use super::*;

pub(super) struct CrowdSpec {
    pub(super) targets: Vec<SocketAddr>,
    pub(super) sku: String,
    pub(super) rate: f64,
    pub(super) waiters: u64,
    pub(super) concurrency: usize,
    pub(super) run: u64,
    /// From the first intended join: waiters still at work then are cut off.
    pub(super) deadline: Duration,
}

/// What one waiter did, in ms from the first intended join.
#[derive(Debug, Default)]
pub(super) struct WaiterRecord {
    pub(super) user: String,
    pub(super) key: String,
    /// Its first join put it in line.
    pub(super) queued: bool,
    pub(super) admitted_ms: Option<f64>,
    pub(super) sold_out_heard_ms: Option<f64>,
    /// The purchase's last answer, and when a `purchased` one came.
    pub(super) purchase: Option<String>,
    pub(super) purchased_ms: Option<f64>,
    /// Order ids the purchase's answers carried.
    pub(super) orders: Vec<String>,
    pub(super) purchase_latency_us: Vec<u64>,
    pub(super) stream_open_us: Vec<u64>,
    pub(super) reconnects: u32,
    pub(super) rejoins: u32,
    pub(super) cut_off: bool,
}

/// What the crowd heard.
pub(super) struct Heard {
    pub(super) records: Vec<WaiterRecord>,
    pub(super) join_latency_us: Vec<u64>,
    pub(super) join_outcomes: BTreeMap<String, u64>,
    pub(super) joins_answered: u64,
    /// From the first intended join until the last join's answer.
    pub(super) joins_done_s: f64,
    pub(super) late_joins: u64,
    pub(super) started_unix_ms: f64,
    /// The last fresh `purchased` answer, if the ledger's clock is unknown.
    pub(super) last_purchase_ms: Option<f64>,
}

pub(super) struct Crowd {
    pub(super) spec: CrowdSpec,
    pub(super) hosts: Vec<HeaderValue>,
    /// Per node: idle keep-alive connections for purchases.
    pub(super) purchase_pool: Vec<std::sync::Mutex<Vec<SendRequest<Full<Bytes>>>>>,
    pub(super) started: Instant,
    pub(super) stop: Shutdown,
    pub(super) records: mpsc::UnboundedSender<WaiterRecord>,
    pub(super) spawned: AtomicU64,
}

impl Crowd {
    pub(super) fn since_start_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1e3
    }

    /// An idle pooled connection to `node`, if one is open.
    pub(super) fn take_connection(&self, node: usize) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.purchase_pool[node].lock().unwrap_or_else(|p| p.into_inner());
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    pub(super) fn give_connection(&self, node: usize, sender: SendRequest<Full<Bytes>>) {
        self.purchase_pool[node].lock().unwrap_or_else(|p| p.into_inner()).push(sender);
    }
}

/// What the join pool's workers report.
#[derive(Default)]
pub(super) struct JoinerReport {
    pub(super) latency_us: Vec<u64>,
    pub(super) outcomes: BTreeMap<String, u64>,
    pub(super) answered: u64,
    pub(super) late: u64,
    pub(super) last_answer: Duration,
}

/// Runs the crowd to the end: every waiter bought, heard `sold_out`, or was cut off.
#[expect(
    clippy::too_many_lines,
    reason = "the crowd's loop and its bookkeeping in one place, so each waiter's path reads top to bottom; lab code"
)]
pub(super) async fn run_crowd(
    spec: CrowdSpec,
    ledger: Arc<dyn ledger::Ledger>,
    sku: ledger::SkuId,
) -> anyhow::Result<Heard> {
    anyhow::ensure!(!spec.targets.is_empty(), "no nodes");
    let hosts: Vec<HeaderValue> =
        spec.targets.iter().map(|addr| HeaderValue::from_str(&addr.to_string())).collect::<Result<_, _>>()?;
    // The pool is open before the clock starts: a load balancer's connections to its nodes are.
    let mut pools = Vec::with_capacity(spec.concurrency);
    for _ in 0..spec.concurrency {
        let mut pool = Vec::with_capacity(spec.targets.len());
        for addr in &spec.targets {
            pool.push(Some(testkit::load::connect(*addr).await.context("opening the join pool")?));
        }
        pools.push(pool);
    }
    let mut purchase_pool = Vec::with_capacity(spec.targets.len());
    for addr in &spec.targets {
        let mut idle = Vec::with_capacity(PURCHASE_POOL_PER_NODE);
        for _ in 0..PURCHASE_POOL_PER_NODE {
            idle.push(testkit::load::connect(*addr).await.context("opening the purchases' pool")?);
        }
        purchase_pool.push(std::sync::Mutex::new(idle));
    }
    let (records, mut received) = mpsc::unbounded_channel();
    let started = Instant::now() + Duration::from_millis(20);
    let started_unix_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0) + 20.0;
    let deadline = started + spec.deadline;
    let waiters = spec.waiters;
    let crowd = Arc::new(Crowd {
        spec,
        hosts,
        purchase_pool,
        started,
        stop: Shutdown::new(),
        records,
        spawned: AtomicU64::new(0),
    });
    let next = Arc::new(AtomicU64::new(0));
    let bar = testkit::progress::counter(waiters, "waiters joining");
    let following = testkit::progress::follow(&bar, next.clone());
    let joiners: Vec<_> =
        pools.into_iter().map(|pool| tokio::spawn(joiner(crowd.clone(), pool, next.clone()))).collect();
    let mut joins = JoinerReport::default();
    for joiner in joiners {
        let report = joiner.await?;
        joins.latency_us.extend(report.latency_us);
        for (outcome, n) in report.outcomes {
            *joins.outcomes.entry(outcome).or_insert(0) += n;
        }
        joins.answered += report.answered;
        joins.late += report.late;
        joins.last_answer = joins.last_answer.max(report.last_answer);
    }
    drop(following);
    bar.finish_and_clear();

    // Every waiter's record, until the deadline, or 10 s after the ledger shows nothing left.
    let spawned = crowd.spawned.load(Ordering::Relaxed);
    let mut all = Vec::with_capacity(spawned as usize);
    let mut cut_off_at = deadline;
    let mut sold_out_seen = false;
    let mut next_look = Instant::now();
    while (all.len() as u64) < spawned && Instant::now() < cut_off_at {
        if !sold_out_seen && Instant::now() >= next_look {
            next_look = Instant::now() + Duration::from_millis(100);
            if ledger.status(&sku).await.is_ok_and(|s| s.remaining == 0) {
                sold_out_seen = true;
                cut_off_at = cut_off_at.min(Instant::now() + UNTOLD_AFTER_SOLD_OUT);
            }
        }
        if let Ok(Some(record)) = tokio::time::timeout(Duration::from_millis(50), received.recv()).await {
            all.push(record);
        }
    }
    crowd.stop.trigger();
    while (all.len() as u64) < spawned {
        match tokio::time::timeout(Duration::from_secs(5), received.recv()).await {
            Ok(Some(record)) => all.push(record),
            _ => break,
        }
    }
    let last_purchase_ms = all.iter().filter_map(|r| r.purchased_ms).reduce(f64::max);
    Ok(Heard {
        records: all,
        join_latency_us: joins.latency_us,
        join_outcomes: joins.outcomes,
        joins_answered: joins.answered,
        joins_done_s: joins.last_answer.as_secs_f64(),
        late_joins: joins.late,
        started_unix_ms,
        last_purchase_ms,
    })
}

/// One worker of the join pool: takes the next arrival, sends its join when due, and hands the
/// waiter its own task.
pub(super) async fn joiner(
    crowd: Arc<Crowd>,
    mut pool: Vec<Option<SendRequest<Full<Bytes>>>>,
    next: Arc<AtomicU64>,
) -> JoinerReport {
    let mut report = JoinerReport::default();
    let spec = &crowd.spec;
    loop {
        // Relaxed: hands out distinct arrival numbers, nothing else.
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= spec.waiters {
            return report;
        }
        let due = crowd.started + Duration::from_secs_f64(n as f64 / spec.rate);
        tokio::time::sleep_until(due.into()).await;
        if Instant::now().saturating_duration_since(due) > testkit::load::LATE_SEND {
            report.late += 1;
        }
        let user = format!("w{n}");
        let mut node = n as usize % spec.targets.len();
        for attempt in 0..=RETRIES_MAX {
            let sent = if attempt == 0 { due } else { Instant::now() };
            let answer = join(&crowd, &mut pool[node], node, &user).await;
            report.latency_us.push(sent.elapsed().as_micros().max(1) as u64);
            let outcome = match &answer {
                Ok((status, _)) if *status == StatusCode::OK => "ok".to_string(),
                Ok((status, body)) => error_code(*status, body),
                Err(_) => {
                    pool[node] = None;
                    "connection_error".to_string()
                }
            };
            *report.outcomes.entry(outcome).or_insert(0) += 1;
            match answer {
                Ok((status, body)) if status == StatusCode::OK => {
                    report.answered += 1;
                    report.last_answer = report.last_answer.max(crowd.started.elapsed());
                    let place: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    crowd.spawned.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(waiter(crowd.clone(), user.clone(), node, place));
                    break;
                }
                Ok((status, _)) if !undecided(status) => break,
                _ => {}
            }
            node = (node + 1) % spec.targets.len();
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// 503 decided nothing; 502 and 504 (a proxy's) may not have: a retry is safe either way.
pub(super) fn undecided(status: StatusCode) -> bool {
    matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT)
}

/// The `error` of an error body, or the status when there is none.
pub(super) fn error_code(status: StatusCode, body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| status.as_u16().to_string())
}

/// `POST /v1/room/{sku}/join` for `user` on `slot` (reopened if closed).
pub(super) async fn join(
    crowd: &Crowd,
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    node: usize,
    user: &str,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let body = Bytes::from(format!(r#"{{"user":"{user}"}}"#));
    let request = Request::post(format!("/v1/room/{}/join", crowd.spec.sku))
        .header(HOST, crowd.hosts[node].clone())
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))?;
    exchange(slot, crowd.spec.targets[node], request).await
}

/// Sends `request` on `slot`, opening a connection to `addr` first if it has none.
pub(super) async fn exchange(
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    addr: SocketAddr,
    request: Request<Full<Bytes>>,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let call = async {
        if slot.as_ref().is_none_or(|sender| sender.is_closed()) {
            *slot = Some(testkit::load::connect(addr).await?);
        }
        let sender = slot.as_mut().context("no connection")?;
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    match tokio::time::timeout(CALL_MAX, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => {
            *slot = None;
            Err(e)
        }
        Err(_) => {
            *slot = None;
            anyhow::bail!("no answer within {CALL_MAX:?}")
        }
    }
}

/// One waiter's life after its join; its record goes to the crowd however it ends.
pub(super) async fn waiter(crowd: Arc<Crowd>, user: String, node: usize, place: serde_json::Value) {
    let mut record = WaiterRecord {
        user: user.clone(),
        key: format!("room-{}-{user}", crowd.spec.run),
        queued: matches!(place["state"].as_str(), Some("waiting" | "pre_queue")),
        ..WaiterRecord::default()
    };
    tokio::select! {
        () = live(&crowd, &mut record, &user, node, place) => {}
        () = crowd.stop.wait() => record.cut_off = true,
    }
    let _ = crowd.records.send(record);
}

pub(super) async fn live(
    crowd: &Crowd,
    record: &mut WaiterRecord,
    user: &str,
    node: usize,
    mut place: serde_json::Value,
) {
    loop {
        match place["state"].as_str() {
            Some("admitted") => {
                record.admitted_ms = Some(crowd.since_start_ms());
                let ticket = place["ticket"].as_str().unwrap_or_default().to_string();
                buy(crowd, record, user, node, &ticket).await;
                return;
            }
            Some("waiting" | "pre_queue") => {
                let handle = place["waiter"].as_str().unwrap_or_default().to_string();
                place = listen(crowd, record, node, &handle).await;
            }
            Some("left") => {
                record.rejoins += 1;
                let mut slot = None;
                place = loop {
                    match join(crowd, &mut slot, node, user).await {
                        Ok((status, body)) if status == StatusCode::OK => {
                            break serde_json::from_slice(&body).unwrap_or_default()
                        }
                        _ => tokio::time::sleep(STREAM_RETRY).await,
                    }
                };
            }
            // sold_out, ended, or something unknown: nothing more to wait for.
            _ => {
                record.sold_out_heard_ms = Some(crowd.since_start_ms());
                return;
            }
        }
    }
}

/// Listens on `node`'s event stream for `handle` until the place is one to act on (admitted,
/// sold out, ended, left); reconnects as a browser's EventSource does when the stream breaks.
pub(super) async fn listen(crowd: &Crowd, record: &mut WaiterRecord, node: usize, handle: &str) -> serde_json::Value {
    let addr = crowd.spec.targets[node];
    let mut first = true;
    loop {
        if !first {
            record.reconnects += 1;
            tokio::time::sleep(STREAM_RETRY).await;
        }
        first = false;
        let opened = Instant::now();
        let Ok(mut sender) = testkit::load::connect(addr).await else { continue };
        let Ok(request) = Request::get(format!("/v1/room/{}/events?waiter={handle}", crowd.spec.sku))
            .header(HOST, crowd.hosts[node].clone())
            .body(Full::new(Bytes::new()))
        else {
            return serde_json::json!({"state": "left"});
        };
        let Ok(response) = sender.send_request(request).await else { continue };
        match response.status() {
            StatusCode::OK => {}
            // A handle the node does not take: join again.
            StatusCode::FORBIDDEN => return serde_json::json!({"state": "left"}),
            _ => continue,
        }
        record.stream_open_us.push(opened.elapsed().as_micros().max(1) as u64);
        let mut body = response.into_body();
        let mut text = String::new();
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else { continue };
            text.push_str(&String::from_utf8_lossy(&data));
            while let Some(end) = text.find("\n\n") {
                let event: String = text.drain(..end + 2).collect();
                let Some(data) = event.lines().find_map(|line| line.strip_prefix("data: ")) else { continue };
                // Most events only move the place; the state decides whether to parse the rest.
                if ["\"state\":\"waiting\"", "\"state\":\"pre_queue\""].iter().any(|s| data.contains(s)) {
                    continue;
                }
                if let Ok(place) = serde_json::from_str::<serde_json::Value>(data) {
                    return place;
                }
            }
        }
    }
}

/// Buys once with `ticket`: one key, retried with it on the next node while nothing is decided.
pub(super) async fn buy(crowd: &Crowd, record: &mut WaiterRecord, user: &str, node: usize, ticket: &str) {
    let spec = &crowd.spec;
    let body = Bytes::from(format!(r#"{{"sku":"{}","user":"{user}","qty":1}}"#, spec.sku));
    let mut node = node;
    let heard = Instant::now();
    for attempt in 0..=RETRIES_MAX {
        let sent = if attempt == 0 { heard } else { Instant::now() };
        let request = Request::post("/v1/purchase")
            .header(HOST, crowd.hosts[node].clone())
            .header(CONTENT_TYPE, "application/json")
            .header("idempotency-key", record.key.as_str())
            .header(node::TICKET_HEADER, ticket)
            .body(Full::new(body.clone()));
        let Ok(request) = request else {
            record.purchase = Some("bad_request".into());
            return;
        };
        let mut slot = crowd.take_connection(node);
        let answer = exchange(&mut slot, spec.targets[node], request).await;
        record.purchase_latency_us.push(sent.elapsed().as_micros().max(1) as u64);
        if let Some(sender) = slot {
            crowd.give_connection(node, sender);
        }
        let retry = match answer {
            Ok((status, body)) if status == StatusCode::OK => {
                let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if let Some(order) = parsed["order_id"].as_str() {
                    record.orders.push(order.to_string());
                }
                record.purchase = Some("purchased".into());
                record.purchased_ms = Some(crowd.since_start_ms());
                false
            }
            Ok((status, body)) => {
                record.purchase = Some(error_code(status, &body));
                undecided(status)
            }
            Err(_) => {
                record.purchase = Some("connection_error".into());
                true
            }
        };
        if !retry {
            return;
        }
        node = (node + 1) % spec.targets.len();
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}
