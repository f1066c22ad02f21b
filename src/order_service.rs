//! Starts the order service `[orders]` describes, next to the ledger the config names:
//! `seckill orders` runs it alone, `seckill up` and `seckill demo` beside their nodes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ledger::{Ledger, RedisLedger};
use orders::consumer::Catalogue;
use orders::http::ApiLimits;
use orders::service::{CatalogueFeed, FeedLedgers};
use orders::{OrderService, OrderStore};
use safeguards::{LocalLockBackend, LockBackend, RedisLockBackend};

use crate::config::{Cluster, LedgerSection};
use crate::guard;

/// The SKUs of the config, with the terms their orders are priced on.
/// The config's `[[skus]]` as the order service reads them: one entry per ledger, so a
/// striped SKU is each of its stripes (one order stream each), as the coordinator's catalogue
/// has them.
pub fn catalogue(cluster: &Cluster) -> Catalogue {
    cluster.skus.iter().flat_map(|sku| protocol::ledgers_of(&sku.id, &sku.terms)).collect()
}

/// The catalogue the order service follows: with a coordinator its raft catalogue, which owns
/// every SKU's terms (SKUs created at run time included); without one the config's `[[skus]]`.
pub fn catalogue_feed(cluster: &Cluster) -> anyhow::Result<CatalogueFeed> {
    Ok(match crate::cluster::coordinator_client(cluster, &cluster.orders.consumer)? {
        Some(client) => CatalogueFeed::Coordinator { client, every: orders::service::CATALOGUE_EVERY },
        None => CatalogueFeed::Fixed(catalogue(cluster)),
    })
}

/// Every SKU the fleet sells now: the coordinator's catalogue (SKUs created at run time
/// included) over the config's `[[skus]]`; what `seckill reconcile` covers.
pub async fn current_catalogue(cluster: &Cluster) -> anyhow::Result<Catalogue> {
    let mut skus = catalogue(cluster);
    if let Some(client) = crate::cluster::coordinator_client(cluster, &cluster.orders.consumer)? {
        let answer = client.catalogue().await.context("reading the coordinator's catalogue ([coordinator] members)")?;
        skus.extend(answer.skus);
    }
    Ok(skus)
}

/// Opens the store `[orders] store` names (migrations included); the error names the setting.
pub async fn open_store(cluster: &Cluster) -> anyhow::Result<Arc<dyn OrderStore>> {
    let url = &cluster.orders.store;
    let opened = orders::store::open(url)
        .await
        .with_context(|| format!("[orders] store = {:?}", orders::store::postgres::redact(url)));
    let is_postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
    match opened {
        // PostgreSQL's refusals do not say a password was missing; name where it comes from.
        Err(e) if is_postgres && crate::config::credentials_of(url).1.is_empty() => Err(e.context(format!(
            "the order store's URL carries no password: {}",
            protocol::env_secret::where_to_find(crate::config::POSTGRES_PASSWORD_ENV)
        ))),
        opened => opened,
    }
}

/// Starts the order service on `ledger` (the one sales and releases use) and `store`.
pub async fn start(
    cluster: &Cluster,
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn OrderStore>,
) -> anyhow::Result<OrderService> {
    let secret_set = crate::config::payment_secret()?.is_some();
    if let (Some(listen), false) = (cluster.orders.listen, secret_set) {
        // Refused, not warned about: a listening service without it would refuse every payment
        // callback, and the provider would give up on payments buyers made.
        anyhow::bail!(
            "[orders] listen = \"{listen}\" serves payment callbacks, but {} is not set: set it to the secret \
             your payment provider signs callbacks with (at least 16 characters), or remove [orders] listen",
            crate::config::PAYMENT_SECRET_ENV
        );
    }
    let mut config = cluster.orders.service_config()?;
    config.authenticator = crate::cluster::authenticator(cluster)?;
    config.admin_token = admin_token(cluster)?;
    config.http = api_limits(cluster, config.http);
    config.payments = cluster.payments.payments(cluster.orders.reached_at().as_deref())?;
    start_with(cluster, ledger, store, config).await
}

/// `http` with the cluster's load balancers exempt from the per-address bound and its IPv6 block
/// size. nginx (or any trusted proxy) brings every buyer and the payment provider over its own
/// connections: bounding it per address would bound them all together.
fn api_limits(cluster: &Cluster, mut http: ApiLimits) -> ApiLimits {
    let per_address = &mut http.connections_per_address;
    per_address.exempt = per_address.exempt.union(&cluster.safeguards.trusted_proxies);
    per_address.ipv6_prefix = cluster.safeguards.ipv6_prefix;
    http
}

/// The operators' token on the order API: the coordinator's admin token, or without a
/// coordinator `SECKILL_ADMIN_TOKEN` alone.
fn admin_token(cluster: &Cluster) -> anyhow::Result<Option<protocol::Secret>> {
    if let Some(group) = &cluster.coordinator {
        return Ok(group.admin_token.clone());
    }
    match protocol::env_secret::from_env(crate::config::ADMIN_TOKEN_ENV)? {
        Some(token) => protocol::Secret::new(&token)
            .map(Some)
            .map_err(|_| anyhow::anyhow!("{} is too short to be a secret", crate::config::ADMIN_TOKEN_ENV)),
        None => Ok(None),
    }
}

/// [`start`] with the service settings given (the buyer's authenticator and the admin token
/// included: [`start`] takes them from the cluster) (a demo signs its own payments).
pub async fn start_with(
    cluster: &Cluster,
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn OrderStore>,
    mut config: orders::OrderServiceConfig,
) -> anyhow::Result<OrderService> {
    // The recorder first (installed on first use): counters registered before it would count
    // into nothing.
    config.metrics = node::prometheus().cloned().map(|handle| {
        let render: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(move || handle.render());
        render
    });
    orders::service::register_metrics();
    let service = OrderService::start(
        ledger.clone(),
        feed_ledgers(&cluster.ledger, ledger)?,
        store,
        lock_backend(cluster)?,
        catalogue_feed(cluster)?,
        config,
    )
    .await
    .map_err(anyhow::Error::msg)?;
    Ok(service)
}

/// Where the sweeper's lock lives: the ledger's Redis, shared by every order service of the
/// fleet; in process for the embedded ledger.
fn lock_backend(cluster: &Cluster) -> anyhow::Result<Arc<dyn LockBackend>> {
    Ok(match guard::redis_connection(&cluster.ledger)? {
        Some(connection) => Arc::new(RedisLockBackend::new(
            connection,
            &cluster.ledger.key_prefix,
            Duration::from_millis(cluster.ledger.call_timeout_ms),
        )),
        None => Arc::new(LocalLockBackend::new()),
    })
}

/// What `reconcile --repair` did to the payments.
#[derive(Debug, serde::Serialize)]
pub struct PaymentsRedriven {
    /// Provider checks and refunds made due at once, whatever their backoff said.
    pub checks: u64,
    pub refunds: u64,
    /// What the sweeper round that followed did.
    pub found_by_query: u64,
    pub expired: u64,
    pub refunded: u64,
    /// Asked again and still not settled (the provider unreachable, or still pending).
    pub still_open: u64,
    /// Another sweeper held the lock: nothing was asked; try again.
    pub busy: bool,
}

/// Re-drives stuck payments: every open provider check and unacknowledged refund is made due
/// now, then one sweeper round runs them under the sweeper's lock and fence, exactly as a
/// running order service would. `None` when `[payments]` names no provider.
pub async fn redrive_payments(
    cluster: &Cluster,
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn OrderStore>,
) -> anyhow::Result<Option<PaymentsRedriven>> {
    let Some(payments) = cluster.payments.payments(cluster.orders.reached_at().as_deref())? else { return Ok(None) };
    let (checks, refunds) = store.redrive_payments(orders::unix_ms()).await?;
    let lock = safeguards::DistributedLock::new(lock_backend(cluster)?).map_err(|e| anyhow::anyhow!("{e}"))?;
    let sweeper = orders::sweeper::Sweeper::new(ledger, store, lock, orders::sweeper::SweeperConfig::default())
        .with_payments(Some(payments));
    let round = sweeper.round().await.map_err(anyhow::Error::msg)?;
    Ok(Some(PaymentsRedriven {
        checks,
        refunds,
        found_by_query: round.checks.found_by_query,
        expired: round.checks.expired,
        refunded: round.refunds.refunded,
        still_open: round.checks.deferred + round.refunds.pending,
        busy: round.busy,
    }))
}

/// Each consumer reads through a connection of its own on Redis (a blocking read holds its
/// connection), with every other setting of `[ledger]`: under `durability = "replica"` its
/// reads are fenced, so it never stores an order event the replicas lack (a failover could undo
/// it and hand its sequence number to another sale). The embedded ledger has no connections to
/// hold.
fn feed_ledgers(section: &LedgerSection, shared: Arc<dyn Ledger>) -> anyhow::Result<FeedLedgers> {
    if section.url == "embedded" {
        return Ok(Arc::new(move || Ok(shared.clone())));
    }
    let mut config = crate::cluster::redis_ledger_config(section)?;
    config.connections = 1;
    Ok(Arc::new(move || {
        let ledger: Arc<dyn Ledger> = Arc::new(RedisLedger::connect(config.clone()).map_err(|e| e.to_string())?);
        Ok(ledger)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_api_exempts_the_clusters_load_balancers_and_loopback() {
        let text = r#"
            [safeguards]
            trusted_proxies = ["10.0.0.0/8"]
            ipv6_prefix = 56
            [orders]
            connections_per_address = 9
            [[nodes]]
            id = "n1"
            listen = "127.0.0.1:0"
            [[skus]]
            id = "s"
            total = 1
        "#;
        let cluster = Cluster::parse(text).unwrap();
        let http = api_limits(&cluster, cluster.orders.service_config().unwrap().http);
        let bound = &http.connections_per_address;
        assert_eq!((bound.max, bound.ipv6_prefix), (9, 56));
        for exempt in ["10.1.2.3", "127.0.0.1", "::1"] {
            assert!(bound.exempt.contains(exempt.parse().unwrap()), "{exempt} is a load balancer or local");
        }
        assert!(!bound.exempt.contains("203.0.113.9".parse().unwrap()), "a stranger is bounded");
    }
}
