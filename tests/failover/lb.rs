//! The nginx config of `seckill lb-config nginx` as an operator runs it: exactly as its header
//! says, on a fresh empty directory, as root and as an unprivileged user; and its stock-page
//! micro-cache under a refresh storm.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use crate::harness::{get, purchase, request, Answer};
use crate::nginx::{Nginx, RunAs};
use crate::{started_fleet, SERIAL, SKU};

/// The sum of the series of counter `name` whose labels include `labels`, as `addr` exports it.
async fn counter(addr: SocketAddr, name: &str, labels: &str) -> f64 {
    let metrics = get(addr, "/metrics").await;
    String::from_utf8_lossy(&metrics.raw)
        .lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(labels))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The same counter summed over every node.
async fn fleet_counter(nodes: &[SocketAddr], name: &str, labels: &str) -> f64 {
    let mut sum = 0.0;
    for node in nodes {
        sum += counter(*node, name, labels).await;
    }
    sum
}

fn cache_status(answer: &Answer) -> &str {
    answer.headers.get("x-cache-status").and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Goal: the config `seckill lb-config nginx` prints runs exactly as its header says on a fresh
/// empty directory, whoever runs it: as root (nginx hands its directories to workers running as
/// nobody) and as an unprivileged user; and it serves: a purchase goes through, and the stock
/// page is cached, which needs the workers to write under the directory. Method: one node
/// process; for each user the test can be (`RunAs`), a fresh directory, the header's command
/// word for word, a purchase and stock page requests through nginx, and nginx's error log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_config_runs_as_its_header_says_on_a_fresh_directory() {
    let _serial = SERIAL.lock().await;
    let fleet = started_fleet(1, 1, 10, "0", "").await;
    for (n, run_as) in RunAs::every_available().into_iter().enumerate() {
        let nginx = Nginx::start_as(&fleet, run_as).await;
        let bought = purchase(nginx.addr, &format!("lb-{n}"), SKU, &format!("buyer-{n}"), 1).await;
        assert_eq!(bought.status, 200, "as {run_as:?}, a purchase through nginx: {bought:?}");
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let page = get(nginx.addr, &format!("/v1/skus/{SKU}")).await;
            assert_eq!(page.status, 200, "as {run_as:?}, the stock page through nginx: {page:?}");
            assert_eq!(page.body["sku"], SKU);
            statuses.push(cache_status(&page).to_string());
            if statuses.last().is_some_and(|s| s == "HIT") {
                break;
            }
        }
        assert!(
            statuses.iter().any(|s| s == "HIT"),
            "as {run_as:?}, the stock page was never served from the cache ({statuses:?}): {}",
            nginx.error_log()
        );
        let log = nginx.error_log();
        for level in ["[alert]", "[crit]", "[emerg]", "[error]"] {
            assert!(!log.contains(level), "as {run_as:?}, nginx logged {level}:\n{log}");
        }
        eprintln!("nginx as {run_as:?}: purchase 200, stock page {statuses:?}");
    }
}

/// Goal: behind the generated nginx config, a refresh storm on the stock page reaches the nodes
/// about once a second, every purchase still reaches a node, and a client holding the current
/// figures gets 304. Method: two node processes behind nginx; 32 buyers refresh the page over
/// keep-alive connections for 3 s while 10 purchases go through; the nodes count what reached
/// them (`seckill_stock_page_requests_total`, `seckill_purchase_requests_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_page_refresh_storm_through_nginx_reaches_the_nodes_about_once_a_second() {
    let _serial = SERIAL.lock().await;
    let fleet = started_fleet(1, 2, 100, "0", "").await;
    let nginx = Nginx::start(&fleet).await;
    let nodes = fleet.node_addrs();
    let page_path = format!("/v1/skus/{SKU}");
    let pages_before = fleet_counter(&nodes, "seckill_stock_page_requests_total", r#"outcome="page""#).await;
    let sold_before = fleet_counter(&nodes, "seckill_purchase_requests_total", r#"outcome="purchased""#).await;
    let started = Instant::now();
    let storm_for = Duration::from_secs(3);

    let refreshers: Vec<_> = (0..32)
        .map(|_| {
            let (addr, path) = (nginx.addr, page_path.clone());
            tokio::spawn(async move {
                let connect = || async move { testkit::load::connect(addr).await.expect("connect to nginx") };
                let request = || {
                    hyper::Request::get(path.as_str())
                        .header("host", addr.to_string())
                        .body(Full::new(Bytes::new()))
                        .expect("request")
                };
                let mut sender = connect().await;
                let mut pages = 0u64;
                while started.elapsed() < storm_for {
                    let response = match sender.send_request(request()).await {
                        Ok(response) => response,
                        // nginx closes a keep-alive connection after 1,000 requests
                        // (`keepalive_requests`), as a client must expect: a new one.
                        Err(_) => {
                            sender = connect().await;
                            sender.send_request(request()).await.expect("nginx answers on a new connection")
                        }
                    };
                    assert_eq!(response.status(), 200, "a refresh through nginx");
                    response.into_body().collect().await.expect("body");
                    pages += 1;
                }
                pages
            })
        })
        .collect();
    for n in 0..10 {
        let bought = purchase(nginx.addr, &format!("storm-{n}"), SKU, &format!("storm-{n}"), 1).await;
        assert_eq!(bought.status, 200, "a purchase during the storm: {bought:?}");
    }
    let mut refreshes = 0;
    for refresher in refreshers {
        refreshes += refresher.await.expect("refresher");
    }
    let pages_after = fleet_counter(&nodes, "seckill_stock_page_requests_total", r#"outcome="page""#).await;
    let sold_after = fleet_counter(&nodes, "seckill_purchase_requests_total", r#"outcome="purchased""#).await;
    let window = started.elapsed();
    let reached_nodes = (pages_after - pages_before) as u64;
    eprintln!("{refreshes} refreshes in {window:?} through nginx; {reached_nodes} reached a node");

    assert!(refreshes >= 300, "the storm was a storm: {refreshes} refreshes");
    assert!(reached_nodes >= 1, "the cache is filled from a node");
    // nginx keeps a page for 1 s, counted in whole seconds of its clock: at most one refill
    // per second of the window, plus the one already under way when it opened.
    let most = window.as_secs_f64().ceil() as u64 + 1;
    assert!(reached_nodes <= most, "{reached_nodes} refreshes reached a node in {window:?}; at most {most} should");
    assert_eq!(sold_after - sold_before, 10.0, "every purchase reached a node; none was answered from a cache");

    // The two nodes' pages differ (each shows its own allotment), so the cached page may change
    // between the two requests when it is refilled from the other node: a few tries.
    let mut answers = Vec::new();
    for _ in 0..5 {
        let page = get(nginx.addr, &page_path).await;
        let etag = page.headers.get("etag").and_then(|v| v.to_str().ok()).expect("the page's ETag").to_string();
        let again = request(nginx.addr, "GET", &page_path, &[("if-none-match", &etag)], Bytes::new()).await;
        if again.status == 304 {
            assert!(again.raw.is_empty(), "304 carries no body");
            return;
        }
        answers.push(again);
    }
    panic!("a client holding the current page never got 304 through nginx: {answers:?}");
}

/// Goal: behind nginx, a fleet that verifies buyers sees the buyer's `Authorization` header (a
/// token buys, a request without one is 401), and the stock page stays one shared, cached page
/// whatever credential a request carries. Method: one node process under `[auth] mode = "jwt"`
/// behind the generated config; purchases with and without a token; the stock page asked with
/// two buyers' tokens until nginx answers from its cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_passes_the_buyers_credential_and_shares_the_stock_page() {
    let _serial = SERIAL.lock().await;
    let secret = auth::mint::generate_secret().expect("a secret");
    let mut fleet = crate::fleet::Fleet::verifying_buyers(1, 1, &crate::sku_toml(10, "0"), &secret).await;
    fleet.start_all();
    fleet.wait_nodes_ready().await;
    let nginx = Nginx::start(&fleet).await;
    let minter =
        auth::mint::Minter::hs256(secret.as_bytes(), testkit::fleet::BUYER_ISSUER, testkit::fleet::BUYER_AUDIENCE);
    let bearer = |user: &str| format!("Bearer {}", minter.token(user, auth::unix_now_s()));
    let buy = |key: &'static str, authorization: Option<String>| async move {
        let mut headers = vec![("idempotency-key", key.to_string()), ("content-type", "application/json".to_string())];
        headers.extend(authorization.map(|value| ("authorization", value)));
        let headers: Vec<(&str, &str)> = headers.iter().map(|(name, value)| (*name, value.as_str())).collect();
        request(nginx.addr, "POST", "/v1/purchase", &headers, format!(r#"{{"sku":"{SKU}"}}"#)).await
    };
    let refused = buy("lb-anon", None).await;
    assert_eq!((refused.status.as_u16(), refused.error()), (401, "unauthenticated"), "{refused:?}");
    let mut bought = buy("lb-ann", Some(bearer("ann"))).await;
    for _ in 0..50 {
        if bought.status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        bought = buy("lb-ann", Some(bearer("ann"))).await;
    }
    assert_eq!(bought.status, 200, "a token's purchase through nginx: {bought:?}");

    let page_path = format!("/v1/skus/{SKU}");
    let mut statuses = Vec::new();
    for user in ["ann", "bob", "ann", "bob", "ann", "bob"] {
        let page = request(nginx.addr, "GET", &page_path, &[("authorization", &bearer(user))], Bytes::new()).await;
        assert_eq!(page.status, 200, "{page:?}");
        statuses.push(cache_status(&page).to_string());
    }
    assert!(statuses.iter().any(|s| s == "HIT"), "the stock page was never shared from the cache: {statuses:?}");
}

/// Goal: with `[load_balancer] rate_per_address` set, nginx turns a flood from one address into
/// 429s before it reaches a node, and another address is served meanwhile. Method: rate 2/s,
/// burst 3; 30 requests from 127.0.0.1 at once (at most the burst plus one pass), then one from
/// 127.0.0.2, which has its own allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_limits_each_address_before_the_nodes_when_configured() {
    let _serial = SERIAL.lock().await;
    let fleet = started_fleet(1, 1, 10, "0", "\n[load_balancer]\nrate_per_address = 2\nburst_per_address = 3\n").await;
    let nginx = Nginx::start(&fleet).await;
    let mut statuses = Vec::new();
    for _ in 0..30 {
        statuses.push(get(nginx.addr, "/health").await.status.as_u16());
    }
    let passed = statuses.iter().filter(|s| **s == 200).count();
    assert!((3..=6).contains(&passed), "the burst and little more pass: {statuses:?}");
    assert!(statuses.iter().all(|s| *s == 200 || *s == 429), "{statuses:?}");

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut stream = socket.connect(nginx.addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await.unwrap().unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"), "another address is served: {}", String::from_utf8_lossy(&answer));
}
