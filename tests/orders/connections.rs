//! Issue 23, item 6: "1,400 connections that pipeline requests and never read held all 1,024
//! slots for over a minute; payment callbacks timed out." The whole order service on real Redis
//! and PostgreSQL, its API with few slots so a handful of connections is "all of them"; the
//! abuser is 127.0.0.1, everybody else 127.0.0.2 (`testkit::hogs`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use ledger::SkuId;
use orders::http::ApiLimits;
use orders::signature::{sign, SIGNATURE_HEADER};
use orders::{OrderService, OrderServiceConfig};
use safeguards::client_ip::TrustedProxies;
use safeguards::connections::ConnectionsPerAddress;
use serde_json::{json, Value};
use testkit::hogs::NeverReads;

use crate::harness::*;

const SECRET: &[u8] = b"provider-secret";

/// The abuser's address.
const HOG: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
/// Everybody else: the payment provider, another buyer.
const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// Answered within this or the test fails: generous for a loaded machine; without the fix the
/// wait never ends.
const ANSWER_MAX: Duration = Duration::from_secs(10);

/// A request a hog pipelines: answered from memory, a few hundred bytes.
const PIPELINED: &[u8] = b"GET /health HTTP/1.1\r\nhost: orders\r\n\r\n";

/// The order service with its API bounded by `http`, one SKU, two orders stored.
async fn service_with(env: &Env, sku: &str, http: ApiLimits) -> (OrderService, SocketAddr, SkuId, Vec<Sale>) {
    let terms = terms(10, 1999, 600);
    let sku = env.create(sku, &terms).await;
    let config = OrderServiceConfig { payment_secret: Arc::from(SECRET), http, ..OrderServiceConfig::default() };
    let (service, addr) = start_service(env, &sku, &terms, config).await;
    let sales = sell(&*env.ledger, &sku, "buyer", 2).await;
    assert_one_order_per_sale(env, &sku, &terms, &sales).await;
    (service, addr, sku, sales)
}

/// A signed payment callback for `order` (its full price), sent from `from`: the status and
/// outcome, or why no answer came within [`ANSWER_MAX`].
async fn pay_from(from: IpAddr, addr: SocketAddr, order: &str, reference: &str) -> Result<(u16, Value), String> {
    let body = json!({ "order_id": order, "reference": reference, "amount": 1999, "currency": "USD" }).to_string();
    let signature = sign(SECRET, orders::unix_ms() / 1000, body.as_bytes());
    let request = hyper::Request::post("/v1/payments/callback")
        .header("host", addr.to_string())
        .header(SIGNATURE_HEADER, signature)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    send_from(from, addr, request).await
}

async fn health_from(from: IpAddr, addr: SocketAddr) -> Result<(u16, Value), String> {
    let request = hyper::Request::get("/health")
        .header("host", addr.to_string())
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    send_from(from, addr, request).await
}

async fn send_from(
    from: IpAddr,
    addr: SocketAddr,
    request: hyper::Request<Full<Bytes>>,
) -> Result<(u16, Value), String> {
    let work = async {
        let mut sender = testkit::hogs::http_from(from, addr).await?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    };
    match tokio::time::timeout(ANSWER_MAX, work).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(format!("no answer: {e}")),
        Err(_) => Err(format!("no answer within {ANSWER_MAX:?}")),
    }
}

/// `count` clients from [`HOG`] that pipeline requests and never read, started together.
async fn hogs(addr: SocketAddr, count: usize) -> Vec<NeverReads> {
    let started: Vec<_> =
        (0..count).map(|_| tokio::spawn(async move { NeverReads::start(HOG, addr, PIPELINED).await })).collect();
    let mut hogs = Vec::new();
    for hog in started {
        hogs.push(hog.await.expect("hog task").expect("a hog connects and pipelines"));
    }
    hogs
}

/// Goal: one address cannot take every connection slot of the order API, so a payment callback
/// from another address is answered while it tries. Method: 16 slots, at most 4 per address,
/// and a write timeout far beyond the test, so only the per-address bound can free anything;
/// 24 connections from one address (more than every slot) pipeline requests and never read;
/// then a signed callback from another address pays an order within a generous deadline. On
/// the old server the 16 slots stay held and the callback is never answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_address_that_never_reads_cannot_take_every_slot() {
    let env = Env::start().await;
    let http = ApiLimits {
        connections_max: 16,
        // Loopback is exempt in production (it is where a local nginx connects from); here it
        // plays the clients.
        connections_per_address: ConnectionsPerAddress {
            exempt: TrustedProxies::default(),
            ..ConnectionsPerAddress::new(4)
        },
        write_timeout: Duration::from_secs(600),
    };
    let (service, addr, _sku, sales) = service_with(&env, "sku_c.1", http).await;

    let mut hogs = hogs(addr, 24).await;
    let (status, body) = pay_from(OTHER, addr, &sales[0].order_id, "pay-1").await.expect("the callback is answered");
    assert_eq!((status, body["outcome"].as_str()), (200, Some("paid")), "{body}");

    let mut open = 0;
    for hog in &mut hogs {
        if !hog.closed_by_server(Duration::from_secs(2)).await {
            open += 1;
        }
    }
    assert_eq!(open, 4, "the address keeps exactly its 4 connections; the other 20 were closed at once");
    assert!(health_from(HOG, addr).await.is_err(), "a fifth connection from the full address is closed");
    assert_eq!(health_from(OTHER, addr).await.map(|(status, _)| status), Ok(200), "others are still served");

    // The address's places come back when its connections end.
    drop(hogs);
    eventually(ANSWER_MAX, "the address is served again once its connections closed", || async {
        health_from(HOG, addr).await.map(|_| ())
    })
    .await;
    service.stop().await;
}

/// Goal: clients that pipeline requests and never read the answers are cut off after the write
/// timeout, so even from many addresses they cannot hold the API's slots. Method: 8 slots, no
/// per-address bound (as if each hog had an address of its own), a 500 ms write timeout; 12
/// hogs (more than every slot) back the server up; a signed callback must then be answered
/// within a generous deadline. On the old server (no write timeout) it waits forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_never_read_are_cut_off_after_the_write_timeout() {
    let env = Env::start().await;
    let http = ApiLimits {
        connections_max: 8,
        connections_per_address: ConnectionsPerAddress::off(),
        write_timeout: Duration::from_millis(500),
    };
    let (service, addr, _sku, sales) = service_with(&env, "sku_c.2", http).await;

    let hogs = hogs(addr, 12).await;
    let (status, body) = pay_from(OTHER, addr, &sales[0].order_id, "pay-1").await.expect("the callback is answered");
    assert_eq!((status, body["outcome"].as_str()), (200, Some("paid")), "{body}");
    let (status, _) = health_from(HOG, addr).await.expect("the hogs' own address is served too: no per-address bound");
    assert_eq!(status, 200);
    drop(hogs);
    service.stop().await;
}
