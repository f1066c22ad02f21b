//! The ledger on Redis: the Lua scripts in `lua/` do every write, so each operation is one
//! atomic step on the server, and Redis persistence (AOF) is what makes sales durable.
//!
//! Key layout, for SKU `s` under prefix `p` (the `{s}` hash tag keeps a SKU in one cluster slot):
//! - `p:{s}:meta`     hash: total, sold, remaining, per_user_limit, order_seq, closed (once
//!   closed)
//! - `p:{s}:by_user`  hash: user → units bought (at most one field per buyer, so ≤ total fields)
//! - `p:{s}:by_epoch` hash: `node#epoch` → units sold by that node in that epoch (per-node
//!   totals are its sums: one write per sale instead of two)
//! - `p:{s}:orders`   stream of order events; entry ids are `0-<seq>`, so a reader resumes
//!   from the last sequence number it saw
//! - `p:{s}:key:<k>`  the stored decision for idempotency key k, with a TTL
//! - `p:{s}:token:<t>` the user submit token t was issued to, with the token's TTL; deleted by
//!   the purchase that presents it (`confirm.lua`)
//!
//! Submit tokens need `GETDEL`, so Redis 6.2 or later.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{AsyncCommands, RedisError, Script};

use crate::types::stored;
use crate::*;

static CONFIRM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/confirm.lua")));
static CREATE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/create.lua")));
static RESTOCK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/restock.lua")));
static CLOSE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/close.lua")));
static TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/token.lua")));

/// How to reach Redis and how long to wait for it.
#[derive(Clone, Debug)]
pub struct RedisLedgerConfig {
    /// `redis://host:port[/db]`.
    pub url: String,
    /// Multiplexed connections to spread calls over; one connection already pipelines, more
    /// help only when a single socket's read loop becomes the bottleneck.
    pub connections: usize,
    /// Upper bound on one call, reconnect included. A sale whose confirmation outlives it is
    /// answered 503 and decided by the client's retry, so keep it well under client timeouts.
    pub call_timeout: Duration,
    /// Upper bound on opening a connection.
    pub connect_timeout: Duration,
    /// How long a stored decision answers retries.
    pub idempotency_ttl: Duration,
    /// First part of every key, so several sales can share one Redis.
    pub key_prefix: String,
}

impl RedisLedgerConfig {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            connections: 2,
            call_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(500),
            idempotency_ttl: IDEMPOTENCY_TTL_DEFAULT,
            key_prefix: "seckill".into(),
        }
    }
}

/// The Redis ledger. Cheap to share: connections are multiplexed and reconnect on their own.
pub struct RedisLedger {
    connections: Vec<ConnectionManager>,
    next_connection: AtomicUsize,
    config: RedisLedgerConfig,
}

struct SkuKeys {
    meta: String,
    by_user: String,
    by_epoch: String,
    orders: String,
    record_prefix: String,
    /// Followed by a token to name its key. Bare, it names the key a purchase without a token
    /// passes: tokens are never empty, so it never exists, and it keeps the batch in the slot.
    token_prefix: String,
}

impl RedisLedger {
    /// Connects lazily: the ledger can be built while Redis is still starting, and calls fail
    /// with [`LedgerError::Unavailable`] until it answers.
    pub fn connect(config: RedisLedgerConfig) -> Result<Self, LedgerError> {
        let client = ::redis::Client::open(config.url.as_str())
            .map_err(|e| LedgerError::Unavailable(format!("bad Redis URL {}: {e}", config.url)))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.call_timeout))
            // Reconnect attempts happen inside a call; one quick retry keeps a call within its
            // timeout, and the next call tries again anyway.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let connections = (0..config.connections.max(1))
            .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| unavailable(&e))?;
        Ok(Self { connections, next_connection: AtomicUsize::new(0), config })
    }

    fn connection(&self) -> ConnectionManager {
        // Relaxed: the counter only spreads load; no other memory depends on its value.
        let at = self.next_connection.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        self.connections[at].clone()
    }

    fn keys(&self, sku: &SkuId) -> SkuKeys {
        let base = format!("{}:{{{sku}}}", self.config.key_prefix);
        SkuKeys {
            meta: format!("{base}:meta"),
            by_user: format!("{base}:by_user"),
            by_epoch: format!("{base}:by_epoch"),
            orders: format!("{base}:orders"),
            record_prefix: format!("{base}:key:"),
            token_prefix: format!("{base}:token:"),
        }
    }

    /// Runs one Redis call under the configured deadline and maps its failure.
    async fn call<T>(
        &self,
        sku: Option<&SkuId>,
        fut: impl std::future::Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, LedgerError> {
        match tokio::time::timeout(self.config.call_timeout, fut).await {
            Err(_) => Err(LedgerError::Unavailable(format!("no answer within {:?}", self.config.call_timeout))),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(&e, sku)),
        }
    }
}

fn unavailable(e: &RedisError) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

/// Script errors carry our own codes; anything else is a transport or server fault that the
/// caller treats as "outcome unknown, retry".
fn classify(e: &RedisError, sku: Option<&SkuId>) -> LedgerError {
    let text = e.to_string();
    match sku {
        Some(sku) if text.contains("SECKILL_MISSING") => LedgerError::Missing(sku.clone()),
        _ if text.contains("SECKILL_CORRUPT") => LedgerError::Corrupt(text),
        _ => unavailable(e),
    }
}

fn parse_decision(text: &str) -> Result<Decision, LedgerError> {
    stored::decode(text).ok_or_else(|| LedgerError::Corrupt(format!("unreadable stored decision {text:?}")))
}

fn parse_count(text: Option<&String>, what: &str) -> Result<u64, LedgerError> {
    text.and_then(|t| t.parse().ok()).ok_or_else(|| LedgerError::Corrupt(format!("unreadable {what}")))
}

#[async_trait::async_trait]
impl Ledger for RedisLedger {
    async fn create_sku(&self, spec: &SkuSpec) -> Result<Created, LedgerError> {
        let keys = self.keys(&spec.sku);
        let mut con = self.connection();
        let created: i64 = self
            .call(
                Some(&spec.sku),
                CREATE
                    .key(&keys.meta)
                    .arg(spec.total)
                    .arg(spec.per_user_limit)
                    .arg(u8::from(spec.require_token))
                    .invoke_async(&mut con),
            )
            .await?;
        let status = self.status(&spec.sku).await?;
        Ok(if created == 1 { Created::New(status) } else { Created::Existing(status) })
    }

    async fn restock_to(&self, sku: &SkuId, total: u64) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let _total: i64 = self.call(Some(sku), RESTOCK.key(&keys.meta).arg(total).invoke_async(&mut con)).await?;
        self.status(sku).await
    }

    async fn close(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let _closed: i64 = self.call(Some(sku), CLOSE.key(&keys.meta).invoke_async(&mut con)).await?;
        self.status(sku).await
    }

    async fn issue_token(&self, sku: &SkuId, user: &UserId, ttl: Duration) -> Result<SubmitToken, LedgerError> {
        let keys = self.keys(sku);
        let ttl_ms = ttl.min(TOKEN_TTL_MAX).as_millis().max(1) as u64;
        for _ in 0..TOKEN_DRAWS_MAX {
            let token = SubmitToken::generate()
                .map_err(|e| LedgerError::Unavailable(format!("no secure random source for a token: {e}")))?;
            let mut con = self.connection();
            let stored: i64 = self
                .call(
                    Some(sku),
                    TOKEN
                        .key(&keys.meta)
                        .key(format!("{}{token}", keys.token_prefix))
                        .arg(user.as_str())
                        .arg(ttl_ms)
                        .invoke_async(&mut con),
                )
                .await?;
            if stored == 1 {
                return Ok(token);
            }
        }
        Err(LedgerError::Corrupt(
            "fresh submit tokens keep colliding with stored ones; is the random source broken?".into(),
        ))
    }

    async fn confirm(&self, sku: &SkuId, seller: &Seller, purchases: &[Purchase]) -> Result<BatchOutcome, LedgerError> {
        assert!(purchases.len() <= BATCH_MAX, "confirm takes at most BATCH_MAX purchases");
        let keys = self.keys(sku);
        let mut invocation = CONFIRM.key(&keys.meta);
        invocation.key(&keys.by_epoch).key(&keys.by_user).key(&keys.orders);
        invocation.arg(sku.as_str()).arg(seller.node.as_str()).arg(self.config.idempotency_ttl.as_secs().max(1));
        invocation.arg(seller.epoch_key());
        for purchase in purchases {
            invocation.key(format!("{}{}", keys.record_prefix, purchase.key));
            let token = purchase.token.as_ref().map_or("", SubmitToken::as_str);
            invocation.key(format!("{}{token}", keys.token_prefix));
            invocation.arg(purchase.key.as_str()).arg(purchase.user.as_str()).arg(purchase.qty);
        }
        let mut con = self.connection();
        let reply: Vec<String> = self.call(Some(sku), invocation.invoke_async(&mut con)).await?;
        if reply.len() != purchases.len() * 2 + 2 {
            return Err(LedgerError::Corrupt(format!(
                "confirm returned {} fields for {} purchases",
                reply.len(),
                purchases.len()
            )));
        }
        let verdicts = reply[..purchases.len() * 2]
            .chunks(2)
            .map(|pair| match pair[0].as_str() {
                "fresh" => parse_decision(&pair[1]).map(Verdict::Fresh),
                "replayed" => parse_decision(&pair[1]).map(Verdict::Replayed),
                "key_reused" => Ok(Verdict::KeyReused),
                other => Err(LedgerError::Corrupt(format!("unknown verdict {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sold = parse_count(reply.get(purchases.len() * 2), "sold")?;
        let remaining = parse_count(reply.get(purchases.len() * 2 + 1), "remaining")?;
        Ok(BatchOutcome { verdicts, sold, remaining })
    }

    async fn sold_by(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let (exists, sold): (bool, Option<u64>) = self
            .call(
                Some(sku),
                ::redis::pipe().exists(&keys.meta).hget(&keys.by_epoch, seller.epoch_key()).query_async(&mut con),
            )
            .await?;
        if !exists {
            return Err(LedgerError::Missing(sku.clone()));
        }
        Ok(sold.unwrap_or(0))
    }

    async fn status(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let (meta, by_epoch): (BTreeMap<String, String>, BTreeMap<String, u64>) = self
            .call(Some(sku), ::redis::pipe().hgetall(&keys.meta).hgetall(&keys.by_epoch).query_async(&mut con))
            .await?;
        if meta.is_empty() {
            return Err(LedgerError::Missing(sku.clone()));
        }
        let field = |name: &str| parse_count(meta.get(name), name);
        let mut sold_by_node: BTreeMap<NodeId, u64> = BTreeMap::new();
        for (seller, sold) in by_epoch {
            let node = seller.rsplit_once('#').map_or(seller.as_str(), |(node, _)| node);
            let node = NodeId::new(node).map_err(|_| LedgerError::Corrupt(format!("bad seller {seller:?}")))?;
            *sold_by_node.entry(node).or_insert(0) += sold;
        }
        let status = SkuStatus {
            total: field("total")?,
            sold: field("sold")?,
            remaining: field("remaining")?,
            per_user_limit: u32::try_from(field("per_user_limit")?)
                .map_err(|_| LedgerError::Corrupt("per_user_limit".into()))?,
            sold_by_node,
            closed: meta.get("closed").is_some_and(|closed| closed == "1"),
            require_token: meta.get("require_token").is_some_and(|required| required == "1"),
        };
        if status.sold + status.remaining != status.total {
            return Err(LedgerError::Corrupt(format!("{sku}: sold + remaining ~= total")));
        }
        Ok(status)
    }

    async fn orders(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<OrderEvent>, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let limit = limit.min(ORDER_EVENTS_MAX);
        // Stream ids are `0-<seq>` (see confirm.lua); `(` makes the start exclusive.
        let entries: Vec<(String, Vec<(String, String)>)> = self
            .call(
                Some(sku),
                ::redis::cmd("XRANGE")
                    .arg(&keys.orders)
                    .arg(format!("(0-{after}"))
                    .arg("+")
                    .arg("COUNT")
                    .arg(limit)
                    .query_async(&mut con),
            )
            .await?;
        entries
            .into_iter()
            .map(|(id, fields)| {
                let fields: BTreeMap<String, String> = fields.into_iter().collect();
                let get = |name: &str| {
                    fields
                        .get(name)
                        .map(String::as_str)
                        .ok_or_else(|| LedgerError::Corrupt(format!("order {id} lacks {name}")))
                };
                let bad = |what: &str| LedgerError::Corrupt(format!("order {id} has a bad {what}"));
                let seq = id.strip_prefix("0-").and_then(|seq| seq.parse().ok()).ok_or_else(|| bad("stream id"))?;
                Ok(OrderEvent {
                    seq,
                    order_id: OrderId(get("order_id")?.to_string()),
                    key: IdempotencyKey::new(get("key")?).map_err(|_| bad("key"))?,
                    user: UserId::new(get("user")?).map_err(|_| bad("user"))?,
                    qty: get("qty")?.parse().map_err(|_| bad("qty"))?,
                    node: NodeId::new(get("node")?).map_err(|_| bad("node"))?,
                })
            })
            .collect()
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        let mut con = self.connection();
        let _: String = self.call(None, async { con.ping().await }).await?;
        Ok(())
    }
}
