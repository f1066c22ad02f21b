//! A member wired by hand, without its loops, so a test can write what an earlier leader left
//! in the log before it starts the stripes' transfer loop: a real raft log in a temp dir and a
//! real (embedded) ledger.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{CatalogueLedger, EmbeddedLedger, LedgerReads, SkuId, SkuStatus, SkuTerms};
use safeguards::blacklist::MemoryBlacklistStore;

use super::*;
use crate::config::MemberAddr;
use crate::state::{Command, Outcome, Transfer};

const WAIT_MAX: Duration = Duration::from_secs(10);

fn config(dir: &std::path::Path) -> CoordinatorConfig {
    CoordinatorConfig {
        members: vec![MemberAddr {
            name: "c1".into(),
            listen: "127.0.0.1:1".parse().unwrap(),
            addr: "127.0.0.1:1".into(),
        }],
        data_dir: dir.to_path_buf(),
        heartbeat: Duration::from_millis(100),
        lease: Duration::from_millis(1000),
        grace: Duration::from_millis(200),
        fence_margin: Duration::from_millis(150),
        election_timeout_min: Duration::from_millis(100),
        election_timeout_max: Duration::from_millis(200),
        reallocate: true,
        admin_token: None,
        cluster: protocol::ClusterCredential::generate().unwrap(),
        tls: None,
        orders_api: None,
        max_nodes: 64,
    }
}

/// A one-member group's leader over `ledger`, with no loop running.
async fn leader(dir: &std::path::Path, ledger: Arc<EmbeddedLedger>) -> Arc<Context> {
    let config = config(dir);
    let Opened { raft, store, log_fsyncs, .. } = open(&config, "c1", 1, None).await.unwrap();
    initialize(&raft, &config).await;
    let blacklist = Arc::new(MemoryBlacklistStore::default());
    let parts = Parts {
        raft,
        store,
        config,
        id: 1,
        name: "c1-stripes".into(),
        ledger,
        plans: Vec::new(),
        metrics: None,
        blacklist,
        log_fsyncs,
    };
    let context = Arc::new(Context::new(parts));
    let deadline = Instant::now() + WAIT_MAX;
    while !context.is_leader() {
        assert!(Instant::now() < deadline, "no leader after {WAIT_MAX:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    context
}

fn hot() -> SkuId {
    SkuId::new("hot").unwrap()
}

/// Creates `hot`, 9 units in 3 stripes of 3, as the admin API does: each stripe's ledger, then
/// its catalogue entry.
async fn define_hot(context: &Context, ledger: &EmbeddedLedger) {
    let terms = SkuTerms { stripes: 3, per_user_limit: 0, ..SkuTerms::new(9) };
    for (index, terms) in (0..).zip(terms.stripe_terms()) {
        ledger.create_sku(&hot().stripe(index), &terms).await.unwrap();
        let command = Command::DefineSku { sku: hot().stripe(index), starting: Default::default(), terms };
        assert_eq!(context.write(command).await.unwrap(), Outcome::Defined);
    }
}

async fn write(context: &Context, command: Command) {
    assert_eq!(context.write(command).await.unwrap(), Outcome::Transferred);
}

async fn stripes(ledger: &EmbeddedLedger) -> Vec<SkuStatus> {
    let mut statuses = Vec::new();
    for index in 0..3 {
        statuses.push(ledger.status(&hot().stripe(index)).await.unwrap());
    }
    statuses
}

/// Goal: a transfer an earlier leader left half done is finished by the next one, exactly once,
/// whichever step it stopped after. Method: transfer 0 is started and taken out of stripe 0 at
/// the ledger but its debit never recorded (the answer was lost); transfer 1 is debited in raft
/// but never put in. Then the transfer loop starts, as on a new leader; once both are done,
/// finishing them again by hand changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_left_in_flight_are_finished_once_by_the_next_leader() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(EmbeddedLedger::new(Duration::from_secs(60)));
    let context = leader(dir.path(), ledger.clone()).await;
    define_hot(&context, &ledger).await;
    write(&context, Command::TransferStarted { id: 0, sku: hot(), from: 0, to: 1, most: 2 }).await;
    assert_eq!(ledger.transfer_out(&hot(), 0, 2).await.unwrap(), 2);
    write(&context, Command::TransferStarted { id: 1, sku: hot(), from: 2, to: 1, most: 1 }).await;
    assert_eq!(ledger.transfer_out(&hot().stripe(2), 1, 1).await.unwrap(), 1);
    write(&context, Command::TransferDebited { id: 1, units: 1 }).await;

    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(crate::stripes::run(context.clone(), stopped));
    let deadline = Instant::now() + WAIT_MAX;
    while !context.applied_state().stripes.in_flight.is_empty() {
        assert!(Instant::now() < deadline, "transfers still in flight after {WAIT_MAX:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send_replace(true);
    task.await.unwrap();
    assert_books(&context, &ledger).await;

    for (id, from, most) in [(0, 0, 2), (1, 2, 1)] {
        let transfer = Transfer { sku: hot(), from: Some(from), to: 1, most, debited: None };
        let units = crate::stripes::finish(&context, id, &transfer).await.unwrap();
        assert_eq!(units, most, "a replayed transfer_out answers the recorded count");
    }
    assert_books(&context, &ledger).await;
}

/// Stripe 1 got 2 units from stripe 0 and 1 from stripe 2, once each, in the ledger and in raft.
async fn assert_books(context: &Context, ledger: &EmbeddedLedger) {
    let statuses = stripes(ledger).await;
    let totals: Vec<u64> = statuses.iter().map(|status| status.total).collect();
    assert_eq!(totals, [1, 6, 2]);
    let moved: Vec<(u64, u64)> = statuses.iter().map(|s| (s.transferred_out, s.transferred_in)).collect();
    assert_eq!(moved, [(2, 0), (0, 3), (1, 0)]);
    let state = context.applied_state();
    let catalogue: Vec<u64> = (0..3).map(|index| state.catalogue.terms(&hot().stripe(index)).unwrap().total).collect();
    assert_eq!(catalogue, totals, "the catalogue follows the ledger");
    let striped = &state.stripes.skus[&hot()];
    assert_eq!((striped.total, striped.transfers, striped.transferred_units), (9, 2, 3));
    assert_eq!(state.stripes.next_id, 2);
}

/// Goal: a transfer recorded in the log survives its leader: a member restarted on the same log
/// (a new process, with nothing of the first in memory) finishes it once. Method: start and debit transfer 0 at the
/// ledger, stop the member before anything else is written, start it again on its data dir and
/// run the transfer loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_member_finishes_the_transfer_its_log_holds() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(EmbeddedLedger::new(Duration::from_secs(60)));
    let first = leader(dir.path(), ledger.clone()).await;
    define_hot(&first, &ledger).await;
    write(&first, Command::TransferStarted { id: 0, sku: hot(), from: 0, to: 1, most: 2 }).await;
    assert_eq!(ledger.transfer_out(&hot(), 0, 2).await.unwrap(), 2);
    first.raft().shutdown().await.unwrap();
    drop(first);

    let second = leader(dir.path(), ledger.clone()).await;
    let deadline = Instant::now() + WAIT_MAX;
    while second.applied_state().catalogue.skus.len() < 3 {
        assert!(Instant::now() < deadline, "the log was not applied after {WAIT_MAX:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(second.applied_state().stripes.in_flight.len(), 1, "the log kept the transfer");
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(crate::stripes::run(second.clone(), stopped));
    let deadline = Instant::now() + WAIT_MAX;
    while !second.applied_state().stripes.in_flight.is_empty() {
        assert!(Instant::now() < deadline, "transfer still in flight after {WAIT_MAX:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send_replace(true);
    task.await.unwrap();
    let totals: Vec<u64> = stripes(&ledger).await.iter().map(|status| status.total).collect();
    assert_eq!(totals, [1, 5, 3], "2 units moved, once");
    let state = second.applied_state();
    assert_eq!((state.stripes.skus[&hot()].transferred_units, state.stripes.next_id), (2, 1));
}
