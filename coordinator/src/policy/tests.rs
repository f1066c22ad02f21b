//! Table tests of the leader's rules: each row is a situation (the cluster state, the ledger's
//! figures, the time) and the commands the leader must write.

use std::collections::BTreeMap;

use protocol::{Buffer, SkuReport, SkuTerms};

use super::*;

const LEASE: u64 = 2_000;
const GRACE: u64 = 500;

fn timing() -> Timing {
    Timing::new(LEASE, GRACE)
}

fn id(name: &str) -> NodeId {
    NodeId::new(name).unwrap()
}

fn sku() -> SkuId {
    SkuId::new("s").unwrap()
}

/// A SKU of 300 units planned over n1..n3 (100 + 10% each), every node registered at t=0 with a
/// lease to `LEASE`, then renewed at `renewed_at` (per node; absent = never renewed).
fn fleet(renewed_at: &[(&str, u64)]) -> ClusterState {
    let mut state = ClusterState::default();
    let starting = BTreeMap::from([(id("n1"), 110), (id("n2"), 110), (id("n3"), 110)]);
    state.apply(Command::DefineSku { sku: sku(), starting, terms: SkuTerms::new(300) });
    for node in ["n1", "n2", "n3"] {
        state.apply(Command::Register {
            node: id(node),
            addr: String::new(),
            instance: 1,
            lease_until_ms: LEASE,
            max_live: None,
        });
    }
    for (node, at) in renewed_at {
        state.apply(Command::Heartbeat {
            node: id(node),
            epoch: 1,
            now_ms: *at,
            lease_until_ms: at + LEASE,
            reports: BTreeMap::new(),
        });
    }
    state
}

fn expired_nodes(expiries: &Expiries) -> Vec<String> {
    expiries
        .commands
        .iter()
        .map(|command| match command {
            Command::Expire { node, .. } => node.to_string(),
            other => panic!("expiries writes only Expire, not {other:?}"),
        })
        .collect()
}

/// One row of the expiry table: (what, renewals, leader since, now, expired, braked).
type ExpiryRow = (&'static str, &'static [(&'static str, u64)], u64, u64, &'static [&'static str], bool);

#[test]
fn expiry_rules() {
    let rows: &[ExpiryRow] = &[
        ("all renewed: nobody expires", &[("n1", 9_000), ("n2", 9_000), ("n3", 9_000)], 0, 10_000, &[], false),
        ("one lapsed past grace expires", &[("n2", 9_000), ("n3", 9_000)], 0, 10_000, &["n1"], false),
        ("within grace: not yet", &[("n2", 9_000), ("n3", 9_000)], 0, LEASE + GRACE, &[], false),
        ("a new leader waits a full lease", &[("n2", 9_000), ("n3", 9_000)], 9_000, 10_000, &[], false),
        ("two of three lapse at once: the brake holds", &[("n3", 9_000)], 0, 10_000, &[], true),
        ("all of three lapse at once: the brake holds", &[], 0, 10_000, &[], true),
    ];
    for (what, renewals, since, now, expired, braked) in rows {
        let state = fleet(renewals);
        let mut leadership = Leadership { since_ms: *since, brake_since_ms: None };
        let decided = expiries(&state, *now, &mut leadership, timing());
        assert_eq!(expired_nodes(&decided), *expired, "{what}");
        assert_eq!(decided.braked, *braked, "{what}");
    }
}

/// Killing two of three nodes at once used to leave their stock unsold for good: the brake
/// never released. It holds for one lease, then lets them go.
#[test]
fn the_brake_releases_after_its_bound_and_resets_when_nodes_recover() {
    // n3 keeps renewing; n1 and n2 died at once.
    let state = fleet(&[("n3", 11_000)]);
    let mut leadership = Leadership::default();
    let first = expiries(&state, 10_000, &mut leadership, timing());
    assert!(first.braked && first.commands.is_empty());
    assert_eq!(leadership.brake_since_ms, Some(10_000));
    let still = expiries(&state, 10_000 + LEASE - 1, &mut leadership, timing());
    assert!(still.braked, "held for less than its bound");
    let released = expiries(&state, 10_000 + LEASE, &mut leadership, timing());
    assert!(released.brake_released && !released.braked);
    assert_eq!(expired_nodes(&released), ["n1", "n2"]);

    let recovered = fleet(&[("n1", 10_500), ("n2", 10_500), ("n3", 10_500)]);
    let mut leadership = Leadership { since_ms: 0, brake_since_ms: Some(10_000) };
    expiries(&recovered, 11_000, &mut leadership, timing());
    assert_eq!(leadership.brake_since_ms, None, "the brake resets once most nodes renew again");
}

fn report(state: &mut ClusterState, node: &str, now_ms: u64, local_remaining: u64, applied: u64, sold: u64) {
    let reports = BTreeMap::from([(sku(), SkuReport::new(local_remaining, applied, sold))]);
    state.apply(Command::Heartbeat { node: id(node), epoch: 1, now_ms, lease_until_ms: now_ms + LEASE, reports });
}

fn granted_units(command: &Option<Command>) -> BTreeMap<String, u64> {
    match command {
        None => BTreeMap::new(),
        Some(Command::Grant { items, .. }) => items.iter().map(|item| (item.node.to_string(), item.units)).collect(),
        Some(other) => panic!("top-up writes only Grant, not {other:?}"),
    }
}

#[test]
fn top_up_rules() {
    // Every node reported 50 local after applying its 110: 150 held by the live nodes.
    let mut state = fleet(&[]);
    for node in ["n1", "n2", "n3"] {
        report(&mut state, node, 1_000, 50, 110, 60);
    }
    let open = |remaining| LedgerFigures { remaining, closed: false };
    let settled = Leadership { since_ms: 0, brake_since_ms: None };
    // (what, ledger, now, expected target, expected total granted)
    let rows: &[(&str, LedgerFigures, u64, u64, u64)] = &[
        ("held covers remaining + 10%", open(120), 10_000, 132, 0),
        ("the gap to remaining + 10% is granted", open(200), 10_000, 220, 70),
        ("sold out: nothing to hold", open(0), 10_000, 0, 0),
        ("closed: nothing to hold", LedgerFigures { remaining: 200, closed: true }, 10_000, 0, 0),
    ];
    for (what, ledger, now, target, granted) in rows {
        let top = top_up(&state, &sku(), *ledger, *now, &settled, timing());
        assert_eq!(top.target, *target, "{what}");
        assert_eq!(top.held, 150, "{what}");
        assert_eq!(granted_units(&top.command).values().sum::<u64>(), *granted, "{what}");
    }
}

#[test]
fn while_starting_up_unregistered_nodes_of_the_plan_count_as_holding_their_share() {
    let mut state = ClusterState::default();
    let starting = BTreeMap::from([(id("n1"), 110), (id("n2"), 110), (id("n3"), 110)]);
    state.apply(Command::DefineSku { sku: sku(), starting, terms: SkuTerms::new(300) });
    state.apply(Command::Register {
        node: id("n1"),
        addr: String::new(),
        instance: 1,
        lease_until_ms: LEASE,
        max_live: None,
    });
    let leadership = Leadership { since_ms: 0, brake_since_ms: None };
    let ledger = LedgerFigures { remaining: 300, closed: false };
    let early = top_up(&state, &sku(), ledger, 1_000, &leadership, timing());
    assert_eq!(early.command, None, "n2 and n3 are expected with 220 more: no need to hand n1 everything");
    let late = top_up(&state, &sku(), ledger, 2 * LEASE, &leadership, timing());
    assert_eq!(granted_units(&late.command), BTreeMap::from([("n1".to_string(), 330 - 110)]), "after two leases");
}

#[test]
fn grants_follow_the_sell_rate_and_add_up() {
    let mut state = fleet(&[]);
    report(&mut state, "n1", 1_000, 10, 110, 0);
    report(&mut state, "n2", 1_000, 10, 110, 0);
    report(&mut state, "n3", 1_000, 10, 110, 0);
    // In the next second n1 sells 30, n2 10, n3 nothing.
    report(&mut state, "n1", 2_000, 10, 110, 30);
    report(&mut state, "n2", 2_000, 10, 110, 10);
    report(&mut state, "n3", 2_000, 10, 110, 0);
    let items = |command: Command| match command {
        Command::Reallocate { items, .. } => {
            items.iter().map(|item| (item.node.to_string(), item.units)).collect::<BTreeMap<_, _>>()
        }
        other => panic!("reallocation writes Reallocate, not {other:?}"),
    };
    let dead = id("n9");
    let command = reallocation(&state, &dead, 1, &sku(), 110, 30);
    // A tenth of the mean rate on top of each: n3, which sold nothing, still gets a little.
    let expected = [("n1".to_string(), 57), ("n2".to_string(), 21), ("n3".to_string(), 2)];
    assert_eq!(items(command), BTreeMap::from(expected));
    let all_sold = reallocation(&state, &dead, 1, &sku(), 110, 110);
    assert!(items(all_sold).is_empty(), "an epoch that sold all it was granted leaves nothing, but is settled");
}

/// A node that heartbeats but cannot reach the ledger holds units nobody may sell: they do not
/// count, and the gap goes to the nodes that can confirm.
#[test]
fn a_node_that_cannot_reach_the_ledger_holds_nothing_and_is_granted_nothing() {
    let mut state = fleet(&[]);
    for node in ["n1", "n2", "n3"] {
        report(&mut state, node, 1_000, 50, 110, 60);
    }
    let cut_off = SkuReport { ledger_reachable: false, ..SkuReport::new(50, 110, 60) };
    let reports = BTreeMap::from([(sku(), cut_off)]);
    state.apply(Command::Heartbeat { node: id("n3"), epoch: 1, now_ms: 1_100, lease_until_ms: 3_100, reports });
    let top = top_up(
        &state,
        &sku(),
        LedgerFigures { remaining: 120, closed: false },
        10_000,
        &Leadership::default(),
        timing(),
    );
    assert_eq!(top.held, 100, "n3's 50 cannot be confirmed");
    let granted = granted_units(&top.command);
    assert_eq!(granted.values().sum::<u64>(), 32, "remaining 120 + 10% over what n1 and n2 hold");
    assert!(!granted.contains_key("n3"), "nothing granted to a node that cannot sell it: {granted:?}");
}

#[test]
fn a_buffer_in_units_is_per_live_node() {
    let mut state = fleet(&[]);
    state.apply(Command::SetBuffer { sku: sku(), buffer: Buffer::Units(5) });
    for node in ["n1", "n2", "n3"] {
        report(&mut state, node, 1_000, 0, 110, 110);
    }
    let top = top_up(
        &state,
        &sku(),
        LedgerFigures { remaining: 30, closed: false },
        10_000,
        &Leadership::default(),
        timing(),
    );
    assert_eq!(top.target, 45, "30 remaining + 5 per live node");
    assert_eq!(granted_units(&top.command).values().sum::<u64>(), 45);
}

#[test]
fn split_adds_up_and_follows_the_weights() {
    assert_eq!(split(10, &[1.0, 1.0, 1.0]).iter().sum::<u64>(), 10);
    assert_eq!(split(10, &[3.0, 1.0]), vec![8, 2]);
    assert_eq!(split(7, &[0.0, 0.0]).iter().sum::<u64>(), 7, "no rates yet: even split");
    assert!(split(5, &[]).is_empty());
}

/// Goal: a node that joins mid-sale (never granted the SKU in its epoch) is granted its even
/// share of the target in the very tick that first sees it live, not a sliver by sell rate; a
/// node that sold out what it was granted is not a joiner, and a sold-out SKU grants nobody.
#[test]
fn a_joining_node_gets_its_even_share_in_the_first_tick() {
    let mut state = fleet(&[]);
    for node in ["n1", "n2", "n3"] {
        report(&mut state, node, 1_000, 50, 110, 60);
    }
    state.apply(Command::Register {
        node: id("n4"),
        addr: String::new(),
        instance: 1,
        lease_until_ms: 3_000,
        max_live: None,
    });
    let settled = Leadership { since_ms: 0, brake_since_ms: None };
    let top = top_up(&state, &sku(), LedgerFigures { remaining: 120, closed: false }, 10_000, &settled, timing());
    // Target: 120 remaining + 10% = 132 over four live nodes, 33 each; the others hold 150.
    assert_eq!(granted_units(&top.command), BTreeMap::from([("n4".to_string(), 33)]));
    assert_eq!(top.held, 183, "what the fleet holds counts the joiner's share");
    let sold_out = top_up(&state, &sku(), LedgerFigures { remaining: 0, closed: false }, 10_000, &settled, timing());
    assert_eq!(sold_out.command, None, "nothing left: nothing to share");
    let Some(Command::Grant { items, .. }) = top.command else { panic!("a grant") };
    state.apply(Command::Grant { sku: sku(), items });
    report(&mut state, "n4", 10_250, 0, 33, 33);
    let again = top_up(&state, &sku(), LedgerFigures { remaining: 60, closed: false }, 10_500, &settled, timing());
    assert_eq!(again.command, None, "n4 sold its share: a seller now, topped up by rate like the others, not again");
    assert_eq!((again.target, again.held), (66, 150));
}

/// Goal: rule 6 asks the richest nodes to give back what the fleet holds beyond its target plus
/// one share, never below one share each, and only then; a fleet near its target is left alone.
#[test]
fn a_fleet_holding_far_beyond_its_target_is_rebalanced_from_its_richest_nodes() {
    let mut state = fleet(&[]);
    // n1 holds 300, n2 40, n3 30 (sold the rest of their 110).
    report(&mut state, "n1", 1_000, 300, 110, 0);
    report(&mut state, "n2", 1_000, 40, 110, 70);
    report(&mut state, "n3", 1_000, 30, 110, 80);
    let settled = Leadership { since_ms: 0, brake_since_ms: None };
    // 200 left + 10%: a target of 220, 74 a node; held 370, 76 beyond target + share.
    let top = top_up(&state, &sku(), LedgerFigures { remaining: 200, closed: false }, 10_000, &settled, timing());
    assert_eq!((top.target, top.held), (220, 370));
    assert_eq!(top.hold_max, BTreeMap::from([(id("n1"), 300 - 76)]), "the excess, from the richest");
    // Near the target (held within one share of it): nothing to give back.
    let near = top_up(&state, &sku(), LedgerFigures { remaining: 300, closed: false }, 10_000, &settled, timing());
    assert!(near.hold_max.is_empty(), "{near:?}");
    // Much less left: n1 gives back down to one share, no further.
    let low = top_up(&state, &sku(), LedgerFigures { remaining: 20, closed: false }, 10_000, &settled, timing());
    let share = low.target.div_ceil(3);
    assert_eq!(low.hold_max.get(&id("n1")), Some(&share), "{low:?}");
    assert!(low.hold_max.get(&id("n2")).is_some_and(|max| *max >= share), "{low:?}");
    let sold_out = top_up(&state, &sku(), LedgerFigures { remaining: 0, closed: false }, 10_000, &settled, timing());
    assert!(sold_out.hold_max.is_empty(), "nothing left: no rebalancing");
}
