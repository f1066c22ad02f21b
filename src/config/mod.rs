//! `cluster.toml`: the whole cluster in one file. Parsing is strict (unknown keys are errors, so
//! a typo cannot silently fall back to a default) and every error names the key and the reason.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

mod auth;
mod coordinator;
mod credentials;
mod orders;
mod payments;
mod safeguards;
mod skus;
pub mod source;

use ::safeguards::connections::ConnectionsPerAddress;
use node::{BreakerSettings, HttpLimits, Mode, NodeConfig, SkuConfig};
use protocol::NodeId;
use serde::Deserialize;

pub use self::auth::AuthSection;
use self::coordinator::validate_coordinator;
pub use self::coordinator::{
    CoordinatorSection, MemberEntry, ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ACCEPT_ENV, CLUSTER_TOKEN_ENV,
};
pub use self::credentials::{credentials_of, with_password, POSTGRES_PASSWORD_ENV, REDIS_PASSWORD_ENV};
pub use self::orders::{OrdersSection, PAYMENT_SECRET_ENV};
pub use self::payments::PaymentsSection;
pub use self::safeguards::{AutoBanSection, LimitsSection, LockoutEntry, RateEntry, Safeguards, SafeguardsSection};
pub use self::skus::{allotments, SkuEntry};
pub use protocol::Buffer;

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
    #[serde(default = "default_mode")]
    pub mode: String,
    #[serde(default)]
    pub ledger: LedgerSection,
    #[serde(default)]
    pub node_settings: NodeSection,
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
}

/// `[load_balancer]`: what the generated nginx config does before a request reaches a node.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoadBalancerSection {
    /// Requests per second one client address may send through nginx (`limit_req`), the first
    /// and cheapest layer against a flood; 0 (the default) turns it off. Off by default because
    /// load tests, like a crowd behind one NAT, come from a few addresses.
    pub rate_per_address: u32,
    /// Requests above the rate let through at once before nginx answers 429.
    pub burst_per_address: u32,
}

fn default_mode() -> String {
    "allotment".into()
}

/// `[ledger]`. Its `Debug` hides the URL's password.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerSection {
    /// `embedded`, a `redis://` URL, `redis+cluster://host:port,host:port,…` naming seed
    /// nodes of a Redis Cluster, or `redis+sentinel://host:port,host:port,…/master-name`
    /// naming the sentinels that watch a master.
    pub url: String,
    pub connections: usize,
    pub call_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub idempotency_ttl_s: u64,
    /// How long the ledger keeps each sale's record, against which an unpaid order's release is
    /// checked: a SKU's pay timeout plus the longest order-service outage the fleet survives
    /// with every unpaid unit still coming back (at least [`ORDER_OUTAGE_SURVIVED_MIN_S`]).
    pub sale_record_ttl_s: u64,
    pub key_prefix: String,
    /// Submit tokens one SKU issues per token TTL; bounds their memory in Redis (see
    /// `ledger::TOKEN_ISSUE_MAX_DEFAULT`).
    pub token_issue_max: u64,
    /// `none`, `fsync` or `replica`: what a decision has survived when the buyer hears it
    /// (`ledger::Durability` says exactly).
    pub durability: String,
    /// `durability = "replica"`: replicas that must acknowledge every write (default 1).
    pub replicas: Option<u32>,
    /// `durability = "replica"`: longest the ledger waits for them, per write (default
    /// [`REPLICA_TIMEOUT_MS_DEFAULT`]); below `call_timeout_ms`, which covers write and wait.
    pub replica_timeout_ms: Option<u64>,
}

/// The shortest order-service outage a config must let the fleet survive: `sale_record_ttl_s`
/// is refused below every SKU's `pay_timeout_s` plus this.
pub const ORDER_OUTAGE_SURVIVED_MIN_S: u64 = 60 * 60;

/// How long a write waits for its replicas by default: a replica on the same network
/// acknowledges within a millisecond or two, so 100 ms means it is lagging or gone, and leaves
/// room within the default 500 ms call timeout for the write itself.
pub const REPLICA_TIMEOUT_MS_DEFAULT: u64 = 100;

impl LedgerSection {
    /// The durability the section names; `validate` has checked it.
    pub fn durability(&self) -> Result<ledger::Durability, ConfigError> {
        let set_without_replica = self.replicas.is_some() || self.replica_timeout_ms.is_some();
        match self.durability.as_str() {
            "none" | "fsync" if set_without_replica => {
                Err(invalid("ledger.replicas", "replicas and replica_timeout_ms need durability = \"replica\""))
            }
            "none" => Ok(ledger::Durability::None),
            "fsync" => Ok(ledger::Durability::Fsync),
            "replica" => {
                let replicas = self.replicas.unwrap_or(1);
                let timeout_ms = self.replica_timeout_ms.unwrap_or(REPLICA_TIMEOUT_MS_DEFAULT);
                if replicas == 0 {
                    return Err(invalid(
                        "ledger.replicas",
                        "must be at least 1 (durability = \"none\" waits for none)",
                    ));
                }
                if timeout_ms == 0 || timeout_ms >= self.call_timeout_ms {
                    return Err(invalid(
                        "ledger.replica_timeout_ms",
                        "must be above zero and below call_timeout_ms, which covers the write and its wait",
                    ));
                }
                Ok(ledger::Durability::Replica { replicas, timeout: Duration::from_millis(timeout_ms) })
            }
            other => Err(invalid("ledger.durability", format!("{other:?} is not \"none\", \"fsync\" or \"replica\""))),
        }
    }
}

impl std::fmt::Debug for LedgerSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerSection")
            .field("url", &ledger::redact_url(&self.url))
            .field("connections", &self.connections)
            .field("call_timeout_ms", &self.call_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("idempotency_ttl_s", &self.idempotency_ttl_s)
            .field("sale_record_ttl_s", &self.sale_record_ttl_s)
            .field("key_prefix", &self.key_prefix)
            .field("token_issue_max", &self.token_issue_max)
            .field("durability", &self.durability)
            .field("replicas", &self.replicas)
            .field("replica_timeout_ms", &self.replica_timeout_ms)
            .finish()
    }
}

impl Default for LedgerSection {
    fn default() -> Self {
        let redis = ledger::RedisLedgerConfig::new("embedded");
        Self {
            url: "embedded".into(),
            connections: redis.connections,
            call_timeout_ms: redis.call_timeout.as_millis() as u64,
            connect_timeout_ms: redis.connect_timeout.as_millis() as u64,
            idempotency_ttl_s: redis.idempotency_ttl.as_secs(),
            sale_record_ttl_s: redis.sale_record_ttl.as_secs(),
            key_prefix: redis.key_prefix,
            token_issue_max: redis.token_issue_max,
            durability: redis.durability.name().into(),
            replicas: None,
            replica_timeout_ms: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSection {
    pub confirm_timeout_ms: u64,
    pub confirm_queue_max: usize,
    pub status_refresh_ms: u64,
    pub body_bytes_max: usize,
    pub connections_max: usize,
    /// Open connections per client address (IPv6: per `[safeguards] ipv6_prefix` block); 0 = no
    /// bound. Loopback and `[safeguards] trusted_proxies` are exempt.
    pub connections_per_address: usize,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub write_timeout_ms: u64,
    /// Where each node keeps its order-id high-water files; absent: the ledger numbers orders.
    pub order_ids_dir: Option<std::path::PathBuf>,
    /// Consecutive failed ledger calls after which a node's circuit breaker opens.
    pub breaker_failures_max: u32,
    /// How long an open breaker answers 503 at once before it lets one probe through.
    pub breaker_cool_down_ms: u64,
}

impl Default for NodeSection {
    fn default() -> Self {
        let node = NodeConfig::new(NodeId::new("defaults").expect("valid id"));
        Self {
            confirm_timeout_ms: node.confirm_timeout.as_millis() as u64,
            confirm_queue_max: node.confirm_queue_max,
            status_refresh_ms: node.status_refresh.as_millis() as u64,
            body_bytes_max: node.http.body_bytes_max,
            connections_max: node.http.connections_max,
            connections_per_address: node.http.connections_per_address.max,
            header_timeout_ms: node.http.header_timeout.as_millis() as u64,
            body_timeout_ms: node.http.body_timeout.as_millis() as u64,
            write_timeout_ms: node.http.write_timeout.as_millis() as u64,
            order_ids_dir: None,
            breaker_failures_max: node.breaker.failures_max,
            breaker_cool_down_ms: node.breaker.cool_down.as_millis() as u64,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub id: NodeId,
    pub listen: SocketAddr,
}

/// A validated cluster, ready to start.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub mode: Mode,
    pub ledger: LedgerSection,
    pub nodes: Vec<(NodeConfig, SocketAddr)>,
    pub skus: Vec<SkuEntry>,
    pub coordinator: Option<::coordinator::CoordinatorConfig>,
    pub safeguards: Safeguards,
    pub load_balancer: LoadBalancerSection,
    pub orders: OrdersSection,
    pub payments: PaymentsSection,
    /// `[auth]`, validated; the secrets are read when a process builds its authenticator.
    pub auth: ::auth::Settings,
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
        credentials::apply_env(&mut cluster.ledger.url, &mut cluster.orders.store);
        Ok(cluster)
    }

    pub fn parse(text: &str) -> Result<Cluster, ConfigError> {
        let raw: ClusterConfig = toml::from_str(text).map_err(|e| {
            let key = e
                .span()
                .map(|span| text[..span.start].lines().count().to_string())
                .map(|line| format!("line {line}"))
                .unwrap_or_else(|| "cluster.toml".into());
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

impl ClusterConfig {
    fn validate(mut self) -> Result<Cluster, ConfigError> {
        if let Err(broken) = self.waiting_room.validate() {
            return Err(invalid(format!("waiting_room.{}", broken.field), broken.reason));
        }
        for sku in self.skus.iter_mut().filter(|sku| sku.room_from_fleet) {
            sku.terms.waiting_room = Some(self.waiting_room.clone());
        }
        let mode = match self.mode.as_str() {
            "allotment" => Mode::Allotment,
            "redis-only" => Mode::LedgerOnly,
            other => return Err(invalid("mode", format!("{other:?} is not \"allotment\" or \"redis-only\""))),
        };
        if mode == Mode::LedgerOnly && self.ledger.url == "embedded" {
            return Err(invalid("mode", "\"redis-only\" is the Redis baseline and needs ledger.url = \"redis://…\""));
        }
        if self.ledger.url != "embedded" {
            let schemes = ["redis://", ledger::CLUSTER_SCHEME, ledger::SENTINEL_SCHEME];
            if !schemes.iter().any(|scheme| self.ledger.url.starts_with(scheme)) {
                return Err(invalid(
                    "ledger.url",
                    format!(
                        "{:?} is neither \"embedded\", a redis:// URL, a redis+cluster://host:port,host:port URL nor \
                         a redis+sentinel://host:port,host:port/master-name URL",
                        ledger::redact_url(&self.ledger.url)
                    ),
                ));
            }
            ledger::RedisTarget::parse(&self.ledger.url).map_err(|reason| invalid("ledger.url", reason))?;
        }
        if self.ledger.connections == 0 || self.ledger.connections > 64 {
            return Err(invalid("ledger.connections", "must be between 1 and 64"));
        }
        if self.ledger.call_timeout_ms == 0 || self.ledger.connect_timeout_ms == 0 || self.ledger.idempotency_ttl_s == 0
        {
            return Err(invalid("ledger", "timeouts and idempotency_ttl_s must be above zero"));
        }
        if self.ledger.durability()? != ledger::Durability::None && self.ledger.url == "embedded" {
            return Err(invalid(
                "ledger.durability",
                "the embedded ledger lives in process memory; only durability = \"none\" describes it",
            ));
        }
        if self.ledger.token_issue_max == 0 {
            return Err(invalid("ledger.token_issue_max", "must be above zero"));
        }
        let settings = &self.node_settings;
        if settings.confirm_timeout_ms <= self.ledger.call_timeout_ms {
            return Err(invalid(
                "node_settings.confirm_timeout_ms",
                "must exceed ledger.call_timeout_ms, or requests give up before the ledger answers",
            ));
        }
        if settings.confirm_queue_max == 0 || settings.connections_max == 0 || settings.body_bytes_max < 256 {
            return Err(invalid(
                "node_settings",
                "confirm_queue_max and connections_max must be above zero, body_bytes_max at least 256",
            ));
        }
        if settings.breaker_failures_max == 0 || settings.breaker_cool_down_ms == 0 {
            return Err(invalid("node_settings", "breaker_failures_max and breaker_cool_down_ms must be above zero"));
        }
        if self.nodes.is_empty() {
            return Err(invalid("nodes", "at least one node is needed"));
        }
        if self.nodes.len() > usize::from(::safeguards::WORKER_IDS_MAX) {
            return Err(invalid("nodes", "at most 1024 nodes: each needs its own order-id worker id"));
        }
        let mut ids = HashSet::new();
        let mut addresses = HashSet::new();
        for (at, node) in self.nodes.iter().enumerate() {
            if !ids.insert(node.id.clone()) {
                return Err(invalid(format!("nodes[{at}].id"), format!("{} appears twice", node.id)));
            }
            if node.listen.port() != 0 && !addresses.insert(node.listen) {
                return Err(invalid(format!("nodes[{at}].listen"), format!("{} is used by another node", node.listen)));
            }
        }
        let mut skus = HashSet::new();
        for (at, sku) in self.skus.iter().enumerate() {
            let key = |field: &str| format!("skus[{at}].{field}");
            if !skus.insert(sku.id.clone()) {
                return Err(invalid(key("id"), format!("{} appears twice", sku.id)));
            }
            // A started payment stretches an order's life past its pay timeout by the grace and
            // the queries ([payments]); its release must still find the sale's record.
            let longest_life = sku.terms.pay_timeout_s.saturating_add(self.payments.deadline_stretch_s());
            let outage_survived = self.ledger.sale_record_ttl_s.saturating_sub(longest_life);
            if outage_survived < ORDER_OUTAGE_SURVIVED_MIN_S {
                return Err(invalid(
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
                ));
            }
            if let Err(invalid_terms) = sku.terms.validate() {
                return Err(invalid(key(invalid_terms.field), invalid_terms.reason));
            }
            for name in sku.weights.keys().chain(sku.node_buffers.keys()) {
                if !ids.contains(name) {
                    return Err(invalid(key("weights"), format!("names node {name}, which is not in [[nodes]]")));
                }
            }
            if self.nodes.iter().all(|node| sku.weights.get(&node.id) == Some(&0)) {
                return Err(invalid(key("weights"), "every node has weight 0, so nobody could sell"));
            }
        }
        let safeguards = self.safeguards.validate(&self.ledger)?;
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(at, entry)| {
                let mut node = NodeConfig::new(entry.id.clone());
                node.order_ids_dir = settings.order_ids_dir.clone();
                node.worker_id = at as u16;
                node.mode = mode;
                node.confirm_timeout = Duration::from_millis(settings.confirm_timeout_ms);
                node.confirm_queue_max = settings.confirm_queue_max;
                node.status_refresh = Duration::from_millis(settings.status_refresh_ms.max(10));
                node.http = HttpLimits {
                    body_bytes_max: settings.body_bytes_max,
                    connections_max: settings.connections_max,
                    connections_per_address: ConnectionsPerAddress {
                        ipv6_prefix: safeguards.ipv6_prefix,
                        ..ConnectionsPerAddress::new(settings.connections_per_address)
                    },
                    header_timeout: Duration::from_millis(settings.header_timeout_ms.max(1)),
                    body_timeout: Duration::from_millis(settings.body_timeout_ms.max(1)),
                    write_timeout: Duration::from_millis(settings.write_timeout_ms.max(1)),
                };
                node.trusted_proxies = safeguards.trusted_proxies.clone();
                node.idempotency_ttl = Duration::from_secs(self.ledger.idempotency_ttl_s);
                node.breaker = BreakerSettings {
                    failures_max: settings.breaker_failures_max,
                    cool_down: Duration::from_millis(settings.breaker_cool_down_ms),
                };
                (node, entry.listen)
            })
            .collect();
        let orders_listen = self.orders.listen;
        let coordinator =
            self.coordinator.as_ref().map(|section| validate_coordinator(section, orders_listen)).transpose()?;
        // Every node must check the tickets every other node signs: under a coordinator the key
        // comes from the cluster token they all share; without one, this process's nodes share
        // a key of its own (a fleet of separate processes needs a coordinator for rooms).
        let ticket_key = match &coordinator {
            Some(group) => node::TicketKey::derive(group.cluster.token().expose().as_bytes()),
            None => node::TicketKey::random(),
        };
        let mut nodes: Vec<(NodeConfig, SocketAddr)> = nodes;
        for (node, _) in &mut nodes {
            node.ticket_key = Some(ticket_key.clone());
        }
        if self.load_balancer.rate_per_address == 0 && self.load_balancer.burst_per_address > 0 {
            return Err(invalid("load_balancer.burst_per_address", "needs rate_per_address above zero"));
        }
        self.orders.validate()?;
        self.payments.validate(self.orders.listen)?;
        let auth = self.auth.validate()?;
        if self.orders.listen.is_some_and(|listen| listen.port() != 0 && addresses.contains(&listen)) {
            return Err(invalid("orders.listen", "is used by a node"));
        }
        Ok(Cluster {
            mode,
            ledger: self.ledger,
            nodes,
            skus: self.skus,
            coordinator,
            safeguards,
            load_balancer: self.load_balancer,
            orders: self.orders,
            payments: self.payments,
            auth,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [[nodes]]
        id = "n1"
        listen = "127.0.0.1:0"
        [[nodes]]
        id = "n2"
        listen = "127.0.0.1:0"
        [[skus]]
        id = "s"
        total = 101
    "#;

    fn error_of(text: &str) -> String {
        Cluster::parse(text).expect_err("config must be refused").to_string()
    }

    #[test]
    fn the_shipped_cluster_toml_is_valid() {
        let cluster = Cluster::parse(DEFAULT_CLUSTER_TOML).unwrap();
        assert!(!cluster.nodes.is_empty() && !cluster.skus.is_empty());
    }

    #[test]
    fn durability_is_a_known_mode_and_replica_settings_need_replica() {
        let redis = |ledger: &str| format!("[ledger]\nurl = \"redis://127.0.0.1:1\"\n{ledger}\n{MINIMAL}");
        let parsed = Cluster::parse(&redis("durability = \"replica\"\nreplicas = 2")).unwrap();
        assert_eq!(
            parsed.ledger.durability().unwrap(),
            ledger::Durability::Replica { replicas: 2, timeout: Duration::from_millis(REPLICA_TIMEOUT_MS_DEFAULT) }
        );
        assert_eq!(Cluster::parse(&redis("")).unwrap().ledger.durability().unwrap(), ledger::Durability::None);
        assert!(error_of(&redis("durability = \"sync\"")).starts_with("ledger.durability"));
        assert!(error_of(&redis("replicas = 1")).starts_with("ledger.replicas"));
        assert!(error_of(&redis("durability = \"replica\"\nreplicas = 0")).starts_with("ledger.replicas"));
        let slow = "durability = \"replica\"\nreplica_timeout_ms = 500\ncall_timeout_ms = 500";
        assert!(error_of(&redis(slow)).starts_with("ledger.replica_timeout_ms"));
        assert!(error_of(&format!("[ledger]\ndurability = \"fsync\"\n{MINIMAL}")).starts_with("ledger.durability"));
    }

    /// Goal: a config whose sale records would expire before an unpaid order's release is
    /// refused, naming the setting, at the limit too; the pay timeout alone no longer depends on
    /// the idempotency TTL.
    #[test]
    fn sale_records_outlive_every_pay_timeout_by_an_outage() {
        let config = |ledger: &str, pay_timeout_s: u64| {
            format!(
                "[ledger]\n{ledger}\n{}",
                MINIMAL.replace("total = 101", &format!("total = 5\npay_timeout_s = {pay_timeout_s}"))
            )
        };
        let at_limit = config("sale_record_ttl_s = 4500", 900);
        assert_eq!(Cluster::parse(&at_limit).unwrap().ledger.sale_record_ttl_s, 4500);
        let short = error_of(&config("sale_record_ttl_s = 4499", 900));
        assert!(short.starts_with("ledger.sale_record_ttl_s") && short.contains("skus[0].pay_timeout_s"), "{short}");
        let short_idempotency = config("idempotency_ttl_s = 60", 900);
        assert!(Cluster::parse(&short_idempotency).is_ok(), "releases no longer need the idempotency record");
        assert_eq!(Cluster::parse(MINIMAL).unwrap().ledger.sale_record_ttl_s, 172_800);
        // A started payment stretches an order's life by the grace and the queries.
        let payments = "\n[payments]\nprovider = \"sandbox\"\nurl = \"http://127.0.0.1:8095\"\n\
                        callback_url = \"http://127.0.0.1:8090/v1/payments/callback\"\npay_grace_s = 60\nquery_limit_s = 40";
        let stretched = config("sale_record_ttl_s = 4600", 900) + payments;
        assert_eq!(Cluster::parse(&stretched).unwrap().payments.deadline_stretch_s(), 100);
        let short = error_of(&(config("sale_record_ttl_s = 4599", 900) + payments));
        assert!(short.starts_with("ledger.sale_record_ttl_s") && short.contains("query_limit_s"), "{short}");
    }

    /// Goal: `[payments]` names its provider and where it notifies, within bounds, each mistake
    /// refused naming its key.
    #[test]
    fn payments_name_a_known_provider_its_url_and_where_it_notifies() {
        let with = |payments: &str| format!("{MINIMAL}\n[payments]\n{payments}");
        assert!(!Cluster::parse(MINIMAL).unwrap().payments.enabled(), "off unless configured");
        assert!(error_of(&with("provider = \"stripe\"")).starts_with("payments.provider"));
        assert!(error_of(&with("provider = \"sandbox\"")).starts_with("payments.url"));
        assert!(error_of(&with("provider = \"sandbox\"\nurl = \"https://127.0.0.1:1\"")).starts_with("payments.url"));
        let sandbox = "provider = \"sandbox\"\nurl = \"http://127.0.0.1:8095\"";
        assert!(error_of(&with(sandbox)).starts_with("payments.callback_url"), "no [orders] listen, no callback URL");
        let listening = format!("[orders]\nlisten = \"0.0.0.0:8090\"\n{MINIMAL}\n[payments]\n{sandbox}");
        let cluster = Cluster::parse(&listening).unwrap();
        let payments = cluster.payments.payments(cluster.orders.listen).unwrap().expect("a provider");
        assert_eq!(
            payments.callback_url, "http://127.0.0.1:8090/v1/payments/callback",
            "a wildcard is reached on loopback"
        );
        let notified = format!("{sandbox}\ncallback_url = \"http://shop.example/v1/payments/callback\"");
        assert!(Cluster::parse(&with(&notified)).is_ok());
        assert!(error_of(&with(&format!("{notified}\npay_grace_s = 3601"))).starts_with("payments.pay_grace_s"));
        assert!(error_of(&with(&format!("{notified}\nquery_limit_s = 0"))).starts_with("payments.query_limit_s"));
    }

    #[test]
    fn shares_add_up_to_the_total_before_buffers() {
        let mut cluster = Cluster::parse(MINIMAL).unwrap();
        cluster.skus[0].terms.buffer = Buffer::Units(0);
        let split = allotments(&cluster.skus[0], &cluster.node_ids());
        assert_eq!(split.values().sum::<u64>(), 101);
        assert_eq!(split.values().copied().collect::<Vec<_>>(), [51, 50]);
    }

    #[test]
    fn buffers_and_weights_shape_the_allotment() {
        let text = MINIMAL
            .replace("total = 101", "total = 300\nbuffer = \"10%\"\nweights = { n1 = 2 }\nnode_buffers = { n2 = 7 }");
        let cluster = Cluster::parse(&text).unwrap();
        let split = allotments(&cluster.skus[0], &cluster.node_ids());
        let n1 = NodeId::new("n1").unwrap();
        let n2 = NodeId::new("n2").unwrap();
        assert_eq!(split[&n1], 200 + 20, "weight 2 of 3, plus 10% of its share");
        assert_eq!(split[&n2], 100 + 7, "weight 1 of 3, plus its own buffer");
    }

    #[test]
    fn errors_name_the_key_and_the_reason() {
        assert!(error_of(&MINIMAL.replace("total = 101", "total = 0")).starts_with("skus[0].total"));
        assert!(error_of(&MINIMAL.replace("\"n2\"", "\"n1\"")).starts_with("nodes[1].id"));
        assert!(
            error_of(&MINIMAL.replace("total = 101", "total = 5\nbuffer = \"ten\"")).contains("neither a unit count")
        );
        assert!(error_of(&MINIMAL.replace("total = 101", "total = 5\nweights = { n9 = 1 }")).contains("n9"));
        assert!(error_of(&format!("mode = \"fast\"\n{MINIMAL}")).starts_with("mode"));
        assert!(error_of(&format!("mode = \"redis-only\"\n{MINIMAL}")).contains("redis://"));
        assert!(
            error_of(&MINIMAL.replace("total = 101", "total = 5\ncolour = 1")).contains("colour"),
            "unknown keys are refused"
        );
        let ledger = |url: &str| format!("[ledger]\nurl = \"{url}\"\n{MINIMAL}");
        assert!(error_of(&ledger("memcached://x:1")).starts_with("ledger.url"));
        for bad in [
            "redis+cluster://",
            "redis+cluster://a:1,,b:2",
            "redis+cluster://a:1,b",
            "redis+cluster://a:1/0",
            "redis+sentinel://a:1,b:2",
            "redis+sentinel://a:1,b/m",
        ] {
            assert!(error_of(&ledger(bad)).starts_with("ledger.url"), "{bad} must be refused");
        }
        let window = MINIMAL
            .replace("total = 101", "total = 5\nstarts_at = 2030-01-01T00:00:00Z\nends_at = 2029-01-01T00:00:00Z");
        assert!(error_of(&window).starts_with("skus[0].ends_at"));
    }

    #[test]
    fn ledger_errors_and_dumps_never_show_a_password() {
        let ledger = |url: &str| format!("[ledger]\nurl = \"{url}\"\n{MINIMAL}");
        for bad in [
            "memcached://u:hunter2-pw@x:1",
            "redis://:hunter2-pw@h:nope",
            "redis+cluster://:hunter2-pw@a:1,b",
            "redis+sentinel://:hunter2-pw@a:1,b/m",
        ] {
            let error = error_of(&ledger(bad));
            assert!(error.starts_with("ledger.url") && !error.contains("hunter2"), "{error}");
        }
        let cluster = Cluster::parse(&ledger("redis://seckill:hunter2-pw@127.0.0.1:6379")).unwrap();
        let dump = format!("{cluster:?}");
        assert!(!dump.contains("hunter2") && dump.contains("seckill:***@127.0.0.1"), "{dump}");
    }

    #[test]
    fn a_redis_cluster_is_named_by_its_seed_nodes() {
        let text = format!("[ledger]\nurl = \"redis+cluster://127.0.0.1:7000, 127.0.0.1:7001\"\n{MINIMAL}");
        let cluster = Cluster::parse(&text).unwrap();
        let Ok(ledger::RedisTarget::Cluster(seeds)) = ledger::RedisTarget::parse(&cluster.ledger.url) else {
            panic!("a cluster URL must parse as a cluster");
        };
        assert_eq!(seeds.urls(), ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]);
        let Ok(ledger::RedisTarget::Cluster(seeds)) = ledger::RedisTarget::parse("redis+cluster://:pw@h:1,[::1]:2")
        else {
            panic!("credentials and IPv6 seeds are accepted");
        };
        assert_eq!(seeds.urls(), ["redis://:pw@h:1", "redis://:pw@[::1]:2"]);
    }

    #[test]
    fn a_sentinel_url_names_sentinels_and_a_master() {
        let text =
            format!("[ledger]\nurl = \"redis+sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380/ledger\"\n{MINIMAL}");
        let cluster = Cluster::parse(&text).unwrap();
        let Ok(ledger::RedisTarget::Sentinel(seeds)) = ledger::RedisTarget::parse(&cluster.ledger.url) else {
            panic!("a sentinel URL must parse as sentinels");
        };
        assert_eq!(seeds.sentinel_urls(), ["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"]);
        assert_eq!(seeds.master_name, "ledger");
        assert!(!format!("{cluster:?}").contains(":pw@"));
    }

    #[test]
    fn coordinator_timings_are_checked() {
        let with = |section: &str| {
            format!("{MINIMAL}\n[coordinator]\nmembers = [{{ name = \"c1\", listen = \"127.0.0.1:0\" }}]\n{section}")
        };
        assert!(Cluster::parse(&with("")).unwrap().coordinator.is_some());
        assert!(error_of(&with("lease_ms = 1000\nelection_timeout_max_ms = 300")).starts_with("coordinator.lease_ms"));
        assert!(error_of(&with("heartbeat_ms = 1000")).starts_with("coordinator.heartbeat_ms"));
        let two = MINIMAL.to_string() + "\n[coordinator]\nmembers = [{ name = \"a\", listen = \"127.0.0.1:0\" }, { name = \"b\", listen = \"127.0.0.1:0\" }]";
        assert!(error_of(&two).starts_with("coordinator.members"));
    }

    #[test]
    fn members_read_the_order_service_where_it_listens_or_where_they_are_told() {
        let with = |orders: &str, section: &str| {
            format!(
                "{MINIMAL}\n[coordinator]\nmembers = [{{ name = \"c1\", listen = \"127.0.0.1:0\" }}]\n{section}\n{orders}"
            )
        };
        let api = |text: String| Cluster::parse(&text).unwrap().coordinator.unwrap().orders_api;
        assert_eq!(api(with("", "")), None, "no order service: no orders by state");
        assert_eq!(api(with("[orders]\nlisten = \"0.0.0.0:8090\"", "")).as_deref(), Some("127.0.0.1:8090"));
        assert_eq!(api(with("[orders]\nlisten = \"[::]:8090\"", "")).as_deref(), Some("[::1]:8090"));
        let told = with("[orders]\nlisten = \"0.0.0.0:8090\"", "orders_api = \"orders.internal:8090\"");
        assert_eq!(api(told).as_deref(), Some("orders.internal:8090"), "the configured address wins");
        for bad in ["orders.internal", "orders.internal:0", ":8090"] {
            let refused = error_of(&with("", &format!("orders_api = \"{bad}\"")));
            assert!(refused.starts_with("coordinator.orders_api"), "{bad}: {refused}");
        }
    }

    #[test]
    fn the_cluster_token_is_configured_or_drawn_and_never_echoed() {
        let with = |section: &str| {
            format!("{MINIMAL}\n[coordinator]\nmembers = [{{ name = \"c1\", listen = \"127.0.0.1:0\" }}]\n{section}")
        };
        let drawn = Cluster::parse(&with("")).unwrap().coordinator.unwrap().cluster;
        assert!(drawn.is_generated(), "no token configured: one is drawn, good only in this process");
        let token = "a-cluster-token-of-some-length";
        let configured = Cluster::parse(&with(&format!("cluster_token = \"{token}\""))).unwrap();
        let credential = configured.coordinator.unwrap().cluster;
        assert!(!credential.is_generated());
        assert!(credential.admits(Some(format!("Bearer {token}").as_bytes())));
        assert!(
            !format!("{:?}", Cluster::parse(&with(&format!("cluster_token = \"{token}\""))).unwrap()).contains(token)
        );
        let weak = error_of(&with("cluster_token = \"short-secret\""));
        assert!(weak.starts_with("coordinator.cluster_token") && !weak.contains("short-secret"), "{weak}");
        let spaced = error_of(&with("admin_token = \"has spaces in the token\""));
        assert!(spaced.starts_with("coordinator.admin_token") && !spaced.contains("spaces in"), "{spaced}");
        let lone = error_of(&with(&format!("cluster_token_accept = \"{token}\"")));
        assert!(lone.starts_with("coordinator.cluster_token_accept"), "{lone}");
        let rotating = Cluster::parse(&with(&format!(
            "cluster_token = \"{token}\"\ncluster_token_accept = \"the-next-cluster-token-00\""
        )))
        .unwrap()
        .coordinator
        .unwrap()
        .cluster;
        assert!(rotating.admits(Some(b"Bearer the-next-cluster-token-00")));
        assert_eq!(rotating.token().expose(), token, "the accepted one is never presented");
    }

    #[test]
    fn a_waiting_room_takes_the_fleet_rules_or_its_own_and_every_bound_names_its_key() {
        let n1 = NodeId::new("n1").unwrap();
        assert!(Cluster::parse(MINIMAL).unwrap().sku_configs_for(&n1)[0].terms.waiting_room.is_none());
        let fleet = MINIMAL.replace("total = 101", "total = 101\nwaiting_room = true")
            + "\n[waiting_room]\nadmit_per_s = 50\nadmit_factor = 2.0\n";
        let cluster = Cluster::parse(&fleet).unwrap();
        let room = cluster.sku_configs_for(&n1)[0].terms.waiting_room.clone().expect("a room");
        assert_eq!((room.admit_per_s, room.admit_factor), (50, 2.0), "the [waiting_room] rules");
        assert_eq!(cluster.sku_plans()[0].terms.waiting_room, Some(room), "the coordinator carries them too");
        let own = MINIMAL.replace("total = 101", "total = 101\nwaiting_room = { admit_per_s = 7 }");
        let room = Cluster::parse(&own).unwrap().sku_configs_for(&n1)[0].terms.waiting_room.clone();
        assert_eq!(room.map(|room| room.admit_per_s), Some(7), "a SKU's own table");
        assert!(error_of(&(fleet.clone() + "abandon_s = 0\n")).starts_with("waiting_room.abandon_s"));
        let own_bad = MINIMAL.replace("total = 101", "total = 101\nwaiting_room = { admit_factor = 0.5 }");
        assert!(error_of(&own_bad).starts_with("skus[0].waiting_room.admit_factor"), "{}", error_of(&own_bad));
        let striped = MINIMAL.replace("total = 101", "total = 101\nstripes = 2\nwaiting_room = true");
        assert!(error_of(&striped).starts_with("skus[0].waiting_room"), "{}", error_of(&striped));
        let (a, b) = (&cluster.nodes[0].0, &cluster.nodes[1].0);
        let ticket = a.ticket_key.as_ref().expect("a key").ticket("s", "ann", "00ff", u64::MAX);
        assert!(b.ticket_key.as_ref().expect("a key").token_of("s", "ann", &ticket, 1).is_some(), "one key per fleet");
    }

    #[test]
    fn submit_token_settings_reach_the_terms_of_the_nodes_and_the_coordinator() {
        let plain = Cluster::parse(MINIMAL).unwrap();
        let n1 = NodeId::new("n1").unwrap();
        let sku = &plain.sku_configs_for(&n1)[0];
        assert!(!sku.terms.require_token, "tokens are off unless asked for");
        assert_eq!(sku.terms.token_ttl(), ledger::TOKEN_TTL_DEFAULT);
        let text = MINIMAL.replace("total = 101", "total = 5\nrequire_token = true\ntoken_ttl_s = 30");
        let cluster = Cluster::parse(&text).unwrap();
        let sku = &cluster.sku_configs_for(&n1)[0];
        assert!(sku.terms.require_token);
        assert_eq!(sku.terms.token_ttl(), Duration::from_secs(30));
        let terms = &cluster.sku_plans()[0].terms;
        assert!(terms.require_token && terms.token_ttl_s == 30, "the coordinator carries them too: {terms:?}");
        for bad in ["0", "86401"] {
            let text = MINIMAL.replace("total = 101", &format!("total = 5\ntoken_ttl_s = {bad}"));
            assert!(error_of(&text).starts_with("skus[0].token_ttl_s"), "token_ttl_s = {bad}");
        }
    }

    /// Goal: a striped `[[skus]]` SKU reaches the coordinator as one plan per stripe, each with
    /// its stripe's total, split over the nodes as any SKU's.
    #[test]
    fn a_striped_sku_is_planned_stripe_by_stripe() {
        let cluster = Cluster::parse(&MINIMAL.replace("total = 101", "total = 101\nstripes = 3\nbuffer = 0")).unwrap();
        let plans = cluster.sku_plans();
        let names: Vec<String> = plans.iter().map(|plan| plan.sku.to_string()).collect();
        assert_eq!(names, ["s", "s/1", "s/2"]);
        let totals: Vec<(u64, u32, u64)> =
            plans.iter().map(|plan| (plan.terms.total, plan.terms.stripes, plan.starting.values().sum())).collect();
        assert_eq!(totals, [(34, 3, 34), (34, 3, 34), (33, 3, 33)]);
        assert_eq!(Cluster::parse(MINIMAL).unwrap().sku_plans().len(), 1, "an unstriped SKU is one plan");
    }

    #[test]
    fn token_issuance_is_limited_per_address_by_default_and_can_be_turned_off() {
        let rate = |text: &str| Cluster::parse(text).unwrap().safeguards.token_rate_per_address;
        let default = ::safeguards::ratelimit::Rate { per_s: 5.0, burst: 20 };
        assert_eq!(rate(MINIMAL), Some(default), "on without a [safeguards] section");
        let with = |lines: &str| format!("[safeguards]\n{lines}\n{MINIMAL}");
        assert_eq!(rate(&with("token_rate_per_address = 0")), None, "0 turns it off");
        let custom = rate(&with("token_rate_per_address = 0.5\ntoken_burst_per_address = 2"));
        assert_eq!(custom, Some(::safeguards::ratelimit::Rate { per_s: 0.5, burst: 2 }));
        for bad in ["-1", "nan", "inf"] {
            let error = error_of(&with(&format!("token_rate_per_address = {bad}")));
            assert!(error.starts_with("safeguards.token_rate_per_address"), "{bad}: {error}");
        }
        let error = error_of(&with("token_burst_per_address = 0"));
        assert!(error.starts_with("safeguards.token_burst_per_address"), "{error}");
        assert_eq!(rate(&with("token_rate_per_address = 0\ntoken_burst_per_address = 0")), None, "off needs no burst");
    }

    #[test]
    fn connections_per_address_are_bounded_by_default_with_loopback_exempt() {
        let cluster = Cluster::parse(MINIMAL).unwrap();
        let bound = &cluster.nodes[0].0.http.connections_per_address;
        assert_eq!((bound.max, bound.ipv6_prefix), (node::CONNECTIONS_PER_ADDRESS_DEFAULT, 64));
        assert!(
            bound.exempt.contains("127.0.0.1".parse().unwrap()) && !bound.exempt.contains("10.0.0.1".parse().unwrap())
        );
        assert_eq!(cluster.orders.connections_per_address, ::orders::http::CONNECTIONS_PER_ADDRESS_DEFAULT);
        let service = cluster.orders.service_config().unwrap();
        assert_eq!(service.http.connections_per_address.max, ::orders::http::CONNECTIONS_PER_ADDRESS_DEFAULT);

        let text = format!(
            "[node_settings]\nconnections_per_address = 0\n[safeguards]\nipv6_prefix = 48\n[orders]\nconnections_per_address = 7\n{MINIMAL}"
        );
        let cluster = Cluster::parse(&text).unwrap();
        let bound = &cluster.nodes[0].0.http.connections_per_address;
        assert_eq!((bound.max, bound.ipv6_prefix), (0, 48), "0 turns the bound off; the prefix is the cluster's");
        assert_eq!(cluster.orders.service_config().unwrap().http.connections_per_address.max, 7);
    }

    #[test]
    fn sale_window_times_are_unix_ms() {
        let text = MINIMAL.replace("total = 101", "total = 5\nstarts_at = 2026-11-22T10:00:00+08:00");
        let cluster = Cluster::parse(&text).unwrap();
        let sku = &cluster.sku_configs_for(&NodeId::new("n1").unwrap())[0];
        assert_eq!(sku.terms.starts_at_ms, Some(1_795_312_800_000), "10:00 at +08:00 is 02:00 UTC");
    }
}
