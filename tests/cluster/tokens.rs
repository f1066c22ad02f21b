//! One-time submit tokens (anti-duplicate submission) through real HTTP on real Redis: a SKU
//! configured with `require_token` sells only to a purchase that brings a live token issued to
//! its buyer for that SKU, and each token sells at most once, fleet-wide.

use std::net::SocketAddr;
use std::time::Duration;

use ledger::{SkuId, UserId};
use redis::Commands;
use seckill::cluster::Options;

use crate::admin::{admin, admin_cluster, CHANGE_VISIBLE, TOKEN};
use crate::harness::{
    cluster_config, eventually, get, purchase, redis_ledger, request, start_cluster, Answer, RedisServer,
};

/// A SKU that requires tokens, and one that does not, side by side.
const SKUS: &str = r#"
[[skus]]
id = "guarded"
total = 10
require_token = true

[[skus]]
id = "open"
total = 10
"#;

/// `POST /v1/tokens` for `user` on `sku`.
async fn issue(addr: SocketAddr, sku: &str, user: &str) -> Answer {
    let body = format!(r#"{{"sku":"{sku}","user":"{user}"}}"#);
    request(addr, "POST", "/v1/tokens", &[("content-type", "application/json")], body).await
}

/// `POST /v1/tokens` through a trusted proxy that names the client `forwarded_for`.
async fn issue_from(addr: SocketAddr, sku: &str, user: &str, forwarded_for: &str) -> Answer {
    let body = format!(r#"{{"sku":"{sku}","user":"{user}"}}"#);
    let headers = [("content-type", "application/json"), ("x-forwarded-for", forwarded_for)];
    request(addr, "POST", "/v1/tokens", &headers, body).await
}

/// Issues a token and returns it, failing the test unless it was issued.
async fn token(addr: SocketAddr, sku: &str, user: &str) -> String {
    let answer = issue(addr, sku, user).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    answer.body["token"].as_str().expect("the answer carries the token").to_string()
}

/// `POST /v1/purchase` of one unit with a `Submit-Token` header.
async fn purchase_with(addr: SocketAddr, key: &str, sku: &str, user: &str, token: &str) -> Answer {
    let body = format!(r#"{{"sku":"{sku}","user":"{user}","qty":1}}"#);
    let headers = [("idempotency-key", key), ("submit-token", token), ("content-type", "application/json")];
    request(addr, "POST", "/v1/purchase", &headers, body).await
}

fn expect(answer: &Answer, status: u16, error: &str) {
    assert_eq!((answer.status.as_u16(), answer.error()), (status, error), "{answer:?}");
}

async fn sold(running: &seckill::cluster::RunningCluster, sku: &str) -> u64 {
    running.ledger.status(&SkuId::new(sku).unwrap()).await.unwrap().sold
}

/// Goal: the whole life of a token. No token: refused from memory, stock untouched. A live
/// token: sold. The same key again (with the spent token, on another node, or with no token):
/// the purchase replays. The spent token under a new key: `token_invalid`, nothing sold, and
/// that refusal replays too. Every rejection is counted in `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_sells_once_and_its_key_replays() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 2, SKUS, "");
    let running = start_cluster(&cluster, Options::default()).await;
    let [n1, n2] = [running.addrs()[0], running.addrs()[1]];

    let page_before = get(n1, "/v1/skus/guarded").await.body;
    expect(&purchase(n1, "bare", "guarded", "alice", 1).await, 403, "token_required");
    assert_eq!(get(n1, "/v1/skus/guarded").await.body, page_before, "a refusal without a token moves no stock");
    assert_eq!(sold(&running, "guarded").await, 0);

    let issued = issue(n1, "guarded", "alice").await;
    assert_eq!(issued.status, 201, "{issued:?}");
    let token = issued.body["token"].as_str().expect("token").to_string();
    assert!(token.len() == 32 && token.chars().all(|c| c.is_ascii_hexdigit()), "128 bits in hex: {token}");
    assert_eq!((issued.body["sku"].as_str(), issued.body["user"].as_str()), (Some("guarded"), Some("alice")));
    assert_eq!(issued.body["expires_in_s"], 300, "the default token_ttl_s");

    let bought = purchase_with(n1, "k1", "guarded", "alice", &token).await;
    expect(&bought, 200, "");
    assert!(!bought.replayed());
    let replay = purchase_with(n2, "k1", "guarded", "alice", &token).await;
    expect(&replay, 200, "");
    assert!(replay.replayed(), "the same key with the spent token replays");
    assert_eq!(replay.raw, bought.raw, "the replay is the original answer, order id included");
    let tokenless = purchase(n1, "k1", "guarded", "alice", 1).await;
    assert!(tokenless.status == 200 && tokenless.replayed(), "a retry that lost the header replays: {tokenless:?}");
    assert_eq!(tokenless.raw, bought.raw);

    let reused = purchase_with(n2, "k2", "guarded", "alice", &token).await;
    expect(&reused, 403, "token_invalid");
    assert!(!reused.replayed());
    let reused_again = purchase_with(n1, "k2", "guarded", "alice", &token).await;
    expect(&reused_again, 403, "token_invalid");
    assert!(reused_again.replayed(), "a stored token_invalid replays like any refusal");
    assert_eq!(sold(&running, "guarded").await, 1, "one token, one unit");

    // SKUs without require_token are untouched: no token needed.
    expect(&purchase(n1, "plain", "open", "alice", 1).await, 200, "");

    let metrics = get(n1, "/metrics").await;
    let text = String::from_utf8_lossy(&metrics.raw);
    for series in [
        r#"seckill_purchase_requests_total{node="n1",outcome="token_required"}"#,
        r#"seckill_purchase_requests_total{node="n1",outcome="token_invalid"}"#,
        r#"seckill_token_requests_total{node="n1",outcome="issued"}"#,
        r#"seckill_token_requests_total{node="n1",outcome="unknown_sku"}"#,
        r#"seckill_token_requests_total{node="n1",outcome="unavailable"}"#,
    ] {
        assert!(text.contains(series), "/metrics lacks {series}:\n{text}");
    }
    running.stop().await;
}

/// Goal: a token sells only to the user it was issued to, and only on its SKU, and another
/// user's attempt does not take it from its owner.
/// Method: two SKUs that require tokens; alice's token for X is tried on Y by alice and on X by
/// bob; neither sells. Then alice, asking again, gets the same token and buys X with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_works_only_for_its_user_and_its_sku() {
    let redis = RedisServer::start();
    let skus =
        "[[skus]]\nid = \"x\"\ntotal = 5\nrequire_token = true\n[[skus]]\nid = \"y\"\ntotal = 5\nrequire_token = true";
    let cluster = cluster_config(&redis.url(), 1, skus, "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];

    let for_x = token(addr, "x", "alice").await;
    expect(&purchase_with(addr, "on-y", "y", "alice", &for_x).await, 403, "token_invalid");
    let for_alice = token(addr, "x", "alice").await;
    assert_eq!(for_alice, for_x, "the token alice holds, unspent by the attempt on Y");
    expect(&purchase_with(addr, "as-bob", "x", "bob", &for_alice).await, 403, "token_invalid");
    assert_eq!((sold(&running, "x").await, sold(&running, "y").await), (0, 0));
    let own = token(addr, "x", "alice").await;
    assert_eq!(own, for_x, "bob's attempt left alice her token");
    expect(&purchase_with(addr, "own", "x", "alice", &own).await, 200, "");
    running.stop().await;
}

/// Goal: a token past its TTL sells nothing. Method: `token_ttl_s = 1`, then wait 1.5 s: the
/// expiry is Redis' own clock, which the test cannot advance, so it waits in real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_refused() {
    let redis = RedisServer::start();
    let skus = "[[skus]]\nid = \"brief\"\ntotal = 5\nrequire_token = true\ntoken_ttl_s = 1";
    let cluster = cluster_config(&redis.url(), 1, skus, "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];
    let issued = issue(addr, "brief", "alice").await;
    assert_eq!(issued.body["expires_in_s"], 1, "{issued:?}");
    let token = issued.body["token"].as_str().expect("token").to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    expect(&purchase_with(addr, "late", "brief", "alice", &token).await, 403, "token_invalid");
    assert_eq!(sold(&running, "brief").await, 0);
    running.stop().await;
}

/// Goal: one token sells exactly once however many purchases race with it across the fleet.
/// Method: one token, 8 concurrent purchases under 8 different keys, spread over 3 nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_sells_once_across_nodes_under_concurrency() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 3, SKUS, "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addrs = running.addrs();
    let token = token(addrs[0], "guarded", "alice").await;
    let racers: Vec<_> = (0..8)
        .map(|n| {
            let (addr, token) = (addrs[n % addrs.len()], token.clone());
            tokio::spawn(async move { purchase_with(addr, &format!("race-{n}"), "guarded", "alice", &token).await })
        })
        .collect();
    let mut answers = Vec::new();
    for racer in racers {
        answers.push(racer.await.unwrap());
    }
    let won = answers.iter().filter(|a| a.status == 200).count();
    let refused = answers.iter().filter(|a| (a.status.as_u16(), a.error()) == (403, "token_invalid")).count();
    assert_eq!((won, refused), (1, 7), "{answers:?}");
    assert_eq!(sold(&running, "guarded").await, 1);
    running.stop().await;
}

/// Goal: `POST /v1/tokens` and the `Submit-Token` header answer as the README documents: 201,
/// 400 for bad input or a SKU that sells without tokens, 404 for an unknown SKU, 403
/// `not_started` and `ended` outside the sale window and 409 `sold_out` from memory, 405, and
/// 503 with Retry-After when the ledger is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_endpoint_answers_by_the_contract() {
    let mut redis = RedisServer::start();
    let skus = format!(
        "{SKUS}\n[[skus]]\nid = \"solo\"\ntotal = 1\nbuffer = 0\nrequire_token = true\n\
         [[skus]]\nid = \"over\"\ntotal = 5\nrequire_token = true\n\
         starts_at = 2000-01-01T00:00:00Z\nends_at = 2001-01-01T00:00:00Z\n\
         [[skus]]\nid = \"later\"\ntotal = 5\nrequire_token = true\nstarts_at = 2100-01-01T00:00:00Z"
    );
    let cluster = cluster_config(&redis.url(), 1, &skus, "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];
    let post = |body: &'static str| request(addr, "POST", "/v1/tokens", &[], body);

    expect(&issue(addr, "guarded", "alice").await, 201, "");
    expect(&issue(addr, "open", "alice").await, 400, "bad_request");
    expect(&issue(addr, "later", "alice").await, 403, "not_started");
    expect(&issue(addr, "nope", "alice").await, 404, "unknown_sku");
    expect(&post(r#"{"sku": "guarded""#).await, 400, "bad_request");
    expect(&post(r#"{"sku": "guarded"}"#).await, 400, "bad_request");
    expect(&post(r#"{"sku": "gu{ar}ded", "user": "alice"}"#).await, 400, "bad_request");
    expect(&post(r#"{"sku": "guarded", "user": "tab\there"}"#).await, 400, "bad_request");
    expect(&request(addr, "GET", "/v1/tokens", &[], "").await, 405, "method_not_allowed");
    expect(&issue(addr, "over", "alice").await, 403, "ended");
    for malformed in ["NOT-HEX", "0123456789ABCDEF", &"a".repeat(65)] {
        expect(&purchase_with(addr, "bad-token", "guarded", "alice", malformed).await, 400, "bad_request");
    }

    let solo = token(addr, "solo", "alice").await;
    expect(&purchase_with(addr, "solo-1", "solo", "alice", &solo).await, 200, "");
    expect(&issue(addr, "solo", "bob").await, 409, "sold_out");

    redis.kill();
    let down = issue(addr, "guarded", "alice").await;
    expect(&down, 503, "unavailable");
    assert!(down.headers.contains_key("retry-after"), "503 must say when to retry: {down:?}");
    running.stop().await;
}

/// Goal: a SKU created at run time through the admin API can require tokens, and every node
/// learns it from the coordinator's terms. Method: create with `require_token` and a 60 s TTL,
/// then on each node: no token is refused from memory, a token it issues sells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_created_sku_requires_tokens_on_every_node() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let (running, member) = admin_cluster(&redis, &data, "").await;
    let put = |body: &'static str| admin(member, "PUT", "/admin/skus/drop", Some(TOKEN), body);
    let zero_ttl = put(r#"{"op":"create","total":9,"price":100,"require_token":true,"token_ttl_s":0}"#).await;
    expect(&zero_ttl, 400, "bad_request");
    let created =
        put(r#"{"op":"create","total":9,"price":100,"buffer":0,"require_token":true,"token_ttl_s":60}"#).await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(
        (created.body["terms"]["require_token"].as_bool(), created.body["ledger"]["require_token"].as_bool()),
        (Some(true), Some(true))
    );
    for (n, node) in running.addrs().into_iter().enumerate() {
        eventually("the node sells the new SKU", CHANGE_VISIBLE, || async move {
            get(node, "/v1/skus/drop").await.status == 200
        })
        .await;
        let user = format!("buyer-{n}");
        expect(&purchase(node, &format!("bare-{n}"), "drop", &user, 1).await, 403, "token_required");
        let issued = issue(node, "drop", &user).await;
        assert_eq!(issued.body["expires_in_s"], 60, "{issued:?}");
        let token = issued.body["token"].as_str().expect("token");
        // The node may hold no allotment yet right after the create; retry until it does.
        let key = format!("with-{n}");
        eventually("a purchase with a token sells", CHANGE_VISIBLE, || {
            let (user, key, token) = (user.clone(), key.clone(), token.to_string());
            async move {
                let answer = purchase_with(node, &key, "drop", &user, &token).await;
                match (answer.status.as_u16(), answer.error()) {
                    (200, _) => true,
                    (409, "sold_out") | (503, _) => false,
                    _ => panic!("unexpected answer: {answer:?}"),
                }
            }
        })
        .await;
    }
    assert_eq!(sold(&running, "drop").await, 3);
    running.stop().await;
}

/// Goal: a token lives in its SKU's hash tag (one slot with the SKU's other keys, so the scripts
/// run on Redis Cluster), holds its user, carries its TTL, and is gone once spent; so is the key
/// that says the buyer holds it.
#[tokio::test]
async fn a_token_key_shares_the_sku_hash_tag_carries_its_ttl_and_is_deleted_when_spent() {
    let redis = RedisServer::start();
    let ledger = redis_ledger(&redis);
    let sku = SkuId::new("tagged").unwrap();
    let terms = ledger::SkuTerms { require_token: true, ..ledger::SkuTerms::new(5) };
    ledger.create_sku(&sku, &terms).await.unwrap();
    let user = UserId::new("alice").unwrap();
    let token = ledger.issue_token(&sku, &user, Duration::from_secs(60)).await.unwrap().token;

    let mut con = redis.connection();
    let key = format!("seckill:{{tagged}}:token:{token}");
    let holder: Option<String> = con.get(&key).unwrap();
    assert_eq!(holder.as_deref(), Some("alice"));
    let ttl_ms: i64 = con.pttl(&key).unwrap();
    assert!((1..=60_000).contains(&ttl_ms), "the token carries its TTL, got {ttl_ms} ms");
    let holder_key = "seckill:{tagged}:token_holder:alice";
    let held: Option<String> = con.get(holder_key).unwrap();
    assert_eq!(held.as_deref(), Some(token.as_str()), "the buyer's holder key names the token");
    let holder_ttl_ms: i64 = con.pttl(holder_key).unwrap();
    assert!((1..=60_000).contains(&holder_ttl_ms), "the holder carries the token's TTL, got {holder_ttl_ms} ms");

    let purchase = ledger::Purchase {
        key: ledger::IdempotencyKey::new("k").unwrap(),
        user,
        qty: 1,
        token: Some(token),
        order_id: None,
    };
    let seller = ledger::Seller::new(ledger::NodeId::new("n1").unwrap(), 0);
    let outcome = ledger.confirm(&sku, &seller, &[purchase]).await.unwrap();
    assert_eq!(outcome.sold, 1);
    let exists: bool = con.exists(&key).unwrap();
    assert!(!exists, "a spent token is deleted");
    let held: bool = con.exists(holder_key).unwrap();
    assert!(!held, "so is its holder key, so the buyer's next ask draws a fresh token");
    let keys: Vec<String> = con.keys("*").unwrap();
    assert!(keys.iter().all(|k| k.starts_with("seckill:{tagged}:")), "every key in the SKU's slot: {keys:?}");
}

/// Goal: a flood of token requests cannot grow Redis without bound, token requests pass the
/// same gate as purchases, and the fleet sells on. Method: `token_issue_max = 40` and a per-user
/// limit; 16 tasks ask for 400 tokens for distinct users: at most 40 are issued, the rest get 429
/// with Retry-After, and Redis holds at most 40 token keys. One user asking again and again is
/// turned away by the per-user limit. Buyers with issued tokens and buyers of the SKU without
/// tokens buy meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_flood_is_bounded_and_the_fleet_sells_on() {
    let redis = RedisServer::start();
    // One address sends the whole flood here: the per-address token limit is off, so only the
    // cap and the per-user limit are under test.
    let extra = "token_issue_max = 40\n[safeguards]\ntoken_rate_per_address = 0\n\
                 [safeguards.limits]\nper_user = { per_s = 0.1, burst = 3 }";
    let skus = format!("{SKUS}\n[[skus]]\nid = \"vip\"\ntotal = 5\nrequire_token = true");
    let cluster = cluster_config(&redis.url(), 2, &skus, extra);
    let running = start_cluster(&cluster, Options::default()).await;
    let nodes = running.addrs();

    let floods: Vec<_> = (0..16)
        .map(|task| {
            let addr = nodes[task % 2];
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for n in 0..25 {
                    answers.push(issue(addr, "guarded", &format!("flood-{task}-{n}")).await);
                }
                answers
            })
        })
        .collect();
    let open = purchase(nodes[0], "open-during-flood", "open", "carol", 1).await;
    expect(&open, 200, "");
    let mut issued = Vec::new();
    let mut limited = 0;
    for flood in floods {
        for answer in flood.await.unwrap() {
            match answer.status.as_u16() {
                201 => issued.push(answer),
                429 => {
                    assert!(answer.headers.contains_key("retry-after"), "{answer:?}");
                    limited += 1;
                }
                other => panic!("unexpected {other}: {answer:?}"),
            }
        }
    }
    assert_eq!(issued.len(), 40, "exactly the window's cap was issued");
    assert_eq!(limited, 400 - 40);
    let keys: Vec<String> = redis.connection().keys("*{guarded}:token:*").unwrap();
    assert_eq!(keys.len(), 40, "Redis holds no more token keys than the cap: {}", keys.len());

    let holder = &issued[0];
    let (user, token) = (holder.body["user"].as_str().unwrap(), holder.body["token"].as_str().unwrap());
    expect(&purchase_with(nodes[1], "with-token", "guarded", user, token).await, 200, "");

    // One user hammering the token endpoint meets the per-user limit, as a purchase would.
    // (`vip` is far from its cap: only the gate can say no.)
    let mut dave = Vec::new();
    for _ in 0..6 {
        dave.push(issue(nodes[0], "vip", "dave").await.status.as_u16());
    }
    assert_eq!(dave, [201, 201, 201, 429, 429, 429], "burst 3, then the per-user limit");
    assert_eq!(sold(&running, "guarded").await, 1);
    assert_eq!(sold(&running, "open").await, 1);
    running.stop().await;
}

/// The ledger's count of tokens `sku` issued in the window that holds now, for a TTL of
/// `ttl_s` (`prefix:{sku}:tokens:<window>`), and that window.
fn window_count(redis: &RedisServer, sku: &str, ttl_s: u64) -> (u64, u64) {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let window = now_ms / (ttl_s * 1000);
    let count: Option<u64> = redis.connection().get(format!("seckill:{{{sku}}}:tokens:{window}")).unwrap();
    (window, count.unwrap_or(0))
}

/// Goal: one buyer asking for tokens again and again holds one: the same token every time,
/// one slot of the SKU's window cap, one token key in Redis, until a purchase spends it.
/// Method: 1,000 asks by alice over two nodes, each from another address (through a trusted
/// proxy, so no per-address limit stands between her and the ledger); then she buys with the
/// token, and her next ask is a new token. The TTL is an hour, so the window cannot turn
/// during the test unless it starts within seconds of the hour (then it is checked again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_buyer_asking_a_thousand_times_holds_one_token() {
    let redis = RedisServer::start();
    let skus = "[[skus]]\nid = \"held\"\ntotal = 5\nrequire_token = true\ntoken_ttl_s = 3600";
    let extra = "[safeguards]\ntrusted_proxies = [\"127.0.0.1\"]";
    let cluster = cluster_config(&redis.url(), 2, skus, extra);
    let running = start_cluster(&cluster, Options::default()).await;
    let nodes = running.addrs();

    let (window, before) = window_count(&redis, "held", 3600);
    let mut tokens = std::collections::BTreeSet::new();
    for n in 0..1_000u32 {
        let from = format!("10.1.{}.{}", n / 250, n % 250 + 1);
        let answer = issue_from(nodes[n as usize % 2], "held", "alice", &from).await;
        assert_eq!(answer.status, 201, "ask {n}: {answer:?}");
        let expires_in_s = answer.body["expires_in_s"].as_u64().expect("expires_in_s");
        assert!((3_590..=3_600).contains(&expires_in_s), "the held token's remaining TTL: {answer:?}");
        tokens.insert(answer.body["token"].as_str().expect("token").to_string());
    }
    assert_eq!(tokens.len(), 1, "1,000 asks by one buyer must hold one token, got {}", tokens.len());
    let (window_after, after) = window_count(&redis, "held", 3600);
    if window_after == window {
        assert_eq!(after, before + 1, "1,000 asks by one buyer take one slot of the window's cap");
    }
    let keys: Vec<String> = redis.connection().keys("seckill:{held}:token:*").unwrap();
    assert_eq!(keys.len(), 1, "one token key in Redis: {keys:?}");

    let held = tokens.into_iter().next().unwrap_or_default();
    expect(&purchase_with(nodes[1], "alice-1", "held", "alice", &held).await, 200, "");
    let next = token(nodes[0], "held", "alice").await;
    assert_ne!(next, held, "a spent token is not handed out again");
    assert_eq!(token(nodes[1], "held", "alice").await, next, "the new one is held in turn");
    running.stop().await;
}

/// Goal: one address inventing users cannot drain a SKU's tokens; buyers elsewhere get theirs
/// and buy. Method: default safeguards (no limit configured); 8 tasks send 10,000 token asks
/// under invented users from addresses of one IPv6 /64, through a trusted proxy, over two
/// nodes, while five buyers on other addresses each get a token and buy with it. Most of the
/// flood gets 429 with Retry-After, counted as the gate's `token_rate` refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_inventing_users_is_limited_while_buyers_buy() {
    let redis = RedisServer::start();
    let extra = "[safeguards]\ntrusted_proxies = [\"127.0.0.1\"]";
    let cluster = cluster_config(&redis.url(), 2, SKUS, extra);
    let running = start_cluster(&cluster, Options::default()).await;
    let nodes = running.addrs();

    let floods: Vec<_> = (0..8u32)
        .map(|task| {
            let addr = nodes[task as usize % 2];
            tokio::spawn(async move {
                let (mut issued, mut limited) = (0u32, 0u32);
                for n in 0..1_250u32 {
                    let from = format!("2001:db8:7:7::{:x}", task * 1_250 + n + 1);
                    let answer = issue_from(addr, "guarded", &format!("invented-{task}-{n}"), &from).await;
                    match answer.status.as_u16() {
                        201 => issued += 1,
                        429 => {
                            assert!(answer.headers.contains_key("retry-after"), "{answer:?}");
                            limited += 1;
                        }
                        other => panic!("unexpected {other}: {answer:?}"),
                    }
                }
                (issued, limited)
            })
        })
        .collect();
    for buyer in 1..=5u32 {
        let (addr, user, from) = (nodes[buyer as usize % 2], format!("buyer-{buyer}"), format!("198.51.100.{buyer}"));
        let answer = issue_from(addr, "guarded", &user, &from).await;
        assert_eq!(answer.status, 201, "a buyer on another address gets a token during the flood: {answer:?}");
        let token = answer.body["token"].as_str().expect("token");
        expect(&purchase_with(addr, &format!("buy-{buyer}"), "guarded", &user, token).await, 200, "");
    }
    let (mut issued, mut limited) = (0, 0);
    for flood in floods {
        let (i, l) = flood.await.unwrap();
        issued += i;
        limited += l;
    }
    assert_eq!(issued + limited, 10_000);
    assert!(limited >= 9_500, "one address must be limited: {issued} issued, {limited} refused");
    assert_eq!(sold(&running, "guarded").await, 5, "every real buyer bought");

    let metrics = get(nodes[0], "/metrics").await;
    let text = String::from_utf8_lossy(&metrics.raw);
    for series in [
        r#"seckill_gate_refusals_total{node="n1",reason="token_rate"}"#,
        r#"seckill_token_requests_total{node="n1",outcome="rate_limited"}"#,
    ] {
        assert!(text.lines().any(|l| l.starts_with(series) && !l.ends_with(" 0")), "/metrics lacks {series}:\n{text}");
    }
    running.stop().await;
}
