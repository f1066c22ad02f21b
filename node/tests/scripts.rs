//! Scripted tests of the node (goldenscript, as toydb tests its Raft node): each script in
//! `tests/scripts/` starts nodes on one embedded ledger, sends purchases, flips faults, moves
//! time, and prints what every step answered and what the node and the ledger hold afterwards.
//! The expected output is checked in; `UPDATE_GOLDENFILES=1 cargo test -p seckill-node --test
//! scripts` rewrites it, to be read and committed.
//!
//! Method: one current-thread Tokio runtime per script with paused time, so the node's timers
//! (status refresh, heartbeats, lease, breaker cool-down, confirm timeout) move only when the
//! script ticks or when every task waits on a timer. The ledger is the embedded one behind a
//! switch (`harness::ScriptLedger`); the coordinator answers in process. Nothing sleeps but the
//! `sleep` command (the embedded ledger's idempotency TTL runs on the real clock).
//!
//! Commands (`NODE` is a node's name, `DUR` like `500ms`, `3s`, `2m`):
//! - `ledger [ttl=DUR]`: a fresh ledger keeping idempotency records `ttl` (before any `sku`).
//! - `sku NAME total=N [allot=N] [limit=N] [qty_max=N] [tokens=true] [starts=DUR] [ends=DUR]
//!   [ledger=false] [stripes=K]`: a SKU every node started later sells, created at the ledger
//!   unless `ledger=false`; `starts`/`ends` are from now. Striped, each stripe's ledger is
//!   created and the coordinator defines each stripe (`NAME/i`) as a SKU, as the real one does.
//! - `node NAME [mode=ledger-only] [coordinator=true] [queue=N] [breaker=N] [ttl=DUR]
//!   [timeout=DUR]`: starts a node selling every SKU defined so far.
//! - `purchase NODE key=K [user=U] [sku=S] [qty=N] [token=held|of owner=U|TEXT] [async=true]`:
//!   one purchase, with the buyer's own token, another buyer's, or any text; `async` leaves it running
//!   until `await`.
//! - `purchases NODE count=N [sku=S] [prefix=P]`: N purchases at once, answers counted.
//! - `await`: the answers of the `async` purchases, in the order they were sent.
//! - `token NODE user=U [sku=S]`: a submit token, kept for `token=held`.
//! - `tick DUR`, `sleep DUR`: move the paused clocks / sleep for real.
//! - `status [NODE]`: every node's figures and the ledger's.
//! - `batches`: the sizes of the confirmations the ledger got since last asked.
//! - `ledger-down`, `ledger-up`, `ledger-hold`, `ledger-resume`, `close SKU`,
//!   `restock SKU total=N` (SKU may be a stripe, `s/i`), `release KEY [sku=S]`, `transfer FROM TO units=N [land=false]`
//!   (between two stripes, as the coordinator moves them; `land=false` takes them out only,
//!   `transfer-land` puts them in): the ledger's side. A stripe is named `NAME/i`.
//! - `grant NODE units=N [sku=S]`, `end-epoch NODE`, `coordinator-down`, `coordinator-up`,
//!   `coordinator-close SKU`: the coordinator's side.
//! - `shutdown NODE`: fires the node's shutdown signal.

mod harness;

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use goldenscript::{Command, Runner};
use harness::{ScriptClock, ScriptCoordinator, ScriptLedger};
use ledger::{CatalogueLedger, EmbeddedLedger, LedgerReads, NodeId, OrderFeed, Release, SalesLedger, SkuId, SkuTerms};
use node::{CoordinatorLink, Mode, Node, NodeConfig, NodeOptions, Outcome, PurchaseRequest, Shutdown, SkuConfig};
use tokio::task::JoinHandle;

type Result<T = String> = std::result::Result<T, Box<dyn Error>>;

/// How far `tick` moves time in one step: the node's timers fire at most this late, so a tick
/// of seconds sees every heartbeat and refresh in it.
const TICK_STEP: Duration = Duration::from_millis(100);
/// The status refresh and heartbeat period of every scripted node.
const PERIOD: Duration = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(3);
const FENCE_MARGIN: Duration = Duration::from_millis(500);

macro_rules! scripts {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/", stringify!($name));
            goldenscript::run(&mut NodeRunner::new(), path).expect("the script runs");
        }
    )*};
}

scripts!(
    allotment_empty_with_ledger_stock,
    batch_confirm_many_winners,
    breaker_opens_and_probe_closes,
    breaker_probe_fails_and_reopens,
    closed_by_coordinator,
    closed_at_ledger,
    confirm_queue_full,
    confirm_timeout_settles_later,
    epoch_ended_units_never_return,
    grant_and_top_up,
    hold_max_gives_back,
    idempotency_after_ttl,
    idempotency_replay_from_memory,
    in_progress_same_key,
    key_belongs_to_its_buyer,
    key_reused,
    lease_lapse_fences,
    ledger_down_returns_units,
    ledger_missing_sku,
    ledger_only_mode,
    ledger_only_sold_out,
    ledger_replay_across_nodes,
    qty_bounds,
    release_reopens_sale,
    release_unseen_sells_elsewhere,
    restock_reopens_sale,
    sale_window_ended,
    sale_window_not_started,
    shutdown_refuses_winners,
    sold_out_at_ledger,
    sold_out_from_memory,
    sold_out_replays_buyer_of_other_node,
    stripe_empty_at_ledger,
    stripe_empty_retry,
    stripe_refilled_retry_replays,
    stripe_transfer_sells_again,
    stripes_routing,
    token_invalid,
    token_required,
    token_spent_once,
    unknown_sku,
    user_limit,
);

/// One script's world: a runtime with paused time, the ledger, the coordinator, the nodes.
struct NodeRunner {
    runtime: tokio::runtime::Runtime,
    clock: Arc<ScriptClock>,
    ledger: Arc<ScriptLedger>,
    coordinator: Arc<ScriptCoordinator>,
    skus: Vec<SkuConfig>,
    nodes: BTreeMap<String, (Node, Shutdown)>,
    /// `async` purchases not awaited yet: who sent them and their answer to come.
    pending: Vec<(String, JoinHandle<Outcome>)>,
    /// Submit tokens issued, by user.
    tokens: HashMap<String, String>,
    /// The last transfer id used between stripes.
    transfers: u64,
    /// The units of the last transfer, taken out and not yet put in: to which stripe, its id.
    moving: Option<(SkuId, u64, u64)>,
}

impl NodeRunner {
    fn new() -> Self {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("a runtime");
        Self {
            runtime,
            clock: Arc::new(ScriptClock::new()),
            ledger: Arc::new(ScriptLedger::new(EmbeddedLedger::default())),
            coordinator: Arc::default(),
            skus: Vec::new(),
            nodes: BTreeMap::new(),
            pending: Vec::new(),
            tokens: HashMap::new(),
            transfers: 0,
            moving: None,
        }
    }

    fn node(&self, name: &str) -> Result<Node> {
        Ok(self.nodes.get(name).ok_or_else(|| format!("no node {name}"))?.0.clone())
    }

    /// The named SKU, or the first one defined.
    fn sku_name(&self, given: Option<&str>) -> Result<String> {
        match given {
            Some(sku) => Ok(sku.to_string()),
            None => Ok(self.skus.first().ok_or("no sku defined")?.sku.to_string()),
        }
    }

    /// Lets every task that can run, run: confirmers settle, a woken heartbeat adopts.
    fn settle(&self) {
        self.runtime.block_on(settle());
    }

    fn define_sku(&mut self, command: &Command) -> Result {
        let mut args = command.consume_args();
        let name = args.next_pos().ok_or("sku name not given")?.value.clone();
        let mut terms = SkuTerms::new(args.lookup_parse("total")?.ok_or("total not given")?);
        terms.per_user_limit = args.lookup_parse("limit")?.unwrap_or(0);
        terms.qty_max = args.lookup_parse("qty_max")?.unwrap_or(terms.qty_max);
        terms.require_token = args.lookup_parse("tokens")?.unwrap_or(false);
        if let Some(starts) = args.lookup("starts") {
            terms.starts_at_ms = Some(self.clock.in_ms_from_now(duration(&starts.value)?));
        }
        if let Some(ends) = args.lookup("ends") {
            terms.ends_at_ms = Some(self.clock.in_ms_from_now(duration(&ends.value)?));
        }
        let allotment = args.lookup_parse("allot")?.unwrap_or(terms.total);
        let at_ledger = args.lookup_parse("ledger")?.unwrap_or(true);
        terms.stripes = args.lookup_parse("stripes")?.unwrap_or(1);
        args.reject_rest()?;
        let sku = SkuId::new(&name)?;
        for (index, stripe_terms) in (0..).zip(terms.stripe_terms()) {
            let stripe = sku.stripe(index);
            if at_ledger {
                self.runtime.block_on(self.ledger.inner().create_sku(&stripe, &stripe_terms))?;
            }
            self.coordinator.define(stripe, stripe_terms);
        }
        self.skus.push(SkuConfig::new(sku, terms, allotment));
        Ok(String::new())
    }

    fn start_node(&mut self, command: &Command) -> Result {
        let mut args = command.consume_args();
        let name = args.next_pos().ok_or("node name not given")?.value.clone();
        let mut config = NodeConfig::new(NodeId::new(&name)?);
        config.status_refresh = PERIOD;
        // Every script reads each period; the quiet pace is `protocol::pace`'s own test.
        config.status_refresh_quiet_max = PERIOD;
        if args.lookup("mode").is_some_and(|mode| mode.value == "ledger-only") {
            config.mode = Mode::LedgerOnly;
        }
        config.confirm_queue_max = args.lookup_parse("queue")?.unwrap_or(config.confirm_queue_max);
        config.breaker.failures_max = args.lookup_parse("breaker")?.unwrap_or(config.breaker.failures_max);
        if let Some(ttl) = args.lookup("ttl") {
            config.idempotency_ttl = duration(&ttl.value)?;
        }
        if let Some(timeout) = args.lookup("timeout") {
            config.confirm_timeout = duration(&timeout.value)?;
        }
        let coordinated = args.lookup_parse("coordinator")?.unwrap_or(false);
        args.reject_rest()?;
        let coordinator = coordinated.then(|| CoordinatorLink {
            client: self.coordinator.clone(),
            advertise: format!("{name}:0"),
            heartbeat: PERIOD,
            lease: LEASE,
            fence_margin: FENCE_MARGIN,
        });
        let options = NodeOptions { clock: self.clock.clone(), coordinator, ..NodeOptions::default() };
        let shutdown = Shutdown::new();
        let ledger: Arc<dyn SalesLedger> = self.ledger.clone();
        let node =
            self.runtime.block_on(async { Node::start(config, self.skus.clone(), ledger, options, shutdown.clone()) });
        self.nodes.insert(name, (node, shutdown));
        self.settle();
        Ok(String::new())
    }

    fn purchase(&mut self, command: &Command) -> Result {
        let mut args = command.consume_args();
        let name = args.next_pos().ok_or("node not given")?.value.clone();
        let node = self.node(&name)?;
        let key = args.lookup("key").ok_or("key not given")?.value.clone();
        let user = args.lookup("user").map_or_else(|| format!("u-{key}"), |user| user.value.clone());
        let sku = self.sku_name(args.lookup("sku").map(|sku| sku.value.as_str()))?;
        let qty = args.lookup_parse("qty")?.unwrap_or(1);
        let token = match args.lookup("token").map(|token| token.value.as_str()) {
            Some("held") => Some(self.tokens.get(&user).ok_or("no token held")?.clone()),
            Some("of") => {
                let owner = &args.lookup("owner").ok_or("owner not given")?.value;
                Some(self.tokens.get(owner).ok_or("no token held")?.clone())
            }
            other => other.map(str::to_string),
        };
        let in_background = args.lookup_parse("async")?.unwrap_or(false);
        args.reject_rest()?;
        let label = format!("{name} {key}");
        let buy = async move {
            let request = PurchaseRequest {
                sku: &sku,
                user: &user,
                qty,
                key: &key,
                ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                token: token.as_deref(),
                ticket: None,
                trace: telemetry::untraced(),
            };
            node.purchase(request).await
        };
        if in_background {
            let handle = self.runtime.spawn(buy);
            self.pending.push((label, handle));
            self.settle();
            return Ok(String::new());
        }
        let outcome = self.runtime.block_on(buy);
        self.settle();
        Ok(format!("{label}: {}\n", describe(&outcome)))
    }

    fn purchases(&mut self, command: &Command) -> Result {
        let mut args = command.consume_args();
        let name = args.next_pos().ok_or("node not given")?.value.clone();
        let node = self.node(&name)?;
        let count: u32 = args.lookup_parse("count")?.ok_or("count not given")?;
        let prefix = args.lookup("prefix").map_or("k", |prefix| prefix.value.as_str()).to_string();
        let sku = self.sku_name(args.lookup("sku").map(|sku| sku.value.as_str()))?;
        args.reject_rest()?;
        // Spawned from inside the runtime, so they queue locally in order, all ahead of the
        // confirmer they wake: the burst reaches it at once, as a burst from many connections.
        let outcomes = self.runtime.block_on(async move {
            let handles: Vec<_> = (1..=count)
                .map(|n| {
                    let (node, sku, key) = (node.clone(), sku.clone(), format!("{prefix}{n}"));
                    tokio::spawn(async move {
                        let user = format!("u-{key}");
                        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
                        let request = PurchaseRequest {
                            sku: &sku,
                            user: &user,
                            qty: 1,
                            key: &key,
                            ip,
                            token: None,
                            ticket: None,
                            trace: telemetry::untraced(),
                        };
                        node.purchase(request).await
                    })
                })
                .collect();
            let mut outcomes = Vec::new();
            for handle in handles {
                outcomes.push(handle.await.expect("a purchase task"));
            }
            outcomes
        });
        self.settle();
        let mut counts = BTreeMap::<String, u32>::new();
        for outcome in &outcomes {
            *counts.entry(outcome.code().as_str().to_string()).or_default() += 1;
        }
        let counts: Vec<String> = counts.iter().map(|(code, n)| format!("{code}={n}")).collect();
        Ok(format!("{name}: {count} purchases: {}\n", counts.join(" ")))
    }

    fn await_pending(&mut self) -> Result {
        let mut output = String::new();
        for (label, handle) in std::mem::take(&mut self.pending) {
            let outcome = self.runtime.block_on(handle)?;
            writeln!(output, "{label}: {}", describe(&outcome))?;
        }
        self.settle();
        Ok(output)
    }

    fn token(&mut self, command: &Command) -> Result {
        let mut args = command.consume_args();
        let name = args.next_pos().ok_or("node not given")?.value.clone();
        let node = self.node(&name)?;
        let user = args.lookup("user").ok_or("user not given")?.value.clone();
        let sku = self.sku_name(args.lookup("sku").map(|sku| sku.value.as_str()))?;
        args.reject_rest()?;
        let request = node::TokenRequest { sku: &sku, user: &user, ip: IpAddr::V4(Ipv4Addr::LOCALHOST) };
        let outcome = self.runtime.block_on(node.issue_token(request));
        self.settle();
        Ok(match outcome {
            node::TokenOutcome::Issued { token, .. } => {
                self.tokens.insert(user.clone(), token.to_string());
                format!("{name} token for {user}: issued\n")
            }
            node::TokenOutcome::Refused(refusal) => format!("{name} token for {user}: {}\n", describe(&refusal)),
        })
    }

    fn tick(&self, by: Duration) {
        let mut left = by;
        while !left.is_zero() {
            let step = left.min(TICK_STEP);
            self.clock.advance(step);
            self.runtime.block_on(async {
                tokio::time::advance(step).await;
                settle().await;
            });
            left -= step;
        }
    }

    fn status(&self, command: &Command) -> Result {
        let mut args = command.consume_args();
        let only = args.next_pos().map(|node| node.value.clone());
        args.reject_rest()?;
        // Inside the runtime: the lease is read on its paused clock, not the machine's.
        let _runtime = self.runtime.enter();
        let mut output = String::new();
        for (name, (node, _)) in &self.nodes {
            if only.as_ref().is_some_and(|only| only != name) {
                continue;
            }
            let breaker = node.ledger_breaker().as_str();
            writeln!(output, "{name}: epoch={} breaker={breaker} ready={}", node.epoch(), node.is_ready())?;
            for sku in &self.skus {
                output += &node_sku_lines(name, node, sku);
            }
        }
        if only.is_none() {
            for sku in self.skus.iter().flat_map(stripes) {
                output += &self.ledger_line(&sku)?;
            }
        }
        Ok(output)
    }

    fn ledger_line(&self, sku: &SkuId) -> Result {
        let Ok(status) = self.runtime.block_on(self.ledger.inner().status(sku)) else {
            return Ok(format!("ledger {sku}: missing\n"));
        };
        let by_node: Vec<String> = status.sold_by_node.iter().map(|(node, sold)| format!("{node}={sold}")).collect();
        Ok(format!(
            "ledger {sku}: total={} sold={} remaining={} released={} closed={} sold_by=[{}]\n",
            status.total,
            status.sold,
            status.remaining,
            status.released,
            status.closed,
            by_node.join(" ")
        ))
    }

    /// Gives back the order the ledger sold under `key`, as the order service does for an
    /// unpaid one.
    fn release(&self, command: &Command) -> Result {
        let mut args = command.consume_args();
        let key = args.next_pos().ok_or("key not given")?.value.clone();
        let sku = SkuId::new(&self.sku_name(args.lookup("sku").map(|sku| sku.value.as_str()))?)?;
        args.reject_rest()?;
        let orders = self.runtime.block_on(self.ledger.inner().orders(&sku, 0, 1_000))?;
        let order = orders.iter().rev().find(|order| order.key.as_str() == key).ok_or("no order under that key")?;
        let release = Release {
            order_id: order.order_id.clone(),
            key: order.key.clone(),
            user: order.user.clone(),
            qty: order.qty,
            sold_at_ms: order.at_ms,
        };
        let outcome = self.runtime.block_on(self.ledger.inner().release(&sku, &release))?;
        Ok(format!("release {key}: {outcome:?}\n"))
    }

    fn coordinator_command(&mut self, command: &Command) -> Result {
        let mut args = command.consume_args();
        let output = match command.name.as_str() {
            "grant" => {
                let name = args.next_pos().ok_or("node not given")?.value.clone();
                let units = args.lookup_parse("units")?.ok_or("units not given")?;
                let sku = SkuId::from_wire(&self.sku_name(args.lookup("sku").map(|sku| sku.value.as_str()))?)?;
                let total = self.coordinator.grant(&NodeId::new(&name)?, &sku, units)?;
                format!("granted {name} {sku}: {total} in this epoch\n")
            }
            "hold-max" => {
                let name = args.next_pos().ok_or("node not given")?.value.clone();
                let units = args.lookup_parse("units")?.ok_or("units not given")?;
                let sku = SkuId::from_wire(&self.sku_name(args.lookup("sku").map(|sku| sku.value.as_str()))?)?;
                self.coordinator.hold_max(&NodeId::new(&name)?, &sku, units);
                format!("{name} told to hold at most {units} of {sku}\n")
            }
            "end-epoch" => {
                let name = args.next_pos().ok_or("node not given")?.value.clone();
                let node_id = NodeId::new(&name)?;
                let epoch = self.coordinator.end_epoch(&node_id).ok_or("the node holds no epoch")?;
                let seller = ledger::Seller::new(node_id, epoch);
                let mut output = String::new();
                for sku in self.skus.iter().flat_map(stripes) {
                    let sold = self.runtime.block_on(self.ledger.inner().end_epoch(&sku, &seller))?;
                    writeln!(output, "ended {name} epoch {epoch} {sku}: sold {sold} in it")?;
                }
                output
            }
            "coordinator-down" => {
                self.coordinator.set_down(true);
                String::new()
            }
            "coordinator-up" => {
                self.coordinator.set_down(false);
                String::new()
            }
            "coordinator-close" => {
                let sku = SkuId::new(&args.next_pos().ok_or("sku not given")?.value)?;
                self.coordinator.close(&sku);
                String::new()
            }
            other => return Err(format!("unknown command {other}").into()),
        };
        args.reject_rest()?;
        Ok(output)
    }

    fn ledger_command(&mut self, command: &Command) -> Result {
        let mut args = command.consume_args();
        let output = match command.name.as_str() {
            "ledger" => {
                if !self.skus.is_empty() {
                    return Err("ledger must come before any sku".into());
                }
                let ttl = match args.lookup("ttl") {
                    Some(ttl) => duration(&ttl.value)?,
                    None => ledger::IDEMPOTENCY_TTL_DEFAULT,
                };
                self.ledger = Arc::new(ScriptLedger::new(EmbeddedLedger::new(ttl)));
                String::new()
            }
            "ledger-down" | "ledger-up" => {
                self.ledger.set_down(command.name == "ledger-down");
                String::new()
            }
            "ledger-hold" | "ledger-resume" => {
                self.ledger.set_held(command.name == "ledger-hold");
                String::new()
            }
            "batches" => format!("confirmations: {:?}\n", self.ledger.take_batches()),
            "close" => {
                let sku = SkuId::new(&args.next_pos().ok_or("sku not given")?.value)?;
                self.runtime.block_on(self.ledger.inner().close(&sku))?;
                String::new()
            }
            "restock" => {
                let sku = SkuId::from_wire(&args.next_pos().ok_or("sku not given")?.value)?;
                let total = args.lookup_parse("total")?.ok_or("total not given")?;
                self.runtime.block_on(self.ledger.inner().restock_to(&sku, total))?;
                String::new()
            }
            "transfer" => {
                let from = SkuId::from_wire(&args.next_pos().ok_or("from not given")?.value)?;
                let to = SkuId::from_wire(&args.next_pos().ok_or("to not given")?.value)?;
                let units = args.lookup_parse("units")?.ok_or("units not given")?;
                let land = args.lookup_parse("land")?.unwrap_or(true);
                self.transfers += 1;
                let taken = self.runtime.block_on(self.ledger.inner().transfer_out(&from, self.transfers, units))?;
                self.moving = Some((to, self.transfers, taken));
                let mut output = format!("took {taken} units out of {from}\n");
                if land {
                    output += &self.land_transfer()?;
                }
                output
            }
            "transfer-land" => self.land_transfer()?,
            other => return Err(format!("unknown command {other}").into()),
        };
        args.reject_rest()?;
        Ok(output)
    }
}

impl NodeRunner {
    /// Puts the units of the transfer under way into the stripe they were taken for.
    fn land_transfer(&mut self) -> Result {
        let (to, transfer, units) = self.moving.take().ok_or("no transfer under way")?;
        self.runtime.block_on(self.ledger.inner().transfer_in(&to, transfer, units))?;
        Ok(format!("put {units} units into {to}\n"))
    }
}

/// The ledgers of a SKU: its stripes, or the SKU itself.
fn stripes(sku: &SkuConfig) -> Vec<SkuId> {
    (0..sku.terms.stripes.max(1)).map(|index| sku.sku.stripe(index)).collect()
}

impl Runner for NodeRunner {
    fn run(&mut self, command: &Command) -> Result {
        let output = match command.name.as_str() {
            "sku" => self.define_sku(command)?,
            "node" => self.start_node(command)?,
            "purchase" => self.purchase(command)?,
            "purchases" => self.purchases(command)?,
            "await" => self.await_pending()?,
            "token" => self.token(command)?,
            "status" => self.status(command)?,
            "release" => self.release(command)?,
            "tick" | "sleep" => {
                let mut args = command.consume_args();
                let by = duration(&args.next_pos().ok_or("duration not given")?.value)?;
                args.reject_rest()?;
                if command.name == "tick" {
                    self.tick(by);
                } else {
                    std::thread::sleep(by);
                }
                String::new()
            }
            "shutdown" => {
                let name = &command.consume_args().next_pos().ok_or("node not given")?.value;
                self.nodes.get(name).ok_or("no such node")?.1.trigger();
                self.settle();
                String::new()
            }
            "report" => {
                let mut args = command.consume_args();
                let name = args.next_pos().ok_or("node not given")?.value.clone();
                args.reject_rest()?;
                let node = self.node(&name)?;
                let mut output = String::new();
                for (sku, report) in node.reports() {
                    writeln!(
                        output,
                        "{name} {sku} report: local={} applied={} sold={} returned={}",
                        report.local_remaining, report.applied, report.sold, report.returned
                    )?;
                }
                output
            }
            "grant" | "hold-max" | "end-epoch" | "coordinator-down" | "coordinator-up" | "coordinator-close" => {
                self.coordinator_command(command)?
            }
            _ => self.ledger_command(command)?,
        };
        Ok(output)
    }

    fn end_script(&mut self) -> Result<()> {
        for (_, shutdown) in self.nodes.values() {
            shutdown.trigger();
        }
        Ok(())
    }
}

/// Yields to the runtime until the tasks woken so far had their turn, a few times over: a
/// confirmer's reply wakes a request, a heartbeat's answer wakes nothing further.
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// A SKU's line, or for a striped SKU a line of its sums from the stock page and one per stripe.
fn node_sku_lines(name: &str, node: &Node, sku: &SkuConfig) -> String {
    if sku.terms.stripes <= 1 {
        return node_sku_line(name, node, sku.sku.as_str());
    }
    let Some(page) = node.stock_page(sku.sku.as_str()) else { return format!("{name} {}: unknown\n", sku.sku) };
    let mut output = format!(
        "{name} {}: page total={} sold={} remaining={} local={} sold_out={}\n",
        page.sku, page.total, page.sold, page.remaining, page.local_remaining, page.sold_out
    );
    for (stripe, sku_id) in page.stripes.unwrap_or_default().iter().zip(stripes(sku)) {
        let Some(state) = node.allotment_state(sku_id.as_str()) else { continue };
        let _ = writeln!(
            output,
            "{name} {sku_id}: local={} applied={} sold_in_epoch={} in_flight={} sold_out={} seen={}/{}",
            state.local_remaining,
            state.applied,
            state.sold_in_epoch,
            state.in_flight,
            state.sold_out,
            stripe.sold,
            stripe.total
        );
    }
    output
}

fn node_sku_line(name: &str, node: &Node, sku: &str) -> String {
    let Some(page) = node.stock_page(sku) else { return format!("{name} {sku}: unknown\n") };
    let stats = node.allotment_stats(sku).unwrap_or_default();
    let seen = format!(
        "seen={}/{} closed={} exhausted={} refused={}",
        page.sold, page.total, page.closed, stats.exhausted_with_stock_left, stats.refused_by_ledger
    );
    match node.allotment_state(sku) {
        Some(state) => format!(
            "{name} {sku}: local={} applied={} sold_in_epoch={} in_flight={} sold_out={} {seen}\n",
            state.local_remaining, state.applied, state.sold_in_epoch, state.in_flight, state.sold_out
        ),
        None => format!("{name} {sku}: ledger-only {seen}\n"),
    }
}

/// An outcome as one line: its code, then what the buyer would be told beyond it.
fn describe(outcome: &Outcome) -> String {
    let code = outcome.code().as_str();
    match outcome {
        Outcome::Purchased { receipt, .. } => {
            format!("{code} order={} node={} qty={}", receipt.order_id, receipt.node, receipt.qty)
        }
        Outcome::SoldOut { replayed: true } | Outcome::UserLimit { replayed: true } => format!("{code} (replayed)"),
        Outcome::TokenInvalid { replayed: true } => format!("{code} (replayed)"),
        Outcome::RateLimited { retry_after } => format!("{code} retry_after={retry_after:?}"),
        Outcome::LedgerBreakerOpen { retry_after } => format!("{code}: breaker open, retry_after={retry_after:?}"),
        Outcome::Unavailable { reason } | Outcome::BadRequest { reason } => format!("{code}: {reason}"),
        Outcome::StripeEmpty { key_spent: true } => format!("{code} (key spent)"),
        _ => code.to_string(),
    }
}

fn duration(text: &str) -> Result<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).ok_or("a duration needs a unit")?);
    let number: u64 = number.parse()?;
    Ok(match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number * 60),
        "h" => Duration::from_secs(number * 3600),
        _ => return Err(format!("unknown unit {unit}").into()),
    })
}
