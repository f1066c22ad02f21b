//! The order service's HTTP API (docs/http-api.md, "Orders"):
//!
//! - `GET /v1/orders/{id}`, `GET /v1/me/orders?limit=N`: what the buyer sees;
//!   `GET /v1/users/{user}/orders?limit=N`: one buyer's orders, for operators;
//! - `POST /v1/orders/{id}/cancel`: the buyer gives up an unpaid order;
//! - `POST /v1/orders/{id}/pay`: the buyer starts paying (with a payment provider configured):
//!   the provider's payment and where to pay it;
//! - `POST /v1/payments/callback`: the payment provider's notification, signed
//!   ([`crate::signature`]), checked against the order, idempotent by the provider's reference;
//! - `GET /health`, `GET /metrics`.
//!
//! **Time budgets.** Every answer that needs the store comes within [`ANSWER_MAX`], 503 with
//! `Retry-After` if the store has not answered by then: below nginx's 5 s read timeout, so a
//! buyer behind it gets 503, never 504, and below the provider's 5 s callback timeout, so the
//! provider sees 503 and retries. Pressing pay also waits for the provider: its store reads
//! keep [`ANSWER_MAX`], the whole within [`PAY_ANSWER_MAX`].
//!
//! Buyers are identified the way the purchase API identifies them (`[auth]`). With it on, the
//! order routes answer only the order's owner: another buyer gets exactly the 404 an unknown id
//! gets, so order ids cannot be walked to learn or cancel others' orders; operators read any
//! order and any buyer's list with the admin token. Under `mode = "none"` the body's or path's
//! user is believed, as the purchase API believes it. Bad input gets a 4xx naming the problem
//! and changes nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use auth::{Authenticator, UserId};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use protocol::credential::{self, SecretDigest};
use safeguards::accept::{AcceptLimits, PerAddress};
use safeguards::connections::ConnectionsPerAddress;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::consumer::stopped;
use crate::model::{CancelOutcome, OrderState, Payment, PaymentOutcome};
use crate::payments::{Payments, StartError, Started};
use crate::provider::PaymentStatus;
use crate::signature::{self, SIGNATURE_HEADER};
use crate::store::OrderStore;
use crate::unix_ms;

pub type Body = Full<Bytes>;

/// Longest an answer that needs the store may take (module docs, "Time budgets").
pub const ANSWER_MAX: Duration = Duration::from_millis(1500);

/// Longest pressing pay may take: the store's reads, then the provider's answer.
pub const PAY_ANSWER_MAX: Duration = Duration::from_millis(4500);

/// The store's outages, logged once each.
static STORE_OUTAGE: crate::outage::OutageLog = crate::outage::OutageLog::new("order store");

/// Largest request body: a payment notification or a cancel is a few hundred bytes.
const BODY_BYTES_MAX: usize = 16 * 1024;
/// Most orders one user listing returns.
const USER_ORDERS_MAX: usize = 100;
/// Longest order id and payment reference accepted.
const ID_BYTES_MAX: usize = 128;
/// Time to receive a request's headers, and the idle time allowed between keep-alive requests.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
const BODY_TIMEOUT: Duration = Duration::from_secs(5);
const DRAIN_MAX: Duration = Duration::from_secs(5);

/// Connections one client address may hold on the order API by default. Its callers are buyers
/// reading their orders (a browser opens at most 6 connections per host) and the payment
/// provider, whose callbacks come from a few addresses and pile up while the store is slow; 128
/// leaves the provider that room, and it still takes 8 addresses to fill the 1,024 slots.
pub const CONNECTIONS_PER_ADDRESS_DEFAULT: usize = 128;

/// Bounds on what clients can make the order API hold; `cluster.toml` sets the per-address
/// bound (`[orders] connections_per_address`).
#[derive(Debug, Clone)]
pub struct ApiLimits {
    /// Open connections at once; more wait in the kernel's accept queue.
    pub connections_max: usize,
    /// Open connections one client address may hold (IPv6: one block); a new connection past
    /// it is closed at once. Loopback is exempt by default, and `seckill orders` adds
    /// `[safeguards] trusted_proxies`: behind nginx every connection is nginx's.
    pub connections_per_address: ConnectionsPerAddress,
    /// Longest a write may wait for the client to read: a client that pipelines requests and
    /// never reads the answers is cut off after this instead of holding its slot.
    pub write_timeout: Duration,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self {
            connections_max: 1024,
            connections_per_address: ConnectionsPerAddress::new(CONNECTIONS_PER_ADDRESS_DEFAULT),
            // As the node's: an answer of a few hundred bytes that waits 10 s for its reader has
            // a reader that is not reading.
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct OrdersApi {
    pub store: Arc<dyn OrderStore>,
    /// The payment provider's signing secret.
    pub payment_secret: Arc<[u8]>,
    /// How far a callback's signed timestamp may be from this server's clock, in seconds.
    pub callback_window_s: u64,
    /// Renders the process's metrics for `/metrics`; `None` answers 503 there.
    pub metrics: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    /// Who the buyer is (`[auth]`).
    pub authenticator: Authenticator,
    /// The operators' token (`Authorization: Bearer …`), if one is configured.
    pub admin: Option<SecretDigest>,
    /// The payment provider behind `POST /v1/orders/{id}/pay`; `None`: that route answers 404.
    pub payments: Option<Payments>,
}

/// Who is asking, as far as the order routes care.
enum Caller {
    /// The admin token: any order, any buyer's list.
    Operator,
    /// A verified buyer: their own orders only.
    Buyer(UserId),
    /// `mode = "none"`: whoever the request says.
    Unverified,
}

/// Serves `api` on `listener` within `limits` until `stop` turns true, then drains open
/// requests.
pub async fn serve(api: OrdersApi, listener: TcpListener, limits: ApiLimits, mut stop: watch::Receiver<bool>) {
    let limits = AcceptLimits {
        connections_max: limits.connections_max,
        per_address: Some(PerAddress {
            bound: limits.connections_per_address,
            shed: metrics::counter!("seckill_orders_connections_shed_total", "reason" => "per_address"),
            setting: "[orders] connections_per_address",
        }),
        header_timeout: HEADER_TIMEOUT,
        write_timeout: limits.write_timeout,
        drain_max: DRAIN_MAX,
    };
    let handle = move |request, peer| {
        let api = api.clone();
        async move { handle(&api, request, peer).await }
    };
    safeguards::accept::serve("order API", listener, limits, async move { stopped(&mut stop).await }, handle).await;
}

/// Answers one request within its time budget; every failure is a response.
pub async fn handle(api: &OrdersApi, request: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    let path = request.uri().path();
    let budget = match (request.method(), path) {
        (_, "/health" | "/metrics") => None,
        (&Method::POST, path) if path.ends_with("/pay") => Some(PAY_ANSWER_MAX),
        _ => Some(ANSWER_MAX),
    };
    let Some(budget) = budget else { return route(api, request, peer).await };
    // The route's name is worked out only while tracing is on.
    let span = if telemetry::is_on() {
        telemetry::server_span(route_name(request.method(), path), request.headers())
    } else {
        tracing::Span::none()
    };
    let routed = tracing::Instrument::instrument(route(api, request, peer), span.clone());
    let response = match tokio::time::timeout(budget, routed).await {
        Ok(response) => {
            if response.status() != StatusCode::SERVICE_UNAVAILABLE {
                STORE_OUTAGE.answered();
            }
            response
        }
        Err(_) => unavailable(&format!("no answer within {budget:?}")),
    };
    telemetry::record(&span, "http.response.status_code", i64::from(response.status().as_u16()));
    response
}

/// A span's name for a request: its route, with ids left out so one route's spans share it.
fn route_name(method: &Method, path: &str) -> &'static str {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        (&Method::POST, ["v1", "payments", "callback"]) => "POST /v1/payments/callback",
        (&Method::POST, ["v1", "orders", _, "pay"]) => "POST /v1/orders/{id}/pay",
        (&Method::POST, ["v1", "orders", _, "cancel"]) => "POST /v1/orders/{id}/cancel",
        (&Method::GET, ["v1", "orders", _]) => "GET /v1/orders/{id}",
        (&Method::GET, ["v1", "me", "orders"]) => "GET /v1/me/orders",
        (&Method::GET, ["v1", "users", _, "orders"]) => "GET /v1/users/{user}/orders",
        _ => "orders API",
    }
}

/// The route's answer, unbounded.
async fn route(api: &OrdersApi, request: Request<Incoming>, _peer: SocketAddr) -> Response<Body> {
    let decoded: Option<Vec<String>> =
        request.uri().path().trim_start_matches('/').split('/').map(percent_decoded).collect();
    let Some(decoded) = decoded else {
        return error(StatusCode::BAD_REQUEST, "bad_path", "the path has a malformed %-escape or is not UTF-8");
    };
    let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
    match (request.method(), segments.as_slice()) {
        (&Method::GET, ["health"]) => json(StatusCode::OK, serde_json::json!({ "status": "ok" })),
        (&Method::GET, ["ready"]) => ready(api).await,
        (&Method::GET, ["metrics"]) => metrics(api),
        (&Method::GET, ["v1", "orders", id]) => match caller(api, &request) {
            Ok(caller) => get_order(api, id, &caller).await,
            Err(refused) => refused.into(),
        },
        (&Method::GET, ["v1", "me", "orders"]) => my_orders(api, &request).await,
        (&Method::GET, ["v1", "users", user, "orders"]) => users_orders(api, &request, user).await,
        (&Method::POST, ["v1", "orders", id, "cancel"]) => buyer_action(api, request, id, BuyerAction::Cancel).await,
        (&Method::POST, ["v1", "orders", id, "pay"]) => buyer_action(api, request, id, BuyerAction::Pay).await,
        (&Method::POST, ["v1", "payments", "callback"]) => {
            let header =
                request.headers().get(SIGNATURE_HEADER).and_then(|value| value.to_str().ok()).map(str::to_string);
            match read_body(request).await {
                Ok(body) => payment(api, header.as_deref(), &body).await,
                Err(response) => response,
            }
        }
        (
            _,
            ["v1", "orders", ..]
            | ["v1", "me", ..]
            | ["v1", "users", ..]
            | ["v1", "payments", ..]
            | ["health" | "ready" | "metrics"],
        ) => error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "see docs/http-api.md for the methods"),
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such route"),
    }
}

async fn ready(api: &OrdersApi) -> Response<Body> {
    match tokio::time::timeout(ANSWER_MAX, api.store.ping()).await.unwrap_or_else(|_| {
        Err(crate::store::StoreError::Unavailable(format!("the store did not answer within {ANSWER_MAX:?}")))
    }) {
        Ok(()) => json(StatusCode::OK, serde_json::json!({ "status": "ready" })),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, "not_ready", &e.to_string()),
    }
}

fn metrics(api: &OrdersApi) -> Response<Body> {
    match &api.metrics {
        Some(render) => {
            let mut response = Response::new(Full::new(Bytes::from(render())));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            response
        }
        None => error(StatusCode::SERVICE_UNAVAILABLE, "metrics_unavailable", "no metrics recorder here"),
    }
}

/// `GET /v1/me/orders`: the verified buyer's own orders.
async fn my_orders(api: &OrdersApi, request: &Request<Incoming>) -> Response<Body> {
    match caller(api, request) {
        Ok(Caller::Buyer(user)) => user_orders(api, user.as_str(), query_limit(request.uri().query())).await,
        Ok(_) => error(
            StatusCode::BAD_REQUEST,
            "no_buyer",
            "this route lists the verified buyer's own orders: it needs [auth] mode = \"jwt\" or \"gateway\" and a buyer's credential",
        ),
        Err(refused) => refused.into(),
    }
}

/// `GET /v1/users/{user}/orders`: any buyer's orders for an operator, a buyer's own for them.
async fn users_orders(api: &OrdersApi, request: &Request<Incoming>, user: &str) -> Response<Body> {
    match caller(api, request) {
        Ok(Caller::Buyer(buyer)) if buyer.as_str() != user => error(
            StatusCode::FORBIDDEN,
            "admin_only",
            "another buyer's orders are for operators (the admin token); GET /v1/me/orders lists yours",
        ),
        Ok(_) => user_orders(api, user, query_limit(request.uri().query())).await,
        Err(refused) => refused.into(),
    }
}

/// What a buyer's `POST` on an order does.
#[derive(Clone, Copy)]
enum BuyerAction {
    Cancel,
    Pay,
}

/// A buyer's `POST` on an order: who calls is settled before the body is read.
async fn buyer_action(api: &OrdersApi, request: Request<Incoming>, id: &str, action: BuyerAction) -> Response<Body> {
    let caller = match caller(api, &request) {
        Ok(caller) => caller,
        Err(refused) => return refused.into(),
    };
    match (read_body(request).await, action) {
        (Ok(body), BuyerAction::Cancel) => cancel(api, id, &body, &caller).await,
        (Ok(body), BuyerAction::Pay) => pay(api, id, &body, &caller).await,
        (Err(response), _) => response,
    }
}

/// The caller of a buyer's route: the admin token, else the buyer its credential proves (401
/// `unauthenticated` if it proves none), else, under `mode = "none"`, unverified.
fn caller(api: &OrdersApi, request: &Request<Incoming>) -> Result<Caller, Unauthenticated> {
    let headers = request.headers();
    let authorization = headers.get(AUTHORIZATION).map(HeaderValue::as_bytes);
    if let (Some(admin), Some(_)) = (&api.admin, authorization) {
        if credential::accepts(std::slice::from_ref(admin), credential::bearer_of(authorization)) {
            return Ok(Caller::Operator);
        }
    }
    match api.authenticator.verify(headers, auth::unix_now_s()) {
        Ok(Some(user)) => Ok(Caller::Buyer(user)),
        Ok(None) => Ok(Caller::Unverified),
        Err(refusal) => {
            tracing::debug!("order API refused a credential: {refusal}");
            Err(Unauthenticated)
        }
    }
}

/// The caller's credential proved nobody; answered 401 and nothing is looked up.
struct Unauthenticated;

impl From<Unauthenticated> for Response<Body> {
    fn from(_: Unauthenticated) -> Response<Body> {
        let mut response = error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "a valid credential of the buyer (or the admin token) is required",
        );
        response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        response
    }
}

/// The 404 for an order id the caller may not see: word for word the unknown id's, so a
/// stranger cannot tell "not yours" from "no such order".
fn unknown_order() -> Response<Body> {
    error(StatusCode::NOT_FOUND, "unknown_order", "no such order (yet: it appears within a second of the purchase)")
}

async fn get_order(api: &OrdersApi, id: &str, caller: &Caller) -> Response<Body> {
    if !valid_id(id) {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_order_id",
            "an order id is 1-128 letters, digits and '-', '_', '.', ':'",
        );
    }
    match api.store.get(id).await {
        Ok(Some(order)) if matches!(caller, Caller::Buyer(buyer) if buyer.as_str() != order.new.user) => {
            unknown_order()
        }
        Ok(Some(order)) => json(StatusCode::OK, serde_json::to_value(&order).unwrap_or_default()),
        Ok(None) => unknown_order(),
        Err(e) => unavailable(&e),
    }
}

async fn user_orders(api: &OrdersApi, user: &str, limit: Result<usize, ()>) -> Response<Body> {
    if ledger::UserId::new(user).is_err() {
        return error(StatusCode::BAD_REQUEST, "bad_user", "a user id is 1-64 printable characters");
    }
    let Ok(limit) = limit else {
        return error(StatusCode::BAD_REQUEST, "bad_limit", "limit is a number from 1 to 100");
    };
    match api.store.by_user(user, limit).await {
        Ok(orders) => json(StatusCode::OK, serde_json::json!({ "user": user, "orders": orders })),
        Err(e) => unavailable(&e),
    }
}

/// `user` is required under `mode = "none"`; with `[auth]` on, the credential names the buyer
/// and a `user` naming anyone else is refused.
#[derive(Deserialize)]
struct CancelBody {
    #[serde(default)]
    user: Option<String>,
}

/// The buyer acting on order `id` (cancel, pay): the verified buyer, or under `mode = "none"`
/// the body's `user`; a 4xx if the id, the body or the user is bad.
fn acting_buyer(id: &str, body: &[u8], caller: &Caller) -> Result<String, Box<Response<Body>>> {
    if !valid_id(id) {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "bad_order_id",
            "an order id is 1-128 letters, digits and '-', '_', '.', ':'",
        )));
    }
    let claimed = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        match serde_json::from_slice::<CancelBody>(body) {
            Ok(body) => body.user,
            Err(_) => {
                return Err(Box::new(error(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    r#"the body is {"user": "<the buyer>"}"#,
                )))
            }
        }
    };
    if claimed.as_deref().is_some_and(|user| UserId::new(user).is_err()) {
        return Err(Box::new(error(StatusCode::BAD_REQUEST, "bad_user", "a user id is 1-64 printable characters")));
    }
    match (caller, claimed) {
        (Caller::Buyer(buyer), Some(claimed)) if claimed != buyer.as_str() => Err(Box::new(error(
            StatusCode::FORBIDDEN,
            "user_mismatch",
            "the body's user is not the buyer the credential proves; leave it out",
        ))),
        (Caller::Buyer(buyer), _) => Ok(buyer.as_str().to_string()),
        (_, Some(claimed)) => Ok(claimed),
        (_, None) => {
            Err(Box::new(error(StatusCode::BAD_REQUEST, "bad_body", r#"the body is {"user": "<the buyer>"}"#)))
        }
    }
}

async fn cancel(api: &OrdersApi, id: &str, body: &[u8], caller: &Caller) -> Response<Body> {
    let user = match acting_buyer(id, body, caller) {
        Ok(user) => user,
        Err(refused) => return *refused,
    };
    match api.store.cancel(id, &user, unix_ms()).await {
        Ok(outcome @ (CancelOutcome::Cancelled | CancelOutcome::AlreadyCancelled)) => {
            if outcome == CancelOutcome::Cancelled {
                metrics::counter!("seckill_orders_transitions_total", "to" => "cancelled").increment(1);
            }
            json(StatusCode::OK, serde_json::to_value(&outcome).unwrap_or_default())
        }
        Ok(CancelOutcome::NotPending { state }) => error(
            StatusCode::CONFLICT,
            "not_pending",
            &format!("the order is {} and can no longer be cancelled", state.as_str()),
        ),
        Ok(CancelOutcome::UnknownOrder) => error(StatusCode::NOT_FOUND, "unknown_order", "no such order for this user"),
        Err(e) => unavailable(&e),
    }
}

/// The buyer starts paying their order: the provider's payment, where to pay it, and the
/// order's deadline (extended once by the grace). Only the owner may; to anyone else the order
/// does not exist. Pressing "pay" again answers the same payment.
async fn pay(api: &OrdersApi, id: &str, body: &[u8], caller: &Caller) -> Response<Body> {
    let Some(payments) = &api.payments else {
        return error(
            StatusCode::NOT_FOUND,
            "no_payment_provider",
            "this order service takes no payments itself ([payments] provider is not set)",
        );
    };
    let user = match acting_buyer(id, body, caller) {
        Ok(user) => user,
        Err(refused) => return *refused,
    };
    match tokio::time::timeout(ANSWER_MAX, payable(api, id, &user)).await {
        Ok(Ok(())) => {}
        Ok(Err(refused)) => return refused,
        Err(_) => return unavailable(&format!("no answer within {ANSWER_MAX:?}")),
    }
    let started = crate::payments::start(&*api.store, payments, id, unix_ms()).await;
    answer_started(id, started)
}

/// Whether `user` may pay order `id`: it is theirs, and it costs something.
async fn payable(api: &OrdersApi, id: &str, user: &str) -> Result<(), Response<Body>> {
    match api.store.get(id).await {
        Ok(Some(order)) if order.new.user != user => Err(unknown_order()),
        Ok(Some(order)) if order.new.amount() == 0 => {
            Err(error(StatusCode::CONFLICT, "nothing_to_pay", "the order costs nothing (a giveaway): no payment"))
        }
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(unknown_order()),
        Err(e) => Err(unavailable(&e)),
    }
}

/// The buyer's answer to "pay", counted by outcome.
fn answer_started(id: &str, started: Result<Started, StartError>) -> Response<Body> {
    let counted = |outcome: &'static str| {
        metrics::counter!("seckill_orders_payment_starts_total", "outcome" => outcome).increment(1);
    };
    match started {
        Ok(Started::Payment { order, payment_id, pay_url, status }) => {
            counted("started");
            let status = match status {
                PaymentStatus::Succeeded { .. } => "succeeded",
                PaymentStatus::Failed { .. } => "failed",
                PaymentStatus::Pending | PaymentStatus::NotFound => "pending",
            };
            json(
                StatusCode::OK,
                serde_json::json!({
                    "order_id": order.new.id,
                    "payment_id": payment_id,
                    "pay_url": pay_url,
                    "amount": order.new.amount(),
                    "currency": order.new.currency,
                    "pay_deadline_ms": order.new.pay_deadline_ms,
                    "status": status,
                }),
            )
        }
        Ok(Started::NotPending(order)) => {
            counted("not_pending");
            let why = match order.state {
                OrderState::PendingPayment => "its pay deadline has passed".to_string(),
                state => format!("it is {}", state.as_str()),
            };
            error(StatusCode::CONFLICT, "not_pending", &format!("the order can no longer be paid: {why}"))
        }
        Ok(Started::UnknownOrder) => unknown_order(),
        Err(StartError::Store(e)) => unavailable(&e),
        Err(StartError::Provider(crate::provider::ProviderError::Refused(why))) => {
            counted("refused");
            tracing::error!(order = %id, "the payment provider refused the payment: {why}");
            error(StatusCode::BAD_GATEWAY, "payment_refused", &format!("the payment provider refused: {why}"))
        }
        Err(StartError::Provider(e)) => {
            counted("unavailable");
            tracing::warn!(order = %id, "payment not started: {e}");
            let mut response = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "provider_unavailable",
                "the payment provider did not answer; press pay again (the same payment is answered)",
            );
            response.headers_mut().insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

/// The provider's notification. Its fields beyond these are ignored: providers add fields.
#[derive(Deserialize)]
struct PaymentBody {
    order_id: String,
    reference: String,
    amount: u64,
    currency: String,
}

async fn payment(api: &OrdersApi, header: Option<&str>, body: &[u8]) -> Response<Body> {
    let now_ms = unix_ms();
    if let Err(e) = signature::verify(&api.payment_secret, header, body, now_ms / 1000, api.callback_window_s) {
        metrics::counter!("seckill_orders_payments_total", "outcome" => "bad_signature").increment(1);
        return error(StatusCode::UNAUTHORIZED, "bad_signature", &e.to_string());
    }
    let payment = match payment_of(body, now_ms) {
        Ok(payment) => payment,
        Err(refused) => return *refused,
    };
    let recording =
        tracing::Instrument::instrument(api.store.record_payment(&payment), telemetry::child("store payment"));
    let outcome = match recording.await {
        Ok(outcome) => outcome,
        Err(e) => return unavailable(&e),
    };
    metrics::counter!("seckill_orders_payments_total", "outcome" => outcome.label()).increment(1);
    if outcome.refund_owed() {
        metrics::counter!("seckill_orders_refunds_owed_total").increment(1);
        tracing::info!(order = %payment.order_id, reference = %payment.reference, outcome = outcome.label(), "payment recorded: refund owed");
    }
    answer_recorded(&outcome)
}

/// A signed notification's body as the payment it reports, or the 400 that refuses it for good.
fn payment_of(body: &[u8], now_ms: u64) -> Result<Payment, Box<Response<Body>>> {
    let body: PaymentBody = match serde_json::from_slice(body) {
        Ok(body) => body,
        Err(e) => {
            return Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                "bad_body",
                &format!(r#"the body is {{"order_id", "reference", "amount" (minor units), "currency"}}: {e}"#),
            )))
        }
    };
    // The store keeps amounts as signed 64-bit integers: a larger one can never match a price, so
    // it is refused for good here rather than failing the store on every retry (a 503 forever).
    if i64::try_from(body.amount).is_err() {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "bad_body",
            "amount does not fit a signed 64-bit integer of minor units",
        )));
    }
    // The provider names the payment attempt it was created under: its order's id, or that id
    // and the attempt's number.
    let order_id = crate::payments::attempts::order_of(&body.order_id);
    if !valid_id(order_id) || body.reference.is_empty() || body.reference.len() > ID_BYTES_MAX {
        let why = "order_id or reference is empty, too long or malformed";
        return Err(Box::new(error(StatusCode::BAD_REQUEST, "bad_body", why)));
    }
    Ok(Payment {
        order_id: order_id.to_string(),
        reference: body.reference,
        amount: body.amount,
        currency: body.currency,
        received_at_ms: now_ms,
        source: crate::model::PaymentSource::Callback,
    })
}

/// The provider's answer for a recorded payment, counting the order's transition.
fn answer_recorded(outcome: &PaymentOutcome) -> Response<Body> {
    let body = serde_json::json!({
        "outcome": outcome.label(),
        "detail": serde_json::to_value(outcome).unwrap_or_default(),
        "refund_owed": outcome.refund_owed(),
    });
    // Every recorded payment is acknowledged (2xx), so the provider stops retrying: what it
    // said is in the store, refunds owed included. Only a reference already recorded for
    // another order is refused, since this payment cannot be recorded under it.
    match outcome {
        PaymentOutcome::Paid => {
            metrics::counter!("seckill_orders_transitions_total", "to" => "paid").increment(1);
            json(StatusCode::OK, body)
        }
        PaymentOutcome::PaidAfterExpiry => {
            metrics::counter!("seckill_orders_transitions_total", "to" => "paid_after_expiry").increment(1);
            json(StatusCode::OK, body)
        }
        PaymentOutcome::AwaitingOrder => json(StatusCode::ACCEPTED, body),
        PaymentOutcome::Duplicate { .. } | PaymentOutcome::AlreadyPaid | PaymentOutcome::Mismatch { .. } => {
            json(StatusCode::OK, body)
        }
        PaymentOutcome::ReferenceReused => {
            error(StatusCode::CONFLICT, "reference_reused", "this payment reference was recorded for another order")
        }
    }
}

/// One path segment with its %-escapes decoded (RFC 3986), so `/v1/users/ann%20smith/orders`
/// names the user `ann smith`; `None` for a malformed escape or bytes that are not UTF-8.
fn percent_decoded(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            decoded.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

fn valid_id(id: &str) -> bool {
    id.len() <= ID_BYTES_MAX && ledger::OrderId::is_valid(id)
}

fn query_limit(query: Option<&str>) -> Result<usize, ()> {
    let Some(value) = query.into_iter().flat_map(|q| q.split('&')).find_map(|pair| pair.strip_prefix("limit=")) else {
        return Ok(20);
    };
    match value.parse::<usize>() {
        Ok(limit) if (1..=USER_ORDERS_MAX).contains(&limit) => Ok(limit),
        _ => Err(()),
    }
}

async fn read_body(request: Request<Incoming>) -> Result<Bytes, Response<Body>> {
    let body = Limited::new(request.into_body(), BODY_BYTES_MAX);
    match tokio::time::timeout(BODY_TIMEOUT, body.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(_)) => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            &format!("the request body is larger than {BODY_BYTES_MAX} bytes or broken"),
        )),
        Err(_) => Err(error(StatusCode::REQUEST_TIMEOUT, "body_timeout", "the request body took too long")),
    }
}

fn unavailable(e: &dyn std::fmt::Display) -> Response<Body> {
    STORE_OUTAGE.failed(e);
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the order store is unavailable; retry");
    response.headers_mut().insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

fn json(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    json(status, serde_json::json!({ "error": code, "message": message }))
}
