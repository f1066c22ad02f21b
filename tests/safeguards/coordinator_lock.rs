//! The lock suite on the coordinator backend: a one-member raft group in this process (log in a
//! temp dir, HTTP on a free loopback port), reached through `CoordinatorClient`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coordinator::{CoordinatorConfig, Member, MemberAddr};
use ledger::EmbeddedLedger;
use protocol::CoordinatorClient;
use safeguards::blacklist::MemoryBlacklistStore;
use safeguards::CoordinatorLockBackend;
use safeguards::{Exclusive, LockBackend, LockName};
use tokio::net::TcpListener;

use crate::lock_suite::{self, lock, SLACK, TTL};

/// How long a one-member group may take to elect itself.
const ELECTION_MAX: Duration = Duration::from_secs(10);

struct Group {
    member: Option<Member>,
    addr: SocketAddr,
    /// The group's cluster token, which lock clients present.
    token: protocol::Secret,
    _dir: tempfile::TempDir,
}

impl Group {
    /// One member, with the timings `seckill demo` uses for a local group.
    async fn start() -> Group {
        let dir = tempfile::tempdir().expect("a temp dir");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("an address");
        let config = CoordinatorConfig {
            members: vec![MemberAddr { name: "c1".into(), listen: addr, addr: addr.to_string() }],
            data_dir: dir.path().to_path_buf(),
            heartbeat: Duration::from_millis(100),
            lease: Duration::from_millis(1000),
            grace: Duration::from_millis(200),
            fence_margin: Duration::from_millis(150),
            election_timeout_min: Duration::from_millis(100),
            election_timeout_max: Duration::from_millis(200),
            reallocate: true,
            admin_token: None,
            cluster: protocol::ClusterCredential::generate().expect("a random source"),
            tls: None,
            orders_api: None,
            max_nodes: 64,
        };
        let config_token = config.cluster.token().clone();
        let ledger = Arc::new(EmbeddedLedger::new(Duration::from_secs(60)));
        let member =
            Member::start(config, "c1", listener, ledger, Vec::new(), None, Arc::new(MemoryBlacklistStore::default()))
                .await
                .expect("a member");
        let deadline = Instant::now() + ELECTION_MAX;
        while member.status().leader != Some(1) {
            assert!(Instant::now() < deadline, "no leader after {ELECTION_MAX:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Group { member: Some(member), addr, token: config_token, _dir: dir }
    }

    fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(CoordinatorLockBackend::new(CoordinatorClient::new(vec![self.addr.to_string()], self.token.clone())))
    }

    async fn stop(&mut self) {
        if let Some(member) = self.member.take() {
            member.stop().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lock_mutual_exclusion_under_contention() {
    let mut group = Group::start().await;
    // Every attempt is a raft write with an fsync: fewer rounds than on Redis.
    lock_suite::mutual_exclusion_under_contention(group.client(), 16, 4).await;
    group.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lock_of_a_crashed_holder_expires() {
    let mut group = Group::start().await;
    lock_suite::a_crashed_holders_lock_expires(|| group.client()).await;
    group.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lock_cannot_be_released_or_extended_by_another_owner() {
    let mut group = Group::start().await;
    lock_suite::nobody_can_release_or_extend_another_owners_lock(group.client()).await;
    group.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lock_reentry_keeps_the_fence() {
    let mut group = Group::start().await;
    lock_suite::reentrant_holds_keep_the_fence_and_free_on_the_last_release(group.client()).await;
    group.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lock_fences_strictly_increase() {
    let mut group = Group::start().await;
    lock_suite::fencing_tokens_strictly_increase_across_owners(group.client()).await;
    group.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lock_run_exclusive_runs_once_or_reports_busy() {
    let mut group = Group::start().await;
    lock_suite::run_exclusive_runs_the_work_once_or_reports_busy(group.client()).await;
    group.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lock_renewal_failure_cancels_the_work() {
    let mut group = Group::start().await;
    lock_suite::renewal_failure_cancels_the_work(group.client()).await;
    group.stop().await;
}

/// Goal: when the coordinator group goes away, the holder's work is cancelled within the ttl.
/// Method: stop the only member while `run_exclusive` runs work that would never end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lock_lost_group_cancels_the_work_within_the_ttl() {
    let group = Mutex::new(Group::start().await);
    let client = group.lock().unwrap().client();
    let name = LockName::new("group-down").unwrap();
    let mut stopped_at = None;
    let mut cancelled = None;
    let outcome = lock(client)
        .run_exclusive(&name, TTL, TTL, |_, cancel| async {
            cancelled = Some(tokio::spawn(async move {
                cancel.cancelled().await;
                Instant::now()
            }));
            let member = group.lock().unwrap().member.take();
            member.expect("a running member").stop().await;
            stopped_at = Some(Instant::now());
            std::future::pending::<()>().await;
        })
        .await
        .unwrap();
    assert_eq!(outcome, Exclusive::Lost);
    let after = cancelled.expect("the work ran").await.unwrap() - stopped_at.expect("the member stopped");
    eprintln!("work cancelled {after:?} after the coordinator stopped (ttl {TTL:?})");
    assert!(after <= TTL + SLACK, "cancelled {after:?} after the group stopped; ttl {TTL:?}");
}
