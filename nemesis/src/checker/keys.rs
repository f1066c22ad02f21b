//! The per-key rules: every buyer's use of a key decided once, sold once per TTL, never told
//! sold out after it bought, never refused for another buyer's use of the key.

use std::collections::{BTreeMap, BTreeSet};

use ledger::OrderEvent;

use super::{Evidence, Violation, ViolationKind, USE_GAP_SLACK_MS};
use crate::history::Request;

/// A key as its buyer holds it: a key is its buyer's, so another buyer's purchase under it is
/// a purchase of its own, judged apart.
type BuyerKey<'r> = (&'r str, &'r str);

/// How a buyer's key is named in a violation's detail.
fn named((key, user): BuyerKey) -> String {
    format!("{key} of {user}")
}

/// Each buyer's key's requests split into uses (see the module docs), each in send order.
fn uses<'r>(evidence: &Evidence<'r>) -> BTreeMap<BuyerKey<'r>, Vec<Vec<&'r Request>>> {
    let mut by_key: BTreeMap<BuyerKey, Vec<&Request>> = BTreeMap::new();
    for request in evidence.requests {
        by_key.entry((request.key.as_str(), request.user.as_str())).or_default().push(request);
    }
    let gap = evidence.idempotency_ttl_ms.saturating_add(USE_GAP_SLACK_MS);
    by_key
        .into_iter()
        .map(|(key, mut requests)| {
            requests.sort_by_key(|r| r.sent_ms);
            let mut uses: Vec<Vec<&Request>> = Vec::new();
            let mut last_answer: Option<u64> = None;
            for request in requests {
                match (uses.last_mut(), last_answer) {
                    (Some(current), Some(last)) if request.sent_ms <= last.saturating_add(gap) => current.push(request),
                    _ => uses.push(vec![request]),
                }
                last_answer = Some(last_answer.map_or(request.answered_ms, |last| last.max(request.answered_ms)));
            }
            (key, uses)
        })
        .collect()
}

/// The uses of keys that bought, as (user, name): one unit each. A key reused after its TTL may
/// buy again, but a reuse answered with an order id an earlier use of the key already holds (a
/// node replaying the earlier sale from its memory) bought nothing more; a use answered with
/// two ids is one purchase (and an `idempotency_conflict`).
pub(super) fn bought_uses<'r>(evidence: &Evidence<'r>) -> Vec<(&'r str, String)> {
    let mut bought = Vec::new();
    for (key, uses) in uses(evidence) {
        let mut held: BTreeSet<&str> = BTreeSet::new();
        for (at, requests) in uses.iter().enumerate() {
            let receipts: Vec<&Request> = requests.iter().copied().filter(|r| r.is_purchase()).collect();
            let Some(first) = receipts.first() else { continue };
            let ids: BTreeSet<&str> = receipts.iter().filter_map(|r| r.order_id.as_deref()).collect();
            if !ids.is_empty() && ids.is_subset(&held) {
                continue;
            }
            held.extend(ids);
            let name = if at == 0 { named(key) } else { format!("{} (use {})", named(key), at + 1) };
            bought.push((first.user.as_str(), name));
        }
    }
    bought
}

/// Per key: sold again only after its TTL; per use of a key: one decision, one order id; every
/// receipt in the ledger.
pub(super) fn keys(evidence: &Evidence, orders: &[OrderEvent], found: &mut Vec<Violation>) {
    let ttl = evidence.idempotency_ttl_ms;
    let mut sold: BTreeMap<BuyerKey, Vec<&OrderEvent>> = BTreeMap::new();
    for order in orders {
        sold.entry((order.key.as_str(), order.user.as_str())).or_default().push(order);
    }
    for (held, events) in &sold {
        let (key, held) = (held.0, named(*held));
        // The record a sale writes lives the TTL by the ledger's clock, which also stamps
        // `at_ms`: a second sale before it lapsed replaced a live decision.
        let early = events.windows(2).filter(|pair| pair[1].at_ms < pair[0].at_ms.saturating_add(ttl)).count();
        if early > 0 {
            let sales: Vec<String> = events.iter().map(|o| format!("{} at {}", o.order_id.0, o.at_ms)).collect();
            found.push(
                Violation::new(
                    ViolationKind::KeySoldTwice,
                    format!(
                        "key {held} is in the order stream {} times ({sales:?}), {early} of them within the \
                         idempotency TTL ({ttl} ms) of the sale before",
                        events.len()
                    ),
                )
                .keys([key.to_string()]),
            );
        }
    }
    let resales = evidence.ledger.status.as_ref().is_ok_and(|status| status.released > 0);
    for (held, uses) in uses(evidence) {
        let events: &[&OrderEvent] = sold.get(&held).map_or(&[], Vec::as_slice);
        let key = held.0;
        let starts: Vec<u64> = uses.iter().map(|requests| requests[0].sent_ms).collect();
        // The use under way when the ledger sold: the last one started by then.
        let use_of = |event: &OrderEvent| {
            let at = event.at_ms.saturating_sub(evidence.clock_origin_unix_ms);
            starts.iter().rposition(|start| *start <= at.saturating_add(USE_GAP_SLACK_MS)).unwrap_or(0)
        };
        for (at, requests) in uses.iter().enumerate() {
            let sales: Vec<&OrderEvent> = events.iter().copied().filter(|event| use_of(event) == at).collect();
            let earlier: BTreeSet<&str> =
                events.iter().filter(|event| use_of(event) < at).map(|event| event.order_id.0.as_str()).collect();
            let (stale, current): (Vec<&Request>, Vec<&Request>) = requests
                .iter()
                .partition(|r| r.is_purchase() && r.order_id.as_deref().is_some_and(|id| earlier.contains(id)));
            for answer in &stale {
                found.push(
                    Violation::new(
                        ViolationKind::StaleReplay,
                        format!(
                            "key {}, used again after its idempotency TTL, answered by {} at {} ms with order {} \
                             of its earlier use",
                            named(held),
                            answer.node,
                            answer.answered_ms,
                            answer.order_id.as_deref().unwrap_or("?")
                        ),
                    )
                    .keys([key.to_string()]),
                );
            }
            one_use(held, &current, &sales, events, resales, found);
        }
    }
    keys_taken(evidence, found);
}

/// `key_taken_by_another_buyer`: the workload sends each buyer's key with one body only, so a
/// `key_reused` answer means another buyer's use of the key was held against this one.
fn keys_taken(evidence: &Evidence, found: &mut Vec<Violation>) {
    let mut buyers_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for request in evidence.requests {
        buyers_of.entry(request.key.as_str()).or_default().insert(request.user.as_str());
    }
    for answer in evidence.requests.iter().filter(|r| r.outcome == "key_reused") {
        let others: Vec<&str> = buyers_of
            .get(answer.key.as_str())
            .into_iter()
            .flatten()
            .copied()
            .filter(|user| *user != answer.user)
            .collect();
        found.push(
            Violation::new(
                ViolationKind::KeyTakenByAnotherBuyer,
                format!(
                    "key {} answered key_reused by {} at {} ms; its buyer never sent it with another body \
                     (other buyers of the key: {others:?})",
                    named((answer.key.as_str(), answer.user.as_str())),
                    answer.node,
                    answer.answered_ms
                ),
            )
            .keys([answer.key.clone()]),
        );
    }
}

/// One use of a buyer's key: its `requests`, the `sales` the ledger made in it, and every sale
/// of the buyer's key.
fn one_use(
    held: BuyerKey,
    requests: &[&Request],
    sales: &[&OrderEvent],
    every_sale: &[&OrderEvent],
    resales: bool,
    found: &mut Vec<Violation>,
) {
    let (key, name) = (held.0, named(held));
    let receipts: BTreeSet<&str> =
        requests.iter().filter(|r| r.is_purchase()).filter_map(|r| r.order_id.as_deref()).collect();
    let others: Vec<&&Request> = requests.iter().filter(|r| r.is_decision() && !r.is_purchase()).collect();
    let bought = !sales.is_empty() || !receipts.is_empty();
    // What the key was decided as, if not a purchase: the first answer that is not memory's
    // sold-out (which the ledger never stored); none if memory's sold-out is all it got.
    let stored = others.iter().find(|r| r.outcome != "sold_out" || r.replayed).map(|r| r.outcome.as_str());
    let decided = if bought { Some("purchased") } else { stored };
    for answer in &others {
        let from_memory = answer.outcome == "sold_out" && !answer.replayed;
        let conflict = match decided {
            // A key the ledger refused, told `sold_out` from memory later: both are final
            // refusals, and the promise (docs/http-api.md) lets memory's sold-out stand in
            // for any stored refusal rather than pay a ledger lookup per sold-out request.
            Some(decision) if decision != "purchased" && from_memory => false,
            Some(decision) => answer.outcome != decision,
            None => false,
        };
        if !conflict {
            continue;
        }
        // Once units were released, "sold out" is true only until they come back: memory's
        // sold-out followed by a fresh purchase of the key sent after it was answered is
        // the resale working, not a lost sale (a fresh purchase means the ledger had not
        // decided the key before; had a hidden sale come first, it would be a replay).
        let bought_afterwards =
            requests.iter().any(|r| r.is_purchase() && !r.replayed && r.sent_ms >= answer.answered_ms);
        if from_memory && resales && decided == Some("purchased") && bought_afterwards {
            continue;
        }
        // Memory's sold-out to the key's very first send came before any decision of it: a
        // premature answer. To a retry or a repeat, the key may have been decided already
        // (a 503 or a lost answer can hide a sale): defect (a).
        let decided_before = requests.iter().any(|r| r.is_decision() && r.answered_ms <= answer.sent_ms);
        let (kind, what) = if !from_memory {
            (ViolationKind::IdempotencyConflict, "answered another decision")
        } else if answer.attempt == 0 && !decided_before {
            (ViolationKind::SoldOutThenDecided, "first answered sold_out from memory")
        } else {
            (ViolationKind::RetryToldSoldOut, "answered sold_out from memory to a retry")
        };
        found.push(
            Violation::new(
                kind,
                format!(
                    "key {name}, decided {}, {what}: {} by {} at {} ms",
                    decided.unwrap_or("?"),
                    answer.outcome,
                    answer.node,
                    answer.answered_ms
                ),
            )
            .keys([key.to_string()]),
        );
    }
    // Two ids in one use are two sales only if the ledger made both in it (their spacing is
    // `key_sold_twice`'s to judge); otherwise one purchase was answered with two ids.
    let sold_in_use: BTreeSet<&str> = sales.iter().map(|o| o.order_id.0.as_str()).collect();
    if receipts.len() > 1 && !receipts.is_subset(&sold_in_use) {
        found.push(
            Violation::new(
                ViolationKind::IdempotencyConflict,
                format!("key {name} got {} order ids: {receipts:?}", receipts.len()),
            )
            .keys([key.to_string()]),
        );
    }
    for receipt in &receipts {
        // A replay from a node's memory may name the key's sale of an earlier use: still a sale.
        if !every_sale.iter().any(|o| o.order_id.0 == *receipt) {
            let ledger_says: Vec<&str> = every_sale.iter().map(|o| o.order_id.0.as_str()).collect();
            found.push(
                Violation::new(
                    ViolationKind::LostReceipt,
                    format!("key {name}: receipt {receipt} but the order stream has {ledger_says:?}"),
                )
                .keys([key.to_string()]),
            );
        }
    }
}
