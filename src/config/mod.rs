//! `cluster.toml`: the whole cluster in one file. Parsing is strict (unknown keys are errors, so
//! a typo cannot silently fall back to a default) and every error names the key and the reason.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

pub mod address;
mod auth;
mod coordinator;
mod credentials;
mod ledger;
mod load_balancer;
mod node;
mod orders;
mod payments;
mod safeguards;
mod skus;
pub mod source;
mod telemetry;

use ::node::{Mode, NodeConfig, SkuConfig};
use protocol::NodeId;
use serde::Deserialize;

pub use self::auth::AuthSection;
use self::coordinator::validate_coordinator;
pub use self::coordinator::{
    CoordinatorSection, MemberEntry, ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ACCEPT_ENV, CLUSTER_TOKEN_ENV,
};
pub use self::credentials::{credentials_of, with_password, POSTGRES_PASSWORD_ENV, REDIS_PASSWORD_ENV};
pub use self::ledger::{LedgerSection, ORDER_OUTAGE_SURVIVED_MIN_S, REPLICA_TIMEOUT_MS_DEFAULT};
pub use self::load_balancer::LoadBalancerSection;
use self::node::NodeSections;
pub use self::node::{NodeEntry, NodePlace, NodeSection};
pub use self::orders::{payment_secret, OrdersSection, PAYMENT_SECRET_ENV};
pub use self::payments::PaymentsSection;
pub use self::safeguards::{AutoBanSection, LimitsSection, LockoutEntry, RateEntry, Safeguards, SafeguardsSection};
pub use self::skus::{allotments, SkuEntry};
pub use self::telemetry::{TelemetrySection, SAMPLE_RATIO_DEFAULT};
pub use protocol::Buffer;

/// Where a node that joins at run time listens unless told: every interface, the port the
/// image and the docs use for nodes.
pub const JOINING_NODE_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8080);

/// The repository's `cluster.toml`, built in so `seckill up` works with no file at hand.
pub const DEFAULT_CLUSTER_TOML: &str = include_str!("../../cluster.toml");

/// A problem in the config: which key, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError { key: key.into(), reason: reason.into() }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `allotment` (the design) or `redis-only` (the baseline: every purchase is a ledger call).
    #[serde(default)]
    pub mode: ModeName,
    #[serde(default)]
    pub ledger: LedgerSection,
    #[serde(default)]
    pub node_settings: NodeSection,
    /// The nodes known in advance; more may join at run time through the coordinator.
    #[serde(default)]
    pub nodes: Vec<NodeEntry>,
    /// May be empty when SKUs are created through the admin API.
    #[serde(default)]
    pub skus: Vec<SkuEntry>,
    /// Absent: nodes sell their configured allotment with no leases and nothing reallocates.
    pub coordinator: Option<CoordinatorSection>,
    #[serde(default)]
    pub safeguards: SafeguardsSection,
    #[serde(default)]
    pub load_balancer: LoadBalancerSection,
    #[serde(default)]
    pub orders: OrdersSection,
    /// The payment provider; absent: payments are only notified.
    #[serde(default)]
    pub payments: PaymentsSection,
    /// Who the buyer is; absent: `mode = "none"`.
    #[serde(default)]
    pub auth: AuthSection,
    /// The rules of every SKU set `waiting_room = true`; a SKU may give its own table instead.
    #[serde(default)]
    pub waiting_room: protocol::RoomRules,
    /// Traces over OTLP; absent: the standard `OTEL_*` variables decide, off by default.
    #[serde(default)]
    pub telemetry: TelemetrySection,
}

/// `mode`: how purchases are decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeName {
    /// The design: a local allotment first, the ledger for local winners.
    #[default]
    Allotment,
    /// The baseline: every purchase is one ledger call.
    RedisOnly,
}

impl From<ModeName> for Mode {
    fn from(name: ModeName) -> Mode {
        match name {
            ModeName::Allotment => Mode::Allotment,
            ModeName::RedisOnly => Mode::LedgerOnly,
        }
    }
}

/// A validated cluster, ready to start.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub mode: Mode,
    pub ledger: LedgerSection,
    /// The listed nodes, each with its settings and place.
    pub nodes: Vec<(NodeConfig, NodePlace)>,
    /// The settings of a node that joins at run time, before its id is set
    /// ([`Cluster::node_config`]).
    pub node_template: NodeConfig,
    pub skus: Vec<SkuEntry>,
    pub coordinator: Option<::coordinator::CoordinatorConfig>,
    pub safeguards: Safeguards,
    pub load_balancer: LoadBalancerSection,
    pub orders: OrdersSection,
    pub payments: PaymentsSection,
    /// `[auth]`, validated; the secrets are read when a process builds its authenticator.
    pub auth: ::auth::Settings,
    pub telemetry: TelemetrySection,
}

impl Cluster {
    /// Reads and validates a config file, then gives its URLs the passwords of the
    /// environment ([`REDIS_PASSWORD_ENV`], [`POSTGRES_PASSWORD_ENV`]). Not [`Cluster::parse`]:
    /// the dev commands parse texts naming private servers of their own, which the operator's
    /// passwords are not for.
    pub fn load(path: &Path) -> Result<Cluster, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid(path.display().to_string(), format!("cannot read: {e}")))?;
        let mut cluster = Self::parse(&text)?;
        credentials::apply_env(&mut cluster.ledger.url, &mut cluster.orders.store)?;
        Ok(cluster)
    }

    pub fn parse(text: &str) -> Result<Cluster, ConfigError> {
        let raw: ClusterConfig = toml::from_str(text).map_err(|e| {
            let key = e.span().map_or_else(|| "cluster.toml".into(), |span| key_at(text, span.start));
            invalid(key, e.message().to_string())
        })?;
        raw.validate()
    }

    /// The SKU settings node `node` starts with, allotment included.
    pub fn sku_configs_for(&self, node: &NodeId) -> Vec<SkuConfig> {
        let nodes = self.node_ids();
        self.skus
            .iter()
            .map(|sku| {
                let allotment = allotments(sku, &nodes).get(node).copied().unwrap_or(0);
                SkuConfig::new(sku.id.clone(), sku.terms.clone(), allotment)
            })
            .collect()
    }

    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|(node, _)| node.id.clone()).collect()
    }

    /// Node `id`'s settings and place: its `[[nodes]]` entry if it has one, else the settings
    /// every node shares, for a node that joins at run time (which needs a coordinator to lease
    /// it a worker id and grant it stock). `listen` and `advertise` from the command line
    /// override the entry's.
    pub fn node_config(
        &self,
        id: &NodeId,
        listen: Option<SocketAddr>,
        advertise: Option<&str>,
    ) -> Result<(NodeConfig, NodePlace), ConfigError> {
        let (config, mut place) = match self.nodes.iter().find(|(node, _)| node.id == *id) {
            Some((config, place)) => (config.clone(), place.clone()),
            None if self.coordinator.is_none() => {
                return Err(invalid(
                    "nodes",
                    format!("{id} is not in [[nodes]], and without a [coordinator] no node joins at run time"),
                ))
            }
            None => {
                let listen = listen.unwrap_or(JOINING_NODE_LISTEN);
                (NodeConfig { id: id.clone(), ..self.node_template.clone() }, NodePlace { listen, advertise: None })
            }
        };
        if let Some(listen) = listen {
            place.listen = listen;
        }
        if let Some(advertise) = advertise {
            place.advertise = Some(address::host_port("--advertise", advertise)?);
        }
        Ok((config, place))
    }

    /// What the coordinator plans for each SKU: its terms and every node's starting allotment.
    /// A striped SKU is one plan per stripe (`SkuTerms::stripe_terms`), stripe 0 first: the
    /// coordinator creates each stripe's ledger and defines it as a SKU of its own.
    pub fn sku_plans(&self) -> Vec<::coordinator::SkuPlan> {
        let nodes = self.node_ids();
        self.skus
            .iter()
            .flat_map(|sku| {
                (0..).zip(sku.terms.stripe_terms()).map(|(index, terms)| {
                    let stripe = SkuEntry { terms, ..sku.clone() };
                    ::coordinator::SkuPlan {
                        sku: sku.id.stripe(index),
                        starting: allotments(&stripe, &nodes),
                        terms: stripe.terms,
                    }
                })
            })
            .collect()
    }
}

/// The key a parse error at `offset` of `text` is about, as `section.key (line N)`: the key on
/// that line under the nearest table header above it.
fn key_at(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line_number = before.lines().count().max(1);
    let line = text.lines().nth(line_number - 1).unwrap_or_default();
    let section = before
        .lines()
        .rev()
        .skip(1)
        .map(str::trim)
        .find(|line| line.starts_with('['))
        .map(|header| header.trim_matches(|c| c == '[' || c == ']').trim());
    match (line.split_once('=').map(|(key, _)| key.trim()), section) {
        (Some(key), Some(section)) => format!("{section}.{key} (line {line_number})"),
        (Some(key), None) => format!("{key} (line {line_number})"),
        (None, _) => format!("line {line_number}"),
    }
}

/// The key every node checks waiting-room tickets with, since each must check the tickets every
/// other signs: under a coordinator it comes from the cluster token they all share; without one,
/// this process's nodes share a key of its own (a fleet of separate processes needs a
/// coordinator for rooms).
fn ticket_key(coordinator: Option<&::coordinator::CoordinatorConfig>) -> ::node::TicketKey {
    match coordinator {
        Some(group) => ::node::TicketKey::derive(group.cluster.token().expose().as_bytes()),
        None => ::node::TicketKey::random(),
    }
}

impl ClusterConfig {
    fn validate(mut self) -> Result<Cluster, ConfigError> {
        if let Err(broken) = self.waiting_room.validate() {
            return Err(invalid(format!("waiting_room.{}", broken.field), broken.reason));
        }
        for sku in self.skus.iter_mut().filter(|sku| sku.room_from_fleet) {
            sku.terms.waiting_room = Some(self.waiting_room.clone());
        }
        let mode = self.mode.into();
        if mode == Mode::LedgerOnly && self.ledger.url == "embedded" {
            return Err(invalid("mode", "\"redis-only\" is the Redis baseline and needs ledger.url = \"redis://…\""));
        }
        self.ledger.validate()?;
        self.node_settings.validate(&self.ledger)?;
        let places = self.node_places()?;
        self.validate_skus()?;
        self.load_balancer.validate()?;
        // nginx's own addresses are proxies whose X-Forwarded-For names the buyer.
        self.safeguards.trusted_proxies.extend(self.load_balancer.addresses.iter().cloned());
        let safeguards = self.safeguards.validate(&self.ledger)?;
        self.orders.validate()?;
        let orders_at = self.orders.reached_at();
        self.payments.validate(orders_at.as_deref())?;
        let coordinator =
            self.coordinator.as_ref().map(|section| validate_coordinator(section, orders_at)).transpose()?;
        if coordinator.is_none() && self.nodes.is_empty() {
            return Err(invalid(
                "nodes",
                "at least one node is needed without a [coordinator] (nodes join through one)",
            ));
        }
        let auth = self.auth.validate()?;
        self.telemetry.validate()?;
        if self
            .orders
            .listen
            .is_some_and(|listen| listen.port() != 0 && places.iter().any(|place| place.listen == listen))
        {
            return Err(invalid("orders.listen", "is used by a node"));
        }
        let settings = NodeSections {
            mode,
            settings: &self.node_settings,
            ledger: &self.ledger,
            safeguards: &safeguards,
            ticket_key: ticket_key(coordinator.as_ref()),
        };
        let node_template = NodeConfig::from(settings);
        let nodes = self
            .nodes
            .iter()
            .zip(places)
            .enumerate()
            .map(|(at, (entry, place))| {
                let config = NodeConfig { id: entry.id.clone(), worker_id: at as u16, ..node_template.clone() };
                (config, place)
            })
            .collect();
        Ok(Cluster {
            mode,
            ledger: self.ledger,
            nodes,
            node_template,
            skus: self.skus,
            coordinator,
            safeguards,
            load_balancer: self.load_balancer,
            orders: self.orders,
            payments: self.payments,
            auth,
            telemetry: self.telemetry,
        })
    }

    /// Each listed node's place, every id and listen address unique.
    fn node_places(&self) -> Result<Vec<NodePlace>, ConfigError> {
        if self.nodes.len() > usize::from(::safeguards::WORKER_IDS_MAX) {
            return Err(invalid("nodes", "at most 1024 nodes: each needs its own order-id worker id"));
        }
        let mut ids = HashSet::new();
        let mut addresses = HashSet::new();
        let mut places = Vec::with_capacity(self.nodes.len());
        for (at, node) in self.nodes.iter().enumerate() {
            if !ids.insert(node.id.clone()) {
                return Err(invalid(format!("nodes[{at}].id"), format!("{} appears twice", node.id)));
            }
            if node.listen.port() != 0 && !addresses.insert(node.listen) {
                return Err(invalid(format!("nodes[{at}].listen"), format!("{} is used by another node", node.listen)));
            }
            let advertise = node
                .advertise
                .as_deref()
                .map(|text| address::host_port(&format!("nodes[{at}].advertise"), text))
                .transpose()?;
            places.push(NodePlace { listen: node.listen, advertise });
        }
        Ok(places)
    }

    fn validate_skus(&self) -> Result<(), ConfigError> {
        let ids: HashSet<&NodeId> = self.nodes.iter().map(|node| &node.id).collect();
        let mut skus = HashSet::new();
        for (at, sku) in self.skus.iter().enumerate() {
            let key = |field: &str| format!("skus[{at}].{field}");
            if !skus.insert(sku.id.clone()) {
                return Err(invalid(key("id"), format!("{} appears twice", sku.id)));
            }
            self.check_sale_records_outlive(at, sku)?;
            if let Err(invalid_terms) = sku.terms.validate() {
                return Err(invalid(key(invalid_terms.field), invalid_terms.reason));
            }
            for name in sku.weights.keys().chain(sku.node_buffers.keys()) {
                if !ids.contains(name) {
                    return Err(invalid(key("weights"), format!("names node {name}, which is not in [[nodes]]")));
                }
            }
            if !self.nodes.is_empty() && self.nodes.iter().all(|node| sku.weights.get(&node.id) == Some(&0)) {
                return Err(invalid(key("weights"), "every node has weight 0, so nobody could sell"));
            }
        }
        Ok(())
    }

    /// A started payment stretches an order's life past its pay timeout by the grace and the
    /// queries ([payments]); its release must still find the sale's record.
    fn check_sale_records_outlive(&self, at: usize, sku: &SkuEntry) -> Result<(), ConfigError> {
        let longest_life = sku.terms.pay_timeout_s.saturating_add(self.payments.deadline_stretch_s());
        let outage_survived = self.ledger.sale_record_ttl_s.saturating_sub(longest_life);
        if outage_survived >= ORDER_OUTAGE_SURVIVED_MIN_S {
            return Ok(());
        }
        Err(invalid(
            "ledger.sale_record_ttl_s",
            format!(
                "{} s leaves {outage_survived} s beyond skus[{at}].pay_timeout_s = {} (plus [payments] \
                 pay_grace_s + query_limit_s = {} s): an unpaid order must still be releasable after its \
                 pay timeout plus an order-service outage of at least {} s",
                self.ledger.sale_record_ttl_s,
                sku.terms.pay_timeout_s,
                self.payments.deadline_stretch_s(),
                ORDER_OUTAGE_SURVIVED_MIN_S
            ),
        ))
    }
}

#[cfg(test)]
mod tests;
