//! `[orders]`: the order service — where orders are stored, where its API listens, how its
//! consumers read the order streams and how often the sweeper expires unpaid orders.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// Where the payment provider's signing secret is read from; never from the file, so the file
/// can be shared.
pub const PAYMENT_SECRET_ENV: &str = "SECKILL_PAYMENT_SECRET";

/// Shortest payment secret accepted: 128 bits of hex or 16 characters of anything.
const PAYMENT_SECRET_BYTES_MIN: usize = 16;

/// The payment secret, from [`PAYMENT_SECRET_ENV`] or the file `SECKILL_PAYMENT_SECRET_FILE`
/// names; `None` when neither is set.
pub fn payment_secret() -> Result<Option<String>, ConfigError> {
    protocol::env_secret::from_env(PAYMENT_SECRET_ENV).map_err(|e| invalid("orders", e.to_string()))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrdersSection {
    /// `sqlite::memory:` (the default: zero setup, gone with the process), `sqlite:<path>`, or
    /// `postgres://user@host:port/db`.
    pub store: String,
    /// Where the order API listens; absent: no API (the service still consumes and sweeps).
    pub listen: Option<SocketAddr>,
    /// `host:port` the provider's callbacks, the members and nginx reach the API at (a DNS name
    /// is fine); absent: `listen`, a wildcard there read as loopback.
    pub advertise: Option<String>,
    /// Name of this service in the stream consumer group; unique per process, stable across
    /// its restarts (a restarted consumer takes its own pending entries back first).
    pub consumer: String,
    /// Entries per read and per store write.
    pub batch: usize,
    /// Pending entries idle this long are taken over from a consumer that died.
    pub claim_idle_ms: u64,
    /// Deliveries after which an entry that keeps failing goes to the dead letters.
    pub max_deliveries: u64,
    /// Newest stream entries kept for the nodes' replays when acknowledged ones are trimmed.
    pub trim_retain: u64,
    /// Pause between sweeper rounds (expiring unpaid orders, giving their units back).
    pub sweep_every_ms: u64,
    /// Run the sweeper in this process (the lock lets one sweeper at a time work anyway).
    pub sweep: bool,
    /// How far a payment callback's signed time may be from this service's clock, in seconds
    /// (default 300, at most 86400): the replay window, and the clock skew tolerated between
    /// the payment provider and this service.
    pub callback_window_s: u64,
    /// Open connections one client address may hold on the order API; 0 = no bound. Loopback
    /// and `[safeguards] trusted_proxies` are exempt (behind nginx every connection is nginx's).
    pub connections_per_address: usize,
}

impl Default for OrdersSection {
    fn default() -> Self {
        let consumer = orders::consumer::ConsumerConfig::default();
        let sweeper = orders::sweeper::SweeperConfig::default();
        Self {
            store: orders::store::MEMORY_STORE.into(),
            listen: None,
            advertise: None,
            consumer: consumer.consumer,
            batch: consumer.batch,
            claim_idle_ms: consumer.claim_idle.as_millis() as u64,
            max_deliveries: consumer.max_deliveries,
            trim_retain: consumer.trim_retain,
            sweep_every_ms: sweeper.every.as_millis() as u64,
            sweep: true,
            callback_window_s: orders::signature::TOLERANCE_S,
            connections_per_address: orders::http::CONNECTIONS_PER_ADDRESS_DEFAULT,
        }
    }
}

impl OrdersSection {
    /// Where the others reach the order API: `advertise`, else `listen` as this machine reaches
    /// it; `None` without an API (or on a port still to be picked).
    pub fn reached_at(&self) -> Option<String> {
        if let Some(advertise) = &self.advertise {
            return Some(advertise.clone());
        }
        self.listen.filter(|listen| listen.port() != 0).map(|listen| super::address::reachable(listen).to_string())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(advertise) = &self.advertise {
            super::address::host_port("orders.advertise", advertise)?;
            if self.listen.is_none() {
                return Err(invalid("orders.advertise", "is where others reach [orders] listen, which is not set"));
            }
        }
        if self.batch == 0 || self.batch > orders::store::INSERT_BATCH_MAX {
            return Err(invalid("orders.batch", "must be between 1 and 1000"));
        }
        if self.callback_window_s == 0 || self.callback_window_s > orders::signature::TOLERANCE_MAX_S {
            return Err(invalid(
                "orders.callback_window_s",
                format!("must be between 1 and {} seconds", orders::signature::TOLERANCE_MAX_S),
            ));
        }
        if self.max_deliveries == 0 {
            return Err(invalid("orders.max_deliveries", "must be at least 1"));
        }
        if self.claim_idle_ms < 100 || self.sweep_every_ms < 10 {
            return Err(invalid("orders", "claim_idle_ms must be at least 100, sweep_every_ms at least 10"));
        }
        if self.consumer.is_empty() || self.consumer.len() > 64 || self.consumer.contains(char::is_whitespace) {
            return Err(invalid("orders.consumer", "1-64 characters without spaces"));
        }
        let store = &self.store;
        let known = store == orders::store::MEMORY_STORE
            || store.starts_with("sqlite:")
            || store.starts_with("postgres://")
            || store.starts_with("postgresql://");
        if !known {
            return Err(invalid("orders.store", "is sqlite::memory:, sqlite:<path> or postgres://user@host:port/db"));
        }
        Ok(())
    }

    /// The service's settings; the payment secret from [`payment_secret`], or else a random
    /// one, which no provider knows (only for a service without an API: one that listens
    /// refuses to start without the secret, `order_service::start`).
    pub fn service_config(&self) -> Result<orders::OrderServiceConfig, ConfigError> {
        let secret = match payment_secret()? {
            Some(secret) if secret.len() < PAYMENT_SECRET_BYTES_MIN => {
                return Err(invalid(
                    "orders",
                    format!("{PAYMENT_SECRET_ENV} must be at least {PAYMENT_SECRET_BYTES_MIN} characters"),
                ))
            }
            Some(secret) => secret.into_bytes(),
            None => protocol::Secret::generate()
                .map_err(|e| invalid("orders", format!("no random source for a payment secret: {e}")))?
                .expose()
                .as_bytes()
                .to_vec(),
        };
        let consumer = orders::consumer::ConsumerConfig {
            consumer: self.consumer.clone(),
            batch: self.batch,
            claim_idle: Duration::from_millis(self.claim_idle_ms),
            max_deliveries: self.max_deliveries,
            trim_retain: self.trim_retain,
            ..orders::consumer::ConsumerConfig::default()
        };
        let sweeper = orders::sweeper::SweeperConfig {
            every: Duration::from_millis(self.sweep_every_ms),
            ..orders::sweeper::SweeperConfig::default()
        };
        let http = orders::http::ApiLimits {
            connections_per_address: ::safeguards::connections::ConnectionsPerAddress::new(
                self.connections_per_address,
            ),
            ..orders::http::ApiLimits::default()
        };
        // The buyer's authenticator, the admin token and the proxies exempt from the
        // per-address bound are the cluster's, set by whoever starts the service
        // (`order_service::start`).
        Ok(orders::OrderServiceConfig {
            consumer,
            sweeper,
            authenticator: auth::Authenticator::none(),
            admin_token: None,
            sweep: self.sweep,
            listen: self.listen,
            http,
            payment_secret: Arc::from(secret),
            callback_window_s: self.callback_window_s,
            metrics: None,
            // The cluster's `[payments]`, set by whoever starts the service.
            payments: None,
        })
    }
}
