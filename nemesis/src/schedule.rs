//! Fault schedules drawn from a seed: which faults, on what, from when to when. The same seed
//! and fleet shape always draw the same schedule, so `--seed` replays it; only what cannot be
//! known in advance (which member leads when a fault starts) is resolved at run time.
//!
//! A schedule holds one to [`FAULTS_MAX`] faults inside its fault phase, and may overlap them,
//! except on one target: a node's process, a node's link to Redis, a node's links to the
//! coordinator, Redis, and one member each take one fault at a time (a second fault there would
//! undo the first when it ends). Member wipes also come one at a time: a three-member group
//! survives one lost disk, not two at once.
//!
//! **Replicated Redis.** When the fleet's ledger is a Sentinel group (`--sentinel`) or a Redis
//! Cluster with replicas (`--redis-cluster`), a Redis kill is a failover instead
//! ([`FaultKind::RedisFailover`]), a Redis pause freezes the master that takes the SKU's
//! writes, and a node's link faults go to the coordinator only: a node reaches whichever
//! server the sentinels or the slot map name, past any proxy. The swap happens after each
//! draw, so a seed's replicated schedule resembles its plain one (a swapped link fault may
//! however now collide with another fault on the same target, and the schedule then differs).
//!
//! **Order faults** (the order service's processes and its PostgreSQL) are drawn apart, from a
//! second generator seeded from the same seed, and added to the fleet's faults: a seed draws the
//! same fleet faults as before they existed, so a seed noted in an older report still replays
//! its fleet faults. About [`ORDER_FAULT_PERCENT`] % of schedules get one, on its own target
//! (an order process, or PostgreSQL).
//!
//! **Provider faults** (the sandbox payment provider's knobs, `PUT /v1/faults`) come from a
//! fourth generator, the same way: about [`PROVIDER_FAULT_PERCENT`] % of schedules get one.
//!
//! **Setups** ([`Setup`]) change the fleet rather than break it for a while: a second SKU
//! created at run time through the admin API, a short idempotency TTL with buyers reusing keys
//! after it, the order services' wall clocks skewed. They come from a third generator, so a
//! seed's fleet and order faults stay what they were before setups existed.

use serde::Serialize;
use testkit::fleet::RedisLayout;
use testkit::proxy::{Direction, Fault as LinkState};

/// Most fleet faults in one schedule (an order fault may come on top).
pub const FAULTS_MAX: usize = 3;

/// Share of schedules (with an order service) that get an order fault.
pub const ORDER_FAULT_PERCENT: u32 = 40;

/// Mixed into the seed for the order faults' generator (see the module docs).
const ORDER_SALT: u64 = 0x6f72_6465_7273_0001;

/// Mixed into the seed for the provider faults' generator (see the module docs).
const PAYMENT_SALT: u64 = 0x7061_796d_656e_0001;

/// Share of schedules (with an order service, which takes payments) that get a provider fault.
pub const PROVIDER_FAULT_PERCENT: u32 = 50;

/// Mixed into the seed for the setups' generator (see the module docs).
const SETUP_SALT: u64 = 0x7365_7475_7073_0001;

/// Share of schedules that create a second SKU at run time.
pub const RUNTIME_SKU_PERCENT: u32 = 35;

/// Share of schedules that run a short idempotency TTL with keys reused after it.
pub const SHORT_TTL_PERCENT: u32 = 30;

/// Share of schedules (with an order service) whose order services run on skewed clocks.
pub const CLOCK_SKEW_PERCENT: u32 = 30;

/// Short idempotency TTLs drawn, in seconds. Each exceeds a key's patience plus two request
/// timeouts (the run shortens the patience to fit, see `run`), so every retry of one use of a
/// key meets the record its first sale wrote, and only a deliberate reuse comes after it; and
/// each is short enough that keys decided early in the fault phase are reused before the sale
/// ends.
pub const SHORT_TTLS_S: [u64; 2] = [12, 15];

/// Largest skew of an order service's wall clock, in seconds: under the fleet's pay timeout
/// (10 s), so an order never looks expired before it is stored, and small enough that a clock
/// behind still expires the last orders within the run's settle bound. Far inside `[orders]
/// callback_window_s` (300 s), so signed callbacks still verify.
pub const CLOCK_SKEW_MAX_S: i64 = 8;

/// No fault starts before this: the sale must be under way, with every node selling.
const FIRST_FAULT_MS: u64 = 1_000;

/// Draws of a fault that keep hitting a busy target before the schedule settles for fewer.
const DRAWS_MAX: usize = 20;

/// Lease timings the schedule needs to make a pause outlast a lease.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTimings {
    pub lease_ms: u64,
    pub grace_ms: u64,
}

/// What a link fault does; the proxy's states, minus `Pass`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum LinkFault {
    Drop,
    Delay {
        ms: u64,
    },
    Blackhole,
    /// Only `flows` still carries bytes.
    OneWay {
        flows: Direction,
    },
}

impl LinkFault {
    pub fn state(self) -> LinkState {
        match self {
            LinkFault::Drop => LinkState::Drop,
            LinkFault::Delay { ms } => LinkState::Delay(std::time::Duration::from_millis(ms)),
            LinkFault::Blackhole => LinkState::Blackhole,
            LinkFault::OneWay { flows } => LinkState::OneWay(flows),
        }
    }

    fn name(self) -> &'static str {
        match self {
            LinkFault::Drop => "drop",
            LinkFault::Delay { .. } => "delay",
            LinkFault::Blackhole => "blackhole",
            LinkFault::OneWay { flows: Direction::ToServer } => "one_way_requests_only",
            LinkFault::OneWay { flows: Direction::ToClient } => "one_way_answers_only",
        }
    }
}

/// What the sandbox payment provider does wrong while a provider fault lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderFault {
    /// Half its answers to create, query and refund are 503 (nothing done).
    Unavailable,
    /// Half the payment notifications are never sent: only the query job finds them.
    DropCallbacks,
    /// Half the notifications are delivered twice.
    DuplicateCallbacks,
    /// Every notification waits 3 s before its first attempt.
    DelayCallbacks,
}

impl ProviderFault {
    /// The knob's setting while the fault lasts, and at its end (`PUT /v1/faults` bodies).
    pub fn knobs(self) -> (serde_json::Value, serde_json::Value) {
        let (knob, on): (&str, serde_json::Value) = match self {
            ProviderFault::Unavailable => ("unavailable_p", 0.5.into()),
            ProviderFault::DropCallbacks => ("drop_p", 0.5.into()),
            ProviderFault::DuplicateCallbacks => ("duplicate_p", 0.5.into()),
            ProviderFault::DelayCallbacks => ("callback_delay_ms", 3_000.into()),
        };
        let off: serde_json::Value = if knob == "callback_delay_ms" { 0.into() } else { 0.0.into() };
        (serde_json::json!({ knob: on }), serde_json::json!({ knob: off }))
    }

    fn name(self) -> &'static str {
        match self {
            ProviderFault::Unavailable => "provider_unavailable",
            ProviderFault::DropCallbacks => "callbacks_dropped",
            ProviderFault::DuplicateCallbacks => "callbacks_duplicated",
            ProviderFault::DelayCallbacks => "callbacks_delayed",
        }
    }
}

/// Where a node's link fault applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkTarget {
    Redis,
    /// Every member.
    Coordinator,
    /// The member leading when the fault starts.
    Leader,
}

/// One fault; it starts at its start time and is undone at its end (or at the heal).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL, then a restart at the end.
    KillNodes {
        nodes: Vec<String>,
    },
    /// SIGSTOP for longer than a lease plus grace, then SIGCONT.
    PauseNode {
        node: String,
    },
    /// SIGKILL of whichever member leads, then a restart.
    KillLeader,
    /// The member is killed and its raft directory deleted; it restarts empty at the end.
    WipeMember {
        member: String,
    },
    PauseRedis,
    /// SIGKILL, then a restart on the same port and directory (the AOF brings the data back).
    KillRedis,
    /// On replicated Redis: SIGKILL of the master that takes the SKU's writes; at the end, once
    /// its replica is promoted, the old master restarts from its AOF and turns into the new
    /// master's replica (the next failover and the heal wait until it is in sync).
    RedisFailover,
    Link {
        node: String,
        to: LinkTarget,
        fault: LinkFault,
    },
    /// SIGKILL of an order service (consumer and sweeper), then a restart at the end.
    KillOrders {
        name: String,
    },
    /// SIGSTOP of an order service past its sweeper's lock, then SIGCONT: a consumer whose
    /// entries the other claims, a sweeper that wakes up holding a lapsed lock.
    PauseOrders {
        name: String,
    },
    /// Fast shutdown of the order store, then a restart: the streams buffer the sales.
    StopPostgres,
    /// One of the sandbox payment provider's fault knobs turned on, then off.
    Provider {
        fault: ProviderFault,
    },
    /// SIGKILL of the order store and its backends, then a restart with crash recovery.
    KillPostgres,
    /// A container fleet's: the node's container cut off from the network (a partitioned
    /// host), then connected again; it comes back under a new epoch.
    DisconnectNode {
        node: String,
    },
    /// A container fleet's: the leading member's container cut off from the network, then
    /// (after `kill_after_ms`, if set) killed while cut off; connected and started at the end.
    DisconnectLeader {
        kill_after_ms: Option<u64>,
    },
    /// A container fleet's: the node's container stopped (it drains and hands its lease back)
    /// and removed, and a fresh container started in its place, under a new id.
    ReplaceNode {
        node: String,
    },
    /// A container fleet's: every node, then every member, replaced one at a time by a fresh
    /// container (a rolling upgrade), each waited for until healthy.
    RollFleet,
    /// A container fleet's: the node count changed to `to` (nodes join, or leave gracefully).
    ScaleNodes {
        to: usize,
    },
    /// A container fleet's: the order store's container restarted (fast shutdown, start).
    RestartPostgres,
}

impl FaultKind {
    /// A stable name for counting faults by kind.
    pub fn label(&self, nodes: usize) -> String {
        match self {
            FaultKind::KillNodes { nodes: killed } if killed.len() == 1 => "kill_one_node".into(),
            FaultKind::KillNodes { nodes: killed } if killed.len() + 1 == nodes => "kill_all_but_one_node".into(),
            FaultKind::KillNodes { nodes: killed } => format!("kill_{}_nodes", killed.len()),
            FaultKind::PauseNode { .. } => "pause_node_past_lease".into(),
            FaultKind::KillLeader => "kill_leader".into(),
            FaultKind::WipeMember { .. } => "wipe_member".into(),
            FaultKind::PauseRedis => "pause_redis".into(),
            FaultKind::KillRedis => "kill_redis".into(),
            FaultKind::RedisFailover => "redis_failover".into(),
            FaultKind::Link { to, fault, .. } => {
                let to = match to {
                    LinkTarget::Redis => "redis",
                    LinkTarget::Coordinator => "coordinator",
                    LinkTarget::Leader => "leader",
                };
                format!("link_to_{to}_{}", fault.name())
            }
            FaultKind::KillOrders { .. } => "kill_orders".into(),
            FaultKind::PauseOrders { .. } => "pause_orders".into(),
            FaultKind::StopPostgres => "stop_postgres".into(),
            FaultKind::KillPostgres => "kill_postgres".into(),
            FaultKind::Provider { fault } => fault.name().into(),
            FaultKind::DisconnectNode { .. } => "disconnect_node".into(),
            FaultKind::DisconnectLeader { kill_after_ms: None } => "disconnect_leader".into(),
            FaultKind::DisconnectLeader { kill_after_ms: Some(_) } => "disconnect_then_kill_leader".into(),
            FaultKind::ReplaceNode { .. } => "replace_node".into(),
            FaultKind::RollFleet => "roll_fleet".into(),
            FaultKind::ScaleNodes { to } => format!("scale_nodes_to_{to}"),
            FaultKind::RestartPostgres => "restart_postgres".into(),
        }
    }

    /// The targets it occupies while it lasts (see the module docs).
    fn targets(&self, members: usize) -> Vec<String> {
        match self {
            FaultKind::KillNodes { nodes } => nodes.iter().map(|n| format!("process:{n}")).collect(),
            FaultKind::PauseNode { node } => vec![format!("process:{node}")],
            // Any member may lead: the leader's kill keeps every member busy.
            FaultKind::KillLeader => (1..=members).map(|m| format!("member:c{m}")).collect(),
            // A three-member group survives one lost disk at a time: two wipes overlapping
            // leave no quorum to replace either from (beyond what raft promises), so a wipe
            // also occupies the group's membership.
            FaultKind::WipeMember { member } => vec![format!("member:{member}"), "membership".into()],
            FaultKind::PauseRedis | FaultKind::KillRedis | FaultKind::RedisFailover => vec!["redis".into()],
            FaultKind::Link { node, to: LinkTarget::Redis, .. } => vec![format!("redis-link:{node}")],
            FaultKind::Link { node, .. } => vec![format!("coordinator-links:{node}")],
            FaultKind::KillOrders { name } | FaultKind::PauseOrders { name } => vec![format!("process:{name}")],
            FaultKind::StopPostgres | FaultKind::KillPostgres | FaultKind::RestartPostgres => {
                vec!["postgres".into()]
            }
            FaultKind::Provider { .. } => vec!["paysim".into()],
            FaultKind::DisconnectNode { node } | FaultKind::ReplaceNode { node } => vec![format!("process:{node}")],
            FaultKind::DisconnectLeader { .. } => (1..=members).map(|m| format!("member:c{m}")).collect(),
            // Every container comes and goes: nothing else may run beside it, nor a scale.
            FaultKind::RollFleet | FaultKind::ScaleNodes { .. } => vec!["fleet".into()],
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PlannedFault {
    pub id: usize,
    pub kind: FaultKind,
    pub start_ms: u64,
    pub end_ms: u64,
}

/// What one schedule does.
#[derive(Clone, Debug, Serialize)]
pub struct Schedule {
    pub seed: u64,
    /// Every fault has ended (or is healed) by this time.
    pub fault_phase_ms: u64,
    /// Purchase attempts per second while faults run: drawn, so some schedules sell out during
    /// the faults and some still have most of the stock at the heal.
    pub demand_per_s: u64,
    pub faults: Vec<PlannedFault>,
    pub setup: Setup,
}

/// How the fleet itself differs in this schedule (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Setup {
    /// When a second SKU is created through the admin API, in ms on the schedule's clock.
    pub runtime_sku_at_ms: Option<u64>,
    /// `[ledger] idempotency_ttl_s`, when short; buyers then reuse some keys after it.
    pub idempotency_ttl_s: Option<u64>,
    /// Each order service's wall-clock skew in seconds (`o1` first); empty: none skewed.
    pub orders_clock_skew_s: Vec<i64>,
}

impl Setup {
    /// Draws the setup of `seed` for a fleet of `orders` order services, `phase_ms` of faults.
    pub fn draw(seed: u64, orders: usize, phase_ms: u64) -> Setup {
        let mut rng = fastrand::Rng::with_seed(seed ^ SETUP_SALT);
        let runtime_sku = rng.u32(0..100) < RUNTIME_SKU_PERCENT;
        // Early in the phase, so the new SKU sells under the faults still to come.
        let at_ms = rng.u64(FIRST_FAULT_MS..=(phase_ms / 2).max(FIRST_FAULT_MS));
        let short_ttl = rng.u32(0..100) < SHORT_TTL_PERCENT;
        let ttl_s = SHORT_TTLS_S[rng.usize(0..SHORT_TTLS_S.len())];
        let skewed = orders > 0 && rng.u32(0..100) < CLOCK_SKEW_PERCENT;
        // Ahead or behind, one process each way at times: two sweepers that disagree on when
        // a deadline passes.
        let skews: Vec<i64> = (0..orders).map(|_| rng.i64(-CLOCK_SKEW_MAX_S..=CLOCK_SKEW_MAX_S)).collect();
        Setup {
            runtime_sku_at_ms: runtime_sku.then_some(at_ms),
            idempotency_ttl_s: short_ttl.then_some(ttl_s),
            orders_clock_skew_s: if skewed { skews } else { Vec::new() },
        }
    }

    /// Names for the report: `runtime_sku`, `idempotency_ttl_12s`, `orders_clock_skew`.
    pub fn labels(&self) -> Vec<String> {
        let mut labels = Vec::new();
        if let Some(at) = self.runtime_sku_at_ms {
            labels.push(format!("runtime_sku@{at}ms"));
        }
        if let Some(ttl) = self.idempotency_ttl_s {
            labels.push(format!("idempotency_ttl_{ttl}s"));
        }
        if !self.orders_clock_skew_s.is_empty() {
            let skews: Vec<String> =
                self.orders_clock_skew_s.iter().enumerate().map(|(at, s)| format!("o{}{s:+}s", at + 1)).collect();
            labels.push(format!("orders_clock_skew({})", skews.join(" ")));
        }
        labels
    }
}

impl Schedule {
    /// Draws the schedule of `seed` for a fleet of `nodes` nodes, `members` members and
    /// `orders` order services (0: no order faults), its ledger on `redis`.
    pub fn draw(
        seed: u64,
        nodes: usize,
        members: usize,
        orders: usize,
        redis: RedisLayout,
        fault_phase_ms: u64,
        timings: LeaseTimings,
    ) -> Schedule {
        let mut rng = fastrand::Rng::with_seed(seed);
        let count = match rng.u32(0..10) {
            0..=3 => 1,
            4..=7 => 2,
            _ => FAULTS_MAX,
        };
        let demand_per_s = rng.u64(8..=24);
        let mut faults: Vec<PlannedFault> = Vec::new();
        for _ in 0..DRAWS_MAX {
            if faults.len() == count {
                break;
            }
            let mut kind = draw_kind(&mut rng, nodes, members);
            if redis.replicated() {
                kind = on_replicated_redis(kind);
            }
            let (start_ms, end_ms) = draw_window(&mut rng, &kind, fault_phase_ms, timings);
            let busy = faults.iter().any(|other| {
                other.start_ms < end_ms
                    && start_ms < other.end_ms
                    && other.kind.targets(members).iter().any(|t| kind.targets(members).contains(t))
            });
            if !busy {
                faults.push(PlannedFault { id: faults.len(), kind, start_ms, end_ms });
            }
        }
        if orders > 0 {
            let mut rng = fastrand::Rng::with_seed(seed ^ ORDER_SALT);
            if rng.u32(0..100) < ORDER_FAULT_PERCENT {
                let kind = draw_order_kind(&mut rng, orders);
                let (start_ms, end_ms) = draw_window(&mut rng, &kind, fault_phase_ms, timings);
                faults.push(PlannedFault { id: faults.len(), kind, start_ms, end_ms });
            }
        }
        if orders > 0 {
            let mut rng = fastrand::Rng::with_seed(seed ^ PAYMENT_SALT);
            if rng.u32(0..100) < PROVIDER_FAULT_PERCENT {
                let fault = [
                    ProviderFault::Unavailable,
                    ProviderFault::DropCallbacks,
                    ProviderFault::DuplicateCallbacks,
                    ProviderFault::DelayCallbacks,
                ][rng.usize(0..4)];
                let kind = FaultKind::Provider { fault };
                let (start_ms, end_ms) = draw_window(&mut rng, &kind, fault_phase_ms, timings);
                faults.push(PlannedFault { id: faults.len(), kind, start_ms, end_ms });
            }
        }
        faults.sort_by_key(|f| f.start_ms);
        for (id, fault) in faults.iter_mut().enumerate() {
            fault.id = id;
        }
        // The injector applies faults in this order and heals each at its end: a fault that
        // ended before it began, or out of order, would be healed before it was applied.
        assert!(faults.iter().all(|f| f.start_ms <= f.end_ms), "a fault ends after it starts");
        assert!(faults.windows(2).all(|pair| pair[0].start_ms <= pair[1].start_ms), "faults in start order");
        let setup = Setup::draw(seed, orders, fault_phase_ms);
        Schedule { seed, fault_phase_ms, demand_per_s, faults, setup }
    }

    /// The setup and the timeline as lines, for a violation's report.
    pub fn lines(&self, nodes: usize) -> Vec<String> {
        let setup = self.setup.labels();
        let setup = (!setup.is_empty()).then(|| format!("setup: {}", setup.join(", ")));
        setup
            .into_iter()
            .chain(self.faults.iter().map(|f| {
                format!(
                    "fault {}: {} {:>6}–{:>6} ms  {}",
                    f.id,
                    f.kind.label(nodes),
                    f.start_ms,
                    f.end_ms,
                    serde_json::to_string(&f.kind).unwrap_or_default()
                )
            }))
            .collect()
    }
}

fn node_name(at: usize) -> String {
    format!("n{}", at + 1)
}

fn draw_kind(rng: &mut fastrand::Rng, nodes: usize, members: usize) -> FaultKind {
    let node = node_name(rng.usize(0..nodes));
    match rng.u32(0..100) {
        0..=11 => FaultKind::KillNodes { nodes: vec![node] },
        12..=19 if nodes >= 3 => FaultKind::KillNodes { nodes: pick_nodes(rng, nodes, 2) },
        20..=25 if nodes >= 3 => FaultKind::KillNodes { nodes: pick_nodes(rng, nodes, nodes - 1) },
        12..=25 => FaultKind::KillNodes { nodes: vec![node] },
        26..=35 => FaultKind::PauseNode { node },
        36..=43 if members > 1 => FaultKind::KillLeader,
        44..=49 if members > 1 => FaultKind::WipeMember { member: format!("c{}", rng.usize(1..=members)) },
        36..=49 => FaultKind::PauseNode { node },
        50..=55 => FaultKind::PauseRedis,
        56..=61 => FaultKind::KillRedis,
        _ => {
            let to = match rng.u32(0..10) {
                0..=4 => LinkTarget::Redis,
                5..=7 => LinkTarget::Coordinator,
                _ => LinkTarget::Leader,
            };
            let fault = match rng.u32(0..5) {
                0 => LinkFault::Drop,
                1 => LinkFault::Delay { ms: [50, 200, 600][rng.usize(0..3)] },
                2 => LinkFault::Blackhole,
                3 => LinkFault::OneWay { flows: Direction::ToServer },
                _ => LinkFault::OneWay { flows: Direction::ToClient },
            };
            FaultKind::Link { node, to, fault }
        }
    }
}

/// The fault `kind` becomes when the ledger's Redis is replicated (see the module docs).
fn on_replicated_redis(kind: FaultKind) -> FaultKind {
    match kind {
        FaultKind::KillRedis => FaultKind::RedisFailover,
        FaultKind::Link { node, to: LinkTarget::Redis, fault } => {
            FaultKind::Link { node, to: LinkTarget::Coordinator, fault }
        }
        kind => kind,
    }
}

fn draw_order_kind(rng: &mut fastrand::Rng, orders: usize) -> FaultKind {
    let name = format!("o{}", rng.usize(1..=orders));
    match rng.u32(0..4) {
        0 => FaultKind::KillOrders { name },
        1 => FaultKind::PauseOrders { name },
        2 => FaultKind::StopPostgres,
        _ => FaultKind::KillPostgres,
    }
}

/// `count` distinct nodes, in name order.
fn pick_nodes(rng: &mut fastrand::Rng, nodes: usize, count: usize) -> Vec<String> {
    let mut all: Vec<usize> = (0..nodes).collect();
    rng.shuffle(&mut all);
    let mut picked: Vec<usize> = all.into_iter().take(count).collect();
    picked.sort_unstable();
    picked.into_iter().map(node_name).collect()
}

/// When a fault of `kind` starts and ends, inside the fault phase. A pause outlasts lease +
/// grace, so the coordinator gives the node up while it sleeps. A link fault and a node kill may
/// be long: a dead or cut-off node's units must move within the stranded bound (2 × lease +
/// grace + 2 s), and only a fault that outlasts that bound shows when they do not (a kill of
/// at most 5 s, as first drawn, could not show an expiry that never came).
fn draw_window(rng: &mut fastrand::Rng, kind: &FaultKind, phase_ms: u64, timings: LeaseTimings) -> (u64, u64) {
    let (shortest, longest) = match kind {
        FaultKind::PauseNode { .. } => {
            let past = timings.lease_ms + timings.grace_ms;
            (past + 500, past + 3_000)
        }
        FaultKind::Link { .. } | FaultKind::KillNodes { .. } => (1_000, 10_000),
        // A failover's end waits for the promotion anyway (the sentinels' down-after or the
        // cluster's node timeout, plus an election), however short its window.
        FaultKind::PauseRedis | FaultKind::KillRedis | FaultKind::RedisFailover => (500, 3_000),
        // Past the sweeper's lock (10 s by default) only at the longest: the sweeper's fence
        // is what a wake-up after the lock lapsed tests, and the lock's TTL is the fleet's.
        FaultKind::PauseOrders { .. } | FaultKind::KillOrders { .. } => (1_000, 8_000),
        FaultKind::StopPostgres | FaultKind::KillPostgres => (1_000, 6_000),
        FaultKind::Provider { .. } => (2_000, 8_000),
        _ => (1_000, 5_000),
    };
    let latest_start = phase_ms.saturating_sub(shortest).max(FIRST_FAULT_MS + 1);
    let start = rng.u64(FIRST_FAULT_MS..latest_start);
    let end = (start + rng.u64(shortest..=longest)).min(phase_ms);
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMINGS: LeaseTimings = LeaseTimings { lease_ms: 1_500, grace_ms: 300 };

    #[test]
    fn a_seed_always_draws_the_same_schedule() {
        for seed in 0..200 {
            let a = Schedule::draw(seed, 3, 3, 2, RedisLayout::Single, 14_000, TIMINGS);
            let b = Schedule::draw(seed, 3, 3, 2, RedisLayout::Single, 14_000, TIMINGS);
            assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
        }
    }

    #[test]
    fn some_kills_outlast_the_stranded_bound() {
        let stranded_ms = 2 * TIMINGS.lease_ms + TIMINGS.grace_ms + 2_000;
        let long_kills = (0..200)
            .flat_map(|seed| Schedule::draw(seed, 3, 3, 2, RedisLayout::Single, 14_000, TIMINGS).faults)
            .filter(|f| matches!(f.kind, FaultKind::KillNodes { .. }) && f.end_ms - f.start_ms > stranded_ms + 1_000)
            .count();
        assert!(long_kills >= 10, "{long_kills} kills in 200 schedules outlast the stranded bound by a second");
    }

    #[test]
    fn faults_stay_in_the_phase_and_never_share_a_target_at_once() {
        for seed in 0..2_000 {
            let schedule = Schedule::draw(seed, 3, 3, 2, RedisLayout::Single, 14_000, TIMINGS);
            assert!(!schedule.faults.is_empty() && schedule.faults.len() <= FAULTS_MAX + 2);
            for fault in &schedule.faults {
                assert!(FIRST_FAULT_MS <= fault.start_ms && fault.start_ms < fault.end_ms, "{fault:?}");
                assert!(fault.end_ms <= 14_000, "{fault:?}");
                if let FaultKind::PauseNode { .. } = fault.kind {
                    assert!(fault.end_ms - fault.start_ms > 1_800 || fault.end_ms == 14_000, "{fault:?}");
                }
            }
            for (i, a) in schedule.faults.iter().enumerate() {
                for b in &schedule.faults[i + 1..] {
                    let overlap = a.start_ms < b.end_ms && b.start_ms < a.end_ms;
                    let shared = a.kind.targets(3).iter().any(|t| b.kind.targets(3).contains(t));
                    assert!(!(overlap && shared), "seed {seed}: {a:?} and {b:?}");
                }
            }
        }
    }

    #[test]
    fn order_faults_leave_the_fleet_faults_of_a_seed_as_they_were() {
        for seed in 0..500 {
            let without = Schedule::draw(seed, 3, 3, 0, RedisLayout::Single, 14_000, TIMINGS);
            let with = Schedule::draw(seed, 3, 3, 2, RedisLayout::Single, 14_000, TIMINGS);
            let fleet: Vec<String> = with
                .faults
                .iter()
                .filter(|f| {
                    !f.kind.targets(3).iter().any(|t| t == "postgres" || t == "paysim" || t.starts_with("process:o"))
                })
                .map(|f| format!("{:?} {} {}", f.kind, f.start_ms, f.end_ms))
                .collect();
            let before: Vec<String> =
                without.faults.iter().map(|f| format!("{:?} {} {}", f.kind, f.start_ms, f.end_ms)).collect();
            assert_eq!(fleet, before, "seed {seed}");
            assert_eq!(with.demand_per_s, without.demand_per_s);
        }
    }

    #[test]
    fn every_setup_is_drawn_in_some_schedules_within_its_bounds() {
        let (mut runtime, mut short, mut skewed) = (0, 0, 0);
        for seed in 0..1_000 {
            let setup = Schedule::draw(seed, 3, 3, 2, RedisLayout::Single, 10_000, TIMINGS).setup;
            if let Some(at) = setup.runtime_sku_at_ms {
                assert!((FIRST_FAULT_MS..=5_000).contains(&at), "seed {seed}: {setup:?}");
                runtime += 1;
            }
            if let Some(ttl) = setup.idempotency_ttl_s {
                assert!(SHORT_TTLS_S.contains(&ttl), "seed {seed}: {setup:?}");
                short += 1;
            }
            if !setup.orders_clock_skew_s.is_empty() {
                assert_eq!(setup.orders_clock_skew_s.len(), 2, "seed {seed}: one skew per order service");
                assert!(setup.orders_clock_skew_s.iter().all(|s| s.abs() <= CLOCK_SKEW_MAX_S), "seed {seed}");
                skewed += 1;
            }
            let without_orders = Schedule::draw(seed, 3, 3, 0, RedisLayout::Single, 10_000, TIMINGS).setup;
            assert!(without_orders.orders_clock_skew_s.is_empty(), "seed {seed}: no order service to skew");
        }
        for (name, count, percent) in [
            ("runtime SKU", runtime, RUNTIME_SKU_PERCENT),
            ("short TTL", short, SHORT_TTL_PERCENT),
            ("clock skew", skewed, CLOCK_SKEW_PERCENT),
        ] {
            let expected = 10 * percent as i32;
            assert!((count - expected).abs() < 60, "{name}: {count} of 1000, expected about {expected}");
        }
    }

    #[test]
    fn every_kind_of_fault_is_drawn() {
        let mut labels = std::collections::BTreeSet::new();
        for seed in 0..2_000 {
            for fault in Schedule::draw(seed, 3, 3, 2, RedisLayout::Single, 14_000, TIMINGS).faults {
                labels.insert(fault.kind.label(3));
            }
        }
        for label in [
            "kill_one_node",
            "kill_all_but_one_node",
            "pause_node_past_lease",
            "kill_leader",
            "wipe_member",
            "pause_redis",
            "kill_redis",
            "link_to_redis_drop",
            "link_to_redis_blackhole",
            "link_to_redis_delay",
            "link_to_redis_one_way_requests_only",
            "link_to_coordinator_one_way_answers_only",
            "link_to_leader_blackhole",
            "kill_orders",
            "pause_orders",
            "stop_postgres",
            "kill_postgres",
            "provider_unavailable",
            "callbacks_dropped",
            "callbacks_duplicated",
            "callbacks_delayed",
        ] {
            assert!(labels.contains(label), "{label} never drawn: {labels:?}");
        }
    }

    #[test]
    fn on_replicated_redis_a_redis_kill_is_a_failover_and_nothing_needs_a_redis_proxy() {
        for redis in [RedisLayout::Sentinel, RedisLayout::Cluster] {
            let (mut failovers, mut pauses) = (0, 0);
            for seed in 0..2_000 {
                let replicated = Schedule::draw(seed, 3, 3, 2, redis, 14_000, TIMINGS);
                for fault in &replicated.faults {
                    assert!(!matches!(fault.kind, FaultKind::KillRedis), "{redis:?} seed {seed}: {fault:?}");
                    let redis_link = matches!(fault.kind, FaultKind::Link { to: LinkTarget::Redis, .. });
                    assert!(!redis_link, "{redis:?} seed {seed}: {fault:?}");
                    failovers += usize::from(fault.kind == FaultKind::RedisFailover);
                    pauses += usize::from(fault.kind == FaultKind::PauseRedis);
                }
            }
            assert!(failovers >= 50 && pauses >= 50, "{redis:?}: {failovers} failovers, {pauses} pauses in 2000");
        }
        for seed in 0..200 {
            let plain = Schedule::draw(seed, 3, 3, 2, RedisLayout::Single, 14_000, TIMINGS);
            assert!(plain.faults.iter().all(|f| f.kind != FaultKind::RedisFailover), "seed {seed}");
            let sentinel = Schedule::draw(seed, 3, 3, 2, RedisLayout::Sentinel, 14_000, TIMINGS);
            let cluster = Schedule::draw(seed, 3, 3, 2, RedisLayout::Cluster, 14_000, TIMINGS);
            let sentinel = serde_json::to_string(&sentinel).unwrap();
            assert_eq!(sentinel, serde_json::to_string(&cluster).unwrap(), "seed {seed}: one translation for both");
        }
    }
}
