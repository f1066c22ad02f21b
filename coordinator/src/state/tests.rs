use std::collections::BTreeMap;

use super::stripes::StripedSku;
use super::*;

fn id(name: &str) -> NodeId {
    NodeId::new(name).unwrap()
}

fn sku() -> SkuId {
    SkuId::new("s").unwrap()
}

fn terms() -> SkuTerms {
    SkuTerms { per_user_limit: 1, token_ttl_s: 300, ..SkuTerms::new(100) }
}

fn register(node: &str, instance: u64, lease_until_ms: u64) -> Command {
    Command::Register { node: id(node), addr: format!("{node}:1"), instance, lease_until_ms, max_live: None }
}

fn assigned(outcome: Outcome) -> protocol::Assignment {
    match outcome {
        Outcome::Lease(LeaseAnswer::Assigned(assignment)) => assignment,
        other => panic!("expected an assignment, got {other:?}"),
    }
}

fn state_with_two_nodes() -> ClusterState {
    let mut state = ClusterState::default();
    let starting = BTreeMap::from([(id("n1"), 60), (id("n2"), 50)]);
    state.apply(Command::DefineSku { sku: sku(), starting, terms: terms() });
    for node in ["n1", "n2"] {
        state.apply(register(node, 1, 1_000));
    }
    state
}

fn heartbeat(node: &str, epoch: u64, now_ms: u64, lease_until_ms: u64) -> Command {
    Command::Heartbeat { node: id(node), epoch, now_ms, lease_until_ms, reports: BTreeMap::new() }
}

#[test]
fn first_registration_gets_the_starting_allotment_and_a_restarted_node_gets_nothing() {
    let mut state = state_with_two_nodes();
    assert_eq!(state.fleet.nodes[&id("n1")].granted[&sku()], 60);
    let assignment = assigned(state.apply(register("n1", 2, 2_000)));
    assert_eq!(assignment.epoch, 2);
    assert!(assignment.granted.is_empty(), "a rejoining node starts from zero");
}

#[test]
fn nodes_registered_before_a_sku_exists_get_their_starting_share_once() {
    let mut state = ClusterState::default();
    state.apply(register("n1", 1, 1_000));
    let starting = BTreeMap::from([(id("n1"), 60), (id("n2"), 50)]);
    state.apply(Command::DefineSku { sku: sku(), starting: starting.clone(), terms: terms() });
    assert_eq!(state.fleet.nodes[&id("n1")].granted[&sku()], 60);
    state.apply(Command::DefineSku { sku: sku(), starting, terms: terms() });
    assert_eq!(state.fleet.nodes[&id("n1")].granted[&sku()], 60, "defining again grants nothing more");
}

#[test]
fn a_repeated_registration_from_the_same_process_is_the_same_registration() {
    let mut state = state_with_two_nodes();
    let assignment = assigned(state.apply(register("n1", 1, 2_000)));
    assert_eq!((assignment.epoch, assignment.granted[&sku()]), (1, 60), "same epoch, same grants");
    let assignment = assigned(state.apply(register("n1", 2, 2_000)));
    assert_eq!(assignment.epoch, 2, "a new process starts a new epoch");
}

#[test]
fn expiry_rechecks_the_lease_and_the_epoch() {
    let mut state = state_with_two_nodes();
    state.apply(heartbeat("n1", 1, 900, 5_000));
    let early = state.apply(Command::Expire { node: id("n1"), epoch: 1, now_ms: 4_000, grace_ms: 100 });
    assert_eq!(early, Outcome::StillLeased, "a renewal that raced the expiry wins");
    let stale = state.apply(Command::Expire { node: id("n1"), epoch: 0, now_ms: 9_000, grace_ms: 100 });
    assert_eq!(stale, Outcome::NotLive);
    let expired = state.apply(Command::Expire { node: id("n1"), epoch: 1, now_ms: 9_000, grace_ms: 100 });
    assert_eq!(expired, Outcome::Expired { revoked: BTreeMap::from([(sku(), 60)]) });
    let record = &state.fleet.nodes[&id("n1")];
    assert!(!record.live && record.epoch == 2 && record.worker_id.is_none());
    let late = state.apply(heartbeat("n1", 1, 9_001, 1));
    assert_eq!(late, Outcome::Lease(LeaseAnswer::StaleEpoch { current: 2 }), "the old epoch cannot renew");
}

#[test]
fn an_ended_epoch_is_settled_once_and_its_units_granted_once() {
    let mut state = state_with_two_nodes();
    state.apply(Command::Expire { node: id("n1"), epoch: 1, now_ms: 9_000, grace_ms: 100 });
    let unsettled: Vec<_> =
        state.fleet.unsettled().map(|(node, epoch, skus)| (node.clone(), epoch, skus.clone())).collect();
    assert_eq!(unsettled, [(id("n1"), 1, BTreeMap::from([(sku(), 60)]))], "the ended epoch awaits settlement");
    let settle = Command::Reallocate {
        node: id("n1"),
        epoch: 1,
        sku: sku(),
        items: vec![GrantItem { node: id("n2"), epoch: 1, units: 40 }],
    };
    assert_eq!(state.apply(settle.clone()), Outcome::Granted { units: 40 });
    assert_eq!(state.apply(settle), Outcome::Granted { units: 0 }, "a retried settlement grants nothing");
    assert_eq!(state.fleet.nodes[&id("n2")].granted[&sku()], 90);
    assert_eq!(state.fleet.unsettled().count(), 0);
    state.apply(register("n1", 2, 10_000));
    state.apply(Command::Leave { node: id("n1"), epoch: 2, lease_until_ms: 0 });
    assert_eq!(state.fleet.unsettled().count(), 0, "an epoch granted nothing has nothing to settle");
}

/// A paused holder of an ended epoch could still stamp ids with its worker id until it hears
/// the epoch ended; nobody else gets that id until the epoch is fenced and settled.
#[test]
fn the_worker_id_of_an_unsettled_epoch_is_not_handed_to_another_node() {
    let mut state = state_with_two_nodes();
    let n1_worker = state.fleet.nodes[&id("n1")].worker_id;
    state.apply(Command::Expire { node: id("n1"), epoch: 1, now_ms: 9_000, grace_ms: 100 });
    let Outcome::Lease(LeaseAnswer::Assigned(n3)) = state.apply(register("n3", 1, 10_000)) else { panic!() };
    assert_ne!(Some(n3.worker_id), n1_worker, "quarantined while n1's epoch is unsettled");
    let settle = Command::Reallocate { node: id("n1"), epoch: 1, sku: sku(), items: Vec::new() };
    state.apply(settle);
    state.apply(Command::Leave { node: id("n3"), epoch: 1, lease_until_ms: 0 });
    let Outcome::Lease(LeaseAnswer::Assigned(n4)) = state.apply(register("n4", 1, 10_000)) else { panic!() };
    assert_eq!(Some(n4.worker_id), n1_worker, "free again once settled");
    assert_eq!(state.fleet.check_all(), Ok(()));
}

#[test]
fn grants_reach_only_live_nodes_of_the_named_epoch() {
    let mut state = state_with_two_nodes();
    state.apply(Command::Leave { node: id("n2"), epoch: 1, lease_until_ms: 0 });
    let items = vec![
        GrantItem { node: id("n1"), epoch: 1, units: 7 },
        GrantItem { node: id("n2"), epoch: 1, units: 7 },
        GrantItem { node: id("n1"), epoch: 9, units: 7 },
    ];
    assert_eq!(state.apply(Command::Grant { sku: sku(), items }), Outcome::Granted { units: 7 });
    assert_eq!(state.fleet.nodes[&id("n1")].granted[&sku()], 67);
}

#[test]
fn worker_ids_are_unique_among_live_nodes_and_reused_after_release() {
    let mut state = state_with_two_nodes();
    let worker = |state: &ClusterState, node: &str| state.fleet.nodes[&id(node)].worker_id;
    assert_ne!(worker(&state, "n1"), worker(&state, "n2"));
    let freed = worker(&state, "n2");
    state.apply(Command::Leave { node: id("n2"), epoch: 1, lease_until_ms: 0 });
    state.apply(Command::Reallocate { node: id("n2"), epoch: 1, sku: sku(), items: Vec::new() });
    state.apply(register("n3", 1, 1));
    assert_eq!(worker(&state, "n3"), freed, "a released (and settled) worker id is handed out again");
    assert_eq!(state.fleet.check_all(), Ok(()));
}

#[test]
fn effective_local_counts_grants_not_yet_applied() {
    let mut state = state_with_two_nodes();
    let report = SkuReport::new(10, 60, 50);
    let beat = Command::Heartbeat {
        node: id("n1"),
        epoch: 1,
        now_ms: 500,
        lease_until_ms: 1_500,
        reports: BTreeMap::from([(sku(), report)]),
    };
    state.apply(beat);
    state.apply(Command::Grant { sku: sku(), items: vec![GrantItem { node: id("n1"), epoch: 1, units: 5 }] });
    assert_eq!(state.fleet.nodes[&id("n1")].effective_local(&sku()), 15);
}

#[test]
fn operators_change_terms_of_defined_skus_only_and_nodes_hear_of_them() {
    let mut state = state_with_two_nodes();
    let unknown = SkuId::new("nope").unwrap();
    assert_eq!(state.apply(Command::Close { sku: unknown }), Outcome::UnknownSku);
    state.apply(Command::SetBuffer { sku: sku(), buffer: Buffer::Units(7) });
    state.apply(Command::Restock { sku: sku(), total: 150 });
    let lower = state.apply(Command::Restock { sku: sku(), total: 120 });
    let Outcome::Terms(terms) = lower else { panic!("{lower:?}") };
    assert_eq!((terms.buffer, terms.total), (Buffer::Units(7), 150), "a total never goes down");
    state.apply(Command::Close { sku: sku() });
    let assignment = assigned(state.apply(heartbeat("n1", 1, 1, 2)));
    assert!(assignment.skus[&sku()].closed, "the next heartbeat carries the close");
}

fn acquire(state: &mut ClusterState, owner: &str, hold: u64, now_ms: u64) -> Outcome {
    state.apply(Command::AcquireLock { name: "sweeper".into(), owner: owner.into(), hold, ttl_ms: 1_000, now_ms })
}

fn lock(answer: LockAnswer) -> Outcome {
    Outcome::Lock(answer)
}

#[test]
fn a_lock_excludes_other_owners_until_released_or_expired_and_fences_grow() {
    let mut state = ClusterState::default();
    assert_eq!(acquire(&mut state, "a", 1, 0), lock(LockAnswer::LockAcquired { fence: 1, holds: 1 }));
    assert_eq!(acquire(&mut state, "b", 1, 400), lock(LockAnswer::LockHeld { retry_after_ms: 600 }));
    let not_b = Command::ReleaseLock { name: "sweeper".into(), owner: "b".into(), fence: 1, hold: 1 };
    assert_eq!(state.apply(not_b), lock(LockAnswer::LockNotHeld), "nobody releases another's lock");
    let not_b = Command::ExtendLock { name: "sweeper".into(), owner: "b".into(), fence: 1, ttl_ms: 1, now_ms: 1 };
    assert_eq!(state.apply(not_b), lock(LockAnswer::LockNotHeld), "nobody extends another's lock");
    assert_eq!(acquire(&mut state, "b", 1, 1_000), lock(LockAnswer::LockAcquired { fence: 2, holds: 1 }), "expired");
    let late = Command::ExtendLock { name: "sweeper".into(), owner: "a".into(), fence: 1, ttl_ms: 1, now_ms: 1 };
    assert_eq!(state.apply(late), lock(LockAnswer::LockNotHeld), "the old holder cannot extend");
    let release = Command::ReleaseLock { name: "sweeper".into(), owner: "b".into(), fence: 2, hold: 1 };
    assert_eq!(state.apply(release), lock(LockAnswer::LockReleased { holds_left: 0 }));
    assert!(state.locks.held.is_empty());
    assert_eq!(acquire(&mut state, "a", 2, 1_001), lock(LockAnswer::LockAcquired { fence: 3, holds: 1 }));
}

#[test]
fn reentry_keeps_the_fence_and_repeated_calls_change_nothing() {
    let mut state = ClusterState::default();
    assert_eq!(acquire(&mut state, "a", 1, 0), lock(LockAnswer::LockAcquired { fence: 1, holds: 1 }));
    assert_eq!(acquire(&mut state, "a", 2, 10), lock(LockAnswer::LockAcquired { fence: 1, holds: 2 }));
    assert_eq!(acquire(&mut state, "a", 2, 20), lock(LockAnswer::LockAcquired { fence: 1, holds: 2 }), "a retry");
    let release = Command::ReleaseLock { name: "sweeper".into(), owner: "a".into(), fence: 1, hold: 2 };
    assert_eq!(state.apply(release.clone()), lock(LockAnswer::LockReleased { holds_left: 1 }));
    assert_eq!(state.apply(release), lock(LockAnswer::LockReleased { holds_left: 1 }), "a retried release");
    for hold in 3..=safeguards::lock::LOCK_HOLDS_MAX as u64 + 1 {
        acquire(&mut state, "a", hold, 30);
    }
    assert_eq!(acquire(&mut state, "a", 999, 40), lock(LockAnswer::LockHoldsMax));
}

#[test]
#[should_panic(expected = "grant of s shrank")]
fn a_change_that_shrinks_a_grant_within_an_epoch_panics() {
    let mut state = state_with_two_nodes();
    let before = state.fleet.before(&id("n1"));
    state.fleet.nodes.get_mut(&id("n1")).unwrap().granted.insert(sku(), 1);
    state.fleet.check(&id("n1"), before);
}

/// A log written before the state was split (format 1) replays: commands keep their names.
#[test]
fn commands_logged_by_an_older_release_replay() {
    let define = r#"{"DefineSku":{"sku":"s","starting":{"n1":60},"terms":{"total":100,"per_user_limit":1,
        "qty_max":1,"starts_at_ms":null,"ends_at_ms":null,"buffer":"10%","closed":false}}}"#;
    let register = r#"{"Register":{"node":"n1","addr":"n1:1","instance":1,"lease_until_ms":1000}}"#;
    let mut state = ClusterState::default();
    for record in [define, register] {
        let command: Command = serde_json::from_str(record).unwrap();
        state.apply(command);
    }
    assert_eq!(state.fleet.nodes[&id("n1")].granted[&sku()], 60);
}

#[test]
fn snapshots_of_format_one_convert_and_newer_formats_are_refused() {
    let old = r#"{"skus":{"s":{"n1":60}},"nodes":{},"terms":{"s":{"total":100,"per_user_limit":1,"qty_max":1,
        "starts_at_ms":null,"ends_at_ms":null,"buffer":"10%","closed":true}},"locks":{},"lock_fence":4}"#;
    let state: ClusterState = serde_json::from_str(old).unwrap();
    assert!(state.catalogue.terms(&sku()).unwrap().closed);
    assert_eq!(state.catalogue.skus[&sku()].starting[&id("n1")], 60);
    assert_eq!(state.locks.fence, 4);
    let written = serde_json::to_string(&state).unwrap();
    assert_eq!(serde_json::from_str::<ClusterState>(&written).unwrap(), state, "format 2 round-trips");
    assert!(written.contains("\"format\":2") && !written.contains("stripes"), "no stripes, format 2: {written}");
    let newer = written.replace("\"format\":2", "\"format\":9");
    let refused = serde_json::from_str::<ClusterState>(&newer).unwrap_err().to_string();
    assert!(refused.contains("format 9") && refused.contains("newer seckill"), "{refused}");
}

/// A SKU of 7 units in 3 stripes (3, 2, 2), defined stripe by stripe as the leader does.
fn striped_state() -> ClusterState {
    let mut state = ClusterState::default();
    let terms = SkuTerms { stripes: 3, ..SkuTerms::new(7) };
    for (index, stripe_terms) in terms.stripe_terms().into_iter().enumerate() {
        let starting = BTreeMap::from([(id("n1"), stripe_terms.total)]);
        state.apply(Command::DefineSku { sku: sku().stripe(index as u32), starting, terms: stripe_terms });
    }
    state
}

fn stripe_total(state: &ClusterState, index: u32) -> u64 {
    state.catalogue.terms(&sku().stripe(index)).unwrap().total
}

/// Goal: the three steps of a transfer move units between stripes' catalogue totals exactly
/// once, whatever is replayed. Method: start, debit, finish one transfer, then repeat each step.
#[test]
fn a_transfer_moves_units_once_through_its_three_steps() {
    let mut state = striped_state();
    assert_eq!(state.stripes.skus[&sku()], StripedSku { stripes: 3, total: 7, transfers: 0, transferred_units: 0 });
    let started = Command::TransferStarted { id: 0, sku: sku(), from: 0, to: 1, most: 2 };
    assert_eq!(state.apply(started.clone()), Outcome::Transferred);
    assert_eq!(state.apply(started), Outcome::TransferSkipped(Skipped::Stale), "an id is taken once");
    let stale = Command::TransferStarted { id: 5, sku: sku(), from: 0, to: 1, most: 2 };
    assert_eq!(state.apply(stale), Outcome::TransferSkipped(Skipped::Stale), "only the next id starts");
    assert_eq!(state.apply(Command::TransferDebited { id: 0, units: 2 }), Outcome::Transferred);
    assert_eq!((stripe_total(&state, 0), state.stripes.in_flight_of(&sku())), (1, 2), "debited: in flight");
    state.apply(Command::TransferDebited { id: 0, units: 2 });
    assert_eq!(stripe_total(&state, 0), 1, "a replayed debit takes nothing more");
    assert_eq!(state.apply(Command::TransferDone { id: 0 }), Outcome::Transferred);
    assert_eq!((stripe_total(&state, 1), state.stripes.in_flight_of(&sku())), (4, 0));
    assert_eq!(state.apply(Command::TransferDone { id: 0 }), Outcome::TransferSkipped(Skipped::Stale));
    assert_eq!(stripe_total(&state, 1), 4, "a replayed done gives nothing more");
    assert_eq!(state.stripes.skus[&sku()], StripedSku { stripes: 3, total: 7, transfers: 1, transferred_units: 2 });
    assert_eq!(state.stripes.next_id, 1);
}

/// Goal: a transfer names stripes of a striped SKU, and cannot finish before it is debited.
#[test]
fn transfers_outside_a_striped_sku_or_out_of_order_change_nothing() {
    let mut state = striped_state();
    let plain = SkuId::new("plain").unwrap();
    state.apply(Command::DefineSku { sku: plain.clone(), starting: BTreeMap::new(), terms: SkuTerms::new(5) });
    for (from, to, sku) in [(0, 3, sku()), (1, 1, sku()), (0, 1, plain)] {
        let command = Command::TransferStarted { id: 0, sku, from, to, most: 1 };
        assert_eq!(state.apply(command), Outcome::TransferSkipped(Skipped::NotStriped));
    }
    state.apply(Command::TransferStarted { id: 0, sku: sku(), from: 2, to: 0, most: 1 });
    assert_eq!(state.apply(Command::TransferDone { id: 0 }), Outcome::TransferSkipped(Skipped::Stale));
    assert_eq!(state.apply(Command::TransferDebited { id: 0, units: 0 }), Outcome::Transferred);
    assert_eq!(state.apply(Command::TransferDone { id: 0 }), Outcome::Transferred, "0 units is done at once");
    assert_eq!((stripe_total(&state, 0), stripe_total(&state, 2)), (3, 2));
}

/// Goal: a restock of a striped SKU adds to its total once, through stripe 0, and the absolute
/// restock of unstriped SKUs changes nothing on it; operator changes reach every stripe.
#[test]
fn a_striped_sku_is_restocked_by_a_credit_and_closed_whole() {
    let mut state = striped_state();
    assert_eq!(state.apply(Command::RestockStarted { id: 0, sku: sku(), units: 5 }), Outcome::Transferred);
    assert_eq!((state.stripes.skus[&sku()].total, state.stripes.in_flight_of(&sku())), (12, 5));
    state.apply(Command::TransferDone { id: 0 });
    assert_eq!(stripe_total(&state, 0), 8);
    assert_eq!(state.stripes.skus[&sku()].transfers, 0, "a restock is no transfer between stripes");
    state.apply(Command::Restock { sku: sku(), total: 100 });
    assert_eq!(stripe_total(&state, 0), 8, "an absolute total would break the stripes' sum");
    state.apply(Command::Close { sku: sku() });
    assert!((0..3).all(|index| state.catalogue.terms(&sku().stripe(index)).unwrap().closed));
}

/// Goal: the stripes' invariant is checked on every transfer step.
#[test]
#[should_panic(expected = "its stripes hold")]
fn a_transfer_on_books_that_lost_a_unit_panics() {
    let mut state = striped_state();
    state.catalogue.skus.get_mut(&sku().stripe(2)).unwrap().terms.total -= 1;
    state.apply(Command::TransferStarted { id: 0, sku: sku(), from: 0, to: 1, most: 1 });
}

/// Goal: a log of this release with transfers replays from its JSON records.
#[test]
fn transfer_records_replay_from_their_json() {
    let mut state = striped_state();
    for record in [
        r#"{"TransferStarted":{"id":0,"sku":"s","from":1,"to":2,"most":1}}"#,
        r#"{"TransferDebited":{"id":0,"units":1}}"#,
        r#"{"TransferDone":{"id":0}}"#,
    ] {
        let command: Command = serde_json::from_str(record).unwrap();
        assert_eq!(state.apply(command), Outcome::Transferred, "{record}");
    }
    assert_eq!((stripe_total(&state, 1), stripe_total(&state, 2)), (1, 3));
}

/// Goal: a state with a striped SKU is written as format 3 and read back whole; one without
/// stays format 2, which the release before reads.
#[test]
fn a_state_with_stripes_is_snapshot_format_three() {
    let mut state = striped_state();
    state.apply(Command::TransferStarted { id: 0, sku: sku(), from: 0, to: 1, most: 2 });
    state.apply(Command::TransferDebited { id: 0, units: 2 });
    let written = serde_json::to_string(&state).unwrap();
    assert!(written.contains("\"format\":3"), "{written}");
    assert_eq!(serde_json::from_str::<ClusterState>(&written).unwrap(), state, "format 3 round-trips, in flight too");
}

/// Goal: `[coordinator] max_nodes` bounds the live nodes at registration, at the limit too; a
/// live node restarting keeps its place, and a place freed by a leave is taken again.
#[test]
fn registrations_past_max_nodes_are_refused_until_one_leaves() {
    let mut state = state_with_two_nodes();
    let bounded = |node: &str, instance: u64| Command::Register {
        node: id(node),
        addr: format!("{node}:1"),
        instance,
        lease_until_ms: 1_000,
        max_live: Some(2),
    };
    assert_eq!(state.apply(bounded("n3", 1)), Outcome::Lease(LeaseAnswer::FleetFull { max_nodes: 2 }));
    assert!(!state.fleet.nodes.contains_key(&id("n3")), "a refused node leaves no record");
    let restarted = assigned(state.apply(bounded("n1", 2)));
    assert_eq!(restarted.epoch, 2, "a live node registering again takes its own place");
    state.apply(Command::Leave { node: id("n2"), epoch: 1, lease_until_ms: 1_000 });
    assert_eq!(assigned(state.apply(bounded("n3", 1))).epoch, 1, "the place n2 left");
    assert_eq!(state.live_nodes().count(), 2);
}
