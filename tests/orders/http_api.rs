//! The order service's HTTP API, started whole (`OrderService`) on real Redis and PostgreSQL:
//! what buyers read and cancel, and the payment provider's signed notifications, where every
//! refusal gets its 4xx and changes nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use orders::signature::{sign, SIGNATURE_HEADER};
use orders::{OrderServiceConfig, OrderState};
use serde_json::{json, Value};

use crate::harness::*;

const SECRET: &[u8] = b"provider-secret";

/// One call on a fresh connection: the status and the body as JSON (null if it is not).
async fn call(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, String)], body: Vec<u8>) -> (u16, Value) {
    let work = async {
        let mut sender = testkit::load::connect(addr).await?;
        let mut request = hyper::Request::builder().method(method).uri(path).header("host", addr.to_string());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let response = sender.send_request(request.body(Full::new(Bytes::from(body)))?).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    };
    tokio::time::timeout(Duration::from_secs(5), work).await.expect("an answer within 5 s").expect("the call")
}

async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    call(addr, "GET", path, &[], Vec::new()).await
}

async fn cancel(addr: SocketAddr, id: &str, user: &str) -> (u16, Value) {
    call(addr, "POST", &format!("/v1/orders/{id}/cancel"), &[], json!({ "user": user }).to_string().into_bytes()).await
}

/// A payment notification for `body`, signed with `secret` at `t` (Unix seconds).
async fn notify(addr: SocketAddr, body: &[u8], secret: &[u8], t: u64) -> (u16, Value) {
    let headers = [(SIGNATURE_HEADER, sign(secret, t, body)), ("content-type", "application/json".to_string())];
    call(addr, "POST", "/v1/payments/callback", &headers, body.to_vec()).await
}

fn now_s() -> u64 {
    orders::unix_ms() / 1000
}

fn payment(order: &str, reference: &str, amount: u64, currency: &str) -> Vec<u8> {
    json!({ "order_id": order, "reference": reference, "amount": amount, "currency": currency })
        .to_string()
        .into_bytes()
}

/// Goal: every route answers as docs/http-api.md says, and every refused notification leaves
/// the order as it was; method: a whole OrderService (consumer, sweeper, API) on a free port.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_http_api_answers_and_refusals_change_nothing() {
    let env = Env::start().await;
    let terms = terms(100, 1999, 600);
    let sku = env.create("sku_h.1", &terms).await;
    let config = OrderServiceConfig { payment_secret: Arc::from(SECRET), ..OrderServiceConfig::default() };
    let (service, addr) = start_service(&env, &sku, &terms, config).await;
    let sales = sell(&*env.ledger, &sku, "buyer", 6).await;
    assert_one_order_per_sale(&env, &sku, &terms, &sales).await;
    let (a, b, c, d) = (&sales[0], &sales[1], &sales[2], &sales[3]);
    let state = |id: &str| {
        let store = env.store.clone();
        let id = id.to_string();
        async move { store.get(&id).await.expect("get").expect("order") }
    };

    // Reading.
    let (status, body) = get(addr, &format!("/v1/orders/{}", a.order_id)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["id"].as_str(), body["state"].as_str()), (Some(a.order_id.as_str()), Some("pending_payment")));
    assert_eq!((body["user"].as_str(), body["unit_price"].as_u64()), (Some(a.user.as_str()), Some(1999)));
    assert_eq!(get(addr, "/v1/orders/sku-h-999").await.0, 404);
    assert_eq!(get(addr, "/v1/orders/bad!id").await.0, 400);
    let (status, body) = get(addr, &format!("/v1/users/{}/orders", b.user)).await;
    assert_eq!(status, 200, "{body}");
    let listed: Vec<&str> =
        body["orders"].as_array().expect("orders").iter().filter_map(|o| o["id"].as_str()).collect();
    assert_eq!(listed, vec![b.order_id.as_str()]);
    assert_eq!(get(addr, "/v1/users/nobody/orders").await.1["orders"], json!([]));
    let (status, body) = get(addr, "/v1/users/ann%20smith/orders").await;
    assert_eq!((status, body["user"].as_str()), (200, Some("ann smith")), "the path is percent-decoded: {body}");
    assert_eq!(get(addr, "/v1/users/ann%2/orders").await.0, 400, "a malformed escape");
    assert_eq!(get(addr, &format!("/v1/users/{}/orders?limit=0", b.user)).await.0, 400);

    // Cancelling: only the owner, once; the unit goes back through the sweeper.
    let (status, body) = cancel(addr, &b.order_id, &a.user).await;
    assert_eq!(status, 404, "another user's cancel: {body}");
    assert_eq!(state(&b.order_id).await.state, OrderState::PendingPayment);
    let (status, body) = cancel(addr, &b.order_id, &b.user).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("cancelled")), "{body}");
    let (status, body) = cancel(addr, &b.order_id, &b.user).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("already_cancelled")), "{body}");
    assert_eq!(call(addr, "POST", &format!("/v1/orders/{}/cancel", c.order_id), &[], b"{".to_vec()).await.0, 400);
    let ledger = env.ledger.clone();
    let sku_ = sku.clone();
    eventually(SETTLE, "the cancelled unit goes back", || {
        let (ledger, sku) = (ledger.clone(), sku_.clone());
        async move {
            match ledger.status(&sku).await.map_err(|e| e.to_string())?.released {
                1 => Ok(()),
                n => Err(format!("{n} released")),
            }
        }
    })
    .await;

    // Payments: every refusal first, each checked to change nothing.
    let amount = 1999;
    let currency = terms.currency.clone();
    let good = payment(&a.order_id, "pay-a", amount, &currency);
    let (status, body) = notify(addr, &good, b"not-the-secret", now_s()).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("bad_signature")), "{body}");
    let (status, _) =
        call(addr, "POST", "/v1/payments/callback", &[("content-type", "application/json".into())], good.clone()).await;
    assert_eq!(status, 401, "no signature");
    assert_eq!(notify(addr, &good, SECRET, now_s() - 3600).await.0, 401, "stale timestamp");
    assert_eq!(notify(addr, b"{\"order_id\": ", SECRET, now_s()).await.0, 400, "malformed JSON");
    assert_eq!(notify(addr, &payment("bad!id", "pay-y", amount, &currency), SECRET, now_s()).await.0, 400);
    // An amount the store cannot hold is refused for good (400), not "retry" (503) forever.
    let (status, body) = notify(addr, &payment(&a.order_id, "pay-z", u64::MAX, &currency), SECRET, now_s()).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_body")), "{body}");
    let untouched = state(&a.order_id).await;
    assert_eq!(
        (untouched.state, untouched.payment_ref, untouched.paid_at_ms),
        (OrderState::PendingPayment, None, None)
    );

    // A validly signed payment is recorded whatever it says (issue 23: a mismatch recorded
    // nothing, and a payment for an order not stored yet got a final 404). A wrong amount or
    // currency owes a refund and leaves the order pending.
    for (reference, paid, paid_in) in [("pay-short", amount - 1, currency.as_str()), ("pay-xxx", amount, "XXX")] {
        let (status, body) = notify(addr, &payment(&a.order_id, reference, paid, paid_in), SECRET, now_s()).await;
        assert_eq!(
            (status, body["outcome"].as_str(), body["refund_owed"].as_bool()),
            (200, Some("mismatch"), Some(true)),
            "{body}"
        );
    }
    assert_eq!(state(&a.order_id).await.state, OrderState::PendingPayment, "a mismatch settles nothing");
    let owed = env.store.payments_of(&a.order_id).await.expect("payments");
    assert_eq!(owed.iter().filter(|p| p.refund == Some(orders::RefundState::Owed)).count(), 2, "{owed:?}");
    // A payment for the next sale's order, before the sale: accepted (202), then applied when
    // the consumer stores the order.
    let next_order = format!("{sku}-7");
    let (status, body) = notify(addr, &payment(&next_order, "pay-early", amount, &currency), SECRET, now_s()).await;
    assert_eq!((status, body["outcome"].as_str()), (202, Some("awaiting_order")), "{body}");
    let early_sale = sell(&*env.ledger, &sku, "early", 1).await;
    assert_eq!(early_sale[0].order_id, next_order);
    let store = env.store.clone();
    eventually(SETTLE, "the early payment settles its order when it arrives", || {
        let (store, id) = (store.clone(), next_order.clone());
        async move {
            match store.get(&id).await.map_err(|e| e.to_string())? {
                Some(order) if order.state == OrderState::Paid && order.payment_ref.as_deref() == Some("pay-early") => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    // The good one, after the refusals that carried the same reference: nothing of theirs stuck.
    let (status, body) = notify(addr, &good, SECRET, now_s()).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("paid")), "{body}");
    let paid = state(&a.order_id).await;
    assert_eq!((paid.state, paid.payment_ref.as_deref()), (OrderState::Paid, Some("pay-a")));
    let (status, body) = notify(addr, &good, SECRET, now_s()).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("duplicate")), "{body}");
    assert_eq!(state(&a.order_id).await, paid, "a duplicate changes nothing");
    let (status, body) = notify(addr, &payment(&d.order_id, "pay-a", amount, &currency), SECRET, now_s()).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("reference_reused")), "{body}");
    assert_eq!(state(&d.order_id).await.state, OrderState::PendingPayment);
    // A paid order can no longer be cancelled; a cancelled one paid is paid after expiry.
    assert_eq!(cancel(addr, &a.order_id, &a.user).await.0, 409);
    let (status, body) = notify(addr, &payment(&b.order_id, "pay-b", amount, &currency), SECRET, now_s()).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("paid_after_expiry")), "{body}");

    service.stop().await;
    assert_eq!(env.ledger.status(&sku).await.expect("status").released, 1, "the cancelled unit went back once");
    assert_reconciled(&env, &sku).await;
}

/// Goal: a stuck store ends in an answer, not a hang: with PostgreSQL frozen (SIGSTOP, its
/// connections open), reads, buyer actions and the provider's callbacks answer 503 with
/// `Retry-After` within 2 s, below nginx's 5 s read timeout and the provider's 5 s callback
/// timeout (issue 35: 66 of 67 reads through nginx got 504, a callback no answer in 10 s); once
/// it thaws, the same calls succeed. Method: a whole OrderService; timed answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_store_is_answered_503_within_two_seconds() {
    let env = Env::start().await;
    let terms = terms(10, 1999, 600);
    let sku = env.create("sku_frozen.1", &terms).await;
    let config = OrderServiceConfig { payment_secret: Arc::from(SECRET), ..OrderServiceConfig::default() };
    let (service, addr) = start_service(&env, &sku, &terms, config).await;
    let sales = sell(&*env.ledger, &sku, "buyer", 2).await;
    assert_one_order_per_sale(&env, &sku, &terms, &sales).await;
    let order = &sales[0];
    let path = format!("/v1/orders/{}", order.order_id);
    let good = payment(&order.order_id, "pay-frozen", 1999, &terms.currency);

    env.postgres.freeze();
    let mut answers = Vec::new();
    for round in 0..2 {
        for what in ["read", "cancel", "callback"] {
            let started = std::time::Instant::now();
            let (status, body) = match what {
                "read" => get(addr, &path).await,
                "cancel" => cancel(addr, &sales[1].order_id, &sales[1].user).await,
                _ => notify(addr, &good, SECRET, now_s()).await,
            };
            answers.push((round, what, status, body["error"].clone(), started.elapsed()));
        }
    }
    env.postgres.thaw();
    for (_, _, status, error, took) in &answers {
        assert_eq!((*status, error.as_str()), (503, Some("unavailable")), "a frozen store is 503: {answers:?}");
        assert!(*took < Duration::from_secs(2), "each answer within 2 s: {answers:?}");
    }
    let mut read = get(addr, &path).await;
    for _ in 0..50 {
        if read.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        read = get(addr, &path).await;
    }
    assert_eq!(read.0, 200, "the store answers again once thawed: {read:?}");
    assert_eq!(notify(addr, &good, SECRET, now_s()).await.0, 200, "the provider's retry lands");
    service.stop().await;
}
