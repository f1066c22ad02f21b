//! Hostile and slow traffic: a node under abuse stays up, keeps answering valid requests and
//! loses no stock; a slow ledger turns into immediate 503s, not growing queues.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use ledger::SkuId;
use seckill::cluster::Options;
use testkit::hogs::{http_from, NeverReads};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{cluster_config, eventually, get, purchase, request, start_cluster, RedisServer};

/// Goal: slowloris connections and thousands of malformed requests neither take the node down
/// nor change stock, and slow connections are cut after the header timeout.
/// Method: hold 200 connections that never finish their headers, fire 3,000 bad requests from
/// 16 tasks, buy once in the middle of it, then compare the stock page and watch the slow
/// connections get closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_leaves_the_node_serving_and_the_stock_unchanged() {
    let redis = RedisServer::start();
    let settings = "[node_settings]\nheader_timeout_ms = 500\nbody_timeout_ms = 500";
    let cluster = cluster_config(&redis.url(), 1, "[[skus]]\nid = \"tv\"\ntotal = 100", settings);
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];
    let before = get(addr, "/v1/skus/tv").await.body;

    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"POST /v1/purchase HTTP/1.1\r\nhost: x\r\nidempotency-key: slow\r\n").await.unwrap();
        slow.push(stream);
    }
    let bad_bodies: [&[u8]; 5] = [
        b"{\"sku\":",
        b"{\"sku\":\"tv\",\"user\":\"u\",\"qty\":0}",
        b"{\"sku\":\"nope\",\"user\":\"u\"}",
        b"\x00\x01\x02",
        b"[]",
    ];
    let floods: Vec<_> = (0..16)
        .map(|task| {
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for n in 0..(3_000 / 16) {
                    let body = Bytes::from_static(bad_bodies[(task + n) % bad_bodies.len()]);
                    let key = if n % 7 == 0 { vec![] } else { vec![("idempotency-key", "flood")] };
                    statuses.push(request(addr, "POST", "/v1/purchase", &key, body).await.status.as_u16());
                }
                statuses
            })
        })
        .collect();
    let good = purchase(addr, "good", "tv", "buyer", 1).await;
    let mut statuses = Vec::new();
    for flood in floods {
        statuses.extend(flood.await.unwrap());
    }
    assert_eq!(good.status, 200, "a valid purchase is served under abuse: {good:?}");
    assert!(statuses.iter().all(|s| *s == 400 || *s == 404), "every bad request got a 4xx");
    assert_eq!(get(addr, "/health").await.status, 200);

    let after = get(addr, "/v1/skus/tv").await.body;
    assert_eq!(after["local_remaining"].as_u64().unwrap() + 1, before["local_remaining"].as_u64().unwrap());
    let sold = running.ledger.status(&SkuId::new("tv").unwrap()).await.unwrap().sold;
    assert_eq!(sold, 1, "only the valid purchase sold");

    // Connections that never finish their headers are closed by the server.
    let mut closed = 0;
    for mut stream in slow {
        let mut buffer = [0u8; 512];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await;
        // EOF, a reset, or a 408 before closing all mean the server cut the connection.
        if matches!(read, Ok(Ok(_)) | Ok(Err(_))) {
            closed += 1;
        }
    }
    assert_eq!(closed, 200, "slowloris connections are cut after the header timeout");
    running.stop().await;
}

/// Goal: when the ledger stalls, local winners beyond a bounded queue get 503 at once instead of
/// piling up in memory, and none of their units is lost. Method: queue bound 4, Redis frozen,
/// 40 concurrent purchases; then thaw Redis and reconcile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_ledger_turns_into_503s_not_memory() {
    let redis = RedisServer::start();
    let settings = "call_timeout_ms = 5000\n[node_settings]\nconfirm_timeout_ms = 6000\nconfirm_queue_max = 4";
    let cluster = cluster_config(&redis.url(), 1, "[[skus]]\nid = \"radio\"\ntotal = 100\nbuffer = 0", settings);
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];

    redis.pause();
    let buyers: Vec<_> = (0..40)
        .map(|n| tokio::spawn(async move { purchase(addr, &format!("k{n}"), "radio", &format!("u{n}"), 1).await }))
        .collect();
    // The refused ones answer while Redis is still frozen: count them before thawing it.
    eventually("the queue overflows", Duration::from_secs(5), || async {
        buyers.iter().filter(|b| b.is_finished()).count() >= 30
    })
    .await;
    redis.resume();
    let mut full = 0;
    let mut purchased = 0;
    for buyer in buyers {
        let answer = buyer.await.unwrap();
        match answer.status.as_u16() {
            503 => {
                assert!(answer.body["message"].as_str().unwrap_or("").contains("queue is full"), "{answer:?}");
                full += 1;
            }
            200 => purchased += 1,
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    assert!(full >= 30, "at most one batch plus the queue bound were accepted, {full} refused");
    assert_eq!(full + purchased, 40);
    let status = running.ledger.status(&SkuId::new("radio").unwrap()).await.unwrap();
    assert_eq!(status.sold, purchased as u64);
    let page = get(addr, "/v1/skus/radio").await.body;
    assert_eq!(page["local_remaining"].as_u64().unwrap(), 100 - purchased as u64, "refused units came back");
    running.stop().await;
}

/// Goal: clients that pipeline requests and never read the answers cannot hold a node's
/// connection slots, and the fleet sells on while they try. Method: a node with 4 connection
/// slots and a 500 ms write timeout; 4 clients (tiny receive buffers) stuff it with pipelined
/// requests until their own writes stall, which means the node's answers back up; a buyer then
/// needs a fifth slot on that node, while another node serves a buyer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_cannot_hold_a_slot() {
    let redis = RedisServer::start();
    let settings = "[node_settings]\nconnections_max = 4\nwrite_timeout_ms = 500\nheader_timeout_ms = 30000";
    let cluster = cluster_config(&redis.url(), 2, "[[skus]]\nid = \"tv\"\ntotal = 100", settings);
    let running = start_cluster(&cluster, Options::default()).await;
    let (stuffed, other) = (running.addrs()[0], running.addrs()[1]);

    let mut hogs = Vec::new();
    for _ in 0..4 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(stuffed).await.unwrap();
        let chunk = b"GET /v1/skus/tv HTTP/1.1\r\nhost: x\r\n\r\n".repeat(2_000);
        // Write until a write stalls for a while: the node stopped reading because its answers
        // have nowhere to go.
        let mut stalled = false;
        for _ in 0..1_000 {
            match tokio::time::timeout(Duration::from_millis(300), stream.write_all(&chunk)).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) | Err(_) => {
                    stalled = true;
                    break;
                }
            }
        }
        assert!(stalled, "a client that never reads must back the node up");
        hogs.push(stream);
    }

    let elsewhere = purchase(other, "elsewhere", "tv", "buyer-1", 1).await;
    assert_eq!(elsewhere.status, 200, "the other node sells meanwhile: {elsewhere:?}");
    // Without the write timeout this waits forever; with it, the hogs are cut off after 500 ms
    // of stalled writes (10 s leaves room for a loaded machine).
    let here = tokio::time::timeout(Duration::from_secs(10), purchase(stuffed, "here", "tv", "buyer-2", 1))
        .await
        .expect("the stuffed node frees its slots within the write timeout");
    assert_eq!(here.status, 200, "{here:?}");
    drop(hogs);
    running.stop().await;
}

/// Goal: one address cannot take every connection slot of a node, so buyers from elsewhere are
/// served while it tries. Method: a node with 8 slots, at most 2 per address and a write
/// timeout far beyond the test (only the per-address bound can free anything); 12 connections
/// from 127.0.0.1 pipeline requests and never read; a purchase from 127.0.0.2 must then be
/// answered, while a third connection from 127.0.0.1 is closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_slot_of_a_node() {
    const HOG: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let redis = RedisServer::start();
    let settings = "[node_settings]\nconnections_max = 8\nconnections_per_address = 2\nwrite_timeout_ms = 600000";
    let mut cluster = cluster_config(&redis.url(), 1, "[[skus]]\nid = \"tv\"\ntotal = 100", settings);
    // Loopback is exempt in production (a local nginx connects from there); here it plays the
    // clients.
    for (node, _) in &mut cluster.nodes {
        node.http.connections_per_address.exempt = safeguards::client_ip::TrustedProxies::default();
    }
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];

    let started: Vec<_> = (0..12)
        .map(|_| tokio::spawn(NeverReads::start(HOG, addr, b"GET /v1/skus/tv HTTP/1.1\r\nhost: x\r\n\r\n")))
        .collect();
    let mut hogs = Vec::new();
    for hog in started {
        hogs.push(hog.await.unwrap().expect("a hog connects and pipelines"));
    }
    let buy_from = |from: IpAddr, key: &'static str| async move {
        let work = async {
            let mut sender = http_from(from, addr).await?;
            let request = hyper::Request::post("/v1/purchase")
                .header("host", addr.to_string())
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(format!(r#"{{"sku":"tv","user":"{key}","qty":1}}"#))))?;
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            response.into_body().collect().await?;
            anyhow::Ok(status)
        };
        tokio::time::timeout(Duration::from_secs(10), work).await.map_err(anyhow::Error::from).and_then(|answer| answer)
    };
    let elsewhere = buy_from(OTHER, "elsewhere").await.expect("a buyer from another address is answered");
    assert_eq!(elsewhere, 200);
    let mut open = 0;
    for hog in &mut hogs {
        if !hog.closed_by_server(Duration::from_secs(2)).await {
            open += 1;
        }
    }
    assert_eq!(open, 2, "the address keeps its 2 connections; the other 10 were closed at once");
    assert!(buy_from(HOG, "third").await.is_err(), "a third connection from the full address is closed");
    drop(hogs);
    running.stop().await;
}
