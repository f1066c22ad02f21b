//! Buyer identity (`[auth]`) through real HTTP on real Redis: the nodes and the order service
//! key every per-buyer rule on the buyer a credential proves, never on the body's `user`.
//!
//! Each refused credential is checked to change nothing: the ledger's figures and the order
//! store stay as they were.

use std::net::SocketAddr;
use std::time::Duration;

use auth::mint::{generate_secret, Minter};
use bytes::Bytes;
use ledger::SkuId;
use seckill::cluster::{Options, RunningCluster};
use seckill::config::Cluster;
use serde_json::json;

use crate::harness::{eventually, get, request, start_cluster, Answer, RedisServer};

const ISSUER: &str = "https://id.shop.test";
const AUDIENCE: &str = "seckill";
const ADMIN: &str = "admin-token-of-the-auth-tests-0123456789";

/// One node and the order service on `redis`, with `[auth]` as `auth_toml` says.
fn config(redis: &RedisServer, auth_toml: &str, skus_toml: &str, store: &str) -> Cluster {
    let text = format!(
        "[ledger]\nurl = \"{}\"\n\n[auth]\n{auth_toml}\n\n[orders]\nstore = \"{store}\"\nlisten = \"127.0.0.1:0\"\n\
         sweep_every_ms = 50\n\n{skus_toml}\n\n[[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:0\"\n",
        redis.url()
    );
    Cluster::parse(&text).unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"))
}

const SKUS: &str = r#"
[[skus]]
id = "phone"
total = 5
per_user_limit = 1
price = 100
currency = "USD"
pay_timeout_s = 900
"#;

/// A JWT sale: HS256 with a secret in `env` and ES256 keys from a JWKS file in `dir`.
struct JwtSale {
    redis: RedisServer,

    running: RunningCluster,
    orders: orders::service::OrderService,
    hs256: Minter,
    es256: Minter,
    jwks_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl JwtSale {
    async fn start(env: &str, skus: &str) -> JwtSale {
        let secret = generate_secret().unwrap();
        std::env::set_var(env, &secret);
        let dir = tempfile::tempdir().unwrap();
        let (es256, jwks) = Minter::es256("k1", ISSUER, AUDIENCE).unwrap();
        let jwks_file = dir.path().join("jwks.json");
        std::fs::write(&jwks_file, jwks).unwrap();
        let redis = RedisServer::start();
        let auth = format!(
            "mode = \"jwt\"\nhs256_secret_env = \"{env}\"\njwks_file = {:?}\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"",
            jwks_file.display().to_string()
        );
        let store = format!("sqlite:{}", dir.path().join("orders.db").display());
        let cluster = config(&redis, &auth, skus, &store);
        let running = start_cluster(&cluster, Options::default()).await;
        // The admin token through the config, not SECKILL_ADMIN_TOKEN: the environment is the
        // whole test binary's, and other tests' members read it.
        let mut config = cluster.orders.service_config().unwrap();
        config.authenticator = seckill::cluster::authenticator(&cluster).unwrap();
        config.admin_token = Some(protocol::Secret::new(ADMIN).unwrap());
        let store = seckill::order_service::open_store(&cluster).await.expect("the order store");
        let ledger = running.ledger.clone();
        let orders = seckill::order_service::start_with(&cluster, ledger, store, config).await.expect("orders");
        let hs256 = Minter::hs256(secret.as_bytes(), ISSUER, AUDIENCE);
        JwtSale { redis, running, orders, hs256, es256, jwks_file, _dir: dir }
    }

    fn node(&self) -> SocketAddr {
        self.running.addrs()[0]
    }

    fn orders(&self) -> SocketAddr {
        self.orders.addr.expect("the order API listens")
    }

    async fn sold(&self, sku: &str) -> u64 {
        self.running.ledger.status(&SkuId::new(sku).unwrap()).await.unwrap().sold
    }

    fn token(&self, user: &str) -> String {
        self.hs256.token(user, auth::unix_now_s())
    }
}

/// `POST /v1/purchase` of one unit under `key`, with `authorization` if given and `body_user`
/// in the body if given.
async fn buy(node: SocketAddr, key: &str, sku: &str, authorization: Option<&str>, body_user: Option<&str>) -> Answer {
    let body = match body_user {
        Some(user) => json!({ "sku": sku, "user": user }),
        None => json!({ "sku": sku }),
    };
    let bearer = authorization.map(|token| format!("Bearer {token}"));
    let mut headers = vec![("idempotency-key", key), ("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer));
    }
    request(node, "POST", "/v1/purchase", &headers, body.to_string()).await
}

async fn call(addr: SocketAddr, method: &str, path: &str, bearer: Option<&str>, body: &str) -> Answer {
    let authorization = bearer.map(|token| format!("Bearer {token}"));
    let headers: Vec<(&str, &str)> = authorization.iter().map(|value| ("authorization", value.as_str())).collect();
    request(addr, method, path, &headers, Bytes::from(body.to_string())).await
}

fn unauthenticated(answer: &Answer, case: &str) {
    assert_eq!((answer.status.as_u16(), answer.error()), (401, "unauthenticated"), "{case}: {answer:?}");
    assert_eq!(answer.headers.get("www-authenticate").map(|v| v.to_str().unwrap()), Some("Bearer"), "{case}");
}

/// Goal: every wrong credential is 401 with `WWW-Authenticate: Bearer` and sells nothing; a
/// good one buys as its subject, not as the body's user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_refused_and_change_nothing() {
    let sale = JwtSale::start("SECKILL_TEST_AUTH_WRONG", SKUS).await;
    let now = auth::unix_now_s();
    let with = |change: &dyn Fn(&mut serde_json::Value)| {
        let mut claims = sale.hs256.claims("ann", now);
        change(&mut claims);
        sale.hs256.sign(&claims)
    };
    let forger = Minter::hs256(generate_secret().unwrap().as_bytes(), ISSUER, AUDIENCE);
    let (stranger, _) = Minter::es256("k9", ISSUER, AUDIENCE).unwrap();
    let public_key = std::fs::read(&sale.jwks_file).unwrap();
    let confused = Minter::hs256(&public_key, ISSUER, AUDIENCE);
    let none_token = {
        use base64::Engine;
        let part = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!("{}.{}.", part(json!({"alg": "none"})), part(sale.hs256.claims("ann", now)))
    };
    let cases = [
        ("forged signature", forger.token("ann", now)),
        ("wrong issuer", with(&|c| c["iss"] = json!("https://evil.test"))),
        ("wrong audience", with(&|c| c["aud"] = json!("elsewhere"))),
        ("expired", with(&|c| c["exp"] = json!(now - 120))),
        ("not yet valid", with(&|c| c["nbf"] = json!(now + 120))),
        ("alg none", none_token),
        ("HS256 signed with the public key", confused.token("ann", now)),
        ("unknown kid", stranger.token("ann", now)),
    ];
    for (at, (case, token)) in cases.iter().enumerate() {
        unauthenticated(&buy(sale.node(), &format!("bad-{at}"), "phone", Some(token), None).await, case);
    }
    unauthenticated(&buy(sale.node(), "none", "phone", None, Some("ann")).await, "no credential, body user only");
    assert_eq!(sale.sold("phone").await, 0, "no refused credential sold anything");

    let bought = buy(sale.node(), "good", "phone", Some(&sale.es256.token("ann", now)), None).await;
    assert_eq!(bought.status, 200, "{bought:?}");
    let mismatch = buy(sale.node(), "other", "phone", Some(&sale.token("bob")), Some("ann")).await;
    assert_eq!((mismatch.status.as_u16(), mismatch.error()), (403, "user_mismatch"), "{mismatch:?}");
    assert_eq!(sale.sold("phone").await, 1);
    let order_id = bought.body["order_id"].as_str().unwrap().to_string();
    let path = format!("/v1/orders/{order_id}");
    eventually("the order is stored", Duration::from_secs(10), || async {
        call(sale.orders(), "GET", &path, Some(ADMIN), "").await.status == 200
    })
    .await;
    let order = call(sale.orders(), "GET", &path, Some(ADMIN), "").await;
    assert_eq!(order.body["user"], "ann", "the order belongs to the token's subject");
    sale.orders.stop().await;
    drop(sale.redis);
}

/// Goal: the per-user limit holds per verified buyer, however many valid tokens (distinct `jti`
/// and `iat`) the buyer presents at once from as many connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_user_limit_holds_against_many_tokens_of_one_buyer() {
    let skus = "[[skus]]\nid = \"limited\"\ntotal = 100\nper_user_limit = 2\nqty_max = 1\nprice = 1\n";
    let sale = JwtSale::start("SECKILL_TEST_AUTH_LIMIT", skus).await;
    let attempts = (0..40).map(|i| {
        let (node, token) = (sale.node(), sale.token("mallory"));
        // The body names a different invented user each time: under jwt it must not matter.
        tokio::spawn(async move { buy(node, &format!("m-{i}"), "limited", Some(&token), None).await })
    });
    let mut bought = 0;
    for attempt in attempts {
        let answer = attempt.await.unwrap();
        match answer.status.as_u16() {
            200 => bought += 1,
            409 => assert_eq!(answer.error(), "user_limit", "{answer:?}"),
            503 => {} // a retry would be told user_limit or replay; never a third unit
            _ => panic!("unexpected answer {answer:?}"),
        }
    }
    assert!(bought <= 2, "one buyer bought {bought} units past a limit of 2");
    assert_eq!(sale.sold("limited").await, bought);
    sale.orders.stop().await;
}

/// Goal: the burst against a sold-out, ended or not-started SKU is answered from memory before
/// any credential is looked at (those answers are the same for everyone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_that_reveal_nothing_come_before_verification() {
    let skus = "[[skus]]\nid = \"one\"\ntotal = 1\nbuffer = 0\nprice = 1\n\n\
                [[skus]]\nid = \"later\"\ntotal = 1\nprice = 1\nstarts_at = 2099-01-01T00:00:00Z\n";
    let sale = JwtSale::start("SECKILL_TEST_AUTH_MEMORY", skus).await;
    assert_eq!(buy(sale.node(), "a", "one", Some(&sale.token("ann")), None).await.status, 200);
    eventually("the node sees the SKU sold out", Duration::from_secs(5), || async {
        get(sale.node(), "/v1/skus/one").await.body["sold_out"] == true
    })
    .await;
    // The node may first need one read of the order stream before "sold out" is final.
    eventually("sold out without a credential", Duration::from_secs(5), || async {
        let answer = buy(sale.node(), "b", "one", None, Some("bob")).await;
        answer.status == 409 && answer.error() == "sold_out"
    })
    .await;
    let later = buy(sale.node(), "c", "later", None, None).await;
    assert_eq!((later.status.as_u16(), later.error()), (403, "not_started"), "{later:?}");
    // A key that bought is replayed only to its buyer: without a credential it is 401.
    unauthenticated(&buy(sale.node(), "a", "one", None, Some("ann")).await, "a replay needs the buyer");
    let replay = buy(sale.node(), "a", "one", Some(&sale.token("ann")), None).await;
    assert_eq!(replay.status, 200, "{replay:?}");
    sale.orders.stop().await;
}

/// Goal: the order API answers only the order's owner. Another buyer reading or cancelling it
/// gets the very 404 an unknown id gets, and lists only their own; the owner's order is
/// untouched; operators read anything with the admin token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_answer_only_their_owner() {
    let sale = JwtSale::start("SECKILL_TEST_AUTH_ORDERS", SKUS).await;
    let (ann, bob) = (sale.token("ann"), sale.token("bob"));
    let bought = buy(sale.node(), "ann-1", "phone", Some(&ann), None).await;
    assert_eq!(bought.status, 200, "{bought:?}");
    let order_id = bought.body["order_id"].as_str().unwrap().to_string();
    let path = format!("/v1/orders/{order_id}");
    let orders = sale.orders();
    eventually("ann sees her order", Duration::from_secs(10), || async {
        call(orders, "GET", &path, Some(&ann), "").await.status == 200
    })
    .await;

    let unknown = call(orders, "GET", "/v1/orders/999999999", Some(&bob), "").await;
    let not_hers = call(orders, "GET", &path, Some(&bob), "").await;
    assert_eq!(unknown.status, 404);
    assert_eq!((not_hers.status, &not_hers.raw), (unknown.status, &unknown.raw), "no existence leak");
    let cancel = format!("{path}/cancel");
    let cancelled_by_bob = call(orders, "POST", &cancel, Some(&bob), "").await;
    assert_eq!(cancelled_by_bob.status, 404, "{cancelled_by_bob:?}");
    let claimed = call(orders, "POST", &cancel, Some(&bob), r#"{"user":"ann"}"#).await;
    assert_eq!((claimed.status.as_u16(), claimed.error()), (403, "user_mismatch"), "{claimed:?}");
    let hers = call(orders, "GET", &path, Some(&ann), "").await;
    assert_eq!(hers.body["state"], "pending_payment", "ann's order untouched: {hers:?}");

    let bobs = call(orders, "GET", "/v1/me/orders", Some(&bob), "").await;
    assert_eq!(bobs.body["orders"], json!([]), "{bobs:?}");
    let anns = call(orders, "GET", "/v1/me/orders", Some(&ann), "").await;
    assert_eq!(anns.body["orders"][0]["id"], order_id.as_str(), "{anns:?}");
    let listed = call(orders, "GET", "/v1/users/ann/orders", Some(&bob), "").await;
    assert_eq!((listed.status.as_u16(), listed.error()), (403, "admin_only"), "{listed:?}");
    unauthenticated(&call(orders, "GET", &path, None, "").await, "no credential");
    unauthenticated(&call(orders, "GET", &path, Some("not-a-token"), "").await, "garbage credential");
    let operator = call(orders, "GET", "/v1/users/ann/orders", Some(ADMIN), "").await;
    assert_eq!(operator.body["orders"][0]["id"], order_id.as_str(), "{operator:?}");
    assert_eq!(call(orders, "GET", &path, Some(ADMIN), "").await.status, 200);

    let by_ann = call(orders, "POST", &cancel, Some(&ann), "").await;
    assert_eq!(by_ann.status, 200, "the owner cancels: {by_ann:?}");
    sale.orders.stop().await;
}

/// Goal: behind the shop's gateway, a missing, stale or forged signature is 401 and a fresh one
/// buys as the user it signs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_signature_must_be_fresh_and_genuine() {
    let secret = generate_secret().unwrap();
    std::env::set_var("SECKILL_TEST_AUTH_GATEWAY", &secret);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("orders.db").display());
    let cluster =
        config(&redis, "mode = \"gateway\"\ngateway_secret_env = \"SECKILL_TEST_AUTH_GATEWAY\"", SKUS, &store);
    let running = start_cluster(&cluster, Options::default()).await;
    let node = running.addrs()[0];
    let now = auth::unix_now_s();
    let signed = |user: &str, signature: String| {
        let user = user.to_string();
        async move {
            let headers = [
                ("idempotency-key", "gw"),
                ("content-type", "application/json"),
                (auth::GATEWAY_USER_HEADER, user.as_str()),
                (auth::GATEWAY_SIGNATURE_HEADER, signature.as_str()),
            ];
            request(node, "POST", "/v1/purchase", &headers, r#"{"sku":"phone"}"#).await
        }
    };
    let stale = auth::gateway::sign(secret.as_bytes(), "ann", now - 120);
    unauthenticated(&signed("ann", stale).await, "stale");
    let forged = auth::gateway::sign(b"a secret that is not the gateway's", "ann", now);
    unauthenticated(&signed("ann", forged).await, "forged");
    let swapped = auth::gateway::sign(secret.as_bytes(), "bob", now);
    unauthenticated(&signed("ann", swapped).await, "signed for another user");
    unauthenticated(&buy(node, "gw", "phone", None, Some("ann")).await, "missing");
    assert_eq!(running.ledger.status(&SkuId::new("phone").unwrap()).await.unwrap().sold, 0);
    let fresh = auth::gateway::sign(secret.as_bytes(), "ann", now);
    assert_eq!(signed("ann", fresh).await.status, 200);
    drop(cluster);
}
