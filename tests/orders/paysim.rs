//! The sandbox payment provider as a process (`seckill paysim` on a free loopback port), driven
//! through `orders::provider::SandboxProvider` (the client the order service uses) and plain
//! HTTP for the buyer's side, its notifications received by a listener of the test's and checked
//! with `orders::signature::verify`. It needs neither Redis nor PostgreSQL.

use std::collections::VecDeque;
use std::io::{Read, Seek};
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use orders::provider::{
    CreatePayment, PaymentProvider, PaymentStatus, ProviderError, RefundRequest, RefundStatus, SandboxProvider,
};
use orders::signature::{self, SignatureError, SIGNATURE_HEADER};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::TcpListener;
use tokio::process::{Child, ChildStdout, Command};

pub(crate) const SECRET: &str = "paysim-test-secret-0123456789";
/// Longest wait for anything the sandbox does on its own (a notification, a retry).
const WITHIN: Duration = Duration::from_secs(5);
/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(600);

/// `seckill paysim` on a free loopback port, killed when dropped.
pub(crate) struct Sandbox {
    pub(crate) addr: SocketAddr,
    pub(crate) provider: SandboxProvider,
    _child: Child,
    /// Held so the process never writes to a closed pipe.
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Sandbox {
    /// Starts it with the secret in `SECKILL_PAYMENT_SECRET`, seed 1 (unless `args` name one)
    /// and `args`.
    pub(crate) async fn start(args: &[&str]) -> Sandbox {
        Sandbox::start_with("SECKILL_PAYMENT_SECRET", args).await
    }

    /// Starts it with the secret in the environment variable `secret_env` (and that name given
    /// as `--secret-env`).
    async fn start_with(secret_env: &str, args: &[&str]) -> Sandbox {
        let seed: &[&str] = if args.contains(&"--seed") { &[] } else { &["--seed", "1"] };
        let mut log = tempfile::tempfile().expect("a temp file for its stderr");
        let mut child = Command::new(env!("CARGO_BIN_EXE_seckill"))
            .args(["paysim", "--listen", "127.0.0.1:0", "--secret-env", secret_env])
            .args(seed)
            .args(args)
            .env_remove("SECKILL_PAYMENT_SECRET")
            .env(secret_env, SECRET)
            .stdout(Stdio::piped())
            .stderr(log.try_clone().expect("the temp file"))
            .kill_on_drop(true)
            .spawn()
            .expect("seckill paysim starts");
        let mut stdout = BufReader::new(child.stdout.take().expect("its stdout")).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), stdout.next_line())
            .await
            .expect("paysim names its address within 10 s")
            .expect("its stdout");
        let Some(line) = line else {
            let mut stderr = String::new();
            let _ = log.seek(std::io::SeekFrom::Start(0)).and_then(|_| log.read_to_string(&mut stderr));
            panic!("seckill paysim {args:?} exited before naming its address: {stderr}");
        };
        let addr: SocketAddr = line
            .strip_prefix("paysim on http://")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("not `paysim on http://ADDR …`: {line}"));
        let provider = SandboxProvider::new(&format!("http://{addr}")).expect("the base URL");
        Sandbox { addr, provider, _child: child, _stdout: stdout }
    }

    async fn create(&self, order_id: &str, amount: u64, inbox: &Inbox) -> orders::provider::ProviderPayment {
        let request =
            CreatePayment { order_id: order_id.into(), amount, currency: "USD".into(), callback_url: inbox.url() };
        self.provider.create(&request).await.expect("the payment is created")
    }

    /// The buyer settles payment `id` at its pay URL: the status and the answer.
    pub(crate) async fn pay(&self, id: &str, outcome: &str) -> (u16, Value) {
        testkit::http::post_json(self.addr, &format!("/v1/payments/{id}/pay"), &json!({ "outcome": outcome }), WITHIN)
            .await
            .expect("the pay route answers")
    }

    pub(crate) async fn stats(&self) -> Value {
        self.get("/v1/stats").await
    }

    pub(crate) async fn get(&self, path: &str) -> Value {
        testkit::http::get_json(self.addr, path, WITHIN).await.expect("a GET answers")
    }

    pub(crate) async fn set_faults(&self, faults: Value) -> (u16, Value) {
        testkit::http::send_json(hyper::Method::PUT, self.addr, "/v1/faults", &faults, None, WITHIN)
            .await
            .expect("the faults route answers")
    }

    async fn refund(&self, refund_id: &str, reference: &str, amount: u64) -> Result<RefundStatus, ProviderError> {
        let request =
            RefundRequest { refund_id: refund_id.into(), reference: reference.into(), amount, currency: "USD".into() };
        self.provider.refund(&request).await
    }
}

/// One request the callback receiver got.
#[derive(Clone, Debug)]
struct Received {
    signature: Option<String>,
    body: Bytes,
    at: Instant,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON notification")
    }

    /// Checks the signature as the order service does.
    fn verify(&self, secret: &str) -> Result<(), SignatureError> {
        let now_s = orders::unix_ms() / 1000;
        signature::verify(secret.as_bytes(), self.signature.as_deref(), &self.body, now_s, signature::TOLERANCE_S)
    }
}

/// A stand-in for the order service's callback route: records every request and answers the
/// statuses it was told to, then 200.
struct Inbox {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    answers: Arc<Mutex<VecDeque<u16>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Inbox {
    async fn start() -> Inbox {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("its address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(Mutex::new(VecDeque::new()));
        let (received_, answers_) = (received.clone(), answers.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (received, answers) = (received_.clone(), answers_.clone());
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let (received, answers) = (received.clone(), answers.clone());
                    async move {
                        let signature = request
                            .headers()
                            .get(SIGNATURE_HEADER)
                            .and_then(|value| value.to_str().ok())
                            .map(str::to_string);
                        let body = request.into_body().collect().await?.to_bytes();
                        received.lock().unwrap().push(Received { signature, body, at: Instant::now() });
                        let status = answers.lock().unwrap().pop_front().unwrap_or(200);
                        let mut response = hyper::Response::new(Full::new(Bytes::from_static(b"{}")));
                        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                        Ok::<_, hyper::Error>(response)
                    }
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        Inbox { addr, received, answers, task }
    }

    fn url(&self) -> String {
        format!("http://{}/v1/payments/callback", self.addr)
    }

    /// The next requests are answered with `statuses`, in order.
    fn answer_first(&self, statuses: &[u16]) {
        self.answers.lock().unwrap().extend(statuses);
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until `count` requests came, at most [`WITHIN`].
    async fn wait_for(&self, count: usize) -> Vec<Received> {
        let deadline = Instant::now() + WITHIN;
        loop {
            let received = self.received();
            if received.len() >= count {
                return received;
            }
            assert!(Instant::now() < deadline, "{count} notifications expected within {WITHIN:?}, got {received:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asserts that the receiver got exactly `count` requests and nothing more for [`QUIET`].
    async fn stays_at(&self, count: usize) {
        tokio::time::sleep(QUIET).await;
        assert_eq!(self.received().len(), count, "{:?}", self.received());
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn notification(order_id: &str, reference: &str, amount: u64) -> Value {
    json!({ "order_id": order_id, "reference": reference, "amount": amount, "currency": "USD" })
}

/// Goal: the happy path as the order service will walk it, and create's idempotency. Method: a
/// payment created twice, queried, paid at its pay URL; its notification must verify with the
/// shared secret (and not with another) and say what was paid, once.
#[tokio::test]
async fn a_paid_payment_is_notified_signed_and_create_is_idempotent() {
    let sandbox = Sandbox::start(&[]).await;
    let inbox = Inbox::start().await;
    let created = sandbox.create("sku-1", 1999, &inbox).await;
    assert_eq!((created.order_id.as_str(), &created.status), ("sku-1", &PaymentStatus::Pending));
    let pay_url = format!("http://{}/v1/payments/{}/pay", sandbox.addr, created.id);
    assert_eq!(created.pay_url.as_deref(), Some(pay_url.as_str()));
    assert_eq!(sandbox.create("sku-1", 1999, &inbox).await, created, "a second create is the same payment");
    let other_amount =
        CreatePayment { order_id: "sku-1".into(), amount: 1, currency: "USD".into(), callback_url: inbox.url() };
    assert!(
        matches!(sandbox.provider.create(&other_amount).await, Err(ProviderError::ReferenceTaken(m)) if m.contains("order_id_reused")),
        "another amount under the same order id is the reference taken, for a new attempt"
    );
    assert_eq!(sandbox.provider.query("sku-1").await, Ok(PaymentStatus::Pending));
    assert_eq!(sandbox.provider.query("sku-2").await, Ok(PaymentStatus::NotFound));

    let (status, body) = sandbox.pay(&created.id, "succeed").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("succeeded")), "{body}");
    let got = inbox.wait_for(1).await;
    assert_eq!(got[0].verify(SECRET), Ok(()), "signed with the secret from the environment");
    assert_eq!(got[0].verify("another-secret-of-some-length"), Err(SignatureError::Mismatch));
    assert_eq!(got[0].json(), notification("sku-1", &created.id, 1999));
    let paid = PaymentStatus::Succeeded { reference: created.id.clone(), amount: 1999, currency: "USD".into() };
    assert_eq!(sandbox.provider.query("sku-1").await, Ok(paid.clone()));
    assert_eq!(sandbox.create("sku-1", 1999, &inbox).await.status, paid, "create after payment says it is paid");
    let (status, body) = sandbox.pay(&created.id, "succeed").await;
    assert_eq!((status, body["error"].as_str()), (409, Some("already_settled")), "{body}");
    inbox.stays_at(1).await;
    let stats = sandbox.stats().await;
    assert_eq!(
        (&stats["payments"], &stats["succeeded"], &stats["callbacks_sent"], &stats["callback_attempts"]),
        (&json!(1), &json!(1), &json!(1), &json!(1)),
        "{stats}"
    );
    assert_eq!(stats["callbacks_in_flight"], 0, "{stats}");
}

/// Goal: a decline is a failure the query reports, and nothing is notified. Method: one payment
/// declined by the buyer, one "succeed" declined by `decline_p = 1` set at run time.
#[tokio::test]
async fn a_declined_payment_fails_and_is_never_notified() {
    let sandbox = Sandbox::start(&[]).await;
    let inbox = Inbox::start().await;
    let refused = sandbox.create("sku-1", 500, &inbox).await;
    let (status, body) = sandbox.pay(&refused.id, "decline").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("failed")), "{body}");
    assert!(matches!(sandbox.provider.query("sku-1").await, Ok(PaymentStatus::Failed { .. })));

    let (status, body) = sandbox.set_faults(json!({ "decline_p": 1.0 })).await;
    assert_eq!((status, &body["decline_p"]), (200, &json!(1.0)), "{body}");
    let unlucky = sandbox.create("sku-2", 500, &inbox).await;
    let (status, body) = sandbox.pay(&unlucky.id, "succeed").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("failed")), "{body}");
    assert!(matches!(sandbox.provider.query("sku-2").await, Ok(PaymentStatus::Failed { .. })));
    assert_eq!(sandbox.create("sku-2", 500, &inbox).await.status, sandbox.provider.query("sku-2").await.unwrap());

    inbox.stays_at(0).await;
    let stats = sandbox.stats().await;
    assert_eq!((&stats["declined"], &stats["succeeded"]), (&json!(2), &json!(0)), "{stats}");
    assert_eq!((&stats["callback_attempts"], &stats["callbacks_in_flight"]), (&json!(0), &json!(0)), "{stats}");
}

/// Goal: with `drop_p = 1` a success is never notified, and the query still finds it: the case
/// the order service's query job exists for.
#[tokio::test]
async fn a_dropped_notification_is_found_only_by_query() {
    let sandbox = Sandbox::start(&["--drop-p", "1"]).await;
    let inbox = Inbox::start().await;
    let created = sandbox.create("sku-1", 700, &inbox).await;
    assert_eq!(sandbox.pay(&created.id, "succeed").await.0, 200);
    inbox.stays_at(0).await;
    let paid = PaymentStatus::Succeeded { reference: created.id.clone(), amount: 700, currency: "USD".into() };
    assert_eq!(sandbox.provider.query("sku-1").await, Ok(paid));
    let stats = sandbox.stats().await;
    assert_eq!((&stats["callbacks_dropped"], &stats["callbacks_sent"]), (&json!(1), &json!(0)), "{stats}");
}

/// Goal: with `duplicate_p = 1` a success is notified twice, the same signed body both times,
/// and `--secret-env` names where the secret comes from.
#[tokio::test]
async fn a_duplicated_notification_arrives_twice() {
    let sandbox = Sandbox::start_with("PAYSIM_TEST_SECRET", &["--duplicate-p", "1"]).await;
    let inbox = Inbox::start().await;
    let created = sandbox.create("sku-1", 300, &inbox).await;
    assert_eq!(sandbox.pay(&created.id, "succeed").await.0, 200);
    let got = inbox.wait_for(2).await;
    for received in &got {
        assert_eq!(received.verify(SECRET), Ok(()));
        assert_eq!(received.json(), notification("sku-1", &created.id, 300));
    }
    inbox.stays_at(2).await;
    let stats = sandbox.stats().await;
    assert_eq!((&stats["callbacks_duplicated"], &stats["callbacks_sent"]), (&json!(1), &json!(2)), "{stats}");
}

/// Goal: a notification the receiver does not take is retried until it does, and
/// `callback_delay_ms` holds the first attempt back. Method: the receiver answers 500, then 503,
/// then 200.
#[tokio::test]
async fn notifications_are_retried_until_answered_and_can_be_delayed() {
    let sandbox = Sandbox::start(&["--callback-delay-ms", "300"]).await;
    let inbox = Inbox::start().await;
    inbox.answer_first(&[500, 503]);
    let created = sandbox.create("sku-1", 100, &inbox).await;
    let paid_at = Instant::now();
    assert_eq!(sandbox.pay(&created.id, "succeed").await.0, 200);
    let got = inbox.wait_for(3).await;
    assert!(got[0].at.duration_since(paid_at) >= Duration::from_millis(300), "the delay: {:?}", got[0].at - paid_at);
    for received in &got {
        assert_eq!(received.verify(SECRET), Ok(()), "every attempt is signed afresh");
        assert_eq!(received.json(), notification("sku-1", &created.id, 100));
    }
    inbox.stays_at(3).await;
    let stats = sandbox.stats().await;
    assert_eq!(
        (&stats["callbacks_sent"], &stats["callback_attempts"], &stats["callbacks_failed"]),
        (&json!(1), &json!(3), &json!(0)),
        "{stats}"
    );
}

/// Goal: under `reorder`, the notifications of a batch arrive last-first.
#[tokio::test]
async fn reorder_sends_each_batch_in_reverse() {
    let sandbox = Sandbox::start(&["--reorder", "--reorder-window-ms", "500"]).await;
    let inbox = Inbox::start().await;
    let mut ids = Vec::new();
    for order in ["sku-1", "sku-2", "sku-3"] {
        ids.push(sandbox.create(order, 100, &inbox).await.id);
    }
    for id in &ids {
        assert_eq!(sandbox.pay(id, "succeed").await.0, 200);
    }
    let got = inbox.wait_for(3).await;
    let orders: Vec<Value> = got.iter().map(|received| received.json()["order_id"].clone()).collect();
    assert_eq!(orders, vec![json!("sku-3"), json!("sku-2"), json!("sku-1")]);
}

/// Goal: refunds are idempotent by refund id and never give back more than was paid; every
/// refusal is final (`Refused`), never "unknown".
#[tokio::test]
async fn refunds_are_idempotent_by_refund_id_and_never_exceed_the_payment() {
    let sandbox = Sandbox::start(&[]).await;
    let inbox = Inbox::start().await;
    let paid = sandbox.create("sku-1", 1000, &inbox).await.id;
    let pending = sandbox.create("sku-2", 1000, &inbox).await.id;
    assert_eq!(sandbox.pay(&paid, "succeed").await.0, 200);

    assert_eq!(sandbox.refund("r1", &paid, 600).await, Ok(RefundStatus::Succeeded));
    assert_eq!(sandbox.refund("r1", &paid, 600).await, Ok(RefundStatus::Succeeded), "a retry of the same refund");
    let stats = sandbox.stats().await;
    assert_eq!((&stats["refunds"], &stats["refunded_amount"]), (&json!(1), &json!(600)), "{stats}");
    let refused = |result: Result<RefundStatus, ProviderError>, code: &str| match result {
        Err(ProviderError::Refused(message)) => assert!(message.contains(code), "{code}: {message}"),
        other => panic!("{code}: {other:?}"),
    };
    refused(sandbox.refund("r1", &paid, 700).await, "refund_id_reused");
    refused(sandbox.refund("r2", &paid, 500).await, "exceeds_payment");
    assert_eq!(sandbox.refund("r2", &paid, 400).await, Ok(RefundStatus::Succeeded));
    refused(sandbox.refund("r3", &paid, 1).await, "exceeds_payment");
    refused(sandbox.refund("r4", &pending, 1).await, "not_refundable");
    refused(sandbox.refund("r5", "pay_nobody", 1).await, "unknown_payment");
    let in_euros = RefundRequest { refund_id: "r6".into(), reference: paid.clone(), amount: 1, currency: "EUR".into() };
    refused(sandbox.provider.refund(&in_euros).await, "currency_mismatch");
    let stats = sandbox.stats().await;
    assert_eq!((&stats["refunds"], &stats["refunded_amount"]), (&json!(2), &json!(1000)), "{stats}");
}

/// Goal: an unavailable provider is an error, never a success or a failure, and a 503 did
/// nothing. Method: `unavailable_p = 1` at run time, then off again; then a provider nobody
/// listens for, and one that never answers, under a short timeout.
#[tokio::test]
async fn an_unavailable_provider_is_an_error_never_an_answer() {
    let sandbox = Sandbox::start(&[]).await;
    let inbox = Inbox::start().await;
    let paid = sandbox.create("sku-1", 100, &inbox).await.id;
    assert_eq!(sandbox.pay(&paid, "succeed").await.0, 200);
    assert_eq!(sandbox.set_faults(json!({ "unavailable_p": 1.0 })).await.0, 200);

    let request =
        CreatePayment { order_id: "sku-2".into(), amount: 100, currency: "USD".into(), callback_url: inbox.url() };
    fn unavailable<T>(result: &Result<T, ProviderError>) -> bool {
        matches!(result, Err(ProviderError::Unavailable(_)))
    }
    assert!(unavailable(&sandbox.provider.create(&request).await));
    assert!(unavailable(&sandbox.provider.query("sku-1").await));
    assert!(unavailable(&sandbox.refund("r1", &paid, 100).await));
    let stats = sandbox.stats().await;
    assert_eq!(
        (&stats["unavailable_answers"], &stats["payments"], &stats["refunds"]),
        (&json!(3), &json!(1), &json!(0))
    );

    assert_eq!(sandbox.set_faults(json!({ "unavailable_p": 0.0 })).await.0, 200);
    assert_eq!(sandbox.provider.create(&request).await.map(|p| p.status), Ok(PaymentStatus::Pending));

    let gone = TcpListener::bind("127.0.0.1:0").await.expect("a port").local_addr().expect("its address");
    let nobody = SandboxProvider::new(&format!("http://{gone}")).expect("a base URL");
    assert!(unavailable(&nobody.query("sku-1").await), "nobody listens");
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let mute = SandboxProvider::new(&format!("http://{}", silent.local_addr().expect("its address")))
        .expect("a base URL")
        .with_timeout(Duration::from_millis(300));
    let asked_at = Instant::now();
    assert!(unavailable(&mute.query("sku-1").await), "accepted, never answered");
    assert!(asked_at.elapsed() < Duration::from_secs(2), "bounded by its timeout: {:?}", asked_at.elapsed());
}

/// Goal: the same seed makes the same choices. Method: two sandboxes seeded alike, each asked to
/// settle the same 24 payments with `decline_p = 0.5`, in the same order.
#[tokio::test]
async fn the_same_seed_declines_the_same_payments() {
    let inbox = Inbox::start().await;
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let sandbox = Sandbox::start(&["--seed", "42", "--decline-p", "0.5"]).await;
        let mut statuses = Vec::new();
        for order in 0..24 {
            let id = sandbox.create(&format!("sku-{order}"), 100, &inbox).await.id;
            statuses.push(sandbox.pay(&id, "succeed").await.1["status"].clone());
        }
        outcomes.push(statuses);
    }
    assert_eq!(outcomes[0], outcomes[1]);
    assert!(outcomes[0].contains(&json!("failed")) && outcomes[0].contains(&json!("succeeded")), "{:?}", outcomes[0]);
}

/// Goal: bad requests get a 4xx with a JSON error and change nothing; a sandbox that could not
/// sign, or that would listen beyond loopback, does not start.
#[tokio::test]
async fn bad_requests_are_refused_and_bad_starts_exit() {
    let sandbox = Sandbox::start(&[]).await;
    let addr = sandbox.addr;
    let create =
        |body: Value| async move { testkit::http::post_json(addr, "/v1/payments", &body, WITHIN).await.unwrap() };
    let good =
        json!({ "order_id": "sku-1", "amount": 100, "currency": "USD", "callback_url": "http://127.0.0.1:9/cb" });
    let with = |field: &str, value: Value| {
        let mut body = good.clone();
        body[field] = value;
        body
    };
    for (body, code) in [
        (with("callback_url", json!("https://127.0.0.1:9/cb")), "bad_callback_url"),
        (with("amount", json!(0)), "bad_amount"),
        (with("amount", json!(u64::MAX)), "bad_amount"),
        (with("currency", json!("usd")), "bad_currency"),
        (with("order_id", json!("")), "bad_body"),
        (json!({ "order_id": "sku-1" }), "bad_body"),
    ] {
        let (status, answer) = create(body.clone()).await;
        assert_eq!((status, answer["error"].as_str()), (400, Some(code)), "{body}: {answer}");
        assert!(answer["message"].is_string(), "{answer}");
    }
    let raw = |path: &'static str, body: Bytes| async move {
        testkit::http::post_raw(addr, path, &[], body, WITHIN).await.unwrap()
    };
    assert_eq!(raw("/v1/payments", Bytes::from_static(b"{")).await.0, 400);
    let (status, answer) = raw("/v1/payments", Bytes::from(vec![b' '; 20 * 1024])).await;
    assert_eq!((status, answer["error"].as_str()), (413, Some("body_too_large")));
    let get = |path: &'static str| async move {
        testkit::http::send_json(hyper::Method::GET, addr, path, &Value::Null, None, WITHIN).await.unwrap()
    };
    assert_eq!(get("/v1/payments").await.0, 400, "no order_id");
    assert_eq!(get("/v1/payments/pay_none").await.0, 404);
    assert_eq!(get("/v2/anything").await.0, 404);
    assert_eq!(
        testkit::http::send_json(hyper::Method::DELETE, addr, "/v1/stats", &Value::Null, None, WITHIN).await.unwrap().0,
        405
    );
    let (status, _) =
        testkit::http::post_json(addr, "/v1/payments/pay_none/pay", &json!({ "outcome": "maybe" }), WITHIN)
            .await
            .unwrap();
    assert_eq!(status, 400);
    let (status, answer) = sandbox.set_faults(json!({ "drop_p": 2.0 })).await;
    assert_eq!((status, answer["error"].as_str()), (400, Some("bad_faults")), "{answer}");
    assert_eq!(sandbox.set_faults(json!({ "drop": 1.0 })).await.0, 400, "a misspelt knob");
    let faults = testkit::http::get_json(addr, "/v1/faults", WITHIN).await.unwrap();
    assert_eq!(faults["drop_p"], json!(0.0), "a refused change changes nothing");
    assert_eq!(sandbox.stats().await["payments"], 0);

    let start = |listen: &str, secret: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"));
        command.args(["paysim", "--listen", listen]).env_remove("SECKILL_PAYMENT_SECRET");
        if let Some(secret) = secret {
            command.env("SECKILL_PAYMENT_SECRET", secret);
        }
        let output = command.output().expect("seckill paysim runs");
        assert!(!output.status.success(), "it must not start");
        String::from_utf8_lossy(&output.stderr).to_string()
    };
    assert!(start("127.0.0.1:0", None).contains("SECKILL_PAYMENT_SECRET"));
    assert!(start("127.0.0.1:0", Some("short")).contains("at least 16"));
    assert!(start("0.0.0.0:0", Some(SECRET)).contains("loopback"));
}

/// Goal: the merchant can close an order's payment so it never succeeds after its order
/// expired, a payment that succeeded first is what close answers, and an answer lost on its way
/// back (done, answered 503) is safe to ask again: no second payment, no second refund. Method:
/// close an open, a paid and an unknown order's payment; then `answer_lost_p = 1` for a create,
/// a refund and a close, each asked again with the fault off; the settlement report lists it all.
#[tokio::test]
async fn close_ends_an_open_payment_and_lost_answers_are_safe_to_repeat() {
    let sandbox = Sandbox::start(&[]).await;
    let inbox = Inbox::start().await;
    let open = sandbox.create("sku-1", 100, &inbox).await.id;
    let paid = sandbox.create("sku-2", 100, &inbox).await.id;
    assert_eq!(sandbox.pay(&paid, "succeed").await.0, 200);
    assert!(
        matches!(sandbox.provider.close("sku-1").await, Ok(PaymentStatus::Failed { reason }) if reason == "closed")
    );
    assert_eq!(sandbox.pay(&open, "succeed").await.0, 409, "a closed payment cannot be paid");
    assert!(matches!(sandbox.provider.close("sku-2").await, Ok(PaymentStatus::Succeeded { .. })), "paid first");
    assert_eq!(sandbox.provider.close("sku-9").await, Ok(PaymentStatus::NotFound));

    assert_eq!(sandbox.set_faults(json!({ "answer_lost_p": 1.0 })).await.0, 200);
    let request =
        CreatePayment { order_id: "sku-3".into(), amount: 100, currency: "USD".into(), callback_url: inbox.url() };
    let lost = |result: &Result<_, ProviderError>| matches!(result, Err(ProviderError::Unavailable(_)));
    assert!(lost(&sandbox.provider.create(&request).await.map(|_| ())));
    assert!(lost(&sandbox.refund("r1", &paid, 100).await.map(|_| ())));
    assert!(lost(&sandbox.provider.close("sku-3").await.map(|_| ())));
    assert_eq!(sandbox.set_faults(json!({ "answer_lost_p": 0.0 })).await.0, 200);
    assert!(matches!(sandbox.provider.create(&request).await.map(|p| p.status), Ok(PaymentStatus::Failed { .. })));
    assert_eq!(sandbox.refund("r1", &paid, 100).await, Ok(RefundStatus::Succeeded), "the same refund, once");
    let stats = sandbox.stats().await;
    assert_eq!(
        (&stats["payments"], &stats["refunds"], &stats["closed"], &stats["lost_answers"]),
        (&json!(3), &json!(1), &json!(2), &json!(3)),
        "{stats}"
    );
    let report = sandbox.get("/v1/settlements").await;
    assert_eq!(report["payments"].as_array().map(Vec::len), Some(3), "{report}");
    assert_eq!(report["refunds"][0]["refund_id"], json!("r1"), "{report}");
}
