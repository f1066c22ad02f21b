//! The waiting room through real HTTP on real Redis, across two nodes: a purchase needs the
//! ticket the room admits its buyer with (403 `no_ticket` from memory otherwise), a ticket opens
//! only for its buyer and sells once, and a waiter still in line hears "sold out" pushed on its
//! event stream the moment the last unit sells.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use seckill::cluster::Options;

use crate::harness::{cluster_config, get, purchase, request, start_cluster, Answer, RedisServer};

const SKUS: &str = r#"
[[skus]]
id = "phone"
total = 2
waiting_room = { admit_per_s = 100, admit_factor = 1.0, ticket_ttl_s = 30, abandon_s = 10 }
"#;

async fn join(addr: SocketAddr, user: &str) -> Answer {
    let body = format!(r#"{{"user":"{user}"}}"#);
    request(addr, "POST", "/v1/room/phone/join", &[("content-type", "application/json")], body).await
}

async fn buy_with_ticket(addr: SocketAddr, key: &str, user: &str, ticket: &str) -> Answer {
    let body = format!(r#"{{"sku":"phone","user":"{user}","qty":1}}"#);
    let headers = [("idempotency-key", key), ("ticket", ticket), ("content-type", "application/json")];
    request(addr, "POST", "/v1/purchase", &headers, body).await
}

fn expect(answer: &Answer, status: u16, error: &str) {
    assert_eq!((answer.status.as_u16(), answer.error()), (status, error), "{answer:?}");
}

/// Reads the event stream of `waiter` until an event's state is `state`, or fails after `limit`.
async fn stream_until(
    addr: SocketAddr,
    waiter: String,
    state: &'static str,
    limit: Duration,
) -> Vec<serde_json::Value> {
    let mut sender = testkit::load::connect(addr).await.expect("connect to node");
    let path = format!("/v1/room/phone/events?waiter={waiter}");
    let request = Request::get(path).header("host", addr.to_string()).body(Full::new(Bytes::new())).expect("request");
    let response = sender.send_request(request).await.expect("response");
    assert_eq!(response.status(), 200, "the stream opens");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let mut seen = Vec::new();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .unwrap_or_else(|_| panic!("no {state} event within {limit:?}; saw {seen:?}"))
            .expect("the stream stays open")
            .expect("a frame");
        let Ok(data) = frame.into_data() else { continue };
        text.push_str(&String::from_utf8_lossy(&data));
        while let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            if let Some(json) = event.lines().find_map(|line| line.strip_prefix("data: ")) {
                let status: serde_json::Value = serde_json::from_str(json).expect("events carry JSON");
                let done = status["state"] == state;
                seen.push(status);
                if done {
                    return seen;
                }
            }
        }
    }
}

/// Goal: with the room on, the only way to buy is a ticket of one's own, used once, on any node;
/// and a waiter in line is told "sold out" without asking. Method: two nodes on one Redis, a
/// room of 2 units at admit_factor 1.0: ann and bob are admitted at once, cat waits; purchases
/// without, with a borrowed, a forged and a spent ticket; cat's stream while bob buys the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_admits_its_buyer_once_and_waiters_hear_sold_out() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 2, SKUS, "");
    let running = start_cluster(&cluster, Options::default()).await;
    let [n1, n2] = [running.addrs()[0], running.addrs()[1]];

    expect(&purchase(n1, "bare", "phone", "ann", 1).await, 403, "no_ticket");
    let token = request(n1, "POST", "/v1/tokens", &[], r#"{"sku":"phone","user":"ann"}"#).await;
    expect(&token, 403, "no_ticket");
    // The room routes' prefix and suffix overlap on one `/` here: a clear 404, not a dead connection.
    let no_sku =
        request(n1, "POST", "/v1/room/join", &[("content-type", "application/json")], r#"{"user":"ann"}"#).await;
    expect(&no_sku, 404, "unknown_sku");

    let ann = join(n1, "ann").await;
    assert_eq!((ann.status.as_u16(), ann.body["state"].as_str()), (200, Some("admitted")), "{ann:?}");
    let bob = join(n2, "bob").await;
    assert_eq!(bob.body["state"], "admitted", "two units, factor 1.0: two live tickets: {bob:?}");
    let cat = join(n1, "cat").await;
    assert_eq!(cat.body["state"], "waiting", "{cat:?}");
    assert_eq!((cat.body["position"].as_u64(), cat.body["ahead"].as_u64()), (Some(3), Some(0)));
    let again = join(n2, "cat").await;
    assert_eq!(again.body["position"], 3, "joining again keeps the place: {again:?}");

    let ann_ticket = ann.body["ticket"].as_str().expect("an admission carries a ticket").to_string();
    let bob_ticket = bob.body["ticket"].as_str().expect("ticket").to_string();
    expect(&buy_with_ticket(n1, "borrowed", "cat", &ann_ticket).await, 403, "no_ticket");
    let forged = ann_ticket.replacen(|c: char| c.is_ascii_hexdigit(), "0", 1);
    expect(&buy_with_ticket(n1, "forged", "ann", &format!("x{forged}")).await, 403, "no_ticket");
    expect(&buy_with_ticket(n2, "ann-1", "ann", &ann_ticket).await, 200, "");
    expect(&buy_with_ticket(n1, "ann-2", "ann", &ann_ticket).await, 403, "token_invalid");
    let replay = buy_with_ticket(n1, "ann-1", "ann", &ann_ticket).await;
    assert!(replay.status == 200 && replay.replayed(), "the same key replays: {replay:?}");

    let waiter = cat.body["waiter"].as_str().expect("a waiter handle").to_string();
    let bad = request(n1, "GET", "/v1/room/phone/events?waiter=cat.1.00", &[], Bytes::new()).await;
    expect(&bad, 403, "bad_waiter");
    let listening = tokio::spawn(stream_until(n2, waiter, "sold_out", Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    expect(&buy_with_ticket(n1, "bob-1", "bob", &bob_ticket).await, 200, "");
    let events = listening.await.expect("the stream task");
    assert_eq!(
        events.first().map(|e| e["state"].clone()),
        Some("waiting".into()),
        "it opens with the place: {events:?}"
    );

    // The status route shows the node's last tick: up to one tick old.
    crate::harness::eventually("n1's room says sold out", Duration::from_secs(5), || async {
        get(n1, "/v1/room/phone").await.body["state"] == "sold_out"
    })
    .await;
    let room = get(n1, "/v1/room/phone").await;
    assert_eq!(room.body["remaining"], 0, "{room:?}");
    assert_eq!(room.body["admitted"], 2, "no admission beyond the units: {room:?}");
    let late = join(n2, "dan").await;
    assert_eq!(late.body["state"], "sold_out", "a sold-out room takes nobody in: {late:?}");
}

/// Goal: a room SKU created at run time through the admin API sells through its room on every
/// node, and the operator sees the room (line, admissions, live tickets) in `GET
/// /admin/cluster`, read by the page at `/ops`. Method: a one-member coordinator over 3 nodes;
/// create `concert` (2 units, a room) by the admin API; ann joins on one node and buys with her
/// ticket on another; bob waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_created_at_run_time_sells_through_its_room_and_operators_see_it() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let (running, member) = crate::admin::admin_cluster(&redis, &data, "").await;
    let [n1, n2] = [running.addrs()[0], running.addrs()[1]];
    let create =
        r#"{"op":"create","total":2,"buffer":0,"price":100,"waiting_room":{"admit_per_s":100,"admit_factor":1.0}}"#;
    let created = crate::admin::admin(member, "PUT", "/admin/skus/concert", Some(crate::admin::TOKEN), create).await;
    assert_eq!(created.status, 201, "{created:?}");
    let join_concert = |addr: SocketAddr, user: &'static str| async move {
        let body = format!(r#"{{"user":"{user}"}}"#);
        request(addr, "POST", "/v1/room/concert/join", &[("content-type", "application/json")], body).await
    };
    crate::harness::eventually("every node sells concert", Duration::from_secs(10), || async {
        join_concert(n1, "probe").await.status == 200 && join_concert(n2, "probe").await.status == 200
    })
    .await;
    let ann = join_concert(n1, "ann").await;
    let bob = join_concert(n2, "bob").await;
    let ticket = ann.body["ticket"].as_str().unwrap_or_else(|| panic!("ann is admitted: {ann:?}")).to_string();
    assert_eq!(bob.body["state"], "waiting", "two live tickets (probe, ann) for two units: {bob:?}");
    let body = r#"{"sku":"concert","user":"ann","qty":1}"#;
    let headers = [("idempotency-key", "ann-1"), ("ticket", ticket.as_str()), ("content-type", "application/json")];
    let mut bought = request(n2, "POST", "/v1/purchase", &headers, body).await;
    for _ in 0..50 {
        // A node may still wait for its first grant of the new SKU: 503, same key again.
        if bought.status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        bought = request(n2, "POST", "/v1/purchase", &headers, body).await;
    }
    expect(&bought, 200, "");

    let cluster = crate::admin::admin(member, "GET", "/admin/cluster", Some(crate::admin::TOKEN), "").await;
    let room = &cluster.body["skus"]["concert"]["room"];
    assert_eq!((room["admitted"].as_u64(), room["line"].as_u64()), (Some(2), Some(1)), "{room}");
    assert_eq!(room["live_tickets"], 1, "ann's ticket is spent, probe's lives: {room}");
    assert!(cluster.body["skus"]["phone"].get("room").is_none(), "a SKU without a room shows none");
    assert!(cluster.body["skus"]["concert"].get("orders_by_state").is_none(), "no order service: none shown");
    // Purchase requests reach the coordinator in the nodes' heartbeats, for the page's rate.
    crate::harness::eventually("the nodes report concert's purchase requests", Duration::from_secs(10), || async {
        let cluster = crate::admin::admin(member, "GET", "/admin/cluster", Some(crate::admin::TOKEN), "").await;
        let skus = &cluster.body["skus"];
        skus["concert"]["requests_total"].as_u64().is_some_and(|requests| requests >= 1)
            && skus["phone"]["requests_total"] == 0
    })
    .await;
    let ops = get(member, "/ops").await;
    assert_eq!(ops.status, 200);
    assert!(ops.headers["content-type"].to_str().unwrap_or("").starts_with("text/html"), "{ops:?}");
    running.stop().await;
}

/// Calls of `room.lua` Redis has run: each makes one `ZRANGE` (the line's head), and no other
/// script of the ledger does.
fn room_calls(redis: &RedisServer) -> u64 {
    crate::harness::command_calls(redis, "zrange")
}

/// Goal: a crowd's joins on one node go to the ledger together, each still answered with its
/// own place. Method: 300 buyers join one node at once, each on its own connection; every one
/// is placed (admitted or in line, at a position of its own), in far fewer `room.lua` calls than
/// joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_joining_at_once_is_placed_in_few_ledger_calls() {
    const CROWD: usize = 300;
    let redis = RedisServer::start();
    let skus = "[[skus]]\nid = \"phone\"\ntotal = 1000\nwaiting_room = { admit_per_s = 10, admit_factor = 1.0 }\n";
    let cluster = cluster_config(&redis.url(), 1, skus, "");
    let running = start_cluster(&cluster, Options::default()).await;
    let node = running.addrs()[0];
    expect(&join(node, "first").await, 200, "");
    let before = room_calls(&redis);
    let joins: Vec<_> =
        (0..CROWD).map(|i| tokio::spawn(async move { join(node, &format!("buyer-{i}")).await })).collect();
    let mut positions = std::collections::BTreeSet::new();
    let mut admitted = 0;
    for joined in joins {
        let answer = joined.await.expect("a join task");
        match answer.body["state"].as_str() {
            Some("waiting") => assert!(positions.insert(answer.body["position"].as_u64().expect("a position"))),
            Some("admitted") => admitted += 1,
            _ => panic!("every buyer is placed: {answer:?}"),
        }
    }
    assert_eq!(positions.len() + admitted, CROWD, "one place each");
    let calls = room_calls(&redis) - before;
    // The joins, plus the node's ticks (4 a second) while they ran.
    assert!(calls < CROWD as u64 / 3, "{CROWD} joins took {calls} room.lua calls");
    eprintln!("{CROWD} joins: {calls} room.lua calls, {admitted} admitted at once");
    running.stop().await;
}
