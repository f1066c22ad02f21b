//! The HTTP contract of docs/http-api.md, request by request: every documented status and error
//! code comes out of a real request, and malformed input is refused without touching stock.
//! (`in_progress` and 503 need a stalled or dead Redis; they are in `faults`.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use node::{Admission, Caller, Gate};
use seckill::cluster::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{cluster_config, get, purchase, request, start_cluster, Answer, RedisServer};

/// The admission seam with fixed rules, standing in for the rate limiter and blacklist that
/// plug in there: it lets the test drive the 403 `blocked` and 429 mapping through real HTTP.
struct FixedRules;

impl Gate for FixedRules {
    fn admit(&self, caller: Caller<'_>) -> Admission {
        match caller.user {
            "mallory" => Admission::Blocked,
            "flood" => {
                Admission::RateLimited { retry_after: Duration::from_millis(1500), reason: node::Reason::UserRate }
            }
            _ => Admission::Admit,
        }
    }
}

const SKUS: &str = r#"
[[skus]]
id = "open"
total = 100
per_user_limit = 1

[[skus]]
id = "single"
total = 1
buffer = 0

[[skus]]
id = "pair"
total = 10
qty_max = 2

[[skus]]
id = "later"
total = 10
starts_at = 2099-01-01T00:00:00Z

[[skus]]
id = "over"
total = 10
starts_at = 2000-01-01T00:00:00Z
ends_at = 2001-01-01T00:00:00Z
"#;

fn expect(answer: &Answer, status: u16, error: &str) {
    assert_eq!((answer.status.as_u16(), answer.error()), (status, error), "{answer:?}");
    if status >= 400 {
        assert!(
            answer.body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "errors carry a human message: {answer:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_outcome_comes_from_a_real_request() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 1, SKUS, "");
    let running = start_cluster(&cluster, Options { gate: Some(Arc::new(FixedRules)), ..Options::default() }).await;
    let addr = running.addrs()[0];

    let bought = purchase(addr, "k1", "open", "alice", 1).await;
    expect(&bought, 200, "");
    assert_eq!(bought.body["result"], "purchased");
    assert_eq!(bought.body["sku"], "open");
    assert_eq!(bought.body["qty"], 1);
    assert_eq!(bought.body["node"], "n1");
    assert!(bought.body["order_id"].as_str().is_some_and(|id| !id.is_empty()));
    assert!(!bought.replayed());

    let replay = purchase(addr, "k1", "open", "alice", 1).await;
    expect(&replay, 200, "");
    assert!(replay.replayed(), "a replay carries Idempotent-Replayed: true");
    assert_eq!(replay.raw, bought.raw);

    expect(&purchase(addr, "k1", "open", "alice", 2).await, 400, "bad_request");
    // A key is its buyer's: bob's purchase under alice's key is his own.
    let bobs = purchase(addr, "k1", "open", "bob", 1).await;
    expect(&bobs, 200, "");
    assert_ne!(bobs.body["order_id"], bought.body["order_id"], "another buyer, another order");
    expect(&purchase(addr, "p1", "pair", "alice", 1).await, 200, "");
    expect(&purchase(addr, "p1", "pair", "alice", 2).await, 422, "key_reused");
    expect(&purchase(addr, "k2", "open", "alice", 1).await, 409, "user_limit");
    let limit_replay = purchase(addr, "k2", "open", "alice", 1).await;
    expect(&limit_replay, 409, "user_limit");
    assert!(limit_replay.replayed(), "stored refusals replay too");

    expect(&purchase(addr, "s1", "single", "carol", 1).await, 200, "");
    expect(&purchase(addr, "s2", "single", "dave", 1).await, 409, "sold_out");

    expect(&purchase(addr, "w1", "later", "erin", 1).await, 403, "not_started");
    expect(&purchase(addr, "w2", "over", "erin", 1).await, 403, "ended");
    expect(&purchase(addr, "b1", "open", "mallory", 1).await, 403, "blocked");
    let limited = purchase(addr, "r1", "open", "flood", 1).await;
    expect(&limited, 429, "rate_limited");
    assert_eq!(
        limited.headers.get("retry-after").map(|v| v.to_str().unwrap()),
        Some("2"),
        "Retry-After rounds up to whole seconds"
    );
    expect(&purchase(addr, "u1", "no-such-sku", "erin", 1).await, 404, "unknown_sku");

    let page = get(addr, "/v1/skus/open").await;
    assert_eq!(page.status, 200);
    for field in ["sku", "total", "sold", "remaining", "local_remaining", "sold_out"] {
        assert!(page.body.get(field).is_some(), "stock page lacks {field}: {page:?}");
    }
    assert_eq!((page.body["total"].as_u64(), page.body["sold"].as_u64()), (Some(100), Some(2)));
    expect(&get(addr, "/v1/skus/nope").await, 404, "unknown_sku");
    assert_eq!(get(addr, "/health").await.status, 200);
    assert_eq!(get(addr, "/ready").await.status, 200);

    let metrics = get(addr, "/metrics").await;
    let text = String::from_utf8_lossy(&metrics.raw);
    for series in [
        r#"seckill_purchase_requests_total{node="n1",outcome="purchased"}"#,
        r#"seckill_decisions_total{node="n1",by="local"}"#,
        "seckill_ledger_call_seconds_bucket",
        "seckill_ledger_batch_size_bucket",
        r#"seckill_local_remaining{node="n1",sku="open"}"#,
    ] {
        assert!(text.contains(series), "/metrics lacks {series}:\n{text}");
    }
    running.stop().await;
}

/// Sends raw bytes and returns the status code of the answer (0 if the connection closed
/// without one). For requests a well-behaved client cannot produce.
async fn raw_status(addr: SocketAddr, head: &str, body_bytes: usize, chunked: bool) -> u16 {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < body_bytes {
        let piece = &chunk[..chunk.len().min(body_bytes - sent)];
        // The server may answer and close before the body is done; that is the point.
        let written = if chunked {
            let framed = [format!("{:x}\r\n", piece.len()).as_bytes(), piece, b"\r\n"].concat();
            stream.write_all(&framed).await
        } else {
            stream.write_all(piece).await
        };
        if written.is_err() {
            break;
        }
        sent += piece.len();
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

/// Goal: malformed input gets the documented 4xx, changes no stock, and leaves the server
/// serving. Method: a battery of bad requests, then compare the stock page and buy once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_is_refused_and_changes_nothing() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 1, "[[skus]]\nid = \"shoe\"\ntotal = 50\nqty_max = 5", "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];
    let before = get(addr, "/v1/skus/shoe").await.body;

    let post = |key: &'static str, body: &'static str| async move {
        let headers: Vec<(&str, &str)> = if key.is_empty() { vec![] } else { vec![("idempotency-key", key)] };
        request(addr, "POST", "/v1/purchase", &headers, Bytes::from_static(body.as_bytes())).await
    };
    expect(&post("k", r#"{"sku": "shoe", "user": "#).await, 400, "bad_request");
    expect(&post("k", "").await, 400, "bad_request");
    expect(&post("k", "[1, 2]").await, 400, "bad_request");
    expect(&post("k", r#"{"user": "u"}"#).await, 400, "bad_request");
    expect(&post("k", r#"{"sku": "shoe"}"#).await, 400, "bad_request");
    expect(&post("", r#"{"sku": "shoe", "user": "u", "qty": 1}"#).await, 400, "bad_request");
    for qty in ["0", "-1", "6", "4294967297", "1e30", "\"1\"", "1.5", "null"] {
        let body: &'static str = Box::leak(format!(r#"{{"sku": "shoe", "user": "u", "qty": {qty}}}"#).into_boxed_str());
        expect(&post("k", body).await, 400, "bad_request");
    }
    expect(&post("k", r#"{"sku": "no{such}", "user": "u"}"#).await, 400, "bad_request");
    expect(&post("k", r#"{"sku": "missing", "user": "u", "qty": 1}"#).await, 404, "unknown_sku");
    let long_key = "k".repeat(10 * 1024);
    let answer =
        request(addr, "POST", "/v1/purchase", &[("idempotency-key", &long_key)], r#"{"sku":"shoe","user":"u"}"#).await;
    expect(&answer, 400, "bad_request");
    expect(&request(addr, "GET", "/v1/purchase", &[], Bytes::new()).await, 405, "method_not_allowed");
    expect(&get(addr, "/v2/anything").await, 404, "not_found");

    let ten_mb = 10 * 1024 * 1024;
    let head =
        format!("POST /v1/purchase HTTP/1.1\r\nhost: x\r\nidempotency-key: big\r\ncontent-length: {ten_mb}\r\n\r\n");
    assert_eq!(raw_status(addr, &head, ten_mb, false).await, 413, "a declared 10 MB body is refused up front");
    let head = "POST /v1/purchase HTTP/1.1\r\nhost: x\r\nidempotency-key: big\r\ntransfer-encoding: chunked\r\n\r\n";
    assert_eq!(raw_status(addr, head, ten_mb, true).await, 413, "a streamed 10 MB body is cut off at the limit");
    let garbage = raw_status(addr, "BREW /pot HTCPCP/1.0 \x01\x02\r\n\r\n", 0, false).await;
    assert!(garbage == 400 || garbage == 0, "garbage gets 400 or a closed connection, got {garbage}");

    let after = get(addr, "/v1/skus/shoe").await.body;
    assert_eq!(after, before, "no bad request changed the stock");
    assert_eq!(get(addr, "/health").await.status, 200);
    let bought = purchase(addr, "good", "shoe", "u", 5).await;
    assert_eq!(bought.status, 200, "the node still sells: {bought:?}");
    // Clients that escape non-ASCII (Python's json.dumps does) are served like any other.
    let escaped =
        request(addr, "POST", "/v1/purchase", &[("idempotency-key", "esc")], r#"{"sku":"shoe","user":"名"}"#).await;
    assert_eq!(escaped.status, 200, "{escaped:?}");
    running.stop().await;
}

/// Goal: the stock page may be cached for a second and revalidated by its ETag: a client that
/// names the current figures gets 304 without a body, and a new figure changes the ETag.
/// Method: one node; the page's headers, `If-None-Match` with the ETag (plain, weak, in a list,
/// `*`) and with another, then a sale and the old ETag again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stock_page_is_cacheable_and_answers_304_to_its_etag() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 1, "[[skus]]\nid = \"lamp\"\ntotal = 5\nbuffer = 0", "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];
    let header = |answer: &Answer, name: &str| {
        answer.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
    };
    let conditional = |tag: String| async move {
        request(addr, "GET", "/v1/skus/lamp", &[("if-none-match", tag.as_str())], Bytes::new()).await
    };

    let page = get(addr, "/v1/skus/lamp").await;
    assert_eq!(page.status, 200);
    assert_eq!(header(&page, "cache-control"), "public, max-age=1");
    let etag = header(&page, "etag");
    assert!(etag.len() > 2 && etag.starts_with('"') && etag.ends_with('"'), "a strong, quoted ETag: {etag:?}");
    assert_eq!(header(&get(addr, "/v1/skus/lamp").await, "etag"), etag, "the same figures, the same ETag");

    for tag in [etag.clone(), format!("W/{etag}"), format!("\"other\", {etag}"), "*".to_string()] {
        let answer = conditional(tag.clone()).await;
        assert_eq!(answer.status, 304, "If-None-Match: {tag} names the current page: {answer:?}");
        assert!(answer.raw.is_empty(), "304 carries no body");
        assert_eq!(header(&answer, "etag"), etag, "304 repeats the ETag");
        assert_eq!(header(&answer, "cache-control"), "public, max-age=1", "and the freshness");
    }
    let other = conditional("\"0000000000000000\"".to_string()).await;
    assert_eq!((other.status.as_u16(), other.body["sku"].as_str()), (200, Some("lamp")), "{other:?}");

    assert_eq!(purchase(addr, "k", "lamp", "u", 1).await.status, 200);
    let after = conditional(etag.clone()).await;
    assert_eq!(after.status, 200, "a sale changed the figures, so the old ETag is stale: {after:?}");
    assert_ne!(header(&after, "etag"), etag);
    assert_eq!(after.body["sold"], 1);

    let missing = request(addr, "GET", "/v1/skus/none", &[("if-none-match", "*")], Bytes::new()).await;
    expect(&missing, 404, "unknown_sku");

    let metrics = String::from_utf8_lossy(&get(addr, "/metrics").await.raw).to_string();
    for outcome in ["page", "not_modified", "unknown_sku"] {
        let series = format!(r#"seckill_stock_page_requests_total{{node="n1",outcome="{outcome}"}}"#);
        assert!(metrics.contains(&series), "/metrics counts stock pages: {series} missing");
    }
    running.stop().await;
}
