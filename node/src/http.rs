//! Routes and the HTTP contract of docs/http-api.md: parsing and validating requests, and
//! mapping every [`Outcome`] to its status code and body in one place.

use std::net::SocketAddr;
use std::time::Duration;

use std::borrow::Cow;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{
    HeaderValue, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, ETAG, IF_NONE_MATCH, RETRY_AFTER, WWW_AUTHENTICATE,
};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use ledger::{IdempotencyKey, SkuId, SubmitToken, UserId};
use serde::Deserialize;
use tracing::{Instrument, Span};

use self::room::AnyBody;
use crate::outcome::{Code, Outcome};
use crate::pipeline::{Node, PurchaseRequest};
use crate::tokens::{TokenOutcome, TokenRequest};

mod room;

pub type Body = Full<Bytes>;

/// How long a client should wait before retrying after a 503: long enough for a Redis
/// failover or a confirm queue to drain, short enough not to lose the sale.
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

const IDEMPOTENCY_KEY: &str = "idempotency-key";
const REPLAYED: &str = "idempotent-replayed";
/// Carries the submit token of a purchase. A header, like the Idempotency-Key, rather than a body
/// field: the body stays the payload a retry must repeat, and the token never enters it.
const SUBMIT_TOKEN: &str = "submit-token";

/// How long a client or proxy may reuse a stock page without asking again: one second, the
/// shortest `max-age` HTTP can say (0 forbids reuse). Reuse costs little: the page's ledger
/// figures are already up to `status_refresh_ms` old on the node and differ between nodes, and
/// no purchase is decided from them (a buyer shown one unit too many is refused by the node).
/// Longer would show "sold out" late, inviting clicks. `public`: the page is the same for every
/// buyer, so shared caches (the generated nginx config, a CDN) may keep it too.
const STOCK_PAGE_CACHE_CONTROL: &str = "public, max-age=1";

/// The purchase body, borrowed from the request bytes where it can be (escapes force a copy).
/// `qty` defaults to 1; it is read as a signed 64-bit number so that a negative or oversized
/// value gets a precise message instead of a type error.
#[derive(Deserialize)]
struct PurchaseBody<'a> {
    #[serde(borrow)]
    sku: Cow<'a, str>,
    /// Required under `[auth] mode = "none"`; otherwise the credential names the buyer and this,
    /// if given, must agree with it.
    #[serde(borrow, default)]
    user: Option<Cow<'a, str>>,
    #[serde(default = "one")]
    qty: i64,
}

fn one() -> i64 {
    1
}

/// The body of `POST /v1/tokens`; `user` as in [`PurchaseBody`].
#[derive(Deserialize)]
struct TokenBody<'a> {
    #[serde(borrow)]
    sku: Cow<'a, str>,
    #[serde(borrow, default)]
    user: Option<Cow<'a, str>>,
}

/// Answers one request, an event stream included (the room's, which holds its connection).
pub async fn handle_any(node: &Node, request: Request<Incoming>, peer: SocketAddr) -> Response<AnyBody> {
    let path = request.uri().path();
    if request.method() == Method::GET {
        if let Some(sku) = path.strip_prefix("/v1/room/").and_then(|rest| rest.strip_suffix("/events")) {
            return room::events(node, sku, request.uri().query());
        }
    }
    handle(node, request, peer).await.map(http_body_util::Either::Left)
}

/// Answers one request. Never panics and never returns an error: every failure is a response.
pub async fn handle(node: &Node, request: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    let path = request.uri().path();
    match (request.method(), path) {
        (&Method::POST, "/v1/purchase") => purchase(node, request, peer).await,
        (&Method::POST, "/v1/tokens") => token(node, request, peer).await,
        (&Method::GET, "/health") => json(StatusCode::OK, Bytes::from_static(br#"{"status":"ok"}"#)),
        (&Method::GET, "/ready") => ready(node),
        (&Method::GET, "/metrics") => metrics(node),
        (&Method::GET, _) if path.starts_with("/v1/skus/") => {
            stock_page(node, &path["/v1/skus/".len()..], request.headers())
        }
        (&Method::POST, _) if path.starts_with("/v1/room/") && path.ends_with("/join") => {
            // `/v1/room/join` has the prefix and the suffix overlapping on one `/`: no SKU.
            let sku = path.strip_prefix("/v1/room/").and_then(|rest| rest.strip_suffix("/join")).unwrap_or("");
            let sku = sku.to_owned();
            room::join(node, &sku, request, peer).await
        }
        (&Method::GET, _) if path.starts_with("/v1/room/") => room::status(node, &path["/v1/room/".len()..]).await,
        (&Method::GET, _) if path.starts_with("/sale/") => static_file(web::sale_page(), PAGE_CACHE_CONTROL),
        (&Method::GET, _) if path.starts_with(web::ASSET_PREFIX) => {
            match web::asset(&path[web::ASSET_PREFIX.len()..]) {
                Some(asset) => static_file(asset, PAGE_CACHE_CONTROL),
                None => error(StatusCode::NOT_FOUND, "not_found", "no such file"),
            }
        }
        (_, "/v1/purchase" | "/v1/tokens" | "/health" | "/ready" | "/metrics") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "see the API reference for the methods of this path",
        ),
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such route"),
    }
}

/// A purchase under its request span when traced (see [`telemetry::server_span`]).
async fn purchase(node: &Node, request: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    let span = telemetry::server_span("POST /v1/purchase", request.headers());
    if !telemetry::traced(&span) {
        return purchase_untraced(node, request, peer, &span).await;
    }
    // Boxed: the untraced future, the one nearly every request polls, stays its size.
    let response = Box::pin(purchase_untraced(node, request, peer, &span).instrument(span.clone())).await;
    telemetry::record(&span, "http.response.status_code", i64::from(response.status().as_u16()));
    response
}

/// Requests refused here, before the pipeline, are counted here; the pipeline counts its own.
async fn purchase_untraced(node: &Node, request: Request<Incoming>, peer: SocketAddr, trace: &Span) -> Response<Body> {
    let (headers, body) = match read_purchase(node, request).await {
        Ok(read) => read,
        Err(rejection) => {
            if matches!(rejection.status(), StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE) {
                node.metrics().count(Code::BadRequest);
            }
            return rejection;
        }
    };
    match validate(node, &headers, &body).and_then(|valid| Ok((valid, submit_token(&headers)?))) {
        Ok(((key, parsed, qty), token)) => {
            if node.authenticator().is_on() {
                if let Some(refusal) = node.refusal_before_identity(&parsed.sku, key).await {
                    return respond(&refusal);
                }
            }
            let user = match buyer(node, &headers, parsed.user.as_deref()) {
                Ok(user) => user,
                Err(refusal) => {
                    node.metrics().count(refusal.code());
                    return respond(&refusal);
                }
            };
            let ticket = headers.get(crate::room::TICKET_HEADER).and_then(|value| value.to_str().ok());
            let ip = client_ip(node, &headers, peer);
            let request = PurchaseRequest { sku: &parsed.sku, user: &user, qty, key, ip, token, ticket, trace };
            respond(&node.purchase(request).await)
        }
        Err(Invalid::Request(message)) => {
            node.metrics().count(Code::BadRequest);
            bad_request(&message)
        }
        Err(Invalid::UnknownSku) => respond(&Outcome::UnknownSku),
    }
}

/// The buyer's address: `X-Forwarded-For` counts only when the peer is a trusted proxy.
pub(crate) fn client_ip(node: &Node, headers: &HeaderMap, peer: SocketAddr) -> std::net::IpAddr {
    let forwarded = headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok());
    safeguards::client_ip::client_ip(peer.ip(), forwarded, &node.config().trusted_proxies)
}

/// Reads the headers and the body, bounded in size and time.
pub(crate) async fn read_purchase(
    node: &Node,
    request: Request<Incoming>,
) -> Result<(HeaderMap, Bytes), Response<Body>> {
    let limits = &node.config().http;
    let (parts, body) = request.into_parts();
    let declared_length =
        parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared_length.is_some_and(|length| length > limits.body_bytes_max as u64) {
        return Err(too_large(limits.body_bytes_max));
    }
    let collected =
        tokio::time::timeout(limits.body_timeout, Limited::new(body, limits.body_bytes_max).collect()).await;
    let body = match collected {
        Err(_) => {
            return Err(error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the request body did not arrive in time",
            ))
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large(limits.body_bytes_max)),
        Ok(Err(_)) => return Err(bad_request("the request body could not be read")),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    Ok((parts.headers, body))
}

/// Step 1 of the pipeline: everything wrong with the request itself is a 4xx here, before any
/// state is touched. Returns the key, the body (borrowing from the request bytes unless a field
/// had JSON escapes) and the quantity; nothing is allocated unless the request is bad.
fn validate<'a>(
    node: &Node,
    headers: &'a HeaderMap,
    body: &'a Bytes,
) -> Result<(&'a str, PurchaseBody<'a>, u32), Invalid> {
    let invalid = |message: String| Invalid::Request(message);
    let key = match headers.get(IDEMPOTENCY_KEY).map(HeaderValue::to_str) {
        None => return Err(invalid("the Idempotency-Key header is required".into())),
        Some(Err(_)) => return Err(invalid("the Idempotency-Key header must be visible ASCII".into())),
        Some(Ok(key)) => key,
    };
    IdempotencyKey::validate(key).map_err(|e| invalid(e.to_string()))?;
    let parsed: PurchaseBody<'a> =
        serde_json::from_slice(body).map_err(|e| invalid(format!("the body is not a valid purchase: {e}")))?;
    SkuId::validate(&parsed.sku).map_err(|e| invalid(e.to_string()))?;
    if let Some(user) = &parsed.user {
        UserId::validate(user).map_err(|e| invalid(e.to_string()))?;
    }
    // An unknown SKU is a 404 even when its qty would be out of range: the SKU is what is wrong.
    let qty_max = node.qty_max(&parsed.sku).ok_or(Invalid::UnknownSku)?;
    let qty = match u32::try_from(parsed.qty) {
        Ok(qty) if qty >= 1 && qty <= qty_max => qty,
        _ => return Err(invalid(format!("qty must be between 1 and {qty_max} for this SKU, got {}", parsed.qty))),
    };
    Ok((key, parsed, qty))
}

/// The buyer a request is for: with `[auth]` on, the user its credential proves (a body `user`
/// naming anyone else is refused); with `mode = "none"`, the body's `user`, which is then
/// required. Under `none` nothing is allocated.
pub(crate) fn buyer<'a>(node: &Node, headers: &HeaderMap, claimed: Option<&'a str>) -> Result<Cow<'a, str>, Outcome> {
    match node.authenticator().verify(headers, auth::unix_now_s()) {
        Ok(None) => claimed.map(Cow::Borrowed).ok_or(Outcome::BadRequest { reason: "user is required" }),
        Ok(Some(verified)) if claimed.is_some_and(|claimed| claimed != verified.as_str()) => Err(Outcome::UserMismatch),
        Ok(Some(verified)) => Ok(Cow::Owned(verified.as_str().to_owned())),
        Err(refusal) => {
            tracing::debug!("refused a credential: {refusal}");
            Err(Outcome::Unauthenticated)
        }
    }
}

/// The optional `Submit-Token` header, checked like the Idempotency-Key: a malformed token is a
/// 400 here, a well-formed one that the ledger does not know is `token_invalid` there.
fn submit_token(headers: &HeaderMap) -> Result<Option<&str>, Invalid> {
    let Some(value) = headers.get(SUBMIT_TOKEN) else { return Ok(None) };
    let token = value.to_str().map_err(|_| Invalid::Request("the Submit-Token header must be visible ASCII".into()))?;
    SubmitToken::validate(token).map_err(|e| Invalid::Request(e.to_string()))?;
    Ok(Some(token))
}

/// `POST /v1/tokens`: `{"sku", "user"}` → 201 `{"token", "sku", "user", "expires_in_s"}`.
/// Refusals before the node's own checks are counted here, as for purchases.
async fn token(node: &Node, request: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    let (headers, body) = match read_purchase(node, request).await {
        Ok(read) => read,
        Err(rejection) => {
            if matches!(rejection.status(), StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE) {
                node.metrics().count_token_refused(Code::BadRequest);
            }
            return rejection;
        }
    };
    let parsed = serde_json::from_slice::<TokenBody<'_>>(&body)
        .map_err(|e| format!("the body is not a valid token request: {e}"))
        .and_then(|parsed| {
            SkuId::validate(&parsed.sku).map_err(|e| e.to_string())?;
            if let Some(user) = &parsed.user {
                UserId::validate(user).map_err(|e| e.to_string())?;
            }
            Ok(parsed)
        });
    let parsed = match parsed {
        Ok(parsed) => parsed,
        Err(message) => {
            node.metrics().count_token_refused(Code::BadRequest);
            return bad_request(&message);
        }
    };
    let user = match buyer(node, &headers, parsed.user.as_deref()) {
        Ok(user) => user,
        Err(refusal) => {
            node.metrics().count_token_refused(refusal.code());
            return respond(&refusal);
        }
    };
    match node.issue_token(TokenRequest { sku: &parsed.sku, user: &user, ip: client_ip(node, &headers, peer) }).await {
        TokenOutcome::Issued { token, sku, user, ttl } => {
            let body = serde_json::json!({ "token": token, "sku": sku, "user": user, "expires_in_s": ttl.as_secs() });
            json(StatusCode::CREATED, Bytes::from(body.to_string()))
        }
        TokenOutcome::Refused(outcome) => respond(&outcome),
    }
}

/// Why a purchase request was refused before the pipeline.
enum Invalid {
    Request(String),
    UnknownSku,
}

pub(crate) fn bad_request(message: &str) -> Response<Body> {
    error(StatusCode::BAD_REQUEST, "bad_request", message)
}

/// Maps an outcome to its response: the one place that knows the status codes.
pub fn respond(outcome: &Outcome) -> Response<Body> {
    let code = outcome.code();
    let mut response = match outcome {
        Outcome::Purchased { sku, receipt, .. } => {
            let body = serde_json::json!({
                "result": "purchased",
                "order_id": receipt.order_id,
                "sku": sku,
                "qty": receipt.qty,
                "node": receipt.node,
            });
            json(StatusCode::OK, Bytes::from(body.to_string()))
        }
        Outcome::SoldOut { .. } => static_error(StatusCode::CONFLICT, br#"{"error":"sold_out","message":"no units left"}"#),
        Outcome::UserLimit { .. } => static_error(StatusCode::CONFLICT, br#"{"error":"user_limit","message":"this user has bought the most allowed for this SKU"}"#),
        Outcome::InProgress => static_error(StatusCode::CONFLICT, br#"{"error":"in_progress","message":"a request with this Idempotency-Key is being processed; retry later"}"#),
        Outcome::KeyReused => static_error(StatusCode::UNPROCESSABLE_ENTITY, br#"{"error":"key_reused","message":"this Idempotency-Key was used for a different purchase"}"#),
        Outcome::NotStarted => static_error(StatusCode::FORBIDDEN, br#"{"error":"not_started","message":"the sale has not started"}"#),
        Outcome::Ended => static_error(StatusCode::FORBIDDEN, br#"{"error":"ended","message":"the sale has ended"}"#),
        Outcome::Blocked => static_error(StatusCode::FORBIDDEN, br#"{"error":"blocked","message":"this user or address may not buy"}"#),
        Outcome::UnknownSku => static_error(StatusCode::NOT_FOUND, br#"{"error":"unknown_sku","message":"no such SKU"}"#),
        Outcome::RateLimited { retry_after } => with_retry_after(error(StatusCode::TOO_MANY_REQUESTS, code.as_str(), "too many requests"), *retry_after),
        Outcome::Unavailable { reason } => with_retry_after(error(StatusCode::SERVICE_UNAVAILABLE, code.as_str(), reason), UNAVAILABLE_RETRY_AFTER),
        Outcome::LedgerBreakerOpen { retry_after } => with_retry_after(error(StatusCode::SERVICE_UNAVAILABLE, code.as_str(), "the ledger is failing; this node refuses purchases for a moment; retry with the same Idempotency-Key"), *retry_after),
        Outcome::StripeEmpty { key_spent: false } => with_retry_after(static_error(StatusCode::SERVICE_UNAVAILABLE, br#"{"error":"stripe_empty","message":"the units left of this SKU are on other stripes right now and are being moved; retry with the same Idempotency-Key"}"#), UNAVAILABLE_RETRY_AFTER),
        Outcome::StripeEmpty { key_spent: true } => with_retry_after(static_error(StatusCode::SERVICE_UNAVAILABLE, br#"{"error":"stripe_empty","message":"the units left of this SKU are on other stripes right now and are being moved; the ledger stored sold_out under this Idempotency-Key, so retry with a new one"}"#), UNAVAILABLE_RETRY_AFTER),
        Outcome::BadRequest { reason } => error(StatusCode::BAD_REQUEST, code.as_str(), reason),
        // 403 like the other "you may not buy this way" answers: the same request will never
        // succeed, and 409 in this API means the stock's state, which a token does not change.
        Outcome::TokenRequired => static_error(StatusCode::FORBIDDEN, br#"{"error":"token_required","message":"this SKU requires a Submit-Token header; get one from POST /v1/tokens"}"#),
        Outcome::TokenInvalid { .. } => static_error(StatusCode::FORBIDDEN, br#"{"error":"token_invalid","message":"the submit token is unknown, spent, expired, or was issued for another user or SKU; get a new one from POST /v1/tokens"}"#),
        Outcome::NoTicket => static_error(StatusCode::FORBIDDEN, br#"{"error":"no_ticket","message":"this SKU sells through its waiting room: join it (POST /v1/room/{sku}/join) and buy with the Ticket it admits you with"}"#),
        Outcome::Unauthenticated => {
            let mut response = static_error(StatusCode::UNAUTHORIZED, br#"{"error":"unauthenticated","message":"a valid credential of the buyer is required (Authorization: Bearer <token>)"}"#);
            response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
        Outcome::UserMismatch => static_error(StatusCode::FORBIDDEN, br#"{"error":"user_mismatch","message":"the body's user is not the buyer the credential proves; leave it out"}"#),
    };
    if matches!(
        outcome,
        Outcome::Purchased { replayed: true, .. }
            | Outcome::SoldOut { replayed: true }
            | Outcome::UserLimit { replayed: true }
            | Outcome::TokenInvalid { replayed: true }
    ) {
        response.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// `GET /v1/skus/{sku}`, cacheable for [`STOCK_PAGE_CACHE_CONTROL`], with an ETag over the
/// figures shown: a client that already holds them gets 304 and no body.
fn stock_page(node: &Node, sku: &str, headers: &HeaderMap) -> Response<Body> {
    let metrics = node.metrics();
    let page = SkuId::validate(sku).ok().and_then(|()| node.stock_page(sku));
    let body = match page.map(|page| serde_json::to_vec(&page)) {
        Some(Ok(body)) => body,
        Some(Err(_)) => return error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "could not render the stock page"),
        None => {
            metrics.stock_page_unknown.increment(1);
            return respond(&Outcome::UnknownSku);
        }
    };
    let etag = etag_of(&body);
    let mut response = if if_none_match(headers, &etag) {
        metrics.stock_page_not_modified.increment(1);
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        response
    } else {
        metrics.stock_page_served.increment(1);
        json(StatusCode::OK, Bytes::from(body))
    };
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static(STOCK_PAGE_CACHE_CONTROL));
    if let Ok(value) = HeaderValue::from_str(&etag) {
        response.headers_mut().insert(ETAG, value);
    }
    response
}

/// A strong ETag (quoted) over the page's bytes, so it changes exactly when a figure shown does.
/// FNV-1a, 64 bits: stable across processes and builds, so every node of a fleet tags the same
/// figures alike, and a collision needs two pages of one SKU in a row to hash the same.
fn etag_of(body: &[u8]) -> String {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = body.iter().fold(FNV_OFFSET, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME));
    format!("\"{hash:016x}\"")
}

/// Whether `If-None-Match` names `etag` (or is `*`), by the weak comparison RFC 9110 prescribes
/// for it: a `W/` prefix does not matter.
fn if_none_match(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|list| list.split(','))
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag)
}

fn metrics(node: &Node) -> Response<Body> {
    node.publish_gauges();
    match crate::metrics::prometheus() {
        Some(handle) => {
            let mut response = Response::new(Full::new(Bytes::from(handle.render())));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            response
        }
        None => {
            error(StatusCode::SERVICE_UNAVAILABLE, "metrics_unavailable", "another metrics recorder owns this process")
        }
    }
}

/// 200 when the node can sell, 503 `not_ready` otherwise; both name the ledger circuit
/// breaker's state, so an operator sees at once whether the node is failing purchases fast.
fn ready(node: &Node) -> Response<Body> {
    let breaker = node.ledger_breaker().as_str();
    if node.is_ready() {
        return json(
            StatusCode::OK,
            Bytes::from(serde_json::json!({ "status": "ready", "ledger_breaker": breaker }).to_string()),
        );
    }
    let body = serde_json::json!({
        "error": "not_ready",
        "message": "the ledger is unreachable or lacks a SKU, its circuit breaker is open, the node holds no lease or order-id generator yet, or it is shutting down",
        "ledger_breaker": breaker,
    });
    json(StatusCode::SERVICE_UNAVAILABLE, Bytes::from(body.to_string()))
}

fn too_large(limit: usize) -> Response<Body> {
    error(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", &format!("the request body is larger than {limit} bytes"))
}

pub(crate) fn with_retry_after(mut response: Response<Body>, after: Duration) -> Response<Body> {
    // Retry-After counts whole seconds; round up so a client never comes back early.
    let seconds = after.as_millis().div_ceil(1000).max(1);
    if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
        response.headers_mut().insert(RETRY_AFTER, value);
    }
    response
}

/// The buyer's page and its files are the same for every buyer and change only with a release:
/// a minute in nginx or a CDN spares the nodes the crowd's page loads.
const PAGE_CACHE_CONTROL: &str = "public, max-age=60";

fn static_file(asset: web::Asset, cache_control: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(asset.body)));
    let headers = response.headers_mut();
    for (name, value) in asset.headers() {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static(cache_control));
    response
}

pub(crate) fn json(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn static_error(status: StatusCode, body: &'static [u8]) -> Response<Body> {
    json(status, Bytes::from_static(body))
}

pub(crate) fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    json(status, Bytes::from(serde_json::json!({ "error": code, "message": message }).to_string()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ledger::{EmbeddedLedger, NodeId, SkuTerms};

    use super::*;
    use crate::config::{NodeConfig, SkuConfig};
    use crate::pipeline::NodeOptions;
    use crate::shutdown::Shutdown;

    fn striped_node() -> Node {
        let sku = SkuId::new("hot").unwrap();
        let terms = SkuTerms { stripes: 2, ..SkuTerms::new(4) };
        let config = NodeConfig::new(NodeId::new("n1").unwrap());
        let ledger = Arc::new(EmbeddedLedger::default());
        Node::start(config, vec![SkuConfig::new(sku, terms, 4)], ledger, NodeOptions::default(), Shutdown::new())
    }

    /// Goal: a buyer who names a stripe (`hot/1`) gets a 4xx, never a 500 and never a sale on
    /// the stripe, though the node holds it as a SKU. Method: a node selling a striped SKU;
    /// validate a purchase body naming its stripe, and ask for the stripe's stock page.
    #[tokio::test]
    async fn a_stripe_named_by_a_buyer_is_refused() {
        let node = striped_node();
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("k1"));
        let body = Bytes::from_static(br#"{"sku":"hot/1","user":"alice"}"#);
        assert!(matches!(validate(&node, &headers, &body), Err(Invalid::Request(_))));
        assert_eq!(node.qty_max("hot/1"), None, "a stripe is no SKU to a buyer");
        assert_eq!(stock_page(&node, "hot/1", &HeaderMap::new()).status(), StatusCode::NOT_FOUND);
        assert_eq!(stock_page(&node, "hot", &HeaderMap::new()).status(), StatusCode::OK);
    }

    /// Goal: a buyer on an empty stripe is told to retry (503, `Retry-After: 1`,
    /// `stripe_empty`), never `sold_out`. Method: map both kinds of the outcome.
    fn futures_body(body: Body) -> Bytes {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(body.collect()).unwrap().to_bytes()
    }

    #[test]
    fn stripe_empty_is_a_retry() {
        for key_spent in [false, true] {
            let response = respond(&Outcome::StripeEmpty { key_spent });
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers().get(RETRY_AFTER).unwrap(), "1");
            let body = futures_body(response.into_body());
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["error"], "stripe_empty");
        }
    }
}
