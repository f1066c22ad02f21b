//! The safeguards in front of the stock, end to end on real Redis: rate limits (per user, per
//! address through trusted proxies, fleet-wide, lock-out), the blacklist through the admin API,
//! and automatic bans that reach every node.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use ledger::SkuId;
use seckill::cluster::{Options, RunningCluster};

use crate::harness::{cluster_config, eventually, request, start_cluster, Answer, RedisServer};

const SKU: &str = "[[skus]]\nid = \"phone\"\ntotal = 1000\nper_user_limit = 0\nqty_max = 1";
const SPAMMER_IP: &str = "203.0.113.66";
const SYNC: Duration = Duration::from_secs(5);

async fn buy(node: SocketAddr, key: &str, user: &str, forwarded_for: Option<&str>) -> Answer {
    let body = format!(r#"{{"sku":"phone","user":"{user}","qty":1}}"#);
    let mut headers = vec![("idempotency-key", key), ("content-type", "application/json")];
    if let Some(forwarded_for) = forwarded_for {
        headers.push(("x-forwarded-for", forwarded_for));
    }
    request(node, "POST", "/v1/purchase", &headers, body).await
}

async fn sold(running: &RunningCluster) -> u64 {
    running.ledger.status(&SkuId::new("phone").unwrap()).await.unwrap().sold
}

fn retry_after(answer: &Answer) -> u64 {
    answer.headers.get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Goal: a user over its rate gets 429 + Retry-After, and a refused request holds no stock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_its_rate_gets_429_and_touches_no_stock() {
    let redis = RedisServer::start();
    let limits = "[safeguards.limits]\nper_user = { per_s = 0.2, burst = 2 }";
    let running = start_cluster(&cluster_config(&redis.url(), 1, SKU, limits), Options::default()).await;
    let node = running.addrs()[0];
    let answers: Vec<Answer> = futures_in_order(node, "greedy", 5).await;
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429], "burst 2, then refused");
    assert_eq!(answers[2].error(), "rate_limited");
    assert!((1..=5).contains(&retry_after(&answers[2])), "one interval (5 s) at most: {:?}", answers[2].headers);
    assert_eq!(sold(&running).await, 2, "the refused requests bought nothing");
    assert_eq!(buy(node, "other-1", "patient", None).await.status, 200, "other users are not affected");
    let metrics = crate::harness::get(node, "/metrics").await;
    let text = String::from_utf8_lossy(&metrics.raw);
    assert!(
        text.lines()
            .any(|l| l.starts_with("seckill_gate_refusals_total") && l.contains("user_rate") && l.ends_with(" 3")),
        "refusals are counted by reason:\n{text}"
    );
    running.stop().await;
}

async fn futures_in_order(node: SocketAddr, user: &str, count: usize) -> Vec<Answer> {
    let mut answers = Vec::new();
    for at in 0..count {
        answers.push(buy(node, &format!("{user}-{at}"), user, None).await);
    }
    answers
}

/// Goal: IPv6 clients are limited and banned per /64 (configurable), IPv4 clients per address:
/// a host handed a /64 cannot mint fresh identities by changing its interface id.
/// Method: behind a trusted proxy, per-address burst 2; three purchases from three addresses
/// of one /64 (the third is limited), one from the next /64 and two from neighbouring IPv4
/// addresses (all served); then a ban of one address of a /64 blocks another address of it. With
/// `ipv6_prefix = 128`, the same three addresses count separately.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_clients_are_limited_and_banned_per_block_ipv4_per_address() {
    let redis = RedisServer::start();
    let limits = "[safeguards]\ntrusted_proxies = [\"127.0.0.0/8\"]\nblacklist_sync_ms = 50\n\
                  [safeguards.limits]\nper_ip = { per_s = 0.1, burst = 2 }";
    let cluster = cluster_config(&redis.url(), 1, SKU, limits);
    let running = start_cluster(&cluster, Options::default()).await;
    let node = running.addrs()[0];
    let statuses = [
        buy(node, "v6-0", "a", Some("2001:db8:1:2::1")).await.status.as_u16(),
        buy(node, "v6-1", "b", Some("2001:db8:1:2:ffff::2")).await.status.as_u16(),
        buy(node, "v6-2", "c", Some("2001:db8:1:2:abcd:1234:5678:9")).await.status.as_u16(),
        buy(node, "v6-3", "d", Some("2001:db8:1:3::1")).await.status.as_u16(),
        buy(node, "v4-0", "e", Some("203.0.113.1")).await.status.as_u16(),
        buy(node, "v4-1", "f", Some("203.0.113.2")).await.status.as_u16(),
        buy(node, "v4-2", "g", Some("203.0.113.3")).await.status.as_u16(),
    ];
    assert_eq!(statuses, [200, 200, 429, 200, 200, 200, 200], "one /64 is one address; IPv4 counts each");

    let redis_connection = seckill::guard::redis_connection(&cluster.ledger).unwrap();
    let store = seckill::guard::blacklist_store(&cluster.ledger, redis_connection);
    store.add(&"ip:2001:db8:9:9::1".parse().unwrap(), None).await.unwrap();
    eventually("the ban reaches the node", Duration::from_secs(5), || async {
        buy(node, "banned-probe", "h", Some("2001:db8:9:9:aaaa::7")).await.status == 403
    })
    .await;
    assert_eq!(buy(node, "next-block", "i", Some("2001:db8:9:a::7")).await.status, 200, "only that /64");
    running.stop().await;

    let per_address = limits.replace("blacklist_sync_ms = 50", "blacklist_sync_ms = 50\nipv6_prefix = 128");
    let running = start_cluster(&cluster_config(&redis.url(), 1, SKU, &per_address), Options::default()).await;
    let node = running.addrs()[0];
    for (at, ip) in ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::3"].iter().enumerate() {
        assert_eq!(buy(node, &format!("w{at}"), &format!("u{at}"), Some(ip)).await.status, 200, "{ip}");
    }
    running.stop().await;
}

/// Goal: per-address limits see the client behind a trusted proxy, and only there.
/// Method: the test's own address (127.0.0.1) plays the load balancer. Trusted: requests
/// forwarded for two clients are limited separately. Untrusted: the header is ignored and
/// everything counts against 127.0.0.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_address_limits_read_forwarded_for_only_from_trusted_proxies() {
    let redis = RedisServer::start();
    let limits =
        "[safeguards]\ntrusted_proxies = [\"127.0.0.0/8\"]\n[safeguards.limits]\nper_ip = { per_s = 0.1, burst = 2 }";
    let running = start_cluster(&cluster_config(&redis.url(), 1, SKU, limits), Options::default()).await;
    let node = running.addrs()[0];
    for (at, user) in ["a", "b"].iter().enumerate() {
        assert_eq!(buy(node, &format!("one-{at}"), user, Some("203.0.113.1")).await.status, 200);
    }
    assert_eq!(buy(node, "one-2", "c", Some("203.0.113.1")).await.status, 429, "third from one client");
    let spoofed = buy(node, "two-0", "d", Some("198.51.100.7, 203.0.113.2")).await;
    assert_eq!(spoofed.status, 200, "another client (the rightmost untrusted hop) has its own bucket");
    running.stop().await;

    let untrusted = "[safeguards.limits]\nper_ip = { per_s = 0.1, burst = 2 }";
    let running = start_cluster(&cluster_config(&redis.url(), 1, SKU, untrusted), Options::default()).await;
    let node = running.addrs()[0];
    let statuses: Vec<u16> = [
        buy(node, "u-0", "a", Some("203.0.113.1")).await,
        buy(node, "u-1", "b", Some("203.0.113.2")).await,
        buy(node, "u-2", "c", Some("203.0.113.3")).await,
    ]
    .iter()
    .map(|a| a.status.as_u16())
    .collect();
    assert_eq!(statuses, [200, 200, 429], "without trusted proxies a forged header changes nothing");
    running.stop().await;
}

/// Goal: the fleet-wide limit holds however a user spreads requests over nodes, on Redis time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_wide_limit_holds_across_nodes() {
    let redis = RedisServer::start();
    let limits = "[safeguards.limits]\nfleet_per_user = { per_s = 0.1, burst = 3 }";
    let running = start_cluster(&cluster_config(&redis.url(), 3, SKU, limits), Options::default()).await;
    let mut admitted = 0;
    for round in 0..3 {
        for (at, node) in running.addrs().into_iter().enumerate() {
            let answer = buy(node, &format!("spread-{round}-{at}"), "spreader", None).await;
            match answer.status.as_u16() {
                200 => admitted += 1,
                429 => assert!(retry_after(&answer) >= 1),
                other => panic!("unexpected {other}: {answer:?}"),
            }
        }
    }
    assert_eq!(admitted, 3, "burst 3 across the fleet, not 3 per node");
    assert_eq!(sold(&running).await, 3);
    let mut connection = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("seckill:ratelimit:*").query(&mut connection).unwrap();
    assert_eq!(keys, ["seckill:ratelimit:{user:spreader}:phone"], "one key per user and SKU, tagged by user");
    running.stop().await;
}

/// Goal: the fleet-wide per-address limit holds across nodes for different users behind one
/// address (read through a trusted proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_wide_address_limit_holds_across_nodes_and_users() {
    let redis = RedisServer::start();
    let limits = "[safeguards]\ntrusted_proxies = [\"127.0.0.1\"]\n\
                  [safeguards.limits]\nfleet_per_ip = { per_s = 0.1, burst = 2 }";
    let running = start_cluster(&cluster_config(&redis.url(), 3, SKU, limits), Options::default()).await;
    let mut statuses = Vec::new();
    for (at, node) in running.addrs().into_iter().enumerate() {
        statuses.push(buy(node, &format!("farm-{at}"), &format!("sock{at}"), Some("192.0.2.7")).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429], "burst 2 for the address across the fleet");
    assert_eq!(buy(running.addrs()[2], "elsewhere", "sock9", Some("192.0.2.8")).await.status, 200);
    assert_eq!(sold(&running).await, 3);
    running.stop().await;
}

/// Goal: more than N hits in W seconds locks the user and its address out for L seconds, on
/// every node, not only the one that counted the hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lockout_rule_blocks_for_the_block_time_across_the_fleet() {
    let redis = RedisServer::start();
    let limits = "[safeguards]\nblacklist_sync_ms = 50\ntrusted_proxies = [\"127.0.0.1\"]\n\
                  [safeguards.limits]\nlockout = { hits = 3, window_s = 10, block_s = 120 }";
    let running = start_cluster(&cluster_config(&redis.url(), 2, SKU, limits), Options::default()).await;
    let nodes = running.addrs();
    let mut answers = Vec::new();
    for at in 0..5 {
        answers.push(buy(nodes[0], &format!("hammer-{at}"), "hammer", Some("198.51.100.1")).await);
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 403], "the fourth hit locks out; then the node blocks");
    assert!(retry_after(&answers[3]) > 100, "locked out for the block time: {:?}", answers[3].headers);
    let other = nodes[1];
    eventually("the lock-out reaches the other node", SYNC, || async move {
        buy(other, &format!("hammer-b-{}", fastrand::u32(..)), "hammer", Some("198.51.100.2")).await.status == 403
    })
    .await;
    // The user's and the address's bans are two writes to the store; each reaches the other node
    // within a sync period, not necessarily the same one.
    eventually("the address was locked out with the user", SYNC, || async move {
        let n = fastrand::u32(..);
        buy(other, &format!("same-address-{n}"), &format!("friend-{n}"), Some("198.51.100.1")).await.status == 403
    })
    .await;
    assert_eq!(buy(other, "bystander", "bystander", Some("198.51.100.3")).await.status, 200);
    let mut connection = redis.connection();
    let ttl: f64 =
        redis::cmd("ZSCORE").arg("seckill:{blacklist}:entries").arg("user:hammer").query(&mut connection).unwrap();
    assert!(ttl.is_finite(), "a lock-out is a timed block, not a permanent one");
    running.stop().await;
}

/// Goal: repeated abuse on one node bans the user fleet-wide, through Redis, and the ban is
/// visible in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_abuse_bans_the_user_on_every_node() {
    let redis = RedisServer::start();
    let limits =
        "[safeguards]\nblacklist_sync_ms = 50\ntrusted_proxies = [\"127.0.0.1\"]\n[safeguards.auto_ban]\nrejections = 3\nwindow_s = 60\nban_s = 600\n\
                  [safeguards.limits]\nper_user = { per_s = 0.01, burst = 1 }";
    let running = start_cluster(&cluster_config(&redis.url(), 3, SKU, limits), Options::default()).await;
    let nodes = running.addrs();
    let mut answers = Vec::new();
    for at in 0..6 {
        answers.push(buy(nodes[0], &format!("spam-{at}"), "spammer", Some(SPAMMER_IP)).await);
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(statuses, [200, 429, 429, 429, 429, 403], "the fourth refusal crossed the line; then blocked");
    assert_eq!(answers[5].error(), "blocked");
    for (at, node) in nodes.iter().enumerate().skip(1) {
        let node = *node;
        eventually("the ban reaches the other nodes", SYNC, || async move {
            buy(node, &format!("elsewhere-{at}-{}", fastrand::u32(..)), "spammer", Some("203.0.113.1")).await.status
                == 403
        })
        .await;
    }
    // A node may have sold the spammer one unit before the ban reached it; from here on, none.
    let before = sold(&running).await;
    for (at, node) in nodes.iter().copied().enumerate() {
        let late = buy(node, &format!("late-{at}"), "spammer", Some("203.0.113.3")).await;
        assert_eq!((late.status.as_u16(), late.error()), (403, "blocked"), "node {at}");
    }
    let same_address = buy(nodes[2], "same-address", "sockpuppet", Some(SPAMMER_IP)).await;
    assert_eq!(same_address.status, 403, "the address was banned with the user");
    assert_eq!(buy(nodes[1], "innocent", "bystander", Some("203.0.113.2")).await.status, 200, "others still buy");
    let mut connection = redis.connection();
    let listed: Vec<String> =
        redis::cmd("ZRANGE").arg("seckill:{blacklist}:entries").arg(0).arg(-1).query(&mut connection).unwrap();
    let mut listed = listed;
    listed.sort();
    assert_eq!(listed, ["ip:203.0.113.66", "user:spammer"], "both banned in the store, with a ttl");
    let ttl: i64 =
        redis::cmd("ZSCORE").arg("seckill:{blacklist}:entries").arg("user:spammer").query(&mut connection).unwrap();
    assert!(ttl > 0, "a timed ban has a finite expiry");
    assert_eq!(sold(&running).await, before + 1, "only the bystander bought after the ban");
    running.stop().await;
}

/// Goal: operators block and unblock users and addresses through the admin API; every node
/// follows within a sync period; without the token nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_blacklist_reaches_every_node() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let extra = "[safeguards]\nblacklist_sync_ms = 50\ntrusted_proxies = [\"127.0.0.1\"]";
    let (running, member) = crate::admin::admin_cluster(&redis, &data, extra).await;
    let nodes = running.addrs();
    let admin = |method: &'static str, body: &'static str, token: &'static str| {
        let bearer = format!("Bearer {token}");
        async move {
            let headers = [("authorization", bearer.as_str()), ("content-type", "application/json")];
            request(member, method, "/admin/blacklist", &headers, Bytes::from(body)).await
        }
    };
    let refused = admin("PUT", r#"{"entry":"user:mallory"}"#, "wrong-token-wrong-token").await;
    assert_eq!(refused.status, 401);
    assert_eq!(admin("PUT", r#"{"entry":"mallory"}"#, crate::admin::TOKEN).await.status, 400, "bad entry");
    assert_eq!(admin("PUT", r#"{"entry":"user:mallory"}"#, crate::admin::TOKEN).await.status, 200);
    let banned_ip = admin("PUT", r#"{"entry":"ip:198.51.100.9","ttl_s":600}"#, crate::admin::TOKEN).await;
    assert_eq!(banned_ip.status, 200);
    for (at, node) in nodes.iter().copied().enumerate() {
        eventually("every node blocks mallory", SYNC, || async move {
            buy(node, &format!("m-{at}-{}", fastrand::u32(..)), "mallory", None).await.status == 403
        })
        .await;
        // Two changes, two versions: a node may have loaded the first before the second landed.
        eventually("every node blocks the address", SYNC, || async move {
            let answer = buy(node, &format!("ip-{at}-{}", fastrand::u32(..)), "eve", Some("198.51.100.9")).await;
            (answer.status.as_u16(), answer.error()) == (403, "blocked")
        })
        .await;
        assert_eq!(buy(node, &format!("ok-{at}"), "alice", None).await.status, 200);
    }
    let listed = admin("GET", "", crate::admin::TOKEN).await;
    assert_eq!(listed.body["entries"].as_array().map(Vec::len), Some(2), "{:?}", listed.body);
    assert_eq!(admin("DELETE", r#"{"entry":"user:mallory"}"#, crate::admin::TOKEN).await.body["removed"], true);
    for (at, node) in nodes.iter().copied().enumerate() {
        eventually("every node lets mallory buy again", SYNC, || async move {
            buy(node, &format!("back-{at}-{}", fastrand::u32(..)), "mallory", None).await.status == 200
        })
        .await;
    }
    running.stop().await;
}
