//! The buyer's page as buyers meet it: a real headless chromium (testkit's browser) on the
//! page nginx serves, configured by `seckill lb-config nginx`, in front of a fleet of real
//! processes: a coordinator member, two nodes, an order service on PostgreSQL and the sandbox
//! payment provider. Nothing is scripted on the server side: the countdown runs on the nodes'
//! clock, the line is the ledger's room, the order is the order service's, the payment the
//! sandbox's, and every push reaches the page through nginx's unbuffered event-stream route.
//!
//! Each step's screenshot goes to `target/browser-screenshots/<test>/<buyer>/` (and the
//! operator's page to `…/operator/`); one set is kept in `docs/screenshots/` and shown in the
//! README.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ledger::SkuId;
use testkit::browser::{Browser, LogEntry};

use crate::fleet::{Fleet, OPS_TOKEN};
use crate::harness::get;
use crate::nginx::Nginx;
use crate::{SERIAL, SKU};

/// From writing the config to the sale's start: the fleet (Redis, PostgreSQL, five processes),
/// nginx and a browser start within it, so the page opens before the start. They take about
/// 3 s on this 2-core machine; the rest is room for a busy one.
const START_LEAD: Duration = Duration::from_secs(15);
/// Any one step the page takes on its own (a push, a poll, a payment): seconds, given lots.
const STEP_MAX: Duration = Duration::from_secs(30);
/// The order service's API listening.
const ORDERS_READY_MAX: Duration = Duration::from_secs(30);
const PRICE: u64 = 19_900;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis() as u64
}

/// One unit behind a waiting room that admits one buyer per unit left (`admit_factor` 1.0):
/// while one buyer holds the only ticket, everyone else waits.
fn room_sku_toml(starts_at_ms: u64) -> String {
    format!(
        "[[skus]]\nid = \"{SKU}\"\ntotal = 1\nprice = {PRICE}\npay_timeout_s = 300\nstarts_at_ms = {starts_at_ms}\n\
         waiting_room = {{ admit_per_s = 50, admit_factor = 1.0, ticket_ttl_s = 60, abandon_s = 20 }}\n"
    )
}

/// `target/browser-screenshots/<test>`, emptied.
fn screenshot_dir(test: &str) -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("CARGO_TARGET_TMPDIR is target/tmp");
    let dir = target.join("browser-screenshots").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A failed load this flow causes on purpose: the order read before the order service stored
/// it (404 `unknown_order`, the page reads again), and a purchase a node answered 503 because
/// the other node holds the one unit (the page retries with the same key).
fn expected_failed_load(entry: &LogEntry) -> bool {
    let status = |code: u16| entry.message.contains(&format!("status of {code} "));
    entry.source == "network"
        && ((entry.message.contains("/v1/orders/") && status(404))
            || (entry.message.contains("/v1/purchase") && status(503)))
}

/// Every error the browser logged but [`expected_failed_load`]s: console errors and uncaught
/// exceptions (`console-api`, `javascript`) always count.
async fn unexpected_errors(browser: &Browser) -> Vec<LogEntry> {
    browser.console_errors().await.into_iter().filter(|entry| !expected_failed_load(entry)).collect()
}

async fn button_enabled(browser: &Browser, id: &str, enabled: bool) {
    let script = format!("return document.getElementById({id:?}).disabled === {};", !enabled);
    browser.wait_until(&format!("#{id} enabled: {enabled}"), &script, STEP_MAX).await;
}

/// Goal: the whole sale through the page, on real servers: before the start the page counts
/// down on the server's clock with the button closed; at the start the button opens and the
/// room admits the buyer who was waiting; a second buyer, arriving later, queues behind it
/// with a position; the first buys, sees its order with the deadline, pays at the sandbox and
/// sees it paid; the second, never reloading, is told "Sold out" by a push. No console error
/// in either browser. Method: one unit at admit_factor 1.0 (one live ticket at a time), the
/// start 15 s after the config is written; two chromium sessions, alice and bob, on
/// `/sale/phone` through nginx; the order and the ledger are read back at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_queues_buys_and_pays_in_a_real_browser_while_the_next_hears_sold_out() {
    let _serial = SERIAL.lock().await;
    let began = Instant::now();
    let starts_at_ms = now_ms() + START_LEAD.as_millis() as u64;
    let mut fleet = Fleet::taking_payments(1, 2, &room_sku_toml(starts_at_ms)).await;
    fleet.start_all();
    fleet.wait_nodes_ready().await;
    orders_api_ready(&fleet).await;
    let nginx = Nginx::start_with_config(&fleet.orders_config_path()).await;
    let site = format!("http://{}/sale/{SKU}", nginx.addr);
    let out = screenshot_dir("buyer-page");
    eprintln!("screenshots: {}; fleet ready after {:?}", out.display(), began.elapsed());

    let alice = Browser::start(&out.join("alice")).await;
    alice_opens_the_page_before_the_start(&alice, &site, starts_at_ms).await;
    alice_is_admitted_at_the_start(&alice).await;
    let bob = Browser::start(&out.join("bob")).await;
    bob_queues_behind_alice(&bob, &site).await;
    let order_id = alice_buys(&alice).await;
    bob_hears_sold_out_without_reloading(&bob).await;
    alice_pays(&alice).await;

    the_operator_sees_the_request_and_the_paid_order(&fleet).await;
    let operator = Browser::start(&out.join("operator")).await;
    the_operators_page_shows_the_sale(&operator, &fleet).await;

    let order = get(nginx.addr, &format!("/v1/orders/{order_id}")).await;
    assert_eq!(order.status, 200, "the order through nginx: {order:?}");
    assert_eq!((order.body["user"].as_str(), order.body["state"].as_str()), (Some("alice"), Some("paid")));
    assert_eq!(order.body["unit_price"], PRICE, "{order:?}");
    let status = fleet.ledger().status(&SkuId::new(SKU).expect("sku")).await.expect("the ledger's figures");
    assert_eq!((status.sold, status.remaining), (1, 0), "{status:?}");
    for (name, browser) in [("alice", &alice), ("bob", &bob), ("the operator", &operator)] {
        let errors = unexpected_errors(browser).await;
        assert!(errors.is_empty(), "{name}'s browser logged errors: {errors:#?}");
        let expected = browser.console_errors().await;
        eprintln!("{name}: {} expected failed load(s): {expected:?}", expected.len());
    }
    let log = nginx.error_log();
    for level in ["[alert]", "[crit]", "[emerg]"] {
        assert!(!log.contains(level), "nginx logged {level}:\n{log}");
    }
    eprintln!("the sale through the page took {:?}; screenshots in {}", began.elapsed(), out.display());
}

/// What `/ops` draws, from `GET /admin/cluster`: the SKU's purchase requests, counted by the
/// nodes and heard in their heartbeats, and its orders by state, read from the order service's
/// metrics (published every 2 s).
async fn the_operator_sees_the_request_and_the_paid_order(fleet: &Fleet) {
    let member = fleet.member_addr("c1");
    let deadline = Instant::now() + STEP_MAX;
    loop {
        let cluster = testkit::http::get_json_with(member, "/admin/cluster", Some(OPS_TOKEN), STEP_MAX).await;
        let sku = cluster.as_ref().ok().map(|cluster| cluster["skus"][SKU].clone());
        let seen = sku.as_ref().is_some_and(|sku| {
            sku["requests_total"].as_u64().is_some_and(|requests| requests >= 1) && sku["orders_by_state"]["paid"] == 1
        });
        if seen {
            return;
        }
        assert!(Instant::now() < deadline, "/admin/cluster never showed the request and the paid order: {cluster:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The operator opens `/ops` on the member, gives the admin token, and sees the SKU's row:
/// sold out, a rate of requests (from two reads), and alice's order paid; the charts hold the
/// reads (the unit sold, a request rate) between two clock times; and at the browser's 1000 px
/// nothing scrolls sideways.
async fn the_operators_page_shows_the_sale(operator: &Browser, fleet: &Fleet) {
    operator.goto(&format!("http://{}/ops", fleet.member_addr("c1"))).await;
    operator.type_into("token", OPS_TOKEN).await;
    operator.click("connect").await;
    let row = format!("document.querySelector('#skus tr[data-sku=\"{SKU}\"]')");
    operator
        .wait_until(
            "the SKU's row shows it sold out, its requests per second and the paid order",
            &format!(
                "const row = {row}; return !!row && row.textContent.includes('sold out') \
                 && row.textContent.includes('paid: 1') \
                 && /^[0-9]/.test(row.querySelector('[data-figure=requests-per-s]').textContent);"
            ),
            STEP_MAX,
        )
        .await;
    let points = |chart: &str| format!("JSON.parse(document.getElementById('{chart}').dataset.points || '[]')");
    operator
        .wait_until(
            "the charts hold two reads or more: one unit sold, a request rate",
            &format!(
                "const units = {}, requests = {}; \
                 return units.length >= 2 && units.every(([, sold]) => sold === 1) && requests.length >= 1 \
                 && requests.every(([, rate]) => rate >= 0);",
                points("chart-units"),
                points("chart-requests")
            ),
            STEP_MAX,
        )
        .await;
    let labels = operator
        .execute("return [...document.querySelectorAll('#chart-units text')].map((label) => label.textContent);")
        .await;
    let clock_times = labels.as_array().map_or(0, |labels| {
        labels.iter().filter(|label| label.as_str().is_some_and(|label| label.matches(':').count() == 2)).count()
    });
    assert_eq!(clock_times, 2, "the chart's time axis reads as clock times: {labels}");
    let sideways = operator
        .execute(
            "const page = document.documentElement.scrollWidth > window.innerWidth; \
             const table = document.getElementById('skus').parentElement; \
             return [window.innerWidth, page, table.scrollWidth > table.clientWidth];",
        )
        .await;
    assert_eq!(sideways[1], false, "the page scrolls sideways at {}px", sideways[0]);
    assert_eq!(sideways[2], false, "the SKU table scrolls sideways at {}px", sideways[0]);
    operator.screenshot("ops").await;
}

/// The order service takes a few hundred ms to open its store and listen.
async fn orders_api_ready(fleet: &Fleet) {
    let deadline = Instant::now() + ORDERS_READY_MAX;
    for api in fleet.orders_apis() {
        while tokio::net::TcpStream::connect(api).await.is_err() {
            assert!(Instant::now() < deadline, "the order API on {api} did not listen within {ORDERS_READY_MAX:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Before the start: the countdown, a closed button, a place in the pre-queue, the stock.
async fn alice_opens_the_page_before_the_start(alice: &Browser, site: &str, starts_at_ms: u64) {
    let left_ms = starts_at_ms.saturating_sub(now_ms());
    assert!(
        left_ms > 3_000,
        "the fleet, nginx and the browser took all but {left_ms} ms of the {START_LEAD:?} before the start: \
         too late to see the page before it (a very busy machine? raise START_LEAD)"
    );
    alice.goto(&format!("{site}#user=alice")).await;
    let countdown = alice.wait_for_text("countdown", "Starts in", STEP_MAX).await;
    assert!(!alice.is_enabled("buy").await, "the button is closed before the start ({countdown})");
    let position = alice.wait_for_text("position", "drawn at random", STEP_MAX).await;
    assert!(position.contains("The line opens at"), "the waiter is told when the line opens: {position}");
    let said = format!("{position} {}", alice.text("result").await);
    assert!(!said.contains("your turn"), "never 'your turn' before the start: {said}");
    alice.wait_for_text("stock", "1 of 1 left", STEP_MAX).await;
    assert_eq!(alice.text("buyer").await, "alice");
    assert!(!alice.is_enabled("buy").await, "still closed");
    alice.screenshot("before-start").await;
    eprintln!("alice: {countdown:?}, {left_ms} ms before the start");
}

/// At the start the button opens, and the room, drawing its pre-queue of one, admits alice.
async fn alice_is_admitted_at_the_start(alice: &Browser) {
    alice.wait_for_text("countdown", "On sale now", START_LEAD + STEP_MAX).await;
    button_enabled(alice, "buy", true).await;
    alice.wait_for_text("position", "your turn", STEP_MAX).await;
    alice.wait_for_text("result", "press Buy now", STEP_MAX).await;
    alice.screenshot("on-sale-admitted").await;
}

/// bob arrives after the start, presses buy and joins the line: alice holds the only ticket.
async fn bob_queues_behind_alice(bob: &Browser, site: &str) {
    bob.goto(&format!("{site}#user=bob")).await;
    bob.wait_for_text("countdown", "On sale now", STEP_MAX).await;
    button_enabled(bob, "buy", true).await;
    bob.execute("window.notReloaded = true; return null;").await;
    bob.click("buy").await;
    let position = bob.wait_for_text("position", "Position ", STEP_MAX).await;
    bob.wait_for_text("result", "when it is your turn", STEP_MAX).await;
    bob.screenshot("in-line").await;
    eprintln!("bob: {position:?}");
}

/// alice presses buy with her ticket and sees the order, its deadline and the pay button.
async fn alice_buys(alice: &Browser) -> String {
    alice.click("buy").await;
    alice.wait_for_text("result", "Order placed", STEP_MAX).await;
    let order_id = alice.wait_for_text_matching("order-id", "an order id", |id| !id.is_empty(), STEP_MAX).await;
    alice.wait_for_text("order-state", "Waiting for payment", STEP_MAX).await;
    alice.wait_for_text("order-deadline", "left", STEP_MAX).await;
    alice.wait_for_text("pay", "Pay now", STEP_MAX).await;
    assert_eq!(alice.text("buy").await, "Ordered");
    assert!(!alice.is_enabled("buy").await, "one order, one press");
    alice.wait_for_text("stock", "Sold out", STEP_MAX).await;
    alice.screenshot("ordered").await;
    order_id
}

/// The last unit sold: bob's stream says so, and the page shows it without a reload.
async fn bob_hears_sold_out_without_reloading(bob: &Browser) {
    bob.wait_for_text("result", "Sold out", STEP_MAX).await;
    button_enabled(bob, "buy", false).await;
    assert_eq!(bob.text("buy").await, "Sold out");
    assert_eq!(bob.execute("return window.notReloaded === true;").await, true, "the page was not reloaded");
    bob.wait_for_text("stock", "Sold out", STEP_MAX).await;
    bob.screenshot("sold-out").await;
}

/// alice pays at the sandbox (through nginx) and the order service's order turns paid.
async fn alice_pays(alice: &Browser) {
    alice.click("pay").await;
    alice.wait_for_text("order-state", "Paid", STEP_MAX).await;
    alice.wait_for_text("pay-status", "Paid. Thank you!", STEP_MAX).await;
    alice.wait_for_text("result", "Order placed and paid", STEP_MAX).await;
    let state = alice.execute("return document.getElementById('order').dataset.state;").await;
    assert_eq!(state, "paid");
    assert_eq!(alice.text("pay").await, "", "no pay button on a paid order");
    alice.screenshot("paid").await;
}
