//! The waiting room's rules as checks (see [`crate::room`]). Each drives the room with explicit
//! calls: `starts_at_ms` of a call says whether the sale has started, so no check sleeps for a
//! start.

use super::*;
use crate::room::drawn_order;

/// A start far in the future, and one in the past.
const LATER: Option<u64> = Some(u64::MAX / 2);
const EARLIER: Option<u64> = Some(1);

fn rules(admit_per_s: u32, admit_factor: f64) -> RoomRules {
    RoomRules { admit_per_s, admit_factor, ticket_ttl_s: 60, abandon_s: 60 }
}

async fn create_room(ledger: &dyn Ledger, sku: &SkuId, total: u64, rules: &RoomRules) {
    create_terms(ledger, sku, SkuTerms { waiting_room: Some(rules.clone()), ..SkuTerms::new(total) }).await;
}

fn call<'a>(rules: &'a RoomRules, starts_at_ms: Option<u64>, seed: &'a str) -> RoomCall<'a> {
    RoomCall { rules, starts_at_ms, seed }
}

async fn join(ledger: &dyn Ledger, sku: &SkuId, call: RoomCall<'_>, name: &str) -> (Place, RoomFigures) {
    let view = ledger.room_join(sku, call, &[user(name)]).await.expect("room_join");
    (view.places[0].clone(), view.figures)
}

async fn places(ledger: &dyn Ledger, sku: &SkuId, call: RoomCall<'_>, names: &[String]) -> Vec<Place> {
    let users: Vec<UserId> = names.iter().map(|name| user(name)).collect();
    ledger.room_tick(sku, call, &users).await.expect("room_tick").places
}

fn ticket(place: &Place) -> SubmitToken {
    match place {
        Place::Admitted { token, .. } => token.clone(),
        other => panic!("expected an admission, got {other:?}"),
    }
}

/// Before the start joins wait unordered; the first call after the start draws them in the
/// order its recorded seed gives (recomputable by anyone), later arrivals queue behind, and
/// admission takes the line's head, never past `admit_factor` × remaining live tickets. The log
/// records each admission in line order.
pub async fn a_room_draws_by_its_recorded_seed_and_admits_in_line_order(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("room-draw", tag);
    let rules = rules(1000, 1.0);
    create_room(ledger, &sku, 5, &rules).await;
    assert_eq!(ledger.room_figures(&sku).await.expect("room_figures"), None, "a room that never ran");
    let early: Vec<String> = (0..12).map(|i| format!("early-{i}")).collect();
    for name in &early {
        let (place, figures) = join(ledger, &sku, call(&rules, LATER, "unused"), name).await;
        assert_eq!(place, Place::PreQueue, "{name} joins the pre-queue before the start");
        assert!(figures.draw.is_none(), "nothing is drawn before the start");
    }
    let (again, _) = join(ledger, &sku, call(&rules, LATER, "unused"), &early[0]).await;
    assert_eq!(again, Place::PreQueue, "joining twice keeps one place");

    let (late, figures) = join(ledger, &sku, call(&rules, EARLIER, "seed-1"), "late").await;
    let draw = figures.draw.expect("the first call after the start draws");
    assert_eq!((draw.seed.as_str(), draw.placed), ("seed-1", 12), "the draw records its seed and count");
    assert_eq!(late, Place::Waiting { position: 13, ahead: 13 - 1 - 5 }, "a later arrival queues behind the draw");
    assert_eq!((figures.admitted, figures.live), (5, 5), "5 units at factor 1.0: five live tickets");

    let order = drawn_order("seed-1", early.iter().map(String::as_str));
    let seen =
        places(ledger, &sku, call(&rules, EARLIER, "seed-2"), &order.iter().map(|u| u.to_string()).collect::<Vec<_>>())
            .await;
    for (index, place) in seen.iter().enumerate() {
        match place {
            Place::Admitted { .. } => assert!(index < 5, "only the first five are admitted, got {index}: {place:?}"),
            Place::Waiting { position, ahead } => {
                assert_eq!(*position, index as u64 + 1, "the draw's order is the seed's: {order:?}");
                assert_eq!(*ahead, index as u64 - 5, "waiters ahead of position {position}");
            }
            other => panic!("{} should be in the room, got {other:?}", order[index]),
        }
    }
    let read = ledger.room_figures(&sku).await.expect("room_figures").expect("the room ran");
    let told = ledger.room_tick(&sku, call(&rules, EARLIER, "seed-3"), &[]).await.expect("room_tick").figures;
    assert_eq!(RoomFigures { now_ms: told.now_ms, ..read }, told, "a read shows what a tick does, changing nothing");
    let log = ledger.room_admissions(&sku, 0, 100).await.expect("room_admissions");
    let logged: Vec<(u64, u64, &str)> = log.iter().map(|a| (a.seq, a.position, a.user.as_str())).collect();
    let expected: Vec<(u64, u64, &str)> = (1..=5).map(|n| (n, n, order[n as usize - 1])).collect();
    assert_eq!(logged, expected, "admissions are logged in line order");
    assert!(log.iter().all(|a| a.live <= rules.live_cap(a.remaining)), "no admission beyond the rule: {log:?}");
    assert_eq!(told.head, Some(6), "the line's head: the first position not let through");

    // A node's joins of one moment go in one call, each placed in the order given.
    let batch: Vec<UserId> = ["b1", "b2", "early-0", "b3"].iter().map(|name| user(name)).collect();
    let view = ledger.room_join(&sku, call(&rules, EARLIER, "seed-4"), &batch).await.expect("room_join");
    let early_0 = seen[order.iter().position(|u| *u == "early-0").expect("drawn")].clone();
    let expected = vec![
        Place::Waiting { position: 14, ahead: 8 },
        Place::Waiting { position: 15, ahead: 9 },
        early_0,
        Place::Waiting { position: 16, ahead: 10 },
    ];
    assert_eq!(view.places, expected, "joined in order; one already in the room keeps its place");
    assert_eq!(view.figures.head, Some(6));
}

/// A ticket is a submit token of its buyer: the purchase that presents it spends it, once; a
/// purchase without one is refused; a spent ticket frees its admission only as the units left
/// allow; a closed room (sold out) lets nobody join, and units coming back reopen it for those
/// still in line, in order.
pub async fn a_ticket_sells_once_and_sold_out_shuts_the_room_until_units_come_back(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("room-ticket", tag);
    let rules = rules(1000, 1.0);
    create_room(ledger, &sku, 1, &rules).await;
    let (ann, _) = join(ledger, &sku, call(&rules, None, "s"), "ann").await;
    let (bob, _) = join(ledger, &sku, call(&rules, None, "s"), "bob").await;
    assert!(matches!(bob, Place::Waiting { position: 2, ahead: 0 }), "bob waits behind ann's live ticket: {bob:?}");
    let ann_ticket = ticket(&ann);

    let without = ledger.confirm(&sku, &node("n1"), &[buy("no-ticket", "bob", 1)]).await.unwrap();
    assert_eq!(without.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "no ticket, no sale");
    let stolen = ledger.confirm(&sku, &node("n1"), &[buy_with("stolen", "bob", &ann_ticket)]).await.unwrap();
    assert_eq!(stolen.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "a ticket binds its buyer");
    let sold = ledger.confirm(&sku, &node("n1"), &[buy_with("ann-1", "ann", &ann_ticket)]).await.unwrap();
    assert!(is_purchased(&sold.verdicts[0]), "ann buys with her ticket: {:?}", sold.verdicts);
    let again = ledger.confirm(&sku, &node("n1"), &[buy_with("ann-2", "ann", &ann_ticket)]).await.unwrap();
    assert_eq!(again.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "a ticket sells once");

    let view = ledger.room_tick(&sku, call(&rules, None, "s"), &[user("ann"), user("bob")]).await.unwrap();
    assert_eq!(
        view.places,
        vec![Place::Absent, Place::Waiting { position: 2, ahead: 0 }],
        "sold out: bob keeps his place"
    );
    assert!(view.figures.shut() && view.figures.live == 0, "the spent ticket is no longer live: {:?}", view.figures);
    let (cat, _) = join(ledger, &sku, call(&rules, None, "s"), "cat").await;
    assert_eq!(cat, Place::Absent, "nobody joins a sold-out room");

    let release = release_of(ledger, &sku, &order_of(&sold.verdicts[0]), "ann", 1).await;
    ledger.release(&sku, &release).await.expect("release");
    let view = ledger.room_tick(&sku, call(&rules, None, "s"), &[user("bob")]).await.unwrap();
    assert!(matches!(view.places[0], Place::Admitted { .. }), "units back: bob, first in line, is admitted: {view:?}");
}

fn order_of(verdict: &Verdict) -> OrderId {
    match verdict {
        Verdict::Fresh(Decision::Purchased(receipt)) => receipt.order_id.clone(),
        other => panic!("expected a sale, got {other:?}"),
    }
}

/// At most `admit_per_s` a second, plus the bucket's quarter of a second, in any one-second span;
/// and a waiter that stops heart-beating leaves the line, holding nothing.
pub async fn admissions_keep_the_rate_and_the_abandoned_leave(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("room-rate", tag);
    let rules = RoomRules { abandon_s: 2, ..rules(20, 100.0) };
    create_room(ledger, &sku, 1000, &rules).await;
    let names: Vec<String> = (0..60).map(|i| format!("w{i}")).collect();
    for name in &names {
        join(ledger, &sku, call(&rules, None, "s"), name).await;
    }
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        places(ledger, &sku, call(&rules, None, "s"), &names[..30]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = ledger.room_admissions(&sku, 0, 1000).await.unwrap();
    assert!(log.len() >= 20, "1.5 s at 20/s admits at least 20, got {}", log.len());
    let most_in_a_second = log
        .iter()
        .map(|first| log.iter().filter(|a| a.at_ms >= first.at_ms && a.at_ms < first.at_ms + 1000).count())
        .max()
        .unwrap_or(0);
    assert!(most_in_a_second <= 20 + 5 + 1, "at most 20/s plus the bucket: {most_in_a_second} in one second");

    // w30..w59 never beat after joining, w0..w29 stopped 1.5 s in: all fall silent for longer
    // than abandon_s. (Naming a waiter in a tick is its heartbeat, so this tick names nobody.)
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let view = ledger.room_tick(&sku, call(&rules, None, "s"), &[]).await.unwrap();
    assert_eq!(view.figures.waiting, 0, "every silent waiter left the line: {:?}", view.figures);
    let after = ledger.room_admissions(&sku, 0, 1000).await.unwrap();
    assert_eq!(after.len() as u64, view.figures.admitted, "the log holds every admission");
    assert!(after.iter().all(|a| a.user != "w59"), "a waiter that never beat left unadmitted: {after:?}");
    let (back, _) = join(ledger, &sku, call(&rules, None, "s"), "w59").await;
    assert!(
        matches!(back, Place::Waiting { .. } | Place::Admitted { .. }),
        "a returning waiter joins at the end: {back:?}"
    );
}
