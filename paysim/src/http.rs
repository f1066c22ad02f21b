//! The sandbox's HTTP API (docs/payments.md):
//!
//! - the merchant's: `POST /v1/payments`, `GET /v1/payments?order_id=X`, `GET
//!   /v1/payments/{id}`, `POST /v1/refunds` (each may answer 503 under `unavailable_p`);
//! - the buyer's: `POST /v1/payments/{id}/pay`;
//! - the harness's: `GET`/`PUT /v1/faults`, `GET /v1/stats`, `GET /health`, never faulted, so a
//!   fault can always be turned off again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use protocol::sandbox::{self as wire, CallbackBody, CloseBody, CreateBody, PayBody, PayOutcome, RefundBody, Status};
use safeguards::accept::AcceptLimits;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::book::Refusal;
use crate::callbacks::{Fate, Target};
use crate::faults::FaultsPatch;
use crate::Sandbox;

type Body = Full<Bytes>;

/// Largest request body: every body of this API is a few hundred bytes.
const BODY_BYTES_MAX: usize = 16 * 1024;
const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// Time to receive a request's headers, and the idle time allowed between keep-alive requests.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// An answer its client does not read for this long closes the connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at once; more wait in the listen backlog.
const CONNECTIONS_MAX: usize = 512;
const DRAIN_MAX: Duration = Duration::from_secs(5);

/// Serves the API until `stop` turns true, then drains open requests. Its callers are the order
/// service and tests on loopback: only the total bounds them.
pub(crate) async fn serve(sandbox: Arc<Sandbox>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let limits = AcceptLimits {
        connections_max: CONNECTIONS_MAX,
        per_address: None,
        header_timeout: HEADER_TIMEOUT,
        write_timeout: WRITE_TIMEOUT,
        drain_max: DRAIN_MAX,
    };
    let handle = move |request, _peer| {
        let sandbox = sandbox.clone();
        async move { handle(&sandbox, request).await }
    };
    safeguards::accept::serve("paysim", listener, limits, async move { crate::stopped(&mut stop).await }, handle).await;
}

/// Answers one request under its span when traced.
async fn handle(sandbox: &Sandbox, request: Request<Incoming>) -> Response<Body> {
    // The route's name is worked out only while tracing is on.
    let span = if telemetry::is_on() {
        let name = format!("{} {}", request.method(), route_name(request.uri().path()));
        telemetry::server_span(&name, request.headers())
    } else {
        tracing::Span::none()
    };
    if !telemetry::traced(&span) {
        return answer(sandbox, request).await;
    }
    let response = tracing::Instrument::instrument(answer(sandbox, request), span.clone()).await;
    telemetry::record(&span, "http.response.status_code", i64::from(response.status().as_u16()));
    response
}

/// A path with its ids replaced, so spans of one route share a name.
fn route_name(path: &str) -> &'static str {
    match path.trim_start_matches('/').split('/').collect::<Vec<_>>().as_slice() {
        ["v1", "payments"] => "/v1/payments",
        ["v1", "payments", "close"] => "/v1/payments/close",
        ["v1", "payments", _] => "/v1/payments/{id}",
        ["v1", "payments", _, "pay"] => "/v1/payments/{id}/pay",
        ["v1", "refunds"] => "/v1/refunds",
        ["v1", "settlements"] => "/v1/settlements",
        _ => "other",
    }
}

/// Answers one request; every failure is a response.
async fn answer(sandbox: &Sandbox, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    let query = request.uri().query().map(str::to_string);
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let method = request.method().clone();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["health"]) => json(StatusCode::OK, &serde_json::json!({ "status": "ok" })),
        (&Method::POST, ["v1", "payments"]) => match read_json::<CreateBody>(request).await {
            Ok(body) => create(sandbox, &body),
            Err(refused) => refused,
        },
        (&Method::GET, ["v1", "payments"]) => query_by_order(sandbox, query.as_deref()),
        (&Method::GET, ["v1", "payments", id]) => {
            if let Some(unavailable) = fault_unavailable(sandbox) {
                return unavailable;
            }
            let book = sandbox.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match book.get(id) {
                Some(payment) => json(StatusCode::OK, &payment.body(&sandbox.base_url)),
                None => error(StatusCode::NOT_FOUND, "unknown_payment", &format!("no payment {id}")),
            }
        }
        (&Method::POST, ["v1", "payments", id, "pay"]) => {
            let id = id.to_string();
            match read_json::<PayBody>(request).await {
                Ok(body) => pay(sandbox, &id, body.outcome),
                Err(refused) => refused,
            }
        }
        (&Method::POST, ["v1", "payments", "close"]) => match read_json::<CloseBody>(request).await {
            Ok(body) => close(sandbox, &body.order_id),
            Err(refused) => refused,
        },
        (&Method::POST, ["v1", "refunds"]) => match read_json::<RefundBody>(request).await {
            Ok(body) => refund(sandbox, &body),
            Err(refused) => refused,
        },
        (&Method::GET, ["v1", "faults"]) => json(StatusCode::OK, &sandbox.faults()),
        (&Method::PUT, ["v1", "faults"]) => match read_json::<FaultsPatch>(request).await {
            Ok(patch) => set_faults(sandbox, &patch),
            Err(refused) => refused,
        },
        (&Method::GET, ["v1", "stats"]) => json(StatusCode::OK, &sandbox.stats()),
        (&Method::GET, ["v1", "settlements"]) => match window(query.as_deref()) {
            // Not subject to the fault knobs: the audits (reconcile, the nemesis's money checker,
            // the payments demo) read it while the merchant API is made to fail.
            Some((from_ms, to_ms)) => {
                let book = sandbox.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                json(StatusCode::OK, &book.settlements(&sandbox.base_url, from_ms, to_ms))
            }
            None => error(StatusCode::BAD_REQUEST, "bad_query", "GET /v1/settlements?from_ms=MS&to_ms=MS (Unix ms)"),
        },
        (
            _,
            ["health"]
            | ["v1", "settlements"]
            | ["v1", "payments", ..]
            | ["v1", "refunds"]
            | ["v1", "faults"]
            | ["v1", "stats"],
        ) => error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "see docs/payments.md for the methods"),
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such route (docs/payments.md)"),
    }
}

/// `unavailable_p`'s 503, drawn for one merchant call: nothing was done.
fn fault_unavailable(sandbox: &Sandbox) -> Option<Response<Body>> {
    fault_503(sandbox, sandbox.faults().unavailable_p, &sandbox.unavailable_answers)
}

/// `answer_lost_p`'s 503, drawn after a call that changed something: it was done, and the
/// caller is told it was not.
fn fault_answer_lost(sandbox: &Sandbox) -> Option<Response<Body>> {
    fault_503(sandbox, sandbox.faults().answer_lost_p, &sandbox.lost_answers)
}

/// A 503 with probability `p`, counted in `answered`: to the caller both faults look alike, as
/// a real provider's outage and a lost answer do.
fn fault_503(sandbox: &Sandbox, p: f64, answered: &std::sync::atomic::AtomicU64) -> Option<Response<Body>> {
    if !sandbox.dice.hit(p) {
        return None;
    }
    answered.fetch_add(1, Ordering::Relaxed);
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the provider is unavailable; retry");
    response.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
    Some(response)
}

fn create(sandbox: &Sandbox, body: &CreateBody) -> Response<Body> {
    if let Some(unavailable) = fault_unavailable(sandbox) {
        return unavailable;
    }
    let Some(target) = Target::parse(&body.callback_url) else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_callback_url",
            "callback_url is http://host[:port]/path (the sandbox speaks no TLS)",
        );
    };
    let mut book = sandbox.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match book.create(body, target, protocol::unix_ms()) {
        Ok((payment, created)) => {
            if created {
                tracing::debug!(order = %payment.order_id, payment = %payment.id, "payment created");
            }
            let answer = payment.body(&sandbox.base_url);
            drop(book);
            fault_answer_lost(sandbox).unwrap_or_else(|| json(StatusCode::OK, &answer))
        }
        Err(refused) => refusal(&refused),
    }
}

/// The merchant closes an order's payment (the order expired or was cancelled).
fn close(sandbox: &Sandbox, order_id: &str) -> Response<Body> {
    if let Some(unavailable) = fault_unavailable(sandbox) {
        return unavailable;
    }
    let answer = {
        let mut book = sandbox.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match book.close(order_id, protocol::unix_ms()) {
            Ok(payment) => payment.body(&sandbox.base_url),
            Err(refused) => return refusal(&refused),
        }
    };
    fault_answer_lost(sandbox).unwrap_or_else(|| json(StatusCode::OK, &answer))
}

fn query_by_order(sandbox: &Sandbox, query: Option<&str>) -> Response<Body> {
    let order_id = query
        .into_iter()
        .flat_map(|query| query.split('&'))
        .find_map(|pair| pair.strip_prefix("order_id="))
        .map(wire::percent_decode);
    let Some(Some(order_id)) = order_id else {
        return error(StatusCode::BAD_REQUEST, "bad_query", "GET /v1/payments?order_id=<the order id, %-escaped>");
    };
    if let Some(unavailable) = fault_unavailable(sandbox) {
        return unavailable;
    }
    let book = sandbox.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match book.by_order(&order_id) {
        Some(payment) => json(StatusCode::OK, &payment.body(&sandbox.base_url)),
        None => error(StatusCode::NOT_FOUND, wire::NO_PAYMENT, &format!("no payment for order {order_id}")),
    }
}

/// The buyer pays (or is declined); a success is then notified to the payment's callback URL.
fn pay(sandbox: &Sandbox, id: &str, outcome: PayOutcome) -> Response<Body> {
    let faults = sandbox.faults();
    let (answer, notify) = {
        let mut book = sandbox.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Drawn only for a payment that can still settle, so refused pays shift no draws.
        let declined = match (outcome, book.get(id).map(|payment| payment.status)) {
            (PayOutcome::Decline, _) => Some("declined"),
            (PayOutcome::Succeed, Some(Status::Pending)) if sandbox.dice.hit(faults.decline_p) => Some("declined"),
            _ => None,
        };
        match book.settle(id, declined, protocol::unix_ms()) {
            Ok(payment) => {
                let notify = (payment.status == Status::Succeeded).then(|| {
                    let body = CallbackBody {
                        order_id: payment.order_id.clone(),
                        reference: payment.id.clone(),
                        amount: payment.amount,
                        currency: payment.currency.clone(),
                    };
                    (payment.callback.clone(), body)
                });
                (payment.body(&sandbox.base_url), notify)
            }
            Err(refused) => return refusal(&refused),
        }
    };
    tracing::debug!(payment = %answer.id, status = ?answer.status, "payment settled");
    if let Some((target, body)) = notify {
        // Both drawn every time, so the sequence of draws does not depend on the knobs' values.
        let (dropped, duplicated) = (sandbox.dice.hit(faults.drop_p), sandbox.dice.hit(faults.duplicate_p));
        let fate = match (dropped, duplicated) {
            (true, _) => Fate::Dropped,
            (false, true) => Fate::Twice,
            (false, false) => Fate::Once,
        };
        let delay = Duration::from_millis(faults.callback_delay_ms);
        let window = faults.reorder.then(|| Duration::from_millis(faults.reorder_window_ms));
        sandbox.callbacks.schedule(target, &body.reference, &body, fate, delay, window);
    }
    json(StatusCode::OK, &answer)
}

fn refund(sandbox: &Sandbox, body: &RefundBody) -> Response<Body> {
    if let Some(unavailable) = fault_unavailable(sandbox) {
        return unavailable;
    }
    let done = sandbox.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner).refund(body);
    match done {
        Ok(answer) => fault_answer_lost(sandbox).unwrap_or_else(|| json(StatusCode::OK, &answer)),
        Err(refused) => refusal(&refused),
    }
}

fn set_faults(sandbox: &Sandbox, patch: &FaultsPatch) -> Response<Body> {
    let mut faults = sandbox.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let patched = faults.patched(patch);
    if let Err(e) = patched.validate() {
        return error(StatusCode::BAD_REQUEST, "bad_faults", &e);
    }
    tracing::info!(faults = ?patched, "faults changed");
    *faults = patched;
    json(StatusCode::OK, &*faults)
}

/// The body as `T`, or the 4xx that says why not.
async fn read_json<T: DeserializeOwned>(request: Request<Incoming>) -> Result<T, Response<Body>> {
    let body = Limited::new(request.into_body(), BODY_BYTES_MAX);
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(_)) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                &format!("the request body is larger than {BODY_BYTES_MAX} bytes or broken"),
            ))
        }
        Err(_) => return Err(error(StatusCode::REQUEST_TIMEOUT, "body_timeout", "the request body took too long")),
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "bad_body", &format!("{e} (docs/payments.md has the bodies)")))
}

fn refusal(refused: &Refusal) -> Response<Body> {
    let status = StatusCode::from_u16(refused.status).unwrap_or(StatusCode::BAD_REQUEST);
    error(status, refused.code, &refused.message)
}

fn json<T: serde::Serialize>(status: StatusCode, body: &T) -> Response<Body> {
    let bytes = match serde_json::to_vec(body) {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!("cannot encode an answer: {e}");
            return Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(Full::new(Bytes::from_static(br#"{"error":"internal","message":"cannot encode the answer"}"#)))
                .unwrap_or_default();
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    json(status, &wire::ErrorBody { error: code.to_string(), message: message.to_string() })
}

/// `from_ms` and `to_ms` of a settlement report's query: payments created in `[from, to)`;
/// each bound is optional (all of time). `None`: not a window.
fn window(query: Option<&str>) -> Option<(u64, u64)> {
    let (mut from_ms, mut to_ms) = (0, u64::MAX);
    for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=')?;
        let value: u64 = value.parse().ok()?;
        match name {
            "from_ms" => from_ms = value,
            "to_ms" => to_ms = value,
            _ => return None,
        }
    }
    Some((from_ms, to_ms))
}
