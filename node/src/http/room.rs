//! The room's routes: `GET /v1/room/{sku}` (its figures, for the page's clock and the operator),
//! `POST /v1/room/{sku}/join` (a buyer's place and waiter handle) and
//! `GET /v1/room/{sku}/events?waiter=…` (server-sent events: the waiter's place pushed as it
//! changes; an open stream is the waiter's heartbeat).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use ledger::{SkuId, UserId};
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

use super::{bad_request, buyer, client_ip, error, json, read_purchase, respond, with_retry_after, Body};
use crate::outcome::Outcome;
use crate::pipeline::Node;
use crate::room::fresh_seed;
use crate::room::hub::Hub;
use crate::room::waiter::WaiterStatus;

/// A comment line this often keeps proxies (nginx's `proxy_read_timeout`, 60 s by default) from
/// closing a quiet stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Statuses a slow reader may lag behind: only the latest matters, so a full channel skips.
const STREAM_BUFFER: usize = 4;

#[derive(Deserialize)]
struct JoinBody {
    #[serde(default)]
    user: Option<String>,
}

/// Why a path names no room.
enum NoRoom {
    UnknownSku,
    SellsDirectly,
}

impl NoRoom {
    fn answer(&self) -> Response<Body> {
        match self {
            NoRoom::UnknownSku => respond(&Outcome::UnknownSku),
            NoRoom::SellsDirectly => {
                error(StatusCode::NOT_FOUND, "no_room", "this SKU sells without a waiting room; buy it directly")
            }
        }
    }
}

/// The SKU's room, if the path names a SKU with one.
fn room_of(node: &Node, sku: &str) -> Result<Arc<Hub>, NoRoom> {
    if SkuId::validate(sku).is_err() {
        return Err(NoRoom::UnknownSku);
    }
    let found = node.buyer_sku(sku).ok_or(NoRoom::UnknownSku)?;
    node.room_hub(&found).ok_or(NoRoom::SellsDirectly)
}

fn unavailable(reason: &str) -> Response<Body> {
    with_retry_after(error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", reason), Duration::from_secs(1))
}

/// `GET /v1/room/{sku}`: the room's figures and the server's clock (for the page's countdown).
pub async fn status(node: &Node, sku: &str) -> Response<Body> {
    let hub = match room_of(node, sku) {
        Ok(hub) => hub,
        Err(no_room) => return no_room.answer(),
    };
    let snapshot = match hub.snapshot() {
        Some(snapshot) => snapshot,
        None => match node.ledger().room_tick(hub.sku(), hub.call(&fresh_seed()), &[]).await {
            Ok(view) => hub.observe(&view.figures),
            Err(e) => return unavailable(&format!("the room could not be read: {e}")),
        },
    };
    let figures = &snapshot.figures;
    let now = node.clock().now_unix_ms();
    let state = hub.shut_state(figures, now).unwrap_or("open");
    let body = serde_json::json!({
        "sku": hub.sku(),
        "state": state,
        "starts_at_ms": hub.starts_at_ms(),
        "server_ms": now,
        "remaining": figures.remaining,
        "line": figures.waiting,
        "admitted": figures.admitted,
        "live_tickets": figures.live,
        "admit_rate": snapshot.rate,
        "admit_per_s": hub.rules().admit_per_s,
        "draw": figures.draw.as_ref().map(|draw| serde_json::json!({
            "seed": draw.seed, "at_ms": draw.at_ms, "placed": draw.placed,
        })),
    });
    let mut response = json(StatusCode::OK, Bytes::from(body.to_string()));
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `POST /v1/room/{sku}/join` with `{"user"}` (or the buyer's credential): the buyer's place,
/// kept if it already has one.
pub async fn join(node: &Node, sku: &str, request: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    let hub = match room_of(node, sku) {
        Ok(hub) => hub,
        Err(no_room) => return no_room.answer(),
    };
    let (headers, body) = match read_purchase(node, request).await {
        Ok(read) => read,
        Err(rejection) => return rejection,
    };
    let claimed = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice::<JoinBody>(&body) {
            Ok(parsed) => parsed.user,
            Err(e) => return bad_request(&format!("the body is not a valid join: {e}")),
        }
    };
    if let Some(user) = &claimed {
        if let Err(e) = UserId::validate(user) {
            return bad_request(&e.to_string());
        }
    }
    let user = match buyer(node, &headers, claimed.as_deref()) {
        Ok(user) => user,
        Err(refusal) => return respond(&refusal),
    };
    let caller = crate::gate::Caller { sku: hub.sku().as_str(), user: &user, ip: client_ip(node, &headers, peer) };
    if let Some(refused) = node.refused_by_gate(node.gate().admit(caller)) {
        return respond(&refused);
    }
    let Ok(user) = UserId::new(&user) else { return bad_request("the user is not a valid id") };
    match hub.join(user.clone()).await {
        Ok((place, snapshot)) => {
            let status = hub.status(&user, &place, &snapshot);
            hub.joined(&user, &place, &snapshot.figures, status.clone(), Instant::now());
            match serde_json::to_vec(&status) {
                Ok(body) => json(StatusCode::OK, Bytes::from(body)),
                Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "could not render the place"),
            }
        }
        Err(e) => unavailable(&format!("the room could not be joined: {e}")),
    }
}

/// The body of an event stream: what the waiter's task writes, as it comes.
pub struct EventStream {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// Either a plain answer or an event stream: what the node's server sends.
pub type AnyBody = http_body_util::Either<Full<Bytes>, EventStream>;

/// `GET /v1/room/{sku}/events?waiter=…`.
pub fn events(node: &Node, sku: &str, query: Option<&str>) -> Response<AnyBody> {
    let plain = |response: Response<Body>| response.map(http_body_util::Either::Left);
    let hub = match room_of(node, sku) {
        Ok(hub) => hub,
        Err(no_room) => return plain(no_room.answer()),
    };
    let handle = query.and_then(|query| query_value(query, "waiter"));
    let now = node.clock().now_unix_ms();
    let Some(user) = handle.as_deref().and_then(|handle| hub.key().waiter_of(hub.sku().as_str(), handle, now)) else {
        return plain(error(
            StatusCode::FORBIDDEN,
            "bad_waiter",
            "the waiter handle is missing, expired or not this SKU's: join again (POST /v1/room/{sku}/join)",
        ));
    };
    let Ok(user) = UserId::new(user) else { return plain(bad_request("the waiter names no valid user")) };
    let Some(statuses) = hub.subscribe(&user) else {
        return plain(error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the room's waiters are unavailable"));
    };
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(forward(statuses, tx, node.shutdown_signal().clone()));
    let mut response = Response::new(http_body_util::Either::Right(EventStream { rx }));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // nginx would otherwise buffer the stream and deliver events late.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// Writes each new status of one waiter to its stream until the client goes or the node stops.
async fn forward(
    mut statuses: watch::Receiver<Option<WaiterStatus>>,
    tx: mpsc::Sender<Bytes>,
    shutdown: crate::shutdown::Shutdown,
) {
    // A retry hint for EventSource, then the current status if there is one.
    if tx.send(Bytes::from_static(b"retry: 1000\n\n")).await.is_err() {
        return;
    }
    let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
    keep_alive.tick().await;
    let mut first = true;
    loop {
        let chunk = if first {
            first = false;
            statuses.borrow_and_update().as_ref().map(event)
        } else {
            tokio::select! {
                changed = statuses.changed() => match changed {
                    Ok(()) => statuses.borrow_and_update().as_ref().map(event),
                    Err(_) => return,
                },
                _ = keep_alive.tick() => Some(Bytes::from_static(b": keep-alive\n\n")),
                () = shutdown.wait() => return,
            }
        };
        if let Some(chunk) = chunk {
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
    }
}

fn event(status: &WaiterStatus) -> Bytes {
    let data = serde_json::to_string(status).unwrap_or_else(|_| "{}".to_string());
    Bytes::from(format!("event: status\ndata: {data}\n\n"))
}

/// The value of `name` in a query string, %-decoded.
fn query_value(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == name).then(|| protocol::percent::percent_decode(value)).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_value_is_found_and_decoded() {
        assert_eq!(query_value("a=1&waiter=ann%3A1.5.ff", "waiter").as_deref(), Some("ann:1.5.ff"));
        assert_eq!(query_value("waiter=%zz", "waiter"), None);
        assert_eq!(query_value("other=1", "waiter"), None);
    }
}
