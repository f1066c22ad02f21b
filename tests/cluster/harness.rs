//! What every integration test stands on: a real `redis-server` of its own (free loopback port,
//! temp dir, killed on drop), a cluster started on it, and a small HTTP client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Request, StatusCode};
use ledger::{
    CatalogueLedger, IdempotencyKey, Ledger, NodeId, Purchase, RedisLedger, RedisLedgerConfig, SalesLedger, Seller,
    SkuId, SkuTerms, UserId,
};
use seckill::cluster::{build_ledger, Options, RunningCluster};
use seckill::config::Cluster;

/// How long a cluster may take to come up before the test fails.
const STARTUP_MAX: Duration = Duration::from_secs(10);

/// The shared private Redis (`testkit::redis`), with panicking helpers for tests.
pub struct RedisServer(testkit::redis::RedisServer);

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer(testkit::redis::RedisServer::start().expect("a private redis-server (scripts/test installs it)"))
    }

    pub fn url(&self) -> String {
        self.0.url()
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Starts again on the same port and dir; the AOF brings the data back.
    pub fn restart(&mut self) {
        self.0.restart().expect("redis restarts");
    }

    /// Starts again on the same port with an empty dir: Redis lost everything.
    pub fn restart_empty(&mut self) {
        self.0.restart_empty().expect("redis restarts empty");
    }

    /// SIGSTOP / SIGCONT: Redis hangs without closing connections.
    pub fn pause(&self) {
        self.0.signal("-STOP").expect("SIGSTOP redis");
    }

    pub fn resume(&self) {
        self.0.signal("-CONT").expect("SIGCONT redis");
    }

    /// A direct connection, for checks the ledger API does not expose (TTLs, raw keys).
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url()).and_then(|c| c.get_connection()).expect("connect to test Redis")
    }
}

/// A private three-master Redis Cluster (`testkit::redis::RedisCluster`), up and
/// healthy. Fails the test, never skips it, when `redis-server` or `redis-cli` is missing.
pub fn start_redis_cluster() -> testkit::redis::RedisCluster {
    testkit::redis::RedisCluster::start().unwrap_or_else(|e| {
        panic!("a private Redis Cluster did not start: {e:#}\n(scripts/test installs redis-server and redis-cli)")
    })
}

/// A Redis ledger on `redis` with a short call timeout, as the node tests want.
/// Whether the Redis behind `con` holds a decision for idempotency key `key` of `sku` (prefix
/// `seckill`): a field of one of the SKU's window hashes of records (`confirm.lua`).
pub fn holds_record(con: &mut redis::Connection, sku: &str, key: &str) -> bool {
    let windows: Vec<String> =
        redis::cmd("KEYS").arg(format!("seckill:{{{sku}}}:ids:*")).query(con).expect("KEYS of the record windows");
    windows.iter().any(|window| redis::cmd("HEXISTS").arg(window).arg(key).query::<bool>(con).expect("HEXISTS"))
}

pub fn redis_ledger(redis: &RedisServer) -> Arc<dyn Ledger> {
    Arc::new(RedisLedger::connect(RedisLedgerConfig::new(redis.url())).expect("ledger"))
}

/// `nodes` nodes on free ports over the ledger at `ledger_url`, selling the SKUs in `skus_toml`
/// (`[[skus]]` tables). `extra_toml` follows the ledger URL, so its leading bare keys belong to
/// `[ledger]` and it may open `[node_settings]`.
pub fn cluster_config(ledger_url: &str, nodes: usize, skus_toml: &str, extra_toml: &str) -> Cluster {
    let mut text = format!("[ledger]\nurl = \"{ledger_url}\"\n{extra_toml}\n{skus_toml}\n");
    for n in 1..=nodes {
        text.push_str(&format!("\n[[nodes]]\nid = \"n{n}\"\nlisten = \"127.0.0.1:0\"\n"));
    }
    Cluster::parse(&text).unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"))
}

/// Starts the cluster and waits until every node is ready.
pub async fn start_cluster(cluster: &Cluster, options: Options) -> RunningCluster {
    let ledger = build_ledger(&cluster.ledger).await.expect("ledger");
    let running = RunningCluster::start(cluster, ledger, options).await.expect("cluster starts");
    running.wait_ready(STARTUP_MAX).await.expect("cluster ready");
    running
}

/// One HTTP answer, body parsed as JSON where it is JSON.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: serde_json::Value,
    pub raw: Bytes,
}

impl Answer {
    pub fn error(&self) -> &str {
        self.body.get("error").and_then(|e| e.as_str()).unwrap_or("")
    }

    pub fn replayed(&self) -> bool {
        self.headers.get("idempotent-replayed").is_some_and(|v| v == "true")
    }
}

/// Sends one request on a fresh connection.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let mut sender = testkit::load::connect(addr).await.expect("connect to node");
    let mut builder = Request::builder().method(method).uri(path).header("host", addr.to_string());
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = sender.send_request(builder.body(Full::new(body.into())).expect("request")).await.expect("response");
    let (parts, body) = response.into_parts();
    let raw = body.collect().await.expect("body").to_bytes();
    Answer { status: parts.status, headers: parts.headers, body: serde_json::from_slice(&raw).unwrap_or_default(), raw }
}

/// `POST /v1/purchase` with a key and a JSON body.
pub async fn purchase(addr: SocketAddr, key: &str, sku: &str, user: &str, qty: i64) -> Answer {
    let body = format!(r#"{{"sku":"{sku}","user":"{user}","qty":{qty}}}"#);
    request(addr, "POST", "/v1/purchase", &[("idempotency-key", key), ("content-type", "application/json")], body).await
}

pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    request(addr, "GET", path, &[], Bytes::new()).await
}

/// Polls `check` every 10 ms until it holds, failing the test after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `buyers` distinct buyers, one attempt each (retried on 503 with the same key), 16 at a time.
pub fn one_attempt_per_buyer(targets: Vec<SocketAddr>, sku: &str, buyers: u64, seed: u64) -> testkit::load::LoadPlan {
    testkit::load::LoadPlan {
        targets,
        sku: sku.into(),
        purchases: buyers,
        users: buyers,
        concurrency: 16,
        retries_max: 5,
        retry_pause: Duration::from_millis(20),
        seed,
        rate_per_s: None,
        bearer: None,
    }
}

/// One unit for `user` under the idempotency key `key`, as a node asks the ledger.
pub fn buy(key: &str, user: &str) -> Purchase {
    Purchase {
        key: IdempotencyKey::new(key).unwrap(),
        user: UserId::new(user).unwrap(),
        qty: 1,
        token: None,
        order_id: None,
    }
}

/// `seckill reconcile` against the ledger at `url`, as an operator runs it. Method: 4 sales of
/// each of `skus` straight on the ledger and no order service, so the SQLite store is empty;
/// then a check (exit 1, 4 missing per SKU), `--repair` (exit 0, 4 replayed per SKU), and a
/// check again (exit 0, a report per SKU).
pub async fn assert_reconcile_repairs(url: &str, skus: &[String]) {
    const SALES: u64 = 4;
    let ledger = RedisLedger::connect(RedisLedgerConfig::new(url.to_string())).expect("a ledger");
    let seller = Seller::new(NodeId::new("n1").unwrap(), 1);
    let dir = tempfile::tempdir().unwrap();
    let mut config = format!(
        "[ledger]\nurl = \"{url}\"\n\n[orders]\nstore = \"sqlite:{}\"\n\n[[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:0\"\n",
        dir.path().join("orders.db").display()
    );
    for sku in skus {
        config.push_str(&format!("\n[[skus]]\nid = \"{sku}\"\ntotal = 10\n"));
        let id = SkuId::new(sku).unwrap();
        ledger.create_sku(&id, &SkuTerms::new(10)).await.expect("create");
        for n in 0..SALES {
            ledger.confirm(&id, &seller, &[buy(&format!("k{n}"), &format!("u{n}"))]).await.expect("confirm");
        }
    }
    let path = dir.path().join("cluster.toml");
    std::fs::write(&path, config).unwrap();

    let (code, before) = run_reconcile(&path, false);
    assert_eq!((code, &before["ok"]), (Some(1), &serde_json::json!(false)), "{before}");
    for report in before["skus"].as_array().expect("a report per SKU") {
        assert_eq!(
            (report["events"].as_u64(), report["missing_count"].as_u64()),
            (Some(SALES), Some(SALES)),
            "{report}"
        );
    }
    let (code, repaired) = run_reconcile(&path, true);
    assert_eq!((code, &repaired["ok"]), (Some(0), &serde_json::json!(true)), "{repaired}");
    for sku in skus {
        assert_eq!(repaired["repaired"][sku]["replayed"].as_u64(), Some(SALES), "{sku}: {repaired}");
    }
    let (code, after) = run_reconcile(&path, false);
    assert_eq!(code, Some(0), "{after}");
    assert_eq!(after["skus"].as_array().map(Vec::len), Some(skus.len()), "{after}");
}

/// `seckill reconcile --config <config> --json [--repair]`, as an operator runs it: its exit
/// code and its JSON report.
fn run_reconcile(config: &std::path::Path, repair: bool) -> (Option<i32>, serde_json::Value) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"));
    command.arg("reconcile").arg("--config").arg(config).arg("--json");
    if repair {
        command.arg("--repair");
    }
    let output = tokio::task::block_in_place(|| command.output()).expect("seckill reconcile runs");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stderr)));
    (output.status.code(), report)
}

/// Calls of one Redis command (lower case, as `INFO commandstats` names it) the server has run,
/// those inside scripts included.
pub fn command_calls(redis: &RedisServer, command: &str) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut redis.connection()).expect("INFO");
    let prefix = format!("cmdstat_{command}:calls=");
    stats.lines().find_map(|line| line.strip_prefix(&prefix)?.split(',').next()?.parse().ok()).unwrap_or(0)
}
