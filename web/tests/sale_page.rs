//! The sale page and the operator's page in a real chromium (testkit's browser), against a
//! scripted stand-in for the routes they call: the room, its event stream, the purchase, the
//! order, the payment and the stock page, and the coordinator's `/admin/cluster`.
//!
//! These tests hold the pages to their side of the contract (what they send, when, and what
//! they show for each answer) without a cluster: the stand-in's clock runs an hour ahead of
//! the browser's, its answers and pushes are the test's to choose, and it records every
//! request. The whole sale, on real servers, is the cluster's test.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_TYPE, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use testkit::browser::Browser;
use tokio::sync::mpsc;

type Body = BoxBody<Bytes, Infallible>;

/// The stand-in's clock runs this far ahead of the browser's: a page that ignored
/// `server_ms` would count down an hour too long.
const SKEW_MS: u64 = 3_600_000;
/// The start as first announced: far enough for any browser to load before it. Once both
/// pages are ready, the test moves the start to [`START_SOON_MS`] from then and pushes it.
const START_IN_MS: u64 = 120_000;
const START_SOON_MS: u64 = 2_500;
const ADMIN_TOKEN: &str = "admin-token-for-the-page-test";
const WAIT: Duration = Duration::from_secs(10);

/// One purchase request as the stand-in received it.
#[derive(Debug, Clone)]
struct Purchase {
    key: String,
    ticket: String,
    body: Value,
}

/// The stand-in's state, behind a std mutex that no `.await` is held across.
struct Fake {
    starts_at_ms: u64,
    total: u64,
    sold: u64,
    /// Open event streams per waiter.
    streams: HashMap<String, Vec<mpsc::Sender<Bytes>>>,
    /// The last status pushed per waiter, sent first to a stream that (re)connects.
    last: HashMap<String, Value>,
    joins: Vec<Value>,
    purchases: Vec<Purchase>,
    /// Purchases still to answer 503 before one succeeds.
    busy_purchases: u32,
    /// Then purchases still to answer 409 `sold_out`.
    sold_out_purchases: u32,
    /// A join after the start is admitted at once (an empty line), with this ticket.
    join_ticket: Option<String>,
    order: Option<Value>,
    /// When the provider's notification lands and the order turns paid.
    paid_at_ms: Option<u64>,
    pay_starts: u32,
    provider_pays: Vec<Value>,
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis() as u64
}

fn server_ms() -> u64 {
    wall_ms() + SKEW_MS
}

fn status(state: &str, user: &str, extra: Value) -> Value {
    let mut status = json!({
        "sku": "phone", "state": state, "waiter": format!("w-{user}"), "position": null, "ahead": null,
        "wait_s": null, "ticket": null, "ticket_expires_at_ms": null, "starts_at_ms": null,
        "server_ms": server_ms(), "remaining": 10,
    });
    for (key, value) in extra.as_object().expect("an object") {
        status[key] = value.clone();
    }
    status
}

impl Fake {
    fn new() -> Self {
        Fake {
            starts_at_ms: server_ms() + START_IN_MS,
            total: 10,
            sold: 0,
            streams: HashMap::new(),
            last: HashMap::new(),
            joins: Vec::new(),
            purchases: Vec::new(),
            busy_purchases: 1,
            sold_out_purchases: 0,
            join_ticket: None,
            order: None,
            paid_at_ms: None,
            pay_starts: 0,
            provider_pays: Vec::new(),
        }
    }

    /// Pushes a status to every open stream of `user`'s waiter.
    fn push(&mut self, user: &str, status: Value) {
        let waiter = format!("w-{user}");
        let event = Bytes::from(format!("event: status\ndata: {status}\n\n"));
        self.last.insert(waiter.clone(), status);
        let streams = self.streams.entry(waiter).or_default();
        streams.retain(|stream| stream.try_send(event.clone()).is_ok());
    }

    fn streams_open(&self, user: &str) -> usize {
        self.streams.get(&format!("w-{user}")).map_or(0, Vec::len)
    }

    fn order_now(&mut self) -> Option<Value> {
        let paid = self.paid_at_ms.is_some_and(|at| wall_ms() >= at);
        let order = self.order.as_mut()?;
        if paid && order["state"] == "pending_payment" {
            order["state"] = json!("paid");
            order["paid_at_ms"] = json!(server_ms());
        }
        Some(order.clone())
    }
}

type Shared = Arc<Mutex<Fake>>;

fn lock(fake: &Shared) -> std::sync::MutexGuard<'_, Fake> {
    fake.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn answer(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, content_type.parse().expect("a header value"));
    response
}

fn json_answer(status: StatusCode, body: &Value) -> Response<Body> {
    answer(status, "application/json", body.to_string())
}

/// An event stream: what the test pushes, as it pushes it.
struct Events(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Events {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

async fn handle(fake: Shared, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let method = request.method().clone();
    let headers = request.headers().clone();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut response = match (method.as_str(), path.as_str()) {
        ("GET", "/sale/phone") => page(web::sale_page()),
        ("GET", "/ops") => page(web::ops_page()),
        ("GET", _) if path.starts_with("/web/") => match web::asset(&path["/web/".len()..]) {
            Some(asset) => page(asset),
            None => answer(StatusCode::NOT_FOUND, "text/plain", "no such file"),
        },
        ("GET", "/v1/room/phone") => room(&fake),
        ("POST", "/v1/room/phone/join") => join(&fake, body),
        ("GET", "/v1/room/phone/events") => events(&fake, &query),
        ("POST", "/v1/purchase") => {
            purchase(&fake, Purchase { key: header("idempotency-key"), ticket: header("ticket"), body })
        }
        ("GET", "/v1/skus/phone") => stock(&fake),
        ("GET", "/v1/orders/1001") => match lock(&fake).order_now() {
            Some(order) => json_answer(StatusCode::OK, &order),
            None => json_answer(StatusCode::NOT_FOUND, &json!({ "error": "unknown_order" })),
        },
        ("POST", "/v1/orders/1001/pay") => start_payment(&fake),
        ("POST", "/v1/payments/pay_1/pay") => provider_pay(&fake, body),
        ("GET", "/admin/cluster") => cluster(&fake, &header("authorization")),
        _ => json_answer(StatusCode::NOT_FOUND, &json!({ "error": "not_found", "path": path })),
    };
    response.headers_mut().insert("content-security-policy", web::CONTENT_SECURITY_POLICY.parse().expect("a value"));
    response
}

fn page(asset: web::Asset) -> Response<Body> {
    answer(StatusCode::OK, asset.content_type, Bytes::from_static(asset.body))
}

fn room(fake: &Shared) -> Response<Body> {
    let fake = lock(fake);
    let remaining = fake.total - fake.sold;
    json_answer(
        StatusCode::OK,
        &json!({
            "sku": "phone", "starts_at_ms": fake.starts_at_ms, "server_ms": server_ms(),
            "state": if remaining == 0 { "sold_out" } else { "open" }, "remaining": remaining,
            "line": fake.joins.len(), "admit_rate": 50.0,
        }),
    )
}

fn join(fake: &Shared, body: Value) -> Response<Body> {
    let mut fake = lock(fake);
    let user = body["user"].as_str().unwrap_or("signed-in").to_string();
    fake.joins.push(body);
    let started = server_ms() >= fake.starts_at_ms;
    let mut extra = json!({ "starts_at_ms": fake.starts_at_ms, "position": fake.joins.len() });
    let state = match &fake.join_ticket {
        Some(ticket) if started => {
            extra = json!({ "starts_at_ms": fake.starts_at_ms, "ticket": ticket });
            "admitted"
        }
        _ if started => "waiting",
        _ => "pre_queue",
    };
    let status = status(state, &user, extra);
    fake.last.insert(format!("w-{user}"), status.clone());
    json_answer(StatusCode::OK, &status)
}

fn events(fake: &Shared, query: &str) -> Response<Body> {
    let waiter = query.strip_prefix("waiter=").unwrap_or_default().to_string();
    let (tx, rx) = mpsc::channel(64);
    let mut fake = lock(fake);
    if let Some(last) = fake.last.get(&waiter) {
        let _ = tx.try_send(Bytes::from(format!("event: status\ndata: {last}\n\n")));
    }
    let _ = tx.try_send(Bytes::from_static(b": connected\n\n"));
    fake.streams.entry(waiter).or_default().push(tx);
    let mut response = Response::new(Events(rx).boxed());
    response.headers_mut().insert(CONTENT_TYPE, "text/event-stream".parse().expect("a value"));
    response.headers_mut().insert("cache-control", "no-store".parse().expect("a value"));
    response
}

fn purchase(fake: &Shared, purchase: Purchase) -> Response<Body> {
    let mut fake = lock(fake);
    fake.purchases.push(purchase);
    if fake.busy_purchases > 0 {
        fake.busy_purchases -= 1;
        let mut busy =
            json_answer(StatusCode::SERVICE_UNAVAILABLE, &json!({ "error": "unavailable", "message": "busy" }));
        busy.headers_mut().insert(RETRY_AFTER, "1".parse().expect("a value"));
        return busy;
    }
    if fake.sold_out_purchases > 0 {
        fake.sold_out_purchases -= 1;
        return json_answer(StatusCode::CONFLICT, &json!({ "error": "sold_out", "message": "no units left" }));
    }
    fake.sold += 1;
    fake.order = Some(json!({
        "id": "1001", "sku": "phone", "user": "alice", "qty": 1, "node": "n1", "unit_price": 1999,
        "currency": "USD", "created_at_ms": server_ms(), "pay_deadline_ms": server_ms() + 600_000,
        "state": "pending_payment", "payment_ref": null, "paid_at_ms": null,
    }));
    json_answer(
        StatusCode::OK,
        &json!({ "result": "purchased", "order_id": "1001", "sku": "phone", "qty": 1, "node": "n1" }),
    )
}

fn stock(fake: &Shared) -> Response<Body> {
    let fake = lock(fake);
    let remaining = fake.total - fake.sold;
    json_answer(
        StatusCode::OK,
        &json!({ "sku": "phone", "total": fake.total, "sold": fake.sold, "remaining": remaining,
                 "local_remaining": remaining, "sold_out": remaining == 0, "closed": false }),
    )
}

fn start_payment(fake: &Shared) -> Response<Body> {
    let mut fake = lock(fake);
    fake.pay_starts += 1;
    json_answer(
        StatusCode::OK,
        &json!({
            "order_id": "1001", "payment_id": "pay_1", "pay_url": "http://127.0.0.1:8095/v1/payments/pay_1/pay",
            "amount": 1999, "currency": "USD", "pay_deadline_ms": server_ms() + 660_000, "status": "pending",
        }),
    )
}

fn provider_pay(fake: &Shared, body: Value) -> Response<Body> {
    let mut fake = lock(fake);
    fake.provider_pays.push(body);
    // The provider's notification reaches the order service a moment later.
    fake.paid_at_ms = Some(wall_ms() + 1_500);
    json_answer(StatusCode::OK, &json!({ "id": "pay_1", "order_id": "1001", "status": "succeeded" }))
}

fn cluster(fake: &Shared, authorization: &str) -> Response<Body> {
    if authorization != format!("Bearer {ADMIN_TOKEN}") {
        return json_answer(StatusCode::UNAUTHORIZED, &json!({ "error": "unauthorized", "message": "no" }));
    }
    let fake = lock(fake);
    let ledger = json!({ "total": fake.total, "sold": fake.sold, "remaining": fake.total - fake.sold,
                         "released": 0, "orders": fake.sold, "closed": false });
    let report = json!({ "local_remaining": 4, "applied": 5, "sold": 1, "ledger_reachable": true });
    json_answer(
        StatusCode::OK,
        &json!({
            "member": "c1", "leader": "c1", "term": 2, "last_log_index": 40,
            "nodes": {
                "n1": { "addr": "127.0.0.1:8081", "epoch": 3, "live": true, "lease_until_ms": wall_ms() + 2_000,
                        "worker_id": 1, "granted": { "phone": 5 }, "reports": { "phone": report } },
                "n2": { "addr": "127.0.0.1:8082", "epoch": 1, "live": false, "lease_until_ms": 0,
                        "worker_id": null, "granted": {}, "reports": {} },
            },
            "skus": { "phone": { "terms": { "total": fake.total, "closed": false, "starts_at_ms": null },
                                 "starting": 5, "granted_to_live_nodes": 5, "ledger": ledger,
                                 "requests_total": wall_ms() / 10,
                                 "room": { "line": 2, "admitted": 1, "draw": { "seed": 7 } } } },
        }),
    )
}

async fn serve(fake: Shared) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let fake = fake.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let fake = fake.clone();
                    async move { Ok::<_, Infallible>(handle(fake, request).await) }
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

/// Screenshots land in the target directory, to look at after a run.
fn out_dir(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Waits until the stand-in holds an open stream for `user`'s waiter.
async fn stream_opened(fake: &Shared, user: &str) {
    for _ in 0..100 {
        if lock(fake).streams_open(user) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{user}'s page opened no event stream");
}

/// Goal: one buyer's whole sale as the page shows it, and a second buyer told "sold out"
/// without a reload. Method: alice and bob open the page before the start (countdown on the
/// server's clock, button disabled, both in the pre-queue); at the start alice presses buy,
/// sees her position, is admitted (pushed), buys with her ticket through a 503 (retried with
/// the same key), sees the order, pays at the sandbox through the page's origin and sees it
/// paid; bob, still in line, is told "sold out" by a push, then that units came back.
#[tokio::test]
async fn a_buyer_waits_buys_and_pays_while_another_hears_sold_out_pushed() {
    let fake: Shared = Arc::new(Mutex::new(Fake::new()));
    let addr = serve(fake.clone()).await;
    let alice = Browser::start(&out_dir("sale-page-alice")).await;
    let bob = Browser::start(&out_dir("sale-page-bob")).await;
    both_open_the_page_before_the_start(&fake, addr, &alice, &bob).await;
    the_sale_starts(&fake, &alice).await;
    alice_waits_for_her_turn_and_buys(&fake, &alice).await;
    alice_pays(&fake, &alice).await;
    bob_hears_sold_out_then_units_come_back(&fake, &bob).await;

    // The 503 the stand-in answered on purpose is the one failed load the browser reports.
    let errors = alice.console_errors().await;
    assert!(errors.iter().all(|e| e.source == "network" && e.message.contains("503")), "{errors:?}");
    assert_eq!(bob.console_errors().await, Vec::new());
}

async fn both_open_the_page_before_the_start(fake: &Shared, addr: SocketAddr, alice: &Browser, bob: &Browser) {
    alice.goto(&format!("http://{addr}/sale/phone#user=alice")).await;
    let countdown = alice.wait_for_text("countdown", "Starts in 00:0", WAIT).await;
    assert!(!alice.is_enabled("buy").await, "the button is closed before the start ({countdown})");
    alice.wait_for_text("position", "drawn at random", WAIT).await;
    alice.wait_for_text("stock", "10 of 10 left", WAIT).await;
    alice.screenshot("before-start").await;
    bob.goto(&format!("http://{addr}/sale/phone#user=bob")).await;
    bob.wait_for_text("position", "drawn at random", WAIT).await;
    bob.execute("window.notReloaded = true; return null;").await;
    stream_opened(fake, "alice").await;
    stream_opened(fake, "bob").await;
    assert_eq!(lock(fake).joins, vec![json!({ "user": "alice" }), json!({ "user": "bob" })], "both joined at load");
}

async fn the_sale_starts(fake: &Shared, alice: &Browser) {
    {
        // The start moves (an operator's change, say): pushed statuses carry it.
        let mut fake = lock(fake);
        fake.starts_at_ms = server_ms() + START_SOON_MS;
        let starts_at_ms = fake.starts_at_ms;
        for user in ["alice", "bob"] {
            fake.push(user, status("pre_queue", user, json!({ "starts_at_ms": starts_at_ms })));
        }
    }
    alice.wait_for_text("countdown", "Starts in 00:00:0", WAIT).await;
    alice.wait_for_text("countdown", "On sale now", WAIT).await;
    alice.wait_until("the button opens at the start", "return !document.getElementById('buy').disabled;", WAIT).await;
    alice.screenshot("started").await;
    let mut fake = lock(fake);
    fake.push("alice", status("waiting", "alice", json!({ "position": 2, "ahead": 1, "wait_s": 1.5 })));
    fake.push("bob", status("waiting", "bob", json!({ "position": 5, "ahead": 4, "wait_s": 4.0 })));
}

async fn alice_waits_for_her_turn_and_buys(fake: &Shared, alice: &Browser) {
    alice.click("buy").await;
    assert!(!alice.is_enabled("buy").await, "a press closes the button for 2 s");
    alice.wait_for_text("position", "Position 2 — about 1 ahead, ~2 s", WAIT).await;
    alice.screenshot("queued").await;
    assert!(lock(fake).purchases.is_empty(), "no purchase before the turn");

    let expires = server_ms() + 30_000;
    lock(fake).push(
        "alice",
        status("admitted", "alice", json!({ "ticket": "ticket-alice", "ticket_expires_at_ms": expires })),
    );
    alice.wait_for_text("result", "Order placed", WAIT).await;
    alice.wait_for_text("order", "Waiting for payment", WAIT).await;
    assert!(alice.text("order").await.contains("1001"), "the order id is shown");
    alice.screenshot("ordered").await;
    let purchases = lock(fake).purchases.clone();
    assert_eq!(purchases.len(), 2, "one 503, then the retry: {purchases:?}");
    assert_eq!(purchases[0].key, purchases[1].key, "a retry sends the same Idempotency-Key");
    assert!(purchases[0].key.len() >= 16, "a random key: {}", purchases[0].key);
    for purchase in &purchases {
        assert_eq!(purchase.ticket, "ticket-alice");
        assert_eq!(purchase.body, json!({ "sku": "phone", "user": "alice", "qty": 1 }));
    }
}

async fn alice_pays(fake: &Shared, alice: &Browser) {
    assert!(alice.is_enabled("pay").await);
    alice.click("pay").await;
    alice.wait_for_text("order", "Paid", WAIT).await;
    alice.wait_for_text("result", "paid", WAIT).await;
    alice.screenshot("paid").await;
    assert_eq!(lock(fake).pay_starts, 1);
    assert_eq!(lock(fake).provider_pays, vec![json!({ "outcome": "succeed" })], "the sandbox's pay, same-origin");
}

async fn bob_hears_sold_out_then_units_come_back(fake: &Shared, bob: &Browser) {
    lock(fake).push("bob", status("sold_out", "bob", json!({ "remaining": 0 })));
    bob.wait_for_text("result", "Sold out", WAIT).await;
    assert!(!bob.is_enabled("buy").await, "sold out closes the button");
    bob.screenshot("sold-out").await;
    lock(fake).push("bob", status("waiting", "bob", json!({ "position": 1, "ahead": 0, "wait_s": 0.5 })));
    bob.wait_for_text("result", "came back", WAIT).await;
    bob.wait_for_text("position", "Position 1", WAIT).await;
    assert!(bob.is_enabled("buy").await, "units came back: the button opens again");
    assert_eq!(bob.execute("return window.notReloaded === true;").await, true, "all without a reload");
}

/// Goal: a buyer who arrives after the start joins with the press and buys at once when the
/// join admits; told sold out by the purchase, the page keeps its place, and buys with the new
/// ticket when units come back. Method: the stand-in admits on join, answers the first
/// purchase 409 `sold_out`, then the test pushes a second admission.
#[tokio::test]
async fn a_late_buyer_told_sold_out_buys_when_units_come_back() {
    let fake: Shared = Arc::new(Mutex::new(Fake::new()));
    {
        let mut fake = lock(&fake);
        fake.starts_at_ms = server_ms() - 1_000;
        fake.busy_purchases = 0;
        fake.sold_out_purchases = 1;
        fake.join_ticket = Some("ticket-1".to_string());
    }
    let addr = serve(fake.clone()).await;
    let carol = Browser::start(&out_dir("sale-page-carol")).await;
    carol.goto(&format!("http://{addr}/sale/phone#user=carol")).await;
    carol.wait_for_text("countdown", "On sale now", WAIT).await;
    carol.wait_until("the button is open", "return !document.getElementById('buy').disabled;", WAIT).await;
    assert!(lock(&fake).joins.is_empty(), "after the start, a page joins only when pressed");

    carol.click("buy").await;
    carol.wait_for_text("result", "Sold out", WAIT).await;
    assert!(!carol.is_enabled("buy").await, "sold out closes the button");
    stream_opened(&fake, "carol").await;
    lock(&fake).push("carol", status("admitted", "carol", json!({ "ticket": "ticket-2" })));
    carol.wait_for_text("result", "Order placed", WAIT).await;
    carol.screenshot("bought-after-reopening").await;

    let purchases = lock(&fake).purchases.clone();
    let tickets: Vec<&str> = purchases.iter().map(|p| p.ticket.as_str()).collect();
    assert_eq!(tickets, ["ticket-1", "ticket-2"], "each admission's own ticket");
    assert_ne!(purchases[0].key, purchases[1].key, "a new attempt, a new Idempotency-Key");
    let errors = carol.console_errors().await;
    assert!(errors.iter().all(|e| e.source == "network" && e.message.contains("409")), "{errors:?}");
}

/// Goal: the operator's page asks for the token, then shows each SKU's figures and the nodes,
/// the internals behind their toggle. Method: a wrong token is refused and said so; the right
/// one fills the tables.
#[tokio::test]
async fn the_operator_page_shows_the_sale_with_the_admin_token() {
    let fake: Shared = Arc::new(Mutex::new(Fake::new()));
    let addr = serve(fake.clone()).await;
    let browser = Browser::start(&out_dir("ops-page")).await;
    browser.goto(&format!("http://{addr}/ops")).await;
    assert_eq!(browser.text("updated").await, "Not connected");
    browser.type_into("token", "a-wrong-token-of-some-length").await;
    browser.click("connect").await;
    browser.wait_for_text("error", "refused", WAIT).await;
    browser.type_into("token", ADMIN_TOKEN).await;
    browser.click("connect").await;
    browser.wait_for_text("updated", "Updated", WAIT).await;
    let table = browser.wait_for_text("skus", "phone", WAIT).await;
    assert!(table.contains("selling"), "#skus shows the sale's state:\n{table}");
    // The allotments and the room's figures are internals, shown once the toggle is opened.
    browser.execute("document.querySelector('#internals summary').click();").await;
    let internals = browser.wait_for_text("allotments", "phone", WAIT).await;
    for shown in ["n1: 4 left, sold 1, granted 5", "line: 2", "admitted: 1", "draw seed: 7"] {
        assert!(internals.contains(shown), "#allotments shows {shown:?}:\n{internals}");
    }
    // Requests/s needs two reads of the count, 2 s apart.
    let script = "const heads = [...document.querySelectorAll('#skus thead th')].map((th) => th.textContent); \
                  const cells = document.querySelectorAll('#skus tbody tr:first-child > *'); \
                  const cell = cells[heads.indexOf('Requests/s')]; \
                  return cell !== undefined && /^[0-9]+[.][0-9]$/.test(cell.textContent);";
    browser.wait_until("a request rate from two reads", script, WAIT).await;
    browser.screenshot("ops").await;
    let errors = browser.console_errors().await;
    assert!(errors.iter().all(|e| e.source == "network" && e.message.contains("401")), "{errors:?}");
}
