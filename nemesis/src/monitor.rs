//! Samples the fleet while a schedule runs, past every proxy: what the leader says of each node
//! (epoch, live, worker id), each node's local stock (its stock page), then the ledger's counts
//! and its per-seller books. The checker needs these for what the buyers' history cannot show:
//! a sale under an epoch the coordinator already ended, and units stranded on a node that
//! cannot sell while the nodes that can have none.
//!
//! Within one sample the coordinator and the nodes are asked first and the ledger after, so a
//! sample's ledger figures were read after its view of the epochs: a seller's count that grows
//! after the sample that first saw its epoch ended grew after the end.
//!
//! The per-seller books are the ledger's `by_epoch` hash (`<prefix>:{<sku>}:by_epoch`, fields
//! `<node>#<epoch>`), read directly: the `Ledger` trait answers per seller only for a seller one
//! names. It is read over the ledger's own connection kind ([`RedisConnection`]), so a
//! `redis+sentinel://` URL reaches whichever server is master. If that layout changes, the
//! checker's "books balance" check (Σ sellers = sold) fails loudly rather than this monitor
//! seeing nothing.
//!
//! A striped SKU's ledger figures and per-seller books are its stripes' sums, read one stripe
//! after another in the same sample; a sample keeps them only if every stripe answered.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledger::{LedgerReads, RedisConnection, RedisLedger, RedisLedgerConfig, SkuId};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::history::Clock;

/// Time between samples.
pub const TICK: Duration = Duration::from_millis(250);

/// Longest one probe may take: a frozen process must not stretch a sample.
const PROBE_MAX: Duration = Duration::from_millis(300);

/// Most samples kept (over an hour at one per tick).
const SAMPLES_MAX: usize = 20_000;

/// What to sample, at the real addresses.
#[derive(Clone, Debug)]
pub struct Targets {
    pub sku: SkuId,
    /// The ledgers its stock is kept in: `[sku]`, or each of its stripes.
    pub ledgers: Vec<SkuId>,
    pub redis_url: String,
    pub key_prefix: String,
    pub members: Vec<(String, SocketAddr)>,
    /// The cluster token the members' `/api/state` asks for.
    pub cluster_token: String,
    pub nodes: NodeList,
}

/// The nodes to sample by name and address: fixed for a fleet of processes; one that scales or
/// replaces its nodes (the Compose fleet) is told of each change, and the next sample sees it.
#[derive(Clone, Debug, Default)]
pub struct NodeList(Arc<std::sync::RwLock<Vec<(String, SocketAddr)>>>);

impl NodeList {
    pub fn new(nodes: Vec<(String, SocketAddr)>) -> Self {
        Self(Arc::new(std::sync::RwLock::new(nodes)))
    }

    /// The nodes from now on; a node no longer listed keeps the samples it had.
    pub fn set(&self, nodes: Vec<(String, SocketAddr)>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = nodes;
    }

    pub fn get(&self) -> Vec<(String, SocketAddr)> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Targets {
    /// The same fleet, for another SKU kept in `ledgers`.
    pub fn with_sku(&self, sku: SkuId, ledgers: Vec<SkuId>) -> Targets {
        Targets { sku, ledgers, ..self.clone() }
    }
}

/// The SKU's figures; a striped SKU's are its stripes' sums, present only when every stripe
/// answered (see [`crate::stripes`]).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LedgerFigures {
    pub total: u64,
    pub sold: u64,
    pub remaining: u64,
    /// Units given back by released orders, ever: the checker tells units just released (on
    /// their way to a node) from units stranded.
    pub released: u64,
    /// Units moved out of and into the stripes, ever: 0 for an unstriped SKU, and then left
    /// out of the samples file as before stripes.
    #[serde(skip_serializing_if = "is_zero")]
    pub transferred_out: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub transferred_in: u64,
}

impl LedgerFigures {
    /// Units still for sale, with those between stripes (see [`crate::stripes::unsold`]).
    pub fn unsold(&self) -> u64 {
        crate::stripes::unsold(self.remaining, self.transferred_out, self.transferred_in)
    }
}

fn is_zero(units: &u64) -> bool {
    *units == 0
}

/// A node as the leader's applied state shows it.
#[derive(Clone, Debug, Serialize)]
pub struct NodeView {
    pub epoch: u64,
    pub live: bool,
    pub worker_id: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// When the sample was started.
    pub at_ms: u64,
    pub leader: Option<String>,
    /// By node; none when no leader answered.
    pub nodes: Option<BTreeMap<String, NodeView>>,
    /// Each node's `local_remaining`; none for a node that did not answer.
    pub local: BTreeMap<String, Option<u64>>,
    pub ledger: Option<LedgerFigures>,
    /// `<node>#<epoch>` → units that seller sold.
    pub sellers: Option<BTreeMap<String, u64>>,
}

pub struct Monitor {
    stop: watch::Sender<bool>,
    latest: Arc<Mutex<Option<Sample>>>,
    /// Taken by `stop`.
    task: Option<JoinHandle<Vec<Sample>>>,
}

impl Monitor {
    pub fn start(targets: Targets, clock: Clock) -> anyhow::Result<Monitor> {
        let mut config = RedisLedgerConfig::new(targets.redis_url.clone());
        config.call_timeout = PROBE_MAX;
        config.connect_timeout = PROBE_MAX;
        config.key_prefix = targets.key_prefix.clone();
        let ledger = RedisLedger::connect(config.clone())?;
        let mut redis = RedisConnection::open(&config)?;
        let (stop, mut stopped) = watch::channel(false);
        let latest = Arc::new(Mutex::new(None));
        let shared = latest.clone();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut ticks = tokio::time::interval(TICK);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    _ = stopped.wait_for(|stop| *stop) => return samples,
                }
                let sample = sample(&targets, &ledger, &mut redis, clock).await;
                *shared.lock().unwrap_or_else(|p| p.into_inner()) = Some(sample.clone());
                if samples.len() < SAMPLES_MAX {
                    samples.push(sample);
                }
            }
        });
        Ok(Monitor { stop, latest, task: Some(task) })
    }

    /// The newest sample.
    pub fn latest(&self) -> Option<Sample> {
        self.latest.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub async fn stop(mut self) -> Vec<Sample> {
        self.stop.send_replace(true);
        match self.task.take() {
            Some(task) => task.await.unwrap_or_default(),
            None => Vec::new(),
        }
    }
}

impl Drop for Monitor {
    /// A schedule that failed midway must not leave its monitor polling.
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn sample(targets: &Targets, ledger: &RedisLedger, redis: &mut RedisConnection, clock: Clock) -> Sample {
    let at_ms = clock.now_ms();
    let mut probes = JoinSet::new();
    for (name, addr) in &targets.members {
        let (name, addr, token) = (name.clone(), *addr, targets.cluster_token.clone());
        probes.spawn(async move {
            let status = testkit::http::get_json_with(addr, "/api/state", Some(&token), PROBE_MAX).await.ok();
            (name, Probe::Member(status))
        });
    }
    for (name, addr) in targets.nodes.get() {
        let path = format!("/v1/skus/{}", targets.sku);
        probes.spawn(async move {
            let page = testkit::http::get_json(addr, &path, PROBE_MAX).await.ok();
            (name, Probe::Node(page.and_then(|p| p["local_remaining"].as_u64())))
        });
    }
    // The member that says it leads, in the newest term: a member whose raft stopped keeps
    // saying it leads an old term.
    let mut leader: Option<(u64, String)> = None;
    let mut nodes = None;
    let mut local = BTreeMap::new();
    while let Some(Ok((name, probe))) = probes.join_next().await {
        match probe {
            Probe::Member(Some(status)) if status["leader"].is_u64() && status["leader"] == status["id"] => {
                let term = status["term"].as_u64().unwrap_or(0);
                if leader.as_ref().is_none_or(|(best, _)| term > *best) {
                    leader = Some((term, name));
                    nodes = Some(node_views(&status["applied"]["state"]["fleet"]["nodes"]));
                }
            }
            Probe::Member(_) => {}
            Probe::Node(remaining) => {
                local.insert(name, remaining);
            }
        }
    }
    // After the coordinator's view: see the module docs.
    let ledger_figures = read_figures(targets, ledger).await;
    let sellers = read_sellers(targets, redis).await;
    Sample { at_ms, leader: leader.map(|(_, name)| name), nodes, local, ledger: ledger_figures, sellers }
}

enum Probe {
    Member(Option<serde_json::Value>),
    Node(Option<u64>),
}

fn node_views(nodes: &serde_json::Value) -> BTreeMap<String, NodeView> {
    let Some(nodes) = nodes.as_object() else { return BTreeMap::new() };
    nodes
        .iter()
        .map(|(name, record)| {
            let view = NodeView {
                epoch: record["epoch"].as_u64().unwrap_or(0),
                live: record["live"].as_bool().unwrap_or(false),
                worker_id: record["worker_id"].as_u64(),
            };
            (name.clone(), view)
        })
        .collect()
}

/// The SKU's figures, its stripes' summed; none unless every stripe answered, so a sample's
/// figures are whole (see [`crate::stripes`]).
async fn read_figures(targets: &Targets, ledger: &RedisLedger) -> Option<LedgerFigures> {
    let mut statuses = Vec::with_capacity(targets.ledgers.len());
    for stripe in &targets.ledgers {
        statuses.push(ledger.status(stripe).await.ok()?);
    }
    crate::stripes::combine(&statuses).map(|s| LedgerFigures {
        total: s.total,
        sold: s.sold,
        remaining: s.remaining,
        released: s.released,
        transferred_out: s.transferred_out,
        transferred_in: s.transferred_in,
    })
}

/// The per-seller books of every ledger of the SKU, merged (see [`crate::stripes::merge_sellers`]);
/// none unless every one answered.
pub async fn read_sellers(targets: &Targets, redis: &mut RedisConnection) -> Option<BTreeMap<String, u64>> {
    let mut books = Vec::with_capacity(targets.ledgers.len());
    for stripe in &targets.ledgers {
        books.push(read_seller_book(&targets.key_prefix, stripe, redis).await?);
    }
    Some(crate::stripes::merge_sellers(books))
}

/// One ledger's per-seller books (see the module docs), or none if Redis did not answer in time.
/// The connection reconnects on its own (and, under Sentinel, asks for the master again).
pub async fn read_seller_book(
    key_prefix: &str,
    stripe: &SkuId,
    redis: &mut RedisConnection,
) -> Option<BTreeMap<String, u64>> {
    let key = format!("{key_prefix}:{{{stripe}}}:by_epoch");
    let read = tokio::time::timeout(PROBE_MAX, redis::cmd("HGETALL").arg(&key).query_async(redis)).await;
    match read {
        Ok(Ok(sellers)) => Some(sellers),
        _ => None,
    }
}

/// Units the nodes at `addrs` hold of `sku`, from their stock pages (a node that does not answer
/// holds none): the sale is open everywhere once they hold the whole stock.
pub(crate) async fn stock_held(addrs: impl IntoIterator<Item = std::net::SocketAddr>, sku: &str) -> u64 {
    let mut held = 0;
    for addr in addrs {
        let page = testkit::http::get_json(addr, &format!("/v1/skus/{sku}"), Duration::from_secs(1)).await;
        held += page.ok().and_then(|p| p["local_remaining"].as_u64()).unwrap_or(0);
    }
    held
}
