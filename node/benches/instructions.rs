//! Instruction counts of the hot paths, for CI: throughput here swings ±20% from run to run,
//! while valgrind's count of instructions is the same twice whatever else the machine does, so
//! only a count can catch a 5% regression. `scripts/instructions` runs every case under
//! callgrind and compares with `node/benches/instructions.baseline` (BENCHMARKS.md, "Instruction
//! counts in CI").
//!
//! Each case sets up, warms up, then runs its operation `--iterations` times, each inside
//! [`measured`]: callgrind runs with collection off and `--toggle-collect` on that function, so
//! set-up, warm-up and the runtime's idle work are not counted. A run is one process on a
//! current-thread runtime, so the same binary and input count alike.
//!
//! - `engine_sold_out`: one purchase decided by `Node::purchase` on a sold-out SKU (memory).
//! - `http_sold_out`: the same, as one HTTP request through the node's server and handler, on a
//!   kept-alive loopback connection; the client side is raw bytes, a few hundred instructions.
//! - `confirm_batch_256`: one batch of 256 purchases confirmed on a private redis-server: the
//!   arguments built, the call, the reply parsed (Redis's own work is another process's).
//! - `jwt_cached`: one purchase's HS256 JWT verification, the token already in the cache.
//!
//! With no `--case` (as `cargo test --all-targets` runs it) every case runs once, uncounted: a
//! check that the cases still work.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{
    CatalogueLedger, EmbeddedLedger, IdempotencyKey, Ledger, NodeId, Purchase, RedisLedger, RedisLedgerConfig,
    SalesLedger, Seller, SkuId, SkuTerms, UserId,
};
use node::{Node, NodeConfig, NodeOptions, PurchaseRequest, Shutdown, SkuConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CASES: [&str; 4] = ["engine_sold_out", "http_sold_out", "confirm_batch_256", "jwt_cached"];
const WARM_UP: u64 = 50;

/// The only function callgrind counts in (`--toggle-collect=*instructions::measured*`).
#[inline(never)]
fn measured<R>(operation: impl FnOnce() -> R) -> R {
    std::hint::black_box(operation())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|at| args.get(at + 1)).cloned();
    let iterations: u64 = value("--iterations").and_then(|n| n.parse().ok()).unwrap_or(1);
    let cases: Vec<String> = match value("--case") {
        Some(case) => vec![case],
        None => CASES.iter().map(|c| c.to_string()).collect(),
    };
    for case in &cases {
        let started = Instant::now();
        run(case, iterations);
        if value("--case").is_none() {
            println!("{case}: ran once in {:?}", started.elapsed());
        }
    }
}

fn run(case: &str, iterations: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    match case {
        "engine_sold_out" => engine_sold_out(&runtime, iterations),
        "http_sold_out" => http_sold_out(&runtime, iterations),
        "confirm_batch_256" => confirm_batch(&runtime, iterations, 256),
        "jwt_cached" => jwt_cached(iterations),
        other => panic!("no case {other}; the cases: {CASES:?}"),
    }
}

/// A node on the embedded ledger whose one SKU, `phone`, sold its only unit.
fn sold_out_node(runtime: &tokio::runtime::Runtime) -> Node {
    runtime.block_on(async {
        let ledger: Arc<dyn Ledger> = Arc::new(EmbeddedLedger::default());
        let (sku, terms) = (SkuId::new("phone").expect("id"), SkuTerms::new(1));
        ledger.create_sku(&sku, &terms).await.expect("sku");
        let mut config = NodeConfig::new(NodeId::new("bench").expect("id"));
        // No status refresh during the counted calls: it is background work, not the answer's.
        config.status_refresh = Duration::from_secs(3600);
        // Back-to-back requests would each wait out the gap between catch-up reads, and the
        // count would be the timer's; a crowd shares that wait, and a lone buyer meets none.
        config.sold_out_read_gap = Duration::ZERO;
        let node =
            Node::start(config, vec![SkuConfig::new(sku, terms, 1)], ledger, NodeOptions::default(), Shutdown::new());
        let sold = node.purchase(request("u-first", "k-first")).await;
        assert!(matches!(sold, node::Outcome::Purchased { .. }), "the only unit sells: {sold:?}");
        let refused = node.purchase(request("u-second", "k-second")).await;
        assert!(matches!(refused, node::Outcome::SoldOut { .. }), "then the SKU is sold out: {refused:?}");
        node
    })
}

fn request<'a>(user: &'a str, key: &'a str) -> PurchaseRequest<'a> {
    PurchaseRequest {
        sku: "phone",
        user,
        qty: 1,
        key,
        ip: std::net::Ipv4Addr::LOCALHOST.into(),
        token: None,
        ticket: None,
        trace: telemetry::untraced(),
    }
}

fn engine_sold_out(runtime: &tokio::runtime::Runtime, iterations: u64) {
    let node = sold_out_node(runtime);
    // The same buyer and key each time: a burst's buyers differ, but the decision's work does
    // not depend on which buyer it is, and fixed ids keep the count free of formatting.
    for _ in 0..WARM_UP {
        runtime.block_on(node.purchase(request("u-bench", "k-bench")));
    }
    for _ in 0..iterations {
        let outcome = measured(|| runtime.block_on(node.purchase(request("u-bench", "k-bench"))));
        assert!(matches!(outcome, node::Outcome::SoldOut { .. }), "{outcome:?}");
    }
}

fn http_sold_out(runtime: &tokio::runtime::Runtime, iterations: u64) {
    let node = sold_out_node(runtime);
    let mut client = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let at: SocketAddr = listener.local_addr().expect("addr");
        tokio::spawn(node::serve(node, listener));
        tokio::net::TcpStream::connect(at).await.expect("connect")
    });
    let body = r#"{"sku":"phone","user":"u-bench","qty":1}"#;
    let sent = format!(
        "POST /v1/purchase HTTP/1.1\r\nhost: bench\r\nidempotency-key: k-bench\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut answer = vec![0u8; 4096];
    let mut exchange = |client: &mut tokio::net::TcpStream| {
        runtime.block_on(async {
            client.write_all(sent.as_bytes()).await.expect("send");
            read_response(client, &mut answer).await
        })
    };
    for _ in 0..WARM_UP {
        exchange(&mut client);
    }
    for _ in 0..iterations {
        let status = measured(|| exchange(&mut client));
        assert_eq!(status, 409, "sold out");
    }
}

/// Reads one response (headers and a `content-length` body) and returns its status.
async fn read_response(client: &mut tokio::net::TcpStream, buffer: &mut [u8]) -> u16 {
    let mut filled = 0;
    loop {
        let n = client.read(&mut buffer[filled..]).await.expect("read");
        assert!(n > 0, "the node closed the connection");
        filled += n;
        let text = &buffer[..filled];
        let Some(end) = text.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let head = std::str::from_utf8(&text[..end]).expect("ascii head");
        let length: usize = head
            .lines()
            .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if filled >= end + 4 + length {
            return head[9..12].parse().expect("status");
        }
    }
}

fn confirm_batch(runtime: &tokio::runtime::Runtime, iterations: u64, size: u64) {
    let redis = PrivateRedis::start();
    let ledger = runtime.block_on(async {
        let ledger = RedisLedger::connect(RedisLedgerConfig::new(redis.url())).expect("ledger");
        let sku = SkuId::new("bench").expect("id");
        ledger.create_sku(&sku, &SkuTerms::new(1_000_000_000_000)).await.expect("sku");
        ledger
    });
    let (sku, seller) = (SkuId::new("bench").expect("id"), Seller::new(NodeId::new("bench").expect("id"), 1));
    // Ids of one width, so every batch builds and parses the same number of bytes.
    let batch = |at: u64| -> Vec<Purchase> {
        (at * size..(at + 1) * size)
            .map(|n| Purchase {
                key: IdempotencyKey::new(&format!("k{n:010}")).expect("key"),
                user: UserId::new(&format!("u{n:010}")).expect("user"),
                qty: 1,
                token: None,
                order_id: None,
            })
            .collect()
    };
    let mut at = 0;
    for _ in 0..WARM_UP.min(10) {
        runtime.block_on(ledger.confirm(&sku, &seller, &batch(at))).expect("confirm");
        at += 1;
    }
    for _ in 0..iterations {
        let purchases = batch(at);
        at += 1;
        let outcome = measured(|| runtime.block_on(ledger.confirm(&sku, &seller, &purchases))).expect("confirm");
        assert_eq!(outcome.verdicts.len() as u64, size);
    }
}

fn jwt_cached(iterations: u64) {
    const SECRET_ENV: &str = "SECKILL_BENCH_JWT_SECRET";
    let secret = "bench-secret-of-thirty-two-bytes!!";
    // Set before any thread but this one exists: the process's only environment write.
    std::env::set_var(SECRET_ENV, secret);
    let settings = auth::Settings::Jwt(auth::JwtSettings {
        hs256_secret_env: Some(SECRET_ENV.into()),
        jwks_file: None,
        issuer: "bench".into(),
        audience: "seckill".into(),
        leeway: Duration::from_secs(30),
        user_claim: "sub".into(),
    });
    let authenticator = auth::Authenticator::from_settings(&settings).expect("jwt settings");
    let now = auth::unix_now_s();
    let token = auth::mint::Minter::hs256(secret.as_bytes(), "bench", "seckill").token("u-bench", now);
    let mut headers = hyper::HeaderMap::new();
    headers.insert(hyper::header::AUTHORIZATION, format!("Bearer {token}").parse().expect("header"));
    for _ in 0..WARM_UP {
        authenticator.verify(&headers, now).expect("verifies");
    }
    for _ in 0..iterations {
        let user = measured(|| authenticator.verify(&headers, now)).expect("verifies");
        assert_eq!(user.as_ref().map(|u| u.as_str()), Some("u-bench"));
    }
}

/// A redis-server of this process's own, on a free loopback port, in a temp dir; stopped when
/// dropped.
struct PrivateRedis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    fn start() -> PrivateRedis {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/test installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        PrivateRedis { child, port, _dir: dir }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
