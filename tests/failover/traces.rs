//! Traces across processes: `seckill node`, `seckill orders` and `seckill paysim` export to a
//! collector the test runs, and one purchase and one payment are followed through all three by
//! the W3C `traceparent` each hop passes on.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::otlp::{new_traceparent, Collector, ReceivedSpan, EXPORT_WAIT};
use testkit::redis::RedisServer;

use crate::harness::request;
use crate::SERIAL;

const SECRET: &str = "a-payment-secret-of-some-length";

struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `seckill <args>` exporting to `collector` every 100 ms, every request without a
/// `traceparent` left untraced (ratio 0), so only the test's own traces arrive.
fn spawn(args: &[&str], collector: &Collector, dir: &std::path::Path, log: &str) -> Child {
    let log = std::fs::File::create(dir.join(log)).expect("log file");
    Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(args)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint())
        .env("OTEL_TRACES_SAMPLER_ARG", "0")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("SECKILL_PAYMENT_SECRET", SECRET)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("seckill starts")
}

/// The first stdout line of `child` starting with `prefix`, e.g. `paysim on http://ADDR`.
fn line_starting(child: &mut Child, prefix: &str) -> String {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let line = lines.by_ref().map_while(Result::ok).find(|line| line.starts_with(prefix));
    // The rest is drained so the process never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    line.unwrap_or_else(|| panic!("no line starting {prefix:?}"))
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn of_trace<'a>(spans: &'a [ReceivedSpan], trace: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|span| span.trace_id == trace).collect()
}

fn named<'a>(spans: &[&'a ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    spans.iter().find(|span| span.name == name).unwrap_or_else(|| panic!("no span {name:?} in {spans:#?}"))
}

/// Goal: an operator follows one purchase (HTTP → decision → confirmer batch → ledger call) on
/// a node, and one payment from the order service to the provider and back, each as one trace
/// joined across processes by `traceparent`, each span named by its role and process. Method:
/// the three processes export to a collector the test runs; requests carry a sampled
/// `traceparent` of the test's (the ratio is 0, so nothing else is traced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_and_a_payment_are_each_one_trace_across_processes() {
    let _serial = SERIAL.lock().await;
    let collector = Collector::start().await.expect("collector");
    let redis = RedisServer::start().expect("a private redis-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut processes = Processes(Vec::new());
    let mut paysim = spawn(&["paysim", "--listen", "127.0.0.1:0"], &collector, dir.path(), "paysim.log");
    let paysim_url = line_starting(&mut paysim, "paysim on ")
        .trim_start_matches("paysim on ")
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    processes.0.push(paysim);
    let (node_port, orders_port) = (testkit::redis::free_port().unwrap(), testkit::redis::free_port().unwrap());
    let config = format!(
        "[ledger]\nurl = \"{}\"\n\n[orders]\nlisten = \"127.0.0.1:{orders_port}\"\nstore = \"sqlite:{}\"\n\n\
         [payments]\nprovider = \"sandbox\"\nurl = \"{paysim_url}\"\n\n\
         [[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:{node_port}\"\n\n\
         [[skus]]\nid = \"lamp\"\ntotal = 10\nprice = 1200\npay_timeout_s = 600\n",
        redis.url(),
        dir.path().join("orders.db").display()
    );
    std::fs::write(dir.path().join("cluster.toml"), config).expect("config");
    processes.0.push(spawn(&["node", "--id", "n1", "--config", "cluster.toml"], &collector, dir.path(), "node.log"));
    processes.0.push(spawn(&["orders", "--config", "cluster.toml"], &collector, dir.path(), "orders.log"));
    wait_listening(node_port);
    wait_listening(orders_port);
    let node: std::net::SocketAddr = format!("127.0.0.1:{node_port}").parse().unwrap();
    let orders: std::net::SocketAddr = format!("127.0.0.1:{orders_port}").parse().unwrap();

    // A purchase, traced from the buyer's side.
    let (traceparent, purchase_trace) = new_traceparent();
    let body = r#"{"sku":"lamp","user":"ann","qty":1}"#;
    let headers =
        [("idempotency-key", "k-ann"), ("content-type", "application/json"), ("traceparent", traceparent.as_str())];
    let bought = request(node, "POST", "/v1/purchase", &headers, body).await;
    assert_eq!(bought.status, 200, "{:?}", bought.body);
    let order_id = bought.body["order_id"].as_str().expect("an order id").to_string();
    let spans = collector
        .wait_for(EXPORT_WAIT, "the purchase's ledger call", |spans| {
            spans.iter().any(|span| span.trace_id == purchase_trace && span.name == "ledger confirm")
        })
        .await
        .unwrap();
    let purchase = of_trace(&spans, &purchase_trace);
    let http = named(&purchase, "POST /v1/purchase");
    let decision = named(&purchase, "decision");
    let batch = named(&purchase, "confirm batch");
    let call = named(&purchase, "ledger confirm");
    assert_eq!(http.parent_span_id, traceparent.split('-').nth(2).unwrap(), "the buyer's span is the parent");
    assert_eq!(decision.parent_span_id, http.span_id);
    assert_eq!(batch.parent_span_id, decision.span_id);
    assert_eq!(call.parent_span_id, batch.span_id);
    assert_eq!((http.service.as_str(), http.instance.as_str()), ("seckill-node", "n1"));
    assert_eq!(http.attribute("http.response.status_code"), Some("200"));
    assert_eq!(decision.attribute("seckill.outcome"), Some("purchased"));
    assert_eq!(call.attribute("seckill.sku"), Some("lamp"));

    // The buyer presses pay: the order service's span, its call to the provider, and the
    // provider's own span under it, in another process.
    let (traceparent, pay_trace) = new_traceparent();
    let pay_headers = [("content-type", "application/json"), ("traceparent", traceparent.as_str())];
    let deadline = Instant::now() + Duration::from_secs(20);
    let started = loop {
        let answer =
            request(orders, "POST", &format!("/v1/orders/{order_id}/pay"), &pay_headers, r#"{"user":"ann"}"#).await;
        if answer.status == 200 || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(started.status, 200, "{:?}", started.body);
    let payment_id = started.body["payment_id"].as_str().expect("a payment id").to_string();
    let spans = collector
        .wait_for(EXPORT_WAIT, "the provider's span of the pay", |spans| {
            spans.iter().any(|span| span.trace_id == pay_trace && span.service == "seckill-paysim")
        })
        .await
        .unwrap();
    let pay = of_trace(&spans, &pay_trace);
    let press = named(&pay, "POST /v1/orders/{id}/pay");
    let create = named(&pay, "provider create");
    let provider = named(&pay, "POST /v1/payments");
    assert_eq!(press.service, "seckill-orders");
    assert_eq!(create.parent_span_id, press.span_id);
    assert_eq!(
        (provider.service.as_str(), provider.parent_span_id.as_str()),
        ("seckill-paysim", create.span_id.as_str())
    );

    // The buyer pays at the provider: its callback carries the trace back to the order
    // service, which records the payment under it.
    let (traceparent, paid_trace) = new_traceparent();
    let paysim_addr: std::net::SocketAddr = paysim_url.trim_start_matches("http://").parse().unwrap();
    let pay_headers = [("content-type", "application/json"), ("traceparent", traceparent.as_str())];
    let paid = request(
        paysim_addr,
        "POST",
        &format!("/v1/payments/{payment_id}/pay"),
        &pay_headers,
        r#"{"outcome":"succeed"}"#,
    )
    .await;
    assert_eq!(paid.status, 200, "{:?}", paid.body);
    let spans = collector
        .wait_for(EXPORT_WAIT, "the order service's record of the payment", |spans| {
            spans.iter().any(|span| span.trace_id == paid_trace && span.name == "store payment")
        })
        .await
        .unwrap();
    let paid = of_trace(&spans, &paid_trace);
    let at_provider = named(&paid, "POST /v1/payments/{id}/pay");
    let callback_out = named(&paid, "POST callback");
    let callback_in = named(&paid, "POST /v1/payments/callback");
    let store = named(&paid, "store payment");
    assert_eq!(callback_out.parent_span_id, at_provider.span_id);
    assert_eq!(
        (callback_in.service.as_str(), callback_in.parent_span_id.as_str()),
        ("seckill-orders", callback_out.span_id.as_str())
    );
    assert_eq!(callback_in.attribute("http.response.status_code"), Some("200"));
    assert_eq!(store.parent_span_id, callback_in.span_id);

    // Ratio 0: nothing without the test's traceparent was exported.
    let untraced = request(
        node,
        "POST",
        "/v1/purchase",
        &[("idempotency-key", "k-bob"), ("content-type", "application/json")],
        r#"{"sku":"lamp","user":"bob","qty":1}"#,
    )
    .await;
    assert_eq!(untraced.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let traces: std::collections::BTreeSet<String> = collector.spans().into_iter().map(|span| span.trace_id).collect();
    let expected: std::collections::BTreeSet<String> = [purchase_trace, pay_trace, paid_trace].into();
    assert_eq!(traces, expected, "only the traces the test started");
    drop(processes);
}
