//! Reading the books once a schedule's buyers stopped, whatever fleet ran it (processes or
//! containers): the ledger's final read, the order store's once it settled, the money's at
//! the sandbox and in the store, and whether the members agree on a leader. The checker judges
//! what these return.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ledger::{LedgerReads, OrderFeed, RedisConnection, RedisLedger, RedisLedgerConfig, SkuId, ORDER_EVENTS_MAX};

use crate::checker::{FinalLedger, OrderBooks, StoredOrder};
use crate::history::{Clock, Request};
use crate::money::{self, MoneyBooks, MoneyOrder, RecordedPayment};
use crate::monitor::{self, Targets};
use crate::stripes::{self, StripeBooks};

/// How long the final read of the ledger may keep retrying.
const FINAL_READ_MAX: Duration = Duration::from_secs(10);

/// Longest one poll of a member's state may take: a frozen member must not stall the read.
const PROBE_MAX: Duration = Duration::from_millis(500);

/// Reads the ledger after the buyers stopped, retrying while Redis recovers and, for a striped
/// SKU, while a transfer between its stripes is under way (the checker wants none in flight
/// once settled, and a transfer a fault interrupted is the next leader's to complete).
pub async fn read_final(targets: &Targets, clock: Clock) -> FinalLedger {
    let deadline = Instant::now() + FINAL_READ_MAX;
    let mut config = RedisLedgerConfig::new(targets.redis_url.clone());
    config.call_timeout = Duration::from_secs(2);
    config.key_prefix = targets.key_prefix.clone();
    let ledger = match RedisLedger::connect(config.clone()) {
        Ok(ledger) => ledger,
        Err(e) => {
            let error = e.to_string();
            return FinalLedger {
                status: Err(error.clone()),
                orders: Err(error.clone()),
                releases: Err(error),
                sellers: None,
                stripes: vec![],
                at_ms: clock.now_ms(),
            };
        }
    };
    let mut redis = RedisConnection::open(&config).ok();
    loop {
        let read = read_ledgers(targets, &ledger, &mut redis, clock).await;
        let settled = read.status.as_ref().is_ok_and(|s| s.transferred_out == s.transferred_in);
        let done = read.status.is_ok() && read.orders.is_ok() && read.releases.is_ok() && read.sellers.is_some();
        if (done && settled) || Instant::now() >= deadline {
            return read;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One pass over every ledger of the SKU: each stripe's books, and their sums as the SKU's (see
/// [`crate::stripes`]). An unstriped SKU's is its one ledger's, as read before stripes.
async fn read_ledgers(
    targets: &Targets,
    ledger: &RedisLedger,
    redis: &mut Option<RedisConnection>,
    clock: Clock,
) -> FinalLedger {
    let striped = targets.ledgers.len() > 1;
    // A stripe's error names the stripe; an unstriped SKU's reads as it always did.
    let named = |stripe: &SkuId, e: String| if striped { format!("{stripe}: {e}") } else { e };
    let mut statuses: Result<Vec<ledger::SkuStatus>, String> = Ok(Vec::new());
    let mut orders: Result<Vec<Vec<ledger::OrderEvent>>, String> = Ok(Vec::new());
    let mut releases: Result<Vec<Vec<ledger::ReleaseEvent>>, String> = Ok(Vec::new());
    let mut sellers = Some(Vec::new());
    let mut stripes = Vec::new();
    for stripe in &targets.ledgers {
        let status = ledger.status(stripe).await.map_err(|e| named(stripe, e.to_string()));
        let own_orders = ledger.orders(stripe, 0, ORDER_EVENTS_MAX).await.map_err(|e| named(stripe, e.to_string()));
        let own_releases = release_log(ledger, stripe).await.map_err(|e| named(stripe, e));
        let own_sellers = match redis {
            Some(redis) => monitor::read_seller_book(&targets.key_prefix, stripe, redis).await,
            None => None,
        };
        if let (true, Ok(status)) = (striped, &status) {
            stripes.push(StripeBooks {
                ledger: stripe.to_string(),
                status: status.clone(),
                streamed: own_orders.as_ref().ok().map(|o| o.iter().map(|o| u64::from(o.qty)).sum()),
                by_seller: own_sellers.as_ref().map(|book| book.values().sum()),
            });
        }
        gather(&mut statuses, status);
        gather(&mut orders, own_orders);
        gather(&mut releases, own_releases);
        sellers = sellers.zip(own_sellers).map(|(mut books, book)| {
            books.push(book);
            books
        });
    }
    FinalLedger {
        status: statuses.and_then(|s| stripes::combine(&s).ok_or_else(|| "the SKU has no ledgers".to_string())),
        orders: orders.map(|o| o.concat()),
        releases: releases.map(|r| r.concat()),
        sellers: sellers.map(stripes::merge_sellers),
        stripes,
        at_ms: clock.now_ms(),
    }
}

/// Adds one ledger's read to the SKU's: the first error stands for the whole.
fn gather<T>(all: &mut Result<Vec<T>, String>, one: Result<T, String>) {
    match (all.as_mut(), one) {
        (Ok(all), Ok(one)) => all.push(one),
        (Ok(_), Err(e)) => *all = Err(e),
        (Err(_), _) => {}
    }
}

/// The SKU's whole release log.
async fn release_log(ledger: &RedisLedger, sku: &SkuId) -> Result<Vec<ledger::ReleaseEvent>, String> {
    let mut log = Vec::new();
    loop {
        let after = log.last().map_or(0, |r: &ledger::ReleaseEvent| r.seq);
        let page = ledger.releases(sku, after, ORDER_EVENTS_MAX).await.map_err(|e| e.to_string())?;
        if page.is_empty() {
            return Ok(log);
        }
        log.extend(page);
    }
}

/// Waits (up to `settle`) until the store holds every order event of every ledger of the SKU
/// and every order has expired and given its units back (nobody pays), then reads what the
/// checker needs. A stripe's orders are stored under its own ledger's id (`s/i`), so each is
/// read on its own and the SKU's books are their sums.
pub async fn read_order_books(
    store_url: Option<&str>,
    targets: &Targets,
    requests: &[Request],
    settle: Duration,
) -> OrderBooks {
    let failed = |e: String| OrderBooks {
        settled: Err(e.clone()),
        receipts: BTreeMap::new(),
        releases: Err(e.clone()),
        given_back: Err(e.clone()),
        reconcile: Err(e),
    };
    let Some(url) = store_url else { return failed("the fleet runs no order store".into()) };
    let store = match orders::store::open(url).await {
        Ok(store) => store,
        Err(e) => return failed(format!("the order store: {e}")),
    };
    let mut config = RedisLedgerConfig::new(targets.redis_url.clone());
    config.call_timeout = Duration::from_secs(2);
    config.key_prefix = targets.key_prefix.clone();
    let ledger = match RedisLedger::connect(config) {
        Ok(ledger) => ledger,
        Err(e) => return failed(format!("the ledger: {e}")),
    };
    let striped = targets.ledgers.len() > 1;
    let named = |stripe: &SkuId, e: String| if striped { format!("{stripe}: {e}") } else { e };
    let settled = wait_settled(&ledger, &*store, targets, settle).await;
    let ids: BTreeSet<&str> =
        requests.iter().filter(|r| r.is_purchase()).filter_map(|r| r.order_id.as_deref()).collect();
    let mut receipts = BTreeMap::new();
    for id in ids {
        let order = match store.get(id).await {
            Ok(order) => order,
            Err(e) => return OrderBooks { settled, ..failed(format!("store: {e}")) },
        };
        let order = order.map(|o| StoredOrder {
            key: o.new.idempotency_key.clone(),
            qty: o.new.qty,
            state: o.state.as_str().to_string(),
            released: o.released_at_ms.is_some(),
        });
        receipts.insert(id.to_string(), order);
    }
    let (mut given_back, mut releases, mut reconcile) = (Ok(Vec::new()), Ok(Vec::new()), Ok(Vec::new()));
    for stripe in &targets.ledgers {
        gather(&mut given_back, given_back_of(&*store, stripe).await.map_err(|e| named(stripe, e)));
        let log = match (release_log(&ledger, stripe).await, ledger.status(stripe).await) {
            (Ok(log), Ok(status)) => Ok((log, status.released)),
            (Err(e), _) => Err(e),
            (_, Err(e)) => Err(e.to_string()),
        };
        gather(&mut releases, log.map_err(|e| named(stripe, e)));
        let problems = orders::reconcile::check(&ledger, &*store, stripe).await.map(|report| report.problems);
        gather(&mut reconcile, problems.map(|p| p.into_iter().map(|p| named(stripe, p)).collect::<Vec<_>>()));
    }
    OrderBooks {
        settled,
        receipts,
        releases: releases.map(|logs| {
            let released = logs.iter().map(|(_, released)| released).sum();
            (logs.into_iter().flat_map(|(log, _)| log).collect(), released)
        }),
        given_back: given_back.map(|units| units.iter().sum()),
        reconcile: reconcile.map(|problems| problems.concat()),
    }
}

/// Polls until every ledger of the SKU has its order events stored and its orders expired and
/// given back ([`unsettled`]); after `settle`, what was left is the error.
async fn wait_settled(
    ledger: &RedisLedger,
    store: &dyn orders::store::OrderStore,
    targets: &Targets,
    settle: Duration,
) -> Result<(), String> {
    let striped = targets.ledgers.len() > 1;
    let named = |stripe: &SkuId, e: String| if striped { format!("{stripe}: {e}") } else { e };
    let deadline = Instant::now() + settle;
    loop {
        let mut left = Ok(Vec::new());
        for stripe in &targets.ledgers {
            gather(&mut left, unsettled(ledger, store, stripe).await.map(|l| l.map(|l| named(stripe, l))));
        }
        let left = left.map(|left| left.into_iter().flatten().collect::<Vec<String>>().join("; "));
        match left {
            Ok(left) if left.is_empty() => return Ok(()),
            Ok(left) | Err(left) if Instant::now() >= deadline => {
                return Err(format!("after {settle:?}: {left}"));
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// What one ledger's orders still lack in the store, or none when they are all stored and every
/// unpaid one was given back.
async fn unsettled(
    ledger: &RedisLedger,
    store: &dyn orders::store::OrderStore,
    stripe: &SkuId,
) -> Result<Option<String>, String> {
    let status = ledger.status(stripe).await.map_err(|e| format!("ledger: {e}"))?;
    let counts = store.counts(stripe.as_str()).await.map_err(|e| format!("store: {e}"))?;
    let stored = store.stored_seqs(stripe.as_str(), 1, status.orders).await.map_err(|e| format!("store: {e}"))?;
    let settled = stored.len() as u64 == status.orders && counts.units_pending == 0 && counts.orders_unreleased == 0;
    Ok((!settled).then(|| {
        format!(
            "{} of {} order events stored, {} units pending payment, {} ended orders not given back",
            stored.len(),
            status.orders,
            counts.units_pending,
            counts.orders_unreleased
        )
    }))
}

/// Units of one ledger's ended orders the ledger confirmed it took back.
async fn given_back_of(store: &dyn orders::store::OrderStore, stripe: &SkuId) -> Result<u64, String> {
    let counts = store.counts(stripe.as_str()).await.map_err(|e| e.to_string())?;
    let unreleased = orders::reconcile::unreleased_of(store, stripe).await?;
    let ended = counts.units_expired + counts.units_cancelled + counts.units_paid_after_expiry;
    let pending: u64 = unreleased.iter().map(|o| u64::from(o.new.qty)).sum();
    Ok(ended.saturating_sub(pending).saturating_sub(counts.units_release_refused))
}

/// Units of a SKU kept in `ledgers` still for sale (see [`stripes::unsold`]); none unless
/// every ledger answered.
pub async fn unsold(watch: &RedisLedger, ledgers: &[SkuId]) -> Option<u64> {
    let mut statuses = Vec::with_capacity(ledgers.len());
    for stripe in ledgers {
        statuses.push(watch.status(stripe).await.ok()?);
    }
    let status = stripes::combine(&statuses)?;
    Some(stripes::unsold(status.remaining, status.transferred_out, status.transferred_in))
}

/// A ledger handle for the run's own reads of SKUs the monitor does not sample.
pub fn watch_ledger(targets: &Targets) -> anyhow::Result<RedisLedger> {
    let mut config = RedisLedgerConfig::new(targets.redis_url.clone());
    config.call_timeout = Duration::from_millis(500);
    config.key_prefix = targets.key_prefix.clone();
    Ok(RedisLedger::connect(config)?)
}

/// Waits until every member answers and all name the same leader in the same term; else what
/// each said when the bound ran out.
pub async fn agreement(members: &[(String, SocketAddr)], cluster_token: &str, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        let mut views = Vec::new();
        for (name, addr) in members {
            let status = testkit::http::get_json_with(*addr, "/api/state", Some(cluster_token), PROBE_MAX).await.ok();
            views.push((name.clone(), status.map(|s| (s["leader"].as_u64(), s["term"].as_u64()))));
        }
        let first = views.first().and_then(|(_, view)| *view);
        let agreed = first.is_some_and(|(leader, _)| leader.is_some()) && views.iter().all(|(_, view)| *view == first);
        if agreed {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let said: Vec<String> = views
                .iter()
                .map(|(name, view)| match view {
                    Some((leader, term)) => format!("{name}: leader {leader:?} term {term:?}"),
                    None => format!("{name}: no answer"),
                })
                .collect();
            return Err(format!(
                "the members did not agree on a leader within {} ms of the end: {}",
                within.as_millis(),
                said.join("; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (up to `settle`) until the sandbox has no notification under way and the store has
/// recorded every payment the sandbox took and paid back every refund it owes, then reads both
/// books (see [`crate::money`]). `released`: order ids in the ledger's release logs.
pub async fn read_money(
    store_url: Option<&str>,
    paysim: SocketAddr,
    released: BTreeSet<String>,
    settle: Duration,
) -> Result<MoneyBooks, String> {
    let url = store_url.ok_or("the fleet runs no order store")?;
    let store = orders::store::open(url).await.map_err(|e| format!("the order store: {e}"))?;
    let deadline = Instant::now() + settle;
    loop {
        let books = async {
            let report = testkit::http::get_json(paysim, "/v1/settlements", Duration::from_secs(5))
                .await
                .map_err(|e| format!("the sandbox's settlements: {e:#}"))?;
            let (payments, refunds) = money::parse_settlements(&report)?;
            let stats = testkit::http::get_json(paysim, "/v1/stats", Duration::from_secs(5))
                .await
                .map_err(|e| format!("the sandbox's stats: {e:#}"))?;
            let mut books = MoneyBooks { payments, refunds, released: released.clone(), ..MoneyBooks::default() };
            let ids: BTreeSet<String> = books.payments.iter().map(|p| p.order_id.clone()).collect();
            for id in ids {
                for record in store.payments_of(&id).await.map_err(|e| format!("store: {e}"))? {
                    let refund = record.refund.map(|r| r.as_str().to_string());
                    let recorded = RecordedPayment { order_id: id.clone(), outcome: record.outcome, refund };
                    books.recorded.insert(record.reference, recorded);
                }
                let order = store.get(&id).await.map_err(|e| format!("store: {e}"))?;
                let order = order.map(|o| MoneyOrder { state: o.state.as_str().to_string(), released: o.released_at_ms.is_some() });
                books.orders.insert(id, order);
            }
            let in_flight = stats["callbacks_in_flight"].as_u64().unwrap_or(0);
            let unrecorded = books.taken().filter(|p| !books.recorded.contains_key(&p.id)).count();
            let refunding = books.recorded.values().filter(|r| matches!(r.refund.as_deref(), Some("owed" | "pending"))).count();
            let left = (in_flight > 0 || unrecorded > 0 || refunding > 0).then(|| {
                format!("{in_flight} notifications under way, {unrecorded} payments unrecorded, {refunding} refunds not paid back")
            });
            Ok::<_, String>((books, left))
        }
        .await;
        match books {
            Ok((books, None)) => return Ok(books),
            // What is left when the bound runs out is for the checks to judge.
            Ok((books, Some(_))) if Instant::now() >= deadline => return Ok(books),
            Err(e) if Instant::now() >= deadline => return Err(e),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
