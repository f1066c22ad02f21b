//! Applies a schedule's faults to a running fleet and undoes them: kills and restarts,
//! SIGSTOP/SIGCONT, a member's wiped disk, Redis down or frozen, a node's links cut, slowed or
//! made one-way through its proxies, an order service killed or frozen, its PostgreSQL stopped
//! or killed. Every step goes into the timeline.
//!
//! A fault whose target cannot be found when it starts (no leader known for a leader kill) is
//! skipped and noted, never guessed. A wiped member is replaced the supported way (see
//! `coordinator/src/membership.rs`): removed from the group while it is down, restarted on its
//! empty directory at the fault's end, added as a learner (the call returns once it caught up)
//! and promoted; a step that fails is noted and tried again at the heal.
//!
//! On replicated Redis (Sentinel or Cluster) "Redis" is the master that takes the SKU's
//! writes: the master the sentinels name, or the master of the SKU's slot. A Redis pause
//! freezes it (and SIGCONTs that same server at the end, whoever is master by then: a pause
//! past the sentinels' or the cluster's timeout is a failover of its own), and a failover kills
//! it, waits at its end for the promotion and restarts the old master; the next failover, and
//! the heal, wait until it is the new master's synced replica. A promotion or rejoin that does
//! not come in time is noted, not fatal. [`Injector::heal`] undoes whatever is still in
//! effect, in the order that lets each part come back to a working dependency: Redis and
//! PostgreSQL, members, nodes and order services, links; then it waits until every Redis data
//! node is back in its place.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;

use testkit::fleet::Fleet;
use testkit::proxy::{Fault as LinkState, ProxyHandle};

use crate::history::History;
use crate::schedule::{FaultKind, LinkFault, LinkTarget, PlannedFault};

/// The admin token the nemesis gives its members, for the membership changes of a replacement.
pub const ADMIN_TOKEN: &str = "nemesis-admin-token-0123456789";

/// Longest one membership change may take: `add_learner` answers once the learner caught up,
/// which the coordinator allows 30 s.
const MEMBER_CHANGE_MAX: Duration = Duration::from_secs(35);

/// Tries of one membership change (a leader may be being elected), 300 ms apart.
const MEMBER_CHANGE_TRIES: usize = 10;

/// Longest a failover's end waits for the sentinels or the cluster to promote the replica.
const PROMOTION_MAX: Duration = testkit::sentinel::FAILOVER_MAX;

/// Longest the wait for the old master to be the new one's synced replica: the sentinels
/// reconfigure it within a few seconds of seeing it back (a cluster node learns it from the
/// gossip), then a full sync.
const REJOIN_MAX: Duration = Duration::from_secs(30);

/// Longest a fault-knob call to the sandbox may take.
const PROVIDER_CALL_MAX: Duration = Duration::from_secs(2);

/// What a started fault changed, so its end can undo exactly that.
enum Applied {
    Killed(Vec<String>),
    Paused(String),
    /// A member killed (the leader), to start again.
    MemberDown(String),
    /// A member whose disk was wiped, to replace.
    MemberWiped(String),
    /// The Redis frozen, by port (on replicated Redis, the master when the fault started).
    RedisPaused(u16),
    RedisKilled(u16),
    /// On replicated Redis: the master killed, by port.
    RedisFailedOver(u16),
    Link(Vec<ProxyHandle>),
    PostgresStopped,
    /// A sandbox knob, and the body that turns it off again.
    Provider(serde_json::Value),
}

/// When a fault was actually in effect, and on what: the checker's view of the faults.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Window {
    pub id: usize,
    pub label: String,
    pub kind: FaultKind,
    /// The member a leader fault hit, once resolved.
    pub member: Option<String>,
    pub start_ms: u64,
    /// None while in effect.
    pub end_ms: Option<u64>,
    /// Its target could not be found when it was due.
    pub skipped: bool,
}

impl Window {
    /// Nodes it leaves unable to sell while it lasts: killed, frozen, cut off from Redis or
    /// from the coordinator (no lease), or slowed toward Redis past a ledger call's deadline.
    /// A node slowed less still sells, and one slowed toward the coordinator keeps its lease.
    pub fn unable_nodes(&self, ledger_call_ms: u64) -> Vec<String> {
        match &self.kind {
            FaultKind::KillNodes { nodes } => nodes.clone(),
            FaultKind::PauseNode { node } => vec![node.clone()],
            FaultKind::Link { node, to, fault: LinkFault::Delay { ms } } => {
                // A round trip waits twice: once each way.
                let slowed_past_deadline = *to == LinkTarget::Redis && 2 * ms >= ledger_call_ms;
                if slowed_past_deadline {
                    vec![node.clone()]
                } else {
                    Vec::new()
                }
            }
            FaultKind::Link { node, .. } => vec![node.clone()],
            FaultKind::DisconnectNode { node } | FaultKind::ReplaceNode { node } => vec![node.clone()],
            _ => Vec::new(),
        }
    }

    /// Whether it impairs the whole fleet (Redis or the coordinator), not only some nodes.
    pub fn impairs_fleet(&self) -> bool {
        !self.skipped
            && matches!(
                self.kind,
                FaultKind::KillLeader
                    | FaultKind::WipeMember { .. }
                    | FaultKind::PauseRedis
                    | FaultKind::KillRedis
                    | FaultKind::RedisFailover
                    | FaultKind::DisconnectLeader { .. }
                    | FaultKind::RollFleet
            )
    }

    /// Nodes it touches in any way.
    pub fn touched_nodes(&self) -> Vec<String> {
        match &self.kind {
            FaultKind::KillNodes { nodes } => nodes.clone(),
            FaultKind::PauseNode { node }
            | FaultKind::Link { node, .. }
            | FaultKind::DisconnectNode { node }
            | FaultKind::ReplaceNode { node } => vec![node.clone()],
            _ => Vec::new(),
        }
    }
}

pub struct Injector<'a> {
    fleet: &'a mut Fleet,
    /// A key in the SKU's hash slot: on Redis Cluster, its master is the Redis the faults hit.
    sku_key: String,
    history: History,
    nodes: usize,
    active: BTreeMap<usize, Applied>,
    windows: Vec<Window>,
    /// Old masters restarted after a failover, by fault: the heal waits until each is the new
    /// master's synced replica.
    rejoining: Vec<(Option<usize>, u16)>,
}

impl<'a> Injector<'a> {
    /// An injector for `fleet`, whose Redis faults hit the master of `sku_key`.
    pub fn new(fleet: &'a mut Fleet, history: History, sku_key: String) -> Self {
        let nodes = fleet.node_names().len();
        Self { fleet, sku_key, history, nodes, active: BTreeMap::new(), windows: Vec::new(), rejoining: Vec::new() }
    }

    /// Every fault started so far, with when it was in effect.
    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    fn open_window(&mut self, fault: &PlannedFault, member: Option<String>, skipped: bool) {
        self.windows.push(Window {
            id: fault.id,
            label: fault.kind.label(self.nodes),
            kind: fault.kind.clone(),
            member,
            start_ms: self.history.clock().now_ms(),
            end_ms: skipped.then(|| self.history.clock().now_ms()),
            skipped,
        });
    }

    /// Starts `fault`. An error means the fleet could not be driven (a process would not
    /// spawn), not that the fault was refused.
    #[expect(clippy::too_many_lines, reason = "one short arm per fault kind; split, the kinds would be matched twice")]
    pub async fn start(&mut self, fault: &PlannedFault) -> anyhow::Result<()> {
        let id = Some(fault.id);
        let applied = match &fault.kind {
            FaultKind::KillNodes { nodes } => {
                for node in nodes {
                    self.fleet.kill(node)?;
                }
                self.history.event(id, format!("SIGKILL {}", nodes.join(", ")));
                Applied::Killed(nodes.clone())
            }
            FaultKind::PauseNode { node } => {
                self.fleet.pause(node)?;
                self.history.event(id, format!("SIGSTOP {node}"));
                Applied::Paused(node.clone())
            }
            FaultKind::KillLeader => {
                let Some(leader) = self.fleet.leader().await else {
                    self.history.event(id, "skipped: no member knows a leader");
                    self.open_window(fault, None, true);
                    return Ok(());
                };
                self.fleet.kill(&leader)?;
                self.history.event(id, format!("SIGKILL leader {leader}"));
                Applied::MemberDown(leader)
            }
            FaultKind::WipeMember { member } => {
                self.fleet.wipe_member(member)?;
                self.history.event(id, format!("SIGKILL {member} and delete its raft directory"));
                self.change_member(id, member, "remove").await;
                Applied::MemberWiped(member.clone())
            }
            FaultKind::PauseRedis => {
                let port = self.fleet.redis_master(&self.sku_key)?;
                self.redis_on(port)?.signal("-STOP")?;
                self.history.event(id, format!("SIGSTOP redis (port {port})"));
                Applied::RedisPaused(port)
            }
            FaultKind::KillRedis => {
                let port = self.fleet.redis_master(&self.sku_key)?;
                self.redis_on(port)?.kill();
                self.history.event(id, format!("SIGKILL redis (port {port})"));
                Applied::RedisKilled(port)
            }
            FaultKind::RedisFailover => {
                // A second failover before the last one's old master rejoined would leave the
                // sentinels no replica to promote.
                self.finish_rejoins().await;
                let port = self.fleet.kill_redis_master(&self.sku_key)?;
                self.history.event(id, format!("SIGKILL the redis master (port {port})"));
                Applied::RedisFailedOver(port)
            }
            FaultKind::KillOrders { name } => {
                self.fleet.kill(name)?;
                self.history.event(id, format!("SIGKILL {name}"));
                Applied::Killed(vec![name.clone()])
            }
            FaultKind::PauseOrders { name } => {
                self.fleet.pause(name)?;
                self.history.event(id, format!("SIGSTOP {name}"));
                Applied::Paused(name.clone())
            }
            FaultKind::StopPostgres => {
                let postgres =
                    self.fleet.postgres_mut().ok_or_else(|| anyhow::anyhow!("the fleet has no PostgreSQL"))?;
                postgres.stop()?;
                self.history.event(id, "postgres stopped (fast shutdown)");
                Applied::PostgresStopped
            }
            FaultKind::KillPostgres => {
                let postgres =
                    self.fleet.postgres_mut().ok_or_else(|| anyhow::anyhow!("the fleet has no PostgreSQL"))?;
                postgres.kill();
                self.history.event(id, "SIGKILL postgres and its backends");
                Applied::PostgresStopped
            }
            // The container fleet's faults (`crate::docker`): a fleet of processes has no
            // container to cut off or replace.
            FaultKind::DisconnectNode { .. }
            | FaultKind::DisconnectLeader { .. }
            | FaultKind::ReplaceNode { .. }
            | FaultKind::RollFleet
            | FaultKind::ScaleNodes { .. }
            | FaultKind::RestartPostgres => {
                self.history.event(id, "skipped: a container fleet's fault, on a fleet of processes");
                self.open_window(fault, None, true);
                return Ok(());
            }
            FaultKind::Provider { fault: provider } => {
                let (on, off) = provider.knobs();
                match self.set_provider_faults(&on).await {
                    Ok(()) => self.history.event(id, format!("sandbox faults: {on}")),
                    Err(e) => {
                        self.history.event(id, format!("skipped: the sandbox did not take {on}: {e:#}"));
                        self.open_window(fault, None, true);
                        return Ok(());
                    }
                }
                Applied::Provider(off)
            }
            FaultKind::Link { node, to, fault: link } => {
                let proxies = self.proxies(node, *to).await;
                if proxies.is_empty() {
                    self.history.event(id, format!("skipped: no {to:?} link of {node} to fault"));
                    self.open_window(fault, None, true);
                    return Ok(());
                }
                for proxy in &proxies {
                    proxy.set(link.state());
                }
                self.history.event(id, format!("{node}'s link to {to:?} ({} proxies): {link:?}", proxies.len()));
                Applied::Link(proxies)
            }
        };
        let member = match &applied {
            Applied::MemberDown(member) | Applied::MemberWiped(member) => Some(member.clone()),
            _ => None,
        };
        self.open_window(fault, member, false);
        self.active.insert(fault.id, applied);
        Ok(())
    }

    /// Undoes fault `id` if it is still in effect.
    pub async fn end(&mut self, id: usize) -> anyhow::Result<()> {
        let Some(applied) = self.active.remove(&id) else { return Ok(()) };
        self.undo(Some(id), applied).await
    }

    /// Undoes every fault still in effect: Redis first, then members, nodes and links.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        let mut pending: Vec<(usize, Applied)> = std::mem::take(&mut self.active).into_iter().collect();
        pending.sort_by_key(|(_, applied)| match applied {
            Applied::RedisPaused(_)
            | Applied::RedisKilled(_)
            | Applied::RedisFailedOver(_)
            | Applied::PostgresStopped
            | Applied::Provider(_) => 0,
            Applied::MemberDown(_) | Applied::MemberWiped(_) => 1,
            Applied::Killed(_) | Applied::Paused(_) => 2,
            Applied::Link(_) => 3,
        });
        for (id, applied) in pending {
            self.undo(Some(id), applied).await?;
        }
        self.finish_rejoins().await;
        // A pause past the failover timeout moved the master too; it rejoins on its own.
        match self.fleet.wait_redis_whole(REJOIN_MAX).await {
            Ok(()) => self.history.event(None, "every redis data node in its place"),
            Err(e) => self.history.event(None, format!("redis not whole: {e:#}")),
        }
        self.history.event(None, "healed: every process running, every link passing");
        Ok(())
    }

    async fn undo(&mut self, id: Option<usize>, applied: Applied) -> anyhow::Result<()> {
        let now = self.history.clock().now_ms();
        if let Some(window) = self.windows.iter_mut().find(|w| Some(w.id) == id && w.end_ms.is_none()) {
            window.end_ms = Some(now);
        }
        match applied {
            Applied::Killed(nodes) => {
                for node in &nodes {
                    self.fleet.start_process(node)?;
                }
                self.history.event(id, format!("restart {}", nodes.join(", ")));
            }
            Applied::Paused(node) => {
                self.fleet.resume(&node)?;
                self.history.event(id, format!("SIGCONT {node}"));
            }
            Applied::MemberDown(member) => {
                self.fleet.start_process(&member)?;
                self.history.event(id, format!("restart {member}"));
            }
            Applied::MemberWiped(member) => {
                // Again in case the removal failed while the group had no leader; a repeated
                // step changes nothing.
                self.change_member(id, &member, "remove").await;
                self.fleet.start_process(&member)?;
                self.history.event(id, format!("restart {member} on its empty directory"));
                self.change_member(id, &member, "add_learner").await;
                self.change_member(id, &member, "promote").await;
            }
            Applied::RedisPaused(port) => {
                self.redis_on(port)?.signal("-CONT")?;
                self.history.event(id, format!("SIGCONT redis (port {port})"));
            }
            Applied::RedisFailedOver(port) => {
                match self.fleet.wait_redis_promotion(port, &self.sku_key, PROMOTION_MAX).await {
                    Ok(master) => self.history.event(id, format!("port {master} promoted")),
                    Err(e) => self.history.event(id, format!("no promotion: {e:#}")),
                }
                self.redis_on(port)?.restart()?;
                self.history.event(id, format!("port {port} restarted from its AOF"));
                // It turns into a replica some seconds later (the sentinels wait to see it
                // report the wrong role for a while; a cluster node waits for the gossip);
                // waiting here would hold up the rest of the schedule, so the next failover or
                // the heal waits for it.
                if let Some(window) = self.windows.iter_mut().find(|w| Some(w.id) == id) {
                    window.end_ms = None;
                }
                self.rejoining.push((id, port));
            }
            Applied::RedisKilled(port) => {
                self.redis_on(port)?.restart()?;
                self.history.event(id, "redis restarted from its AOF");
            }
            Applied::Link(proxies) => {
                for proxy in &proxies {
                    proxy.set(LinkState::Pass);
                }
                self.history.event(id, "link passing again");
            }
            Applied::PostgresStopped => {
                let postgres =
                    self.fleet.postgres_mut().ok_or_else(|| anyhow::anyhow!("the fleet has no PostgreSQL"))?;
                postgres.restart()?;
                self.history.event(id, "postgres restarted");
            }
            Applied::Provider(off) => {
                // A knob left on would fault the rest of the run: a sandbox that will not take
                // it back cannot be driven.
                self.set_provider_faults(&off).await.context("turning the sandbox's fault off")?;
                self.history.event(id, format!("sandbox faults: {off}"));
            }
        }
        Ok(())
    }

    /// `PUT /v1/faults` on the sandbox.
    async fn set_provider_faults(&self, knobs: &serde_json::Value) -> anyhow::Result<()> {
        let addr = self.fleet.paysim_addr().ok_or_else(|| anyhow::anyhow!("the fleet runs no sandbox"))?;
        let put = hyper::Method::PUT;
        let (status, answer) =
            testkit::http::send_json(put, addr, "/v1/faults", knobs, None, PROVIDER_CALL_MAX).await?;
        anyhow::ensure!(status == 200, "answered {status}: {answer}");
        Ok(())
    }

    /// Waits until every old master restarted after a failover is the new master's synced
    /// replica, and ends its fault's window then: until that moment the promoted master has no
    /// replica, so with `durability = "replica"` it confirms no sale (and under Sentinel, with
    /// `min-replicas-to-write 1`, takes no writes): Redis was not whole.
    async fn finish_rejoins(&mut self) {
        for (id, port) in std::mem::take(&mut self.rejoining) {
            match self.fleet.rejoin_redis(port, REJOIN_MAX).await {
                Ok(()) => self.history.event(id, format!("port {port} is a synced replica of the master")),
                Err(e) => self.history.event(id, format!("rejoin of port {port} failed: {e:#}")),
            }
            let now = self.history.clock().now_ms();
            if let Some(window) = self.windows.iter_mut().find(|w| Some(w.id) == id) {
                window.end_ms = Some(now);
            }
        }
    }

    /// The data node on `port`.
    fn redis_on(&mut self, port: u16) -> anyhow::Result<&mut testkit::redis::RedisServer> {
        self.fleet.redis_on(port).ok_or_else(|| anyhow::anyhow!("no redis on port {port}"))
    }

    /// One step of a member's replacement on the leader, `PUT /admin/members/{member}`; the
    /// outcome goes into the timeline.
    async fn change_member(&self, id: Option<usize>, member: &str, op: &str) {
        let body = serde_json::json!({ "op": op });
        let path = format!("/admin/members/{member}");
        let mut last = String::from("no leader");
        for _ in 0..MEMBER_CHANGE_TRIES {
            let leader = self.fleet.leader().await.filter(|l| l != member);
            if let Some(addr) = leader.as_deref().and_then(|l| self.fleet.addr(l).ok()) {
                let put = hyper::Method::PUT;
                match testkit::http::send_json(put, addr, &path, &body, Some(ADMIN_TOKEN), MEMBER_CHANGE_MAX).await {
                    Ok((200, answer)) => {
                        self.history.event(id, format!("{op} {member}: membership {}", answer["membership"]));
                        return;
                    }
                    Ok((status, answer)) => last = format!("{leader:?} answered {status}: {answer}"),
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        self.history.event(id, format!("{op} {member} failed: {last}"));
    }

    /// The proxies a link fault of `node` toward `to` switches; the leader's is resolved now.
    async fn proxies(&self, node: &str, to: LinkTarget) -> Vec<ProxyHandle> {
        let Some(links) = self.fleet.links(node) else { return Vec::new() };
        match to {
            LinkTarget::Redis => links.redis.iter().map(|p| p.handle()).collect(),
            LinkTarget::Coordinator => links.members.values().map(|p| p.handle()).collect(),
            LinkTarget::Leader => match self.fleet.leader().await {
                Some(leader) => links.members.get(&leader).map(|p| vec![p.handle()]).unwrap_or_default(),
                None => Vec::new(),
            },
        }
    }
}
