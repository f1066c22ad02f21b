//! Real Prometheus over a real fleet: every query of the Grafana dashboard in `ops/` returns
//! data. (`the_grafana_dashboard_queries_only_exported_metrics` in `tests/failover` checks the
//! names; this checks that the expressions work and what they show after real events.)
//!
//! `prometheus` must be installed (`scripts/test` installs Debian's); a missing one fails the
//! test, it is never skipped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use seckill::cluster::{Options, RunningCluster};
use seckill::config::Cluster;
use testkit::load;

use crate::harness::{get, one_attempt_per_buyer, start_cluster, RedisServer};

/// How long Prometheus may take to start, and the dashboard's queries to show this test's
/// events (scrapes every second; a failover takes a lease and a grace, ~1.2 s).
const WAIT_MAX: Duration = Duration::from_secs(30);

/// Prometheus' scrape interval here: the shortest that still leaves a scrape time to finish.
const SCRAPE_INTERVAL: &str = "1s";

/// Metrics this test makes move, so the queries that read them must show a value above zero:
/// sales (purchases, decisions, ledger calls and batches, stock left, stock pages), and a node
/// crash (an expiry, units reallocated); the coordinator's gauges are above zero once it leads.
const MOVED_BY_THIS_TEST: &[&str] = &[
    "seckill_purchase_requests_total",
    "seckill_decisions_total",
    "seckill_local_remaining",
    "seckill_ledger_call_seconds_bucket",
    "seckill_ledger_batch_size_sum",
    "seckill_ledger_batch_size_count",
    "seckill_stock_page_requests_total",
    "seckill_coordinator_expiries_total",
    "seckill_coordinator_granted_units_total",
    "seckill_coordinator_is_leader",
    "seckill_coordinator_live_nodes",
    "seckill_coordinator_last_log_index",
    "seckill_coordinator_term",
    "seckill_orders",
    "seckill_orders_consumed_total",
];

/// Metrics whose queries return data (the series are exported from the start) but may stay at
/// zero here, and why that is right.
const ZERO_HERE: &[(&str, &str)] = &[
    ("seckill_ledger_errors_total", "Redis never fails in this test"),
    ("seckill_coordinator_brake_total", "the brake pulls only when most nodes look dead at once; one crash does not"),
    ("seckill_gate_refusals_total", "no safeguard is configured, so the gate refuses nobody"),
    ("seckill_allotment_exhausted_total", "no node runs dry while the ledger has stock: the stock is not sold out"),
    ("seckill_ledger_refused_winners_total", "the ledger refuses a local winner only once the stock is gone"),
    ("seckill_coordinator_buffer_units", "the SKU's buffer is 0"),
    ("seckill_orders_lag_entries", "the consumer keeps up with 15 sales"),
    ("seckill_orders_lag_seconds", "the consumer keeps up with 15 sales"),
    ("seckill_orders_dead_letters_total", "every order event is readable"),
    ("seckill_orders_store_retries_total", "the order store never fails here"),
    ("seckill_orders_payments_total", "nobody pays in this test (tests/orders covers payments)"),
    ("seckill_orders_transitions_total", "no order is paid, cancelled or expired within the test"),
    ("seckill_orders_releases_total", "no order expires within the test"),
    ("seckill_orders_release_refused_units", "no order ends within the test, so no release is refused"),
    ("seckill_orders_payment_checks_total", "the test configures no payment provider (tests/orders covers the jobs)"),
    ("seckill_orders_refund_attempts_total", "the test configures no payment provider (tests/orders covers the jobs)"),
    ("seckill_orders_refunds", "nobody pays, so no refund is owed"),
];

/// The SKU on sale: 30 units, no buffer.
const SKU: &str = "dashboard";

/// Three nodes, a coordinator member and the order service in process over `redis`, selling
/// [`SKU`]. The order service's metrics render on every node's `/metrics` (one recorder per
/// process). Its names
/// (`prom-*`) are used by no other test in this binary: the process's metrics registry is
/// shared, and another test's `c1` setting a gauge for the same labels would overwrite ours.
async fn dashboard_cluster(
    redis: &RedisServer,
    data: &tempfile::TempDir,
) -> (RunningCluster, SocketAddr, orders::OrderService) {
    let port = testkit::redis::free_port().expect("free port");
    let member = SocketAddr::from(([127, 0, 0, 1], port));
    let mut text = format!(
        "[ledger]\nurl = \"{}\"\n\n[[skus]]\nid = \"{SKU}\"\ntotal = 30\nbuffer = 0\n\n\
         [coordinator]\nmembers = [{{ name = \"prom-c1\", listen = \"{member}\" }}]\ndata_dir = {:?}\n\
         heartbeat_ms = 100\nlease_ms = 1000\ngrace_ms = 200\nfence_margin_ms = 150\n\
         election_timeout_min_ms = 100\nelection_timeout_max_ms = 200\n",
        redis.url(),
        data.path().display().to_string()
    );
    for n in 1..=3 {
        text.push_str(&format!("\n[[nodes]]\nid = \"prom-n{n}\"\nlisten = \"127.0.0.1:0\"\n"));
    }
    let cluster = Cluster::parse(&text).unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"));
    let running = start_cluster(&cluster, Options::default()).await;
    let store = seckill::order_service::open_store(&cluster).await.expect("the order store");
    let orders =
        seckill::order_service::start(&cluster, running.ledger.clone(), store).await.expect("the order service");
    (running, member, orders)
}

/// A `prometheus` child on a free loopback port, its config and data in a temp dir; killed on
/// drop.
struct Prometheus {
    addr: SocketAddr,
    child: Child,
    dir: tempfile::TempDir,
}

/// Prometheus: on PATH, or where Debian puts it.
fn binary() -> PathBuf {
    let on_path = Command::new("sh").args(["-c", "command -v prometheus"]).output().ok().filter(|o| o.status.success());
    on_path
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"))
}

impl Prometheus {
    /// Starts Prometheus scraping `/metrics` of `nodes` and `members` every second, and waits
    /// until it is ready.
    async fn start(nodes: &[SocketAddr], members: &[SocketAddr]) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = testkit::redis::free_port().expect("free port");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let targets = |addrs: &[SocketAddr]| addrs.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(", ");
        let config = format!(
            "global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\n\
             scrape_configs:\n  - job_name: nodes\n    static_configs:\n      - targets: [{}]\n\
             \x20 - job_name: coordinator\n    static_configs:\n      - targets: [{}]\n",
            targets(nodes),
            targets(members)
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("write prometheus.yml");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new(binary())
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run prometheus ({}): {e}; scripts/test installs it (Debian: prometheus)",
                    binary().display()
                )
            });
        let mut prometheus = Prometheus { addr, child, dir };
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if testkit::load::connect(addr).await.is_ok() && get(addr, "/-/ready").await.status == 200 {
                return prometheus;
            }
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited ({status}) before it was ready:\n{}", prometheus.log());
            }
            assert!(Instant::now() < deadline, "prometheus not ready after {WAIT_MAX:?}:\n{}", prometheus.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `expr` evaluated now through `/api/v1/query`: the samples' values, one per series.
    async fn query(&self, expr: &str) -> Result<Vec<f64>, String> {
        let answer = get(self.addr, &format!("/api/v1/query?query={}", percent_encode(expr))).await;
        if answer.body["status"] != "success" {
            return Err(format!("{} {}", answer.status, String::from_utf8_lossy(&answer.raw)));
        }
        let result = &answer.body["data"]["result"];
        let values = match answer.body["data"]["resultType"].as_str() {
            Some("vector") => result.as_array().map(|samples| samples.iter().map(|s| &s["value"][1]).collect()),
            Some("scalar") => Some(vec![&result[1]]),
            _ => None,
        };
        let values = values.ok_or_else(|| format!("unexpected result: {}", answer.body["data"]))?;
        Ok(values.into_iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- prometheus log ----\n{}", self.log());
        }
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters, for a query string.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// The dashboard's expressions with Grafana's variables replaced as Grafana would over this
/// test: `$__rate_interval` by 1m (this test's events all fall in the last minute; Grafana's
/// own value would be 4 × the 1 s scrape), `$__interval` by the scrape interval, `$__range` by
/// the dashboard's 15 minutes, and a dashboard variable (`$sku`, `${node}`, `[[sku]]`) by
/// `.*`, its "All" value. Panics on a `$` left over, so a new kind of variable gets a decision.
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../ops/grafana-dashboard.json")).expect("dashboard is JSON");
    let variables: Vec<String> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|variable| variable["type"] != "datasource")
        .filter_map(|variable| variable["name"].as_str().map(str::to_string))
        .collect();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let Some(expr) = target["expr"].as_str() else { continue };
            let mut instantiated = expr
                .replace("$__rate_interval", "1m")
                .replace("${__rate_interval}", "1m")
                .replace("$__interval", SCRAPE_INTERVAL)
                .replace("${__interval}", SCRAPE_INTERVAL)
                .replace("$__range", "15m")
                .replace("${__range}", "15m");
            for name in &variables {
                for form in [format!("${{{name}}}"), format!("[[{name}]]"), format!("${name}")] {
                    instantiated = instantiated.replace(&form, ".*");
                }
            }
            assert!(!instantiated.contains('$'), "a Grafana variable this test cannot fill in: {expr}");
            let title = panel["title"].as_str().unwrap_or("?").to_string();
            queries.push((title, instantiated));
        }
    }
    queries
}

/// The `seckill_*` metrics an expression reads.
fn metrics_in(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("seckill_")).collect()
}

/// Goal: every query of the Grafana dashboard returns data from a real Prometheus scraping a real
/// fleet, and the queries over what this test did show it (above zero). Method: three nodes and
/// a coordinator member in process over real Redis, Prometheus scraping all four every second;
/// sales, stock page views and a node crash (so an expiry and a reallocation happen); then
/// every dashboard query through `/api/v1/query`, polled until it holds or `WAIT_MAX`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let queries = dashboard_queries();
    for (title, expr) in &queries {
        for metric in metrics_in(expr) {
            assert!(
                MOVED_BY_THIS_TEST.contains(&metric) || ZERO_HERE.iter().any(|(m, _)| *m == metric),
                "panel {title:?} reads {metric}: add it to MOVED_BY_THIS_TEST or ZERO_HERE (with why)"
            );
        }
    }
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let (mut running, member, orders) = dashboard_cluster(&redis, &data).await;
    let prometheus = Prometheus::start(&running.addrs(), &[member]).await;
    let targets = 4.0;
    let deadline = Instant::now() + WAIT_MAX;
    // A scrape of every target before anything happens, so rates and increases have a start.
    while prometheus.query("count(up == 1)").await.unwrap_or_default() != [targets] {
        assert!(Instant::now() < deadline, "prometheus never scraped all {targets} targets:\n{}", prometheus.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 15 of the 30 units: every node sells and keeps some, so the crashed one leaves units to
    // reallocate.
    let report = load::run(one_attempt_per_buyer(running.addrs(), SKU, 15, 7)).await.expect("load");
    assert_eq!(report.count("purchased"), 15, "{:?}", report.outcomes);
    for addr in running.addrs() {
        assert_eq!(get(addr, &format!("/v1/skus/{SKU}")).await.status, 200);
    }
    running.nodes.pop().expect("a node").crash();

    // One deadline for every query: a query that never holds does not buy the next one time.
    let deadline = Instant::now() + WAIT_MAX;
    let mut pending: Vec<(String, String, String)> = Vec::new();
    for (title, expr) in &queries {
        let must_move = metrics_in(expr).iter().any(|metric| MOVED_BY_THIS_TEST.contains(metric));
        let shown = loop {
            let values = prometheus.query(expr).await;
            let holds = match &values {
                Ok(values) if must_move => values.iter().any(|v| v.is_finite() && *v > 0.0),
                Ok(values) => !values.is_empty(),
                Err(_) => false,
            };
            if holds || Instant::now() >= deadline {
                break (holds, values);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        eprintln!("{title:?}: {expr} -> {:?}", shown.1);
        if !shown.0 {
            let wanted = if must_move { "a value above zero" } else { "data" };
            pending.push((title.clone(), expr.clone(), format!("wanted {wanted}, got {:?}", shown.1)));
        }
    }
    assert!(pending.is_empty(), "dashboard queries without what they should show: {pending:#?}");
    for (metric, why) in ZERO_HERE {
        eprintln!("{metric} may stay at zero here: {why}");
    }
    drop(prometheus);
    orders.stop().await;
    running.stop().await;
}
