//! After the heal: the run-time SKU joins the sales judged, demand rushes until every SKU sold
//! out, the buyers drain, and the ledger's, the order store's and the money's books are read.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use ledger::{RedisLedger, SkuId};

use super::{
    member_addrs, sells, Buyers, Ended, Sale, Selling, BOUNDS, DRAIN, ORDERS_SETTLE, PAYERS_DRAIN, PAY_GRACE_S,
    QUERY_LIMIT_S, RUSH_PER_S, SELL_OUT_AFTER_HEAL,
};
use crate::books;
use crate::checker::{FinalLedger, OrderBooks};
use crate::history::{Clock, Request};
use crate::money::MoneyBooks;
use crate::monitor;
use crate::room;
use crate::sales;

/// Sells out (or runs out of time or demand), stops the buyers and reads every book.
pub(super) async fn sell_out_and_read(sale: &mut Sale, mut buyers: Buyers, heal_ms: u64) -> anyhow::Result<Ended> {
    add_runtime_sku(sale).await?;
    buyers.workload.set_rate(RUSH_PER_S);
    let watch = books::watch_ledger(&sale.targets)?;
    let demand_ended_ms = sell_out(sale, &buyers, &watch, heal_ms).await;
    // Waiters still listening get their bound to hear the sell-out before they stop.
    let room = match buyers.waiters.take() {
        Some(waiters) => Some(stop_waiters(sale, waiters, &watch).await?),
        None => None,
    };
    sale.history.event(None, "new keys stop; keys under way drain");
    let keys = buyers.workload.keys();
    let finished = buyers.workload.finish(DRAIN).await;
    let paying = buyers.payer.finish(PAYERS_DRAIN).await;
    sale.history.event(None, format!("buyers stopped paying: {paying:?}"));
    let samples = buyers.monitor.stop().await;
    let (finals, coordinator) = read_ledger(sale).await?;
    let requests = sale.history.requests();
    let (books, money) = read_store(sale, &requests).await;
    Ok(Ended {
        watch,
        demand_ended_ms,
        room,
        keys,
        finished,
        paying,
        samples,
        finals,
        coordinator,
        requests,
        books,
        money,
    })
}

/// Once its creation is done, the run-time SKU is sold and judged like the others.
async fn add_runtime_sku(sale: &mut Sale) -> anyhow::Result<()> {
    if let Some(creating) = sale.creating.take() {
        let created_ms = creating.await.context("the run-time SKU's creation")?;
        let created_ms = created_ms.map_err(|e| anyhow::anyhow!("the run-time SKU: {e}"))?;
        let terms = sales::RUNTIME.striped(sale.stripes);
        let (sku, ledgers) = (SkuId::new(terms.id)?, terms.ledgers()?);
        sale.sellings.push(Selling { terms, sku, ledgers, created_ms: Some(created_ms), sold_out_ms: None });
    }
    Ok(())
}

/// Watches until every SKU sold out, the buyers ran out of keys or the bound after the heal
/// passed, noting when each sold out; returns when demand ended, if it ended on its own.
async fn sell_out(sale: &mut Sale, buyers: &Buyers, watch: &RedisLedger, heal_ms: u64) -> Option<u64> {
    let deadline = sale.clock.instant_at(heal_ms) + SELL_OUT_AFTER_HEAL;
    while Instant::now() < deadline {
        for selling in sale.sellings.iter_mut().filter(|s| s.sold_out_ms.is_none()) {
            // The monitor reads the main SKU every tick; the others are asked here.
            let remaining = if selling.sku == sale.sku {
                buyers.monitor.latest().and_then(|s| s.ledger).map(|l| l.unsold())
            } else {
                books::unsold(watch, &selling.ledgers).await
            };
            if remaining == Some(0) {
                selling.sold_out_ms = Some(sale.clock.now_ms());
            }
        }
        if sale.sellings.iter().all(|s| s.sold_out_ms.is_some()) {
            break;
        }
        if buyers.workload.exhausted() {
            return Some(sale.clock.now_ms());
        }
        tokio::time::sleep(monitor::TICK / 2).await;
    }
    None
}

/// Waits for the room SKU to settle ([`room_settles`]), then stops its waiters: what they heard,
/// and how the room ended.
async fn stop_waiters(
    sale: &Sale,
    waiters: room::Waiters,
    watch: &RedisLedger,
) -> anyhow::Result<(Vec<room::WaiterLog>, room::RoomEnd)> {
    let room_sku = SkuId::new(room::ROOM.id)?;
    let end = room_settles(watch, &room_sku, &sale.clock).await;
    sale.history.event(
        None,
        match end.sold_out_since_ms {
            Some(since) => format!("{}: sold out since {since} ms; its waiters stop", room::ROOM.id),
            None => format!("{}: units left; its waiters stop", room::ROOM.id),
        },
    );
    Ok((waiters.finish().await, end))
}

/// Longest the run waits for the room SKU to stay sold out before its waiters stop: units that
/// expired orders give back can reopen the line more than once.
const ROOM_SETTLE_MAX: Duration = Duration::from_secs(20);

/// Waits until the room SKU has stayed sold out for the bound its waiters have to hear it (or
/// [`ROOM_SETTLE_MAX`] passed): the waiters then stop on a sell-out they all should know of.
async fn room_settles(watch: &RedisLedger, sku: &SkuId, clock: &Clock) -> room::RoomEnd {
    let give_up = Instant::now() + ROOM_SETTLE_MAX;
    let mut sold_out_since_ms = None;
    loop {
        let now_ms = clock.now_ms();
        match books::unsold(watch, std::slice::from_ref(sku)).await {
            Some(0) => {
                let since = *sold_out_since_ms.get_or_insert(now_ms);
                if now_ms >= since + room::SOLD_OUT_HEARD_WITHIN_MS {
                    break;
                }
            }
            // Units back, or a read that failed: the stretch is not known to be unbroken.
            _ => sold_out_since_ms = None,
        }
        if Instant::now() >= give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    room::RoomEnd { sold_out_since_ms, stopped_ms: clock.now_ms() }
}

/// The ledger's final read of every SKU sold, then whether the members agree on a leader.
async fn read_ledger(sale: &Sale) -> anyhow::Result<(Vec<FinalLedger>, Result<(), String>)> {
    let mut finals = Vec::new();
    for selling in &sale.sellings {
        let targets = sale.targets.with_sku(selling.sku.clone(), selling.ledgers.clone());
        finals.push(books::read_final(&targets, sale.clock).await);
    }
    sale.history.event(None, "ledger read");
    let members_now = member_addrs(&sale.fleet)?;
    let settle_ms = Duration::from_millis(BOUNDS.coordinator_settle_ms);
    let coordinator = books::agreement(&members_now, testkit::fleet::TEST_CLUSTER_TOKEN, settle_ms).await;
    sale.history.event(None, format!("members agree on a leader: {}", coordinator.is_ok()));
    Ok((finals, coordinator))
}

/// Each SKU's order books and the money's, once the order service settled (or the bound ran
/// out).
async fn read_store(sale: &Sale, requests: &[Request]) -> (Vec<OrderBooks>, Result<MoneyBooks, String>) {
    // A clock behind expires orders later by as much; a started payment stretches its order's
    // deadline by the grace and then the queries.
    let skews = &sale.schedule.setup.orders_clock_skew_s;
    let behind_s = skews.iter().map(|skew| (-skew).max(0) as u64).max().unwrap_or(0);
    let settle = ORDERS_SETTLE + Duration::from_secs(behind_s + PAY_GRACE_S + QUERY_LIMIT_S);
    let store_url = sale.fleet.store_url();
    let mut books = Vec::new();
    for selling in &sale.sellings {
        let targets = sale.targets.with_sku(selling.sku.clone(), selling.ledgers.clone());
        let sold: Vec<Request> = requests.iter().filter(|r| sells(r, &selling.sku)).cloned().collect();
        let order_books = books::read_order_books(store_url.as_deref(), &targets, &sold, settle).await;
        sale.history.event(None, format!("{}: order store read; settled: {:?}", selling.sku, order_books.settled));
        books.push(order_books);
    }
    let released: BTreeSet<String> = books
        .iter()
        .filter_map(|b| b.releases.as_ref().ok())
        .flat_map(|(log, _)| log.iter().map(|r| r.order_id.0.clone()))
        .collect();
    let money = books::read_money(store_url.as_deref(), sale.paysim, released, settle).await;
    sale.history.event(
        None,
        format!(
            "money read: {}",
            money.as_ref().map_or_else(|e| e.clone(), |m| format!("{} payments taken", m.taken().count()))
        ),
    );
    (books, money)
}
