//! Applies a Compose fleet schedule's steps and undoes them, at the container and network
//! level: `docker kill`, `pause`, `network disconnect`, a container replaced by a fresh one, the
//! fleet scaled or rolled. Every step goes into the timeline and opens a window (the checker's
//! view of the faults), resolved to the containers it hit: nodes by their ids, the leader by
//! its name.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use testkit::compose::{ComposeFleet, Container};

use super::plan::Step;
use crate::faults::Window;
use crate::history::History;
use crate::monitor::NodeList;
use crate::schedule::FaultKind;

/// Longest a replaced, restarted or added container may take to report healthy.
const HEALTHY_MAX: Duration = Duration::from_secs(90);

/// Longest the sentinels may take to promote a replica after the master's container died:
/// their down-after (5 s) plus an election and the promotion.
const PROMOTION_MAX: Duration = Duration::from_secs(30);

/// Longest a node added to the fleet may wait for its first grant once it is ready (issue 34:
/// within a control tick; this bound is the test's, with a heartbeat and a loaded machine).
pub const GRANT_AFTER_READY_MAX: Duration = Duration::from_secs(2);

/// What a started step changed, so its end undoes exactly that.
enum Applied {
    Killed(Vec<Container>),
    Paused(Container),
    Disconnected(Container),
    /// A member cut off, and whether it was killed since.
    LeaderCut {
        member: Container,
        killed: bool,
    },
    /// The Redis master's container killed, and the address it had.
    RedisKilled {
        container: Container,
        ip: IpAddr,
    },
    Provider(serde_json::Value),
    /// Done at its start (a replacement, a scale, a roll, a restart).
    Done,
}

/// A node added mid-sale: how long after it was ready it first held stock.
#[derive(Clone, Debug, serde::Serialize)]
pub struct JoinerGrant {
    pub node: String,
    /// None: no grant within the bound.
    pub granted_after_ready_ms: Option<u64>,
}

pub struct DockerInjector<'a> {
    fleet: &'a ComposeFleet,
    history: History,
    nodes: NodeList,
    /// Every node that sold in the schedule, for the checker.
    pub seen: BTreeSet<String>,
    sku: String,
    windows: Vec<Window>,
    applied: Vec<(usize, Applied)>,
    pub joiners: Vec<JoinerGrant>,
}

impl<'a> DockerInjector<'a> {
    pub fn new(fleet: &'a ComposeFleet, history: History, nodes: NodeList, sku: &str) -> anyhow::Result<Self> {
        let mut injector = DockerInjector {
            fleet,
            history,
            nodes,
            seen: BTreeSet::new(),
            sku: sku.to_string(),
            windows: Vec::new(),
            applied: Vec::new(),
            joiners: Vec::new(),
        };
        injector.refresh_nodes()?;
        Ok(injector)
    }

    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// Tells the monitor which nodes run now.
    pub fn refresh_nodes(&mut self) -> anyhow::Result<()> {
        let nodes = self.fleet.node_addrs()?;
        self.seen.extend(nodes.iter().map(|(name, _)| name.clone()));
        self.nodes.set(nodes);
        Ok(())
    }

    fn now_ms(&self) -> u64 {
        self.history.clock().now_ms()
    }

    fn open(&mut self, step: &Step, kind: FaultKind, member: Option<String>) -> usize {
        let label = kind.label(self.seen.len());
        self.windows.push(Window {
            id: step.id,
            label,
            kind,
            member,
            start_ms: self.now_ms(),
            end_ms: None,
            skipped: false,
        });
        self.windows.len() - 1
    }

    fn close(&mut self, window: usize) {
        let now = self.now_ms();
        if let Some(window) = self.windows.get_mut(window) {
            window.end_ms.get_or_insert(now);
        }
    }

    /// Notes a step that found no target when it was due: a skipped window, nothing done.
    fn skip(&mut self, step: &Step, why: String) -> anyhow::Result<()> {
        self.history.event(Some(step.id), format!("skipped: {why}"));
        let at = self.open(step, step.kind.clone(), None);
        self.windows[at].skipped = true;
        self.close(at);
        Ok(())
    }

    /// The running node a step's `n<i>` names: the i-th of the nodes as the fleet lists them
    /// now (wrapping), none if no node runs.
    fn node(&self, name: &str) -> anyhow::Result<Option<Container>> {
        let running: Vec<Container> = self.fleet.containers("node")?.into_iter().filter(|c| c.running).collect();
        let at: usize = name.trim_start_matches('n').parse().unwrap_or(0);
        Ok((!running.is_empty()).then(|| running[at % running.len()].clone()))
    }

    /// Starts `step`. An error means the fleet could not be driven, not that a fault was refused.
    #[expect(clippy::too_many_lines, reason = "one short arm per fault kind; split, the kinds would be matched twice")]
    pub async fn start(&mut self, step: &Step) -> anyhow::Result<()> {
        let id = Some(step.id);
        let applied = match &step.kind {
            FaultKind::KillNodes { nodes } => {
                let mut killed = Vec::new();
                for name in nodes {
                    if let Some(node) = self.node(name)? {
                        self.fleet.kill(&node)?;
                        killed.push(node);
                    }
                }
                let ids: Vec<String> = killed.iter().map(|c| c.hostname.clone()).collect();
                self.history.event(id, format!("docker kill node {}", ids.join(", ")));
                self.open(step, FaultKind::KillNodes { nodes: ids }, None);
                Applied::Killed(killed)
            }
            FaultKind::PauseNode { node } => {
                let Some(node) = self.node(node)? else { return self.skip(step, "no node runs".into()) };
                self.fleet.pause(&node)?;
                self.history.event(id, format!("docker pause node {}", node.hostname));
                self.open(step, FaultKind::PauseNode { node: node.hostname.clone() }, None);
                Applied::Paused(node)
            }
            FaultKind::DisconnectNode { node } => {
                let Some(node) = self.node(node)? else { return self.skip(step, "no node runs".into()) };
                self.fleet.disconnect(&node)?;
                self.history.event(id, format!("docker network disconnect node {}", node.hostname));
                self.open(step, FaultKind::DisconnectNode { node: node.hostname.clone() }, None);
                Applied::Disconnected(node)
            }
            FaultKind::ReplaceNode { node } => {
                let Some(node) = self.node(node)? else { return self.skip(step, "no node runs".into()) };
                let window = self.open(step, FaultKind::ReplaceNode { node: node.hostname.clone() }, None);
                self.replace_node(id, &node)?;
                self.close(window);
                Applied::Done
            }
            FaultKind::KillLeader => {
                let Some(leader) = self.leader().await? else { return self.skip(step, "no leader known".into()) };
                self.fleet.kill(&leader)?;
                self.history.event(id, format!("docker kill leader {}", leader.hostname));
                self.open(step, FaultKind::KillLeader, Some(leader.hostname.clone()));
                Applied::Killed(vec![leader])
            }
            FaultKind::DisconnectLeader { kill_after_ms } => {
                let Some(leader) = self.leader().await? else { return self.skip(step, "no leader known".into()) };
                self.fleet.disconnect(&leader)?;
                self.history.event(id, format!("docker network disconnect leader {}", leader.hostname));
                self.open(step, step.kind.clone(), Some(leader.hostname.clone()));
                let mut killed = false;
                if let Some(after) = kill_after_ms {
                    tokio::time::sleep(Duration::from_millis(*after)).await;
                    self.fleet.kill(&leader)?;
                    self.history.event(id, format!("docker kill the cut-off leader {}", leader.hostname));
                    killed = true;
                }
                Applied::LeaderCut { member: leader, killed }
            }
            FaultKind::RedisFailover => {
                let Some((container, ip)) = self.redis_master()? else {
                    return self.skip(step, "no sentinel named a master".into());
                };
                self.fleet.kill(&container)?;
                self.history.event(id, format!("docker kill the redis master {} ({ip})", container.hostname));
                self.open(step, FaultKind::RedisFailover, None);
                Applied::RedisKilled { container, ip }
            }
            FaultKind::KillOrders { name } => {
                let orders = self.fleet.container(name)?;
                self.fleet.kill(&orders)?;
                self.history.event(id, format!("docker kill {name}"));
                self.open(step, step.kind.clone(), None);
                Applied::Killed(vec![orders])
            }
            FaultKind::RestartPostgres => {
                let window = self.open(step, FaultKind::RestartPostgres, None);
                let postgres = self.fleet.container("postgres")?;
                self.fleet.stop(&postgres)?;
                self.fleet.start(&postgres)?;
                self.history.event(id, "docker restart postgres");
                self.fleet.wait_healthy("postgres", HEALTHY_MAX)?;
                self.close(window);
                Applied::Done
            }
            FaultKind::ScaleNodes { to } => {
                let window = self.open(step, step.kind.clone(), None);
                self.scale_to(id, *to).await?;
                self.close(window);
                Applied::Done
            }
            FaultKind::RollFleet => {
                self.roll(step).await?;
                Applied::Done
            }
            FaultKind::Provider { fault } => {
                let (on, off) = fault.knobs();
                let paysim = self.fleet.paysim_addr()?;
                let put = hyper::Method::PUT;
                match testkit::http::send_json(put, paysim, "/v1/faults", &on, None, Duration::from_secs(2)).await {
                    Ok((200, _)) => self.history.event(id, format!("sandbox faults: {on}")),
                    other => return self.skip(step, format!("the sandbox did not take {on}: {other:?}")),
                }
                self.open(step, step.kind.clone(), None);
                Applied::Provider(off)
            }
            other => return self.skip(step, format!("{other:?} is not a container fleet's fault")),
        };
        self.applied.push((step.id, applied));
        self.refresh_nodes()
    }

    /// Undoes step `id`, if still in effect.
    pub async fn end(&mut self, id: usize) -> anyhow::Result<()> {
        let Some(at) = self.applied.iter().position(|(applied, _)| *applied == id) else { return Ok(()) };
        let (_, applied) = self.applied.remove(at);
        let event = Some(id);
        match applied {
            Applied::Killed(containers) => {
                for container in &containers {
                    self.fleet.start(container)?;
                }
                let names: Vec<&str> = containers.iter().map(|c| c.hostname.as_str()).collect();
                self.history.event(event, format!("docker start {}", names.join(", ")));
            }
            Applied::Paused(container) => {
                self.fleet.unpause(&container)?;
                self.history.event(event, format!("docker unpause {}", container.hostname));
            }
            Applied::Disconnected(container) => {
                self.fleet.connect(&container, None)?;
                self.history.event(event, format!("docker network connect {}", container.hostname));
            }
            Applied::LeaderCut { member, killed } => {
                self.fleet.connect(&member, None)?;
                if killed {
                    self.fleet.start(&member)?;
                }
                self.history.event(event, format!("docker network connect {} (started: {killed})", member.hostname));
            }
            Applied::RedisKilled { container, ip } => {
                let promoted = self.wait_promotion(ip).await;
                self.history.event(event, format!("sentinels promoted another master: {promoted}"));
                self.fleet.start(&container)?;
                self.history.event(event, format!("docker start the old master {}", container.hostname));
            }
            Applied::Provider(off) => {
                let paysim = self.fleet.paysim_addr()?;
                let put = hyper::Method::PUT;
                let reset =
                    testkit::http::send_json(put, paysim, "/v1/faults", &off, None, Duration::from_secs(2)).await;
                self.history.event(event, format!("sandbox faults off: {}", reset.is_ok()));
            }
            Applied::Done => {}
        }
        for window in self.windows.iter_mut().filter(|w| w.id == id && w.end_ms.is_none()) {
            window.end_ms = Some(self.history.clock().now_ms());
        }
        self.refresh_nodes()
    }

    /// Undoes every step still in effect, then waits until every container of the fleet runs
    /// and reports healthy again.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        let ids: Vec<usize> = self.applied.iter().map(|(id, _)| *id).collect();
        for id in ids {
            self.end(id).await?;
        }
        let deadline = Instant::now() + HEALTHY_MAX;
        loop {
            let ids = self.fleet.compose(&["ps", "-q"])?;
            let mut sick = Vec::new();
            for id in ids.split_whitespace() {
                let container = self.fleet.inspect(id)?;
                if !container.running || container.health != "healthy" && container.health != "none" {
                    sick.push(format!("{} ({})", container.name, container.health));
                }
            }
            if sick.is_empty() {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the fleet is not whole {HEALTHY_MAX:?} after the heal: {sick:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.history.event(None, "every container runs and is healthy");
        self.refresh_nodes()
    }

    /// A node's container stopped (it drains and hands its lease back), removed, and a fresh
    /// one started in its place; waits until the new one is healthy.
    fn replace_node(&mut self, id: Option<usize>, node: &Container) -> anyhow::Result<()> {
        let running: Vec<Container> = self.fleet.containers("node")?.into_iter().filter(|c| c.running).collect();
        let known: BTreeSet<String> = running.iter().map(|c| c.id.clone()).collect();
        self.fleet.stop(node)?;
        self.fleet.remove(node)?;
        let scale = format!("node={}", running.len());
        self.fleet.compose(&["up", "-d", "--no-deps", "--no-recreate", "--scale", &scale, "node"])?;
        // The fresh one only: a node another step paused stays unhealthy until that step ends.
        self.fleet.wait_new_healthy("node", &known, HEALTHY_MAX)?;
        self.history.event(id, format!("node {} replaced by a fresh container", node.hostname));
        self.refresh_nodes()
    }

    /// Every node, then every member, replaced one at a time, each waited for until healthy;
    /// a window per container.
    async fn roll(&mut self, step: &Step) -> anyhow::Result<()> {
        let id = Some(step.id);
        let nodes: Vec<Container> = self.fleet.containers("node")?.into_iter().filter(|c| c.running).collect();
        for node in &nodes {
            let window = self.open(step, FaultKind::ReplaceNode { node: node.hostname.clone() }, None);
            self.replace_node(id, node)?;
            self.close(window);
        }
        for member in ["c1", "c2", "c3"] {
            let window = self.open(step, FaultKind::RollFleet, Some(member.to_string()));
            self.fleet.recreate(member)?;
            self.fleet.wait_healthy(member, HEALTHY_MAX)?;
            self.history.event(id, format!("member {member} replaced by a fresh container"));
            self.close(window);
        }
        Ok(())
    }

    /// Scales the nodes to `to` (`docker compose up --scale node=N`, what `deploy/up
    /// --scale-nodes` runs), and watches each new node, all at once, from ready to its first
    /// grant.
    async fn scale_to(&mut self, id: Option<usize>, to: usize) -> anyhow::Result<()> {
        let before: BTreeSet<String> = self.fleet.node_addrs()?.into_iter().map(|(name, _)| name).collect();
        let known: BTreeSet<String> = self.fleet.containers("node")?.into_iter().map(|c| c.id).collect();
        let scale = format!("node={to}");
        self.fleet.compose(&["up", "-d", "--no-deps", "--no-recreate", "--scale", &scale, "node"])?;
        self.refresh_nodes()?;
        let joined: Vec<(String, std::net::SocketAddr)> =
            self.fleet.node_addrs()?.into_iter().filter(|(name, _)| !before.contains(name)).collect();
        self.history.event(id, format!("scaled to {to} nodes; {} joined", joined.len()));
        let mut watching = tokio::task::JoinSet::new();
        for (node, addr) in joined {
            let sku = self.sku.clone();
            watching.spawn(async move { (node, grant_after_ready(addr, &sku).await) });
        }
        while let Some(Ok((node, granted))) = watching.join_next().await {
            self.history.event(id, format!("node {node} held stock {granted:?} ms after it was ready"));
            self.joiners.push(JoinerGrant { node, granted_after_ready_ms: granted });
        }
        if known.len() < to {
            self.fleet.wait_new_healthy("node", &known, HEALTHY_MAX)?;
        }
        Ok(())
    }

    /// The member that says it leads, in the newest term.
    async fn leader(&self) -> anyhow::Result<Option<Container>> {
        let token = self.fleet.secret("cluster_token")?;
        let mut best: Option<(u64, String)> = None;
        for (name, addr) in self.fleet.member_addrs()? {
            let status =
                testkit::http::get_json_with(addr, "/api/state", Some(&token), Duration::from_millis(500)).await.ok();
            let Some(status) = status else { continue };
            let leads = status["leader"].is_u64() && status["leader"] == status["id"];
            let term = status["term"].as_u64().unwrap_or(0);
            if leads && best.as_ref().is_none_or(|(newest, _)| term > *newest) {
                best = Some((term, name));
            }
        }
        best.map(|(_, name)| self.fleet.container(&name)).transpose()
    }

    /// The master the sentinels name, and its container.
    fn redis_master(&self) -> anyhow::Result<Option<(Container, IpAddr)>> {
        let Some(ip) = self.fleet.redis_master_ip() else { return Ok(None) };
        for name in ["redis-1", "redis-2", "redis-3"] {
            let container = self.fleet.container(name)?;
            if container.ip == Some(ip) {
                return Ok(Some((container, ip)));
            }
        }
        Ok(None)
    }

    /// Waits until the sentinels name a master other than `old`.
    async fn wait_promotion(&self, old: IpAddr) -> bool {
        let deadline = Instant::now() + PROMOTION_MAX;
        while Instant::now() < deadline {
            if self.fleet.redis_master_ip().is_some_and(|ip| ip != old) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }
}

/// From the node answering `/ready` to its stock page showing units of `sku` held (none past
/// [`GRANT_AFTER_READY_MAX`] and a margin).
async fn grant_after_ready(addr: std::net::SocketAddr, sku: &str) -> Option<u64> {
    let probe = Duration::from_millis(500);
    let deadline = Instant::now() + HEALTHY_MAX;
    while testkit::http::get(addr, "/ready", probe).await.map(|(status, _)| status).ok() != Some(200) {
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready = Instant::now();
    let path = format!("/v1/skus/{sku}");
    while ready.elapsed() < GRANT_AFTER_READY_MAX * 3 {
        let page = testkit::http::get_json(addr, &path, probe).await.ok();
        if page.and_then(|p| p["local_remaining"].as_u64()).is_some_and(|units| units > 0) {
            return Some(ready.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
