//! What a fleet writes and binds before any process starts: each process's config, a node's
//! proxies, and libfaketime for a skewed clock.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::redis::LedgerServers;
use super::{FleetSpec, NodeLinks, Process, Role, BUYER_AUDIENCE, BUYER_ISSUER, BUYER_SECRET_ENV};
use crate::proxy::{Proxy, ProxyOptions};

/// Tries at a proxy port whose address is as long as the upstream's (rewrites keep lengths).
const PROXY_PORT_TRIES_MAX: usize = 50;

/// What every config of one fleet shares; each process's own differs in the ledger URL, the
/// members it names and its order consumer.
pub(super) struct Configs<'a> {
    pub(super) spec: &'a FleetSpec,
    /// The real ledger URL, which every config names but a proxied node's on a single Redis.
    pub(super) ledger_url: String,
    pub(super) nodes: &'a [(String, SocketAddr)],
    pub(super) dir: &'a Path,
    /// The order store's URL, when the fleet runs the order service.
    pub(super) store: Option<String>,
    pub(super) orders_api: Option<SocketAddr>,
}

impl Configs<'_> {
    /// See [`config_text`].
    pub(super) fn text(&self, ledger: &str, members: &[(String, SocketAddr)], consumer: &str) -> String {
        let orders = self.store.as_deref().map(|store| (store, consumer));
        config_text(self.spec, ledger, members, self.nodes, self.dir, orders, self.orders_api)
    }
}

/// Adds every node to `processes`; with proxies, starts each node's and writes its `nN.toml`,
/// and returns the proxies by node.
pub(super) async fn add_nodes(
    configs: &Configs<'_>,
    redis: &LedgerServers,
    members: &[(String, SocketAddr)],
    shared: &Path,
    processes: &mut BTreeMap<String, Process>,
) -> anyhow::Result<BTreeMap<String, NodeLinks>> {
    let mut links = BTreeMap::new();
    for (name, addr) in configs.nodes {
        let mut config = shared.to_path_buf();
        if configs.spec.proxied {
            let redis_addr = match redis {
                LedgerServers::Single(server) => Some(loopback(server.port)),
                LedgerServers::Sentinel { .. } | LedgerServers::Cluster(_) => None,
            };
            let node_links = node_links(redis_addr, members).await?;
            let via: Vec<(String, SocketAddr)> =
                node_links.members.iter().map(|(member, proxy)| (member.clone(), proxy.addr())).collect();
            config = configs.dir.join(format!("{name}.toml"));
            let ledger = match &node_links.redis {
                Some(proxy) => format!("redis://{}", proxy.addr()),
                None => configs.ledger_url.clone(),
            };
            std::fs::write(&config, configs.text(&ledger, &via, "fleet"))?;
            links.insert(name.clone(), node_links);
        }
        let process = Process::new(Role::Node, *addr, config, configs.dir.join(format!("{name}.log")));
        processes.insert(name.clone(), process);
    }
    Ok(links)
}

/// Adds the order services `o1`… to `processes`, each listening on its entry of `order_apis`
/// and, with a sandbox at `paysim`, paying through it; writes each one's `oN.toml`.
pub(super) fn add_orders(
    configs: &Configs<'_>,
    members: &[(String, SocketAddr)],
    order_apis: &[SocketAddr],
    paysim: Option<SocketAddr>,
    processes: &mut BTreeMap<String, Process>,
) -> anyhow::Result<()> {
    let spec = configs.spec;
    let skewed = spec.orders_clock_skew_s.iter().take(spec.orders).any(|skew| *skew != 0);
    let faketime = if skewed { Some(libfaketime()?) } else { None };
    for (at, listen) in (1..=spec.orders).zip(order_apis.iter().copied()) {
        let name = format!("o{at}");
        let config = configs.dir.join(format!("{name}.toml"));
        let mut text = configs.text(&configs.ledger_url, members, &name);
        if let Some(paysim) = paysim {
            text.push_str(&format!(
                "\n[payments]\nprovider = \"sandbox\"\nurl = \"http://{paysim}\"\n{}\n",
                spec.payments_toml
            ));
            text = text.replace("\n[orders]\n", &format!("\n[orders]\nlisten = \"{listen}\"\n"));
        }
        std::fs::write(&config, text)?;
        let mut process = Process::new(Role::Orders, listen, config, configs.dir.join(format!("{name}.log")));
        let skew = spec.orders_clock_skew_s.get(at - 1).copied().unwrap_or(0);
        process.skew = faketime.clone().filter(|_| skew != 0).map(|lib| (lib, skew));
        processes.insert(name, process);
    }
    Ok(())
}

/// Where Debian's libfaketime lives (`/usr/lib/<arch>/faketime/`), or an error naming the
/// package: a skewed clock is never silently a true one.
fn libfaketime() -> anyhow::Result<PathBuf> {
    let mut dirs = vec![PathBuf::from("/usr/lib/faketime")];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        dirs.extend(entries.filter_map(Result::ok).map(|entry| entry.path().join("faketime")));
    }
    dirs.into_iter().map(|dir| dir.join("libfaketime.so.1")).find(|lib| lib.is_file()).context(
        "a skewed clock needs libfaketime.so.1, which Debian's faketime package installs \
         (scripts/test installs it): apt-get install faketime",
    )
}

pub(super) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A config in which `ledger` is the Redis URL and `members` the coordinator's; with
/// `orders`, an `[orders]` section on that store under that consumer name.
fn config_text(
    spec: &FleetSpec,
    ledger: &str,
    members: &[(String, SocketAddr)],
    nodes: &[(String, SocketAddr)],
    dir: &Path,
    orders: Option<(&str, &str)>,
    orders_api: Option<SocketAddr>,
) -> String {
    let mut text = format!("[ledger]\nurl = \"{ledger}\"\n");
    if spec.redis.replicated() {
        text.push_str("durability = \"replica\"\nreplicas = 1\n");
    }
    text.push_str(&format!("{}\n", spec.ledger_toml));
    let mut settings = spec.node_settings_toml.clone();
    if spec.order_ids {
        settings.push_str(&format!("\norder_ids_dir = {:?}\n", dir.join("order-ids")));
    }
    if !settings.is_empty() {
        text.push_str(&format!("\n[node_settings]\n{settings}\n"));
    }
    text.push_str(&format!("\n{}\n", spec.skus_toml));
    if !members.is_empty() {
        let entries: Vec<String> =
            members.iter().map(|(name, addr)| format!("{{ name = \"{name}\", listen = \"{addr}\" }}")).collect();
        // Before the spec's keys, which may open a sub-table.
        let orders_api = orders_api.map(|api| format!("orders_api = \"{api}\"\n")).unwrap_or_default();
        text.push_str(&format!(
            "\n[coordinator]\nmembers = [{}]\ndata_dir = {:?}\ncluster_token = {:?}\n{orders_api}{}\n",
            entries.join(", "),
            dir.join("raft"),
            spec.cluster_token,
            spec.coordinator_toml
        ));
    }
    for (name, addr) in nodes {
        text.push_str(&format!("\n[[nodes]]\nid = \"{name}\"\nlisten = \"{addr}\"\n"));
    }
    if let Some((store, consumer)) = orders {
        text.push_str(&format!("\n[orders]\nstore = {store:?}\nconsumer = {consumer:?}\n{}\n", spec.orders_toml));
    }
    if spec.buyer_secret.is_some() {
        text.push_str(&format!(
            "\n[auth]\nmode = \"jwt\"\nhs256_secret_env = \"{BUYER_SECRET_ENV}\"\nissuer = \"{BUYER_ISSUER}\"\naudience = \"{BUYER_AUDIENCE}\"\n"
        ));
    }
    text
}

/// One node's proxies: to Redis (if it has one address), and to each member with the
/// leader-hint rewrites. The rewrites name the proxies' own addresses, so the listeners are
/// bound first.
async fn node_links(redis: Option<SocketAddr>, members: &[(String, SocketAddr)]) -> anyhow::Result<NodeLinks> {
    let redis = match redis {
        Some(addr) => Some(Proxy::start(addr).await?),
        None => None,
    };
    let mut listeners = Vec::with_capacity(members.len());
    for (_, real) in members {
        listeners.push(same_length_listener(*real).await?);
    }
    let mut rewrites = Vec::with_capacity(members.len());
    for ((_, real), listener) in members.iter().zip(&listeners) {
        rewrites.push((real.to_string().into_bytes(), listener.local_addr()?.to_string().into_bytes()));
    }
    let mut proxies = BTreeMap::new();
    for ((name, real), listener) in members.iter().zip(listeners) {
        let options = ProxyOptions { rewrites: rewrites.clone(), ..ProxyOptions::default() };
        proxies.insert(name.clone(), Proxy::on(listener, *real, options)?);
    }
    Ok(NodeLinks { redis, members: proxies })
}

/// A loopback listener whose address is as long, as text, as `upstream`'s.
async fn same_length_listener(upstream: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let want = upstream.to_string().len();
    for _ in 0..PROXY_PORT_TRIES_MAX {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        if listener.local_addr()?.to_string().len() == want {
            return Ok(listener);
        }
    }
    anyhow::bail!("no loopback port as long as {upstream}'s after {PROXY_PORT_TRIES_MAX} tries")
}
