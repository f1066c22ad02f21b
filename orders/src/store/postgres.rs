//! [`PostgresStore`]: the order store on PostgreSQL, for production.
//!
//! A bounded pool of connections (deadpool), every wait on it and every call bounded by a
//! timeout. Each state change is one compare-and-set `UPDATE`, which PostgreSQL re-checks
//! against the row's newest version when two writers race (READ COMMITTED), so exactly one
//! wins. A payment's reference is claimed first with `INSERT … ON CONFLICT DO NOTHING`: a
//! concurrent duplicate notification waits on that row and then finds it, so only one of them
//! ever changes the order.
//!
//! No TLS: the store talks to PostgreSQL on loopback or a private network. Passwords never
//! appear in an error: [`redact`] masks them in the URL and in any message.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::{NoTls, Row};

use super::codec::*;
use super::transitions::*;
use super::{OrderStore, StoreError};
use crate::lifecycle::{self, settle};
use crate::model::*;

/// Connections the pool keeps at most: enough for the consumer, the sweeper, the releaser and a
/// burst of payment notifications, few enough that several services share one PostgreSQL.
const POOL_SIZE_MAX: usize = 16;

/// Connections kept apart for storing order events (the consumers' batch inserts): a burst of
/// payment notifications can hold every connection of the main pool, and the orders of the sale
/// behind them must still land within a second.
const FEED_POOL_SIZE_MAX: usize = 4;

/// How long opening one connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a call waits for a free pooled connection.
const POOL_WAIT_MAX: Duration = Duration::from_secs(5);

/// How long one store call may take in all (waiting for a connection included); past it the
/// call fails as unavailable and its transaction, if any, is rolled back.
const CALL_MAX: Duration = Duration::from_secs(15);

const _: () = assert!(POOL_WAIT_MAX.as_millis() < CALL_MAX.as_millis());

/// The advisory lock that serializes migrations when several services start on one database.
const MIGRATION_LOCK_ID: i64 = 0x5EC_0001;

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// The consumers' own connections ([`FEED_POOL_SIZE_MAX`]).
    feed: Pool,
    /// The password(s) the URL carried, masked out of every error message.
    secrets: Arc<Vec<String>>,
}

/// What a call can fail with before it becomes a [`StoreError`].
enum Failure {
    Store(StoreError),
    Postgres(tokio_postgres::Error),
    Pool(PoolError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Postgres(e)
    }
}

impl From<PoolError> for Failure {
    fn from(e: PoolError) -> Self {
        Failure::Pool(e)
    }
}

/// The passwords in a connection string: a URL's `user:password@`, or `password=` (a
/// key-value string, or a URL's query parameter).
fn passwords_in(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Some((_, rest)) = url.split_once("://") {
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if let Some((_, password)) = userinfo.split_once(':') {
                found.push(password.to_string());
            }
        }
    }
    let mut rest = url;
    while let Some(at) = rest.find("password=") {
        rest = &rest[at + "password=".len()..];
        let value = match rest.strip_prefix('\'') {
            Some(quoted) => quoted.split('\'').next().unwrap_or(""),
            None => rest.split([' ', '&']).next().unwrap_or(""),
        };
        found.push(value.to_string());
    }
    found.retain(|password| !password.is_empty());
    found
}

fn mask(text: &str, secrets: &[String]) -> String {
    secrets.iter().fold(text.to_string(), |text, secret| text.replace(secret.as_str(), "***"))
}

/// `url` with its password replaced by `***`, fit for logs and error messages.
pub fn redact(url: &str) -> String {
    mask(url, &passwords_in(url))
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, column: usize) -> Result<T, Failure> {
    row.try_get(column).map_err(|e| Failure::Store(StoreError::Corrupt(format!("column {column}: {e}"))))
}

/// A row of `N` integer columns, in order (the counts queries).
fn integers<const N: usize>(row: &Row) -> Result<[i64; N], Failure> {
    let mut values = [0i64; N];
    for (column, value) in values.iter_mut().enumerate() {
        *value = get(row, column)?;
    }
    Ok(values)
}

fn order_from_row(row: &Row) -> Result<Order, Failure> {
    let state: String = get(row, 9)?;
    Ok(Order {
        new: NewOrder {
            id: get(row, 0)?,
            sku: get(row, 1)?,
            user: get(row, 2)?,
            qty: qty_from_sql(get(row, 3)?)?,
            node: get(row, 4)?,
            idempotency_key: get(row, 5)?,
            stream_seq: from_sql(get(row, 6)?, "stream_seq")?,
            unit_price: from_sql(get(row, 7)?, "unit_price")?,
            currency: get(row, 8)?,
            created_at_ms: from_sql(get(row, 10)?, "created_at_ms")?,
            pay_deadline_ms: from_sql(get(row, 11)?, "pay_deadline_ms")?,
        },
        state: state_from_sql(&state)?,
        payment_ref: get(row, 12)?,
        paid_at_ms: opt_from_sql(get(row, 13)?, "paid_at_ms")?,
        expired_at_ms: opt_from_sql(get(row, 14)?, "expired_at_ms")?,
        cancelled_at_ms: opt_from_sql(get(row, 15)?, "cancelled_at_ms")?,
        released_at_ms: opt_from_sql(get(row, 16)?, "released_at_ms")?,
        updated_at_ms: from_sql(get(row, 17)?, "updated_at_ms")?,
        release_refused: get(row, 18)?,
        payment_started_at_ms: opt_from_sql(get(row, 19)?, "payment_started_at_ms")?,
        payment_check_at_ms: opt_from_sql(get(row, 20)?, "payment_check_at_ms")?,
        payment_checks: attempts_from_sql(get(row, 21)?, "payment_checks")?,
        payment_attempt: attempts_from_sql(get(row, 22)?, "payment_attempt")?,
    })
}

fn payment_from_row(row: &Row) -> Result<PaymentRecord, Failure> {
    let columns: PaymentRow = (
        get(row, 0)?,
        get(row, 1)?,
        get(row, 2)?,
        get(row, 3)?,
        get(row, 4)?,
        get(row, 5)?,
        get(row, 6)?,
        get(row, 7)?,
        get(row, 8)?,
        get(row, 9)?,
    );
    Ok(payment_from_sql(columns)?)
}

/// Applies a recorded payment (its row says `awaiting_order`) to its order if the order is
/// stored, inside the caller's transaction: [`settle`] decides, and this persists the decision,
/// the order's transition and the payment's outcome, each exactly once. The order's row is
/// locked first, so a concurrent payment, cancel or expiry of the same order waits for this
/// decision.
async fn apply_payment(tx: &deadpool_postgres::Transaction<'_>, payment: &Payment) -> Result<PaymentOutcome, Failure> {
    let locked = format!("{} FOR UPDATE", for_postgres(ORDER_FOR_PAYMENT));
    let order = tx.query_opt(&locked, &[&payment.order_id]).await?;
    let Some(order) = order else { return Ok(PaymentOutcome::AwaitingOrder) };
    let facts = facts_from_sql(&get::<String>(&order, 0)?, get(&order, 1)?, get(&order, 2)?, get(&order, 3)?)?;
    let settlement = settle(&facts, payment);
    let received_at_ms = to_sql(payment.received_at_ms, "received_at_ms")?;
    if let Some(to) = settlement.to {
        let changed = tx
            .execute(
                &for_postgres(SETTLE_ORDER),
                &[&payment.order_id, &to.as_str(), &payment.reference, &received_at_ms, &facts.state.as_str()],
            )
            .await?;
        debug_assert_eq!(changed, 1, "the row lock keeps the order as decided on until the transition");
    }
    let refund = settlement.refund().map(RefundState::as_str);
    let changed = tx
        .execute(
            &for_postgres(SETTLE_PAYMENT),
            &[&payment.reference, &outcome_to_sql(&settlement.outcome), &refund, &settlement.refund_reason],
        )
        .await?;
    debug_assert_eq!(changed, 1, "a claimed payment is decided once");
    Ok(settlement.outcome)
}

fn orders_from_rows(rows: &[Row]) -> Result<Vec<Order>, Failure> {
    rows.iter().map(order_from_row).collect()
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/db` or a key-value
    /// string) and brings its schema up to date.
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let secrets = Arc::new(passwords_in(url));
        let mut config = tokio_postgres::Config::from_str(url).map_err(|e| {
            StoreError::Invalid(format!("bad PostgreSQL URL {}: {}", redact(url), mask(&e.to_string(), &secrets)))
        })?;
        config.connect_timeout(CONNECT_TIMEOUT);
        let pool = |max_size: usize| {
            let manager = Manager::from_config(
                config.clone(),
                NoTls,
                // Fast: a pooled connection that the server closed is found broken on its next
                // use and replaced; a test query on every checkout would double the round trips.
                ManagerConfig { recycling_method: RecyclingMethod::Fast },
            );
            Pool::builder(manager)
                .max_size(max_size)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(POOL_WAIT_MAX))
                .create_timeout(Some(CONNECT_TIMEOUT))
                .recycle_timeout(Some(CONNECT_TIMEOUT))
                .build()
                .map_err(|e| StoreError::Invalid(format!("PostgreSQL pool for {}: {e}", redact(url))))
        };
        let store = PostgresStore { pool: pool(POOL_SIZE_MAX)?, feed: pool(FEED_POOL_SIZE_MAX)?, secrets };
        store.bounded(store.migrate()).await.map_err(|e| match e {
            StoreError::Unavailable(message) => {
                StoreError::Unavailable(format!("PostgreSQL at {}: {message}", redact(url)))
            }
            other => other,
        })?;
        Ok(store)
    }

    /// Runs one call under [`CALL_MAX`] and turns its failure into a [`StoreError`] with every
    /// password masked.
    async fn bounded<T>(&self, work: impl Future<Output = Result<T, Failure>>) -> Result<T, StoreError> {
        let failure = match tokio::time::timeout(CALL_MAX, work).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(failure)) => failure,
            Err(_) => return Err(StoreError::Unavailable(format!("PostgreSQL did not answer within {CALL_MAX:?}"))),
        };
        Err(match failure {
            Failure::Store(StoreError::Unavailable(message)) => StoreError::Unavailable(mask(&message, &self.secrets)),
            Failure::Store(e) => e,
            Failure::Postgres(e) => StoreError::Unavailable(mask(&format!("postgres: {e}"), &self.secrets)),
            Failure::Pool(e) => StoreError::Unavailable(mask(&format!("postgres pool: {e}"), &self.secrets)),
        })
    }

    /// Applies every migration newer than the database's version in one transaction, under an
    /// advisory lock so two services starting together do not both apply them.
    async fn migrate(&self) -> Result<(), Failure> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_ID]).await?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY NOT NULL)").await?;
        let found: i64 =
            get(&tx.query_one("SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations", &[]).await?, 0)?;
        check_version(found, POSTGRES_MIGRATIONS)?;
        for migration in POSTGRES_MIGRATIONS.iter().filter(|m| m.version > found) {
            tx.batch_execute(migration.sql).await?;
            tx.execute("INSERT INTO schema_migrations (version) VALUES ($1)", &[&migration.version]).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn query_orders(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Order>, Failure> {
        let client = self.pool.get().await?;
        let statement = client.prepare_cached(sql).await?;
        orders_from_rows(&client.query(&statement, params).await?)
    }

    async fn execute(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> Result<u64, Failure> {
        let client = self.pool.get().await?;
        let statement = client.prepare_cached(sql).await?;
        Ok(client.execute(&statement, params).await?)
    }

    async fn insert_batch(&self, orders: &[NewOrder]) -> Result<u64, Failure> {
        check_batch(orders)?;
        if orders.is_empty() {
            return Ok(0);
        }
        let texts = |field: fn(&NewOrder) -> &str| orders.iter().map(|o| field(o).to_string()).collect::<Vec<_>>();
        let ints = |field: fn(&NewOrder) -> u64, what: &str| {
            orders.iter().map(|o| to_sql(field(o), what)).collect::<Result<Vec<i64>, StoreError>>()
        };
        let ids = texts(|o| &o.id);
        let skus = texts(|o| &o.sku);
        let users = texts(|o| &o.user);
        let qtys = ints(|o| u64::from(o.qty), "qty")?;
        let nodes = texts(|o| &o.node);
        let keys = texts(|o| &o.idempotency_key);
        let seqs = ints(|o| o.stream_seq, "stream_seq")?;
        let prices = ints(|o| o.unit_price, "unit_price")?;
        let currencies = texts(|o| &o.currency);
        let created = ints(|o| o.created_at_ms, "created_at_ms")?;
        let deadlines = ints(|o| o.pay_deadline_ms, "pay_deadline_ms")?;
        // One statement: the batch is stored whole or not at all, and a row that collides with a
        // stored order (or with an earlier row of the batch) on any unique key is skipped. On
        // the consumers' own connections, so payments never queue the sale's orders.
        let client = self.feed.get().await?;
        let statement = client
            .prepare_cached(
                "INSERT INTO orders (id, sku, user_id, qty, node, idempotency_key, stream_seq, unit_price, currency, \
             state, created_at_ms, pay_deadline_ms, updated_at_ms) \
             SELECT id, sku, user_id, qty, node, idempotency_key, stream_seq, unit_price, currency, \
             'pending_payment', created_at_ms, pay_deadline_ms, created_at_ms \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bigint[], \
             $8::bigint[], $9::text[], $10::bigint[], $11::bigint[]) \
             AS batch (id, sku, user_id, qty, node, idempotency_key, stream_seq, unit_price, currency, \
             created_at_ms, pay_deadline_ms) \
             ON CONFLICT DO NOTHING",
            )
            .await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 11] =
            [&ids, &skus, &users, &qtys, &nodes, &keys, &seqs, &prices, &currencies, &created, &deadlines];
        Ok(client.execute(&statement, &params).await?)
    }

    async fn record_payment(&self, payment: &Payment) -> Result<PaymentOutcome, Failure> {
        let amount = to_sql(payment.amount, "amount")?;
        let received_at_ms = to_sql(payment.received_at_ms, "received_at_ms")?;
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // Claim the reference first. A concurrent notification of the same reference blocks here
        // until this transaction ends, then finds the row: one of them decides, never both.
        let claimed = tx
            .execute(
                &for_postgres(CLAIM_PAYMENT),
                &[
                    &payment.reference,
                    &payment.order_id,
                    &amount,
                    &payment.currency,
                    &received_at_ms,
                    &payment.source.as_str(),
                ],
            )
            .await?;
        if claimed == 0 {
            let first = tx
                .query_opt(&for_postgres(FIRST_PAYMENT), &[&payment.reference])
                .await?
                .ok_or_else(|| StoreError::Unavailable("a payment reference vanished while read; retry".into()))?;
            tx.rollback().await?;
            let first: FirstPayment =
                (get(&first, 0)?, get(&first, 1)?, get(&first, 2)?, get(&first, 3)?, get(&first, 4)?);
            return Ok(repeat_of(first, payment)?);
        }
        let outcome = apply_payment(&tx, payment).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    async fn settle_awaiting(&self, limit: usize) -> Result<Vec<(String, PaymentOutcome)>, Failure> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // SKIP LOCKED: a payment another settler (or its own notification's transaction) holds
        // is that one's to apply.
        let sql = format!(
            "SELECT {PAYMENT_COLUMNS} FROM payments WHERE outcome = 'awaiting_order' \
             AND EXISTS (SELECT 1 FROM orders WHERE orders.id = payments.order_id) \
             ORDER BY received_at_ms, reference LIMIT $1 FOR UPDATE SKIP LOCKED"
        );
        let rows = tx.query(&sql, &[&limit_to_sql(limit)]).await?;
        let mut settled = Vec::with_capacity(rows.len());
        for row in &rows {
            let record = payment_from_row(row)?;
            let payment = Payment {
                order_id: record.order_id,
                reference: record.reference.clone(),
                amount: record.amount,
                currency: record.currency,
                received_at_ms: record.received_at_ms,
                source: record.source,
            };
            let outcome = apply_payment(&tx, &payment).await?;
            debug_assert_ne!(
                outcome,
                PaymentOutcome::AwaitingOrder,
                "the payment was selected because its order is stored"
            );
            settled.push((record.reference, outcome));
        }
        tx.commit().await?;
        Ok(settled)
    }

    async fn query_payments(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<PaymentRecord>, Failure> {
        let client = self.pool.get().await?;
        let rows = client.query(sql, params).await?;
        rows.iter().map(payment_from_row).collect()
    }

    async fn state_of(&self, id: &str) -> Result<Option<OrderState>, Failure> {
        let client = self.pool.get().await?;
        let row = client.query_opt(&for_postgres(ORDER_STATE), &[&id]).await?;
        Ok(match row {
            Some(row) => Some(state_from_sql(&get::<String>(&row, 0)?)?),
            None => None,
        })
    }

    async fn cancel(&self, id: &str, user: &str, now_ms: u64) -> Result<CancelOutcome, Failure> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        let owner = {
            let client = self.pool.get().await?;
            client.query_opt(&for_postgres(ORDER_OWNER), &[&id]).await?
        };
        match owner {
            Some(row) if get::<String>(&row, 0)? == user => {}
            _ => return Ok(CancelOutcome::UnknownOrder),
        }
        let changed = self.execute(&for_postgres(CANCEL), &[&id, &now_ms]).await?;
        let mut state = None;
        if changed == 0 {
            state = self.state_of(id).await?;
        }
        Ok(lifecycle::cancel_outcome(changed, || state))
    }

    async fn expire(&self, id: &str, fence: u64, now_ms: u64) -> Result<ExpireOutcome, Failure> {
        let fence = to_sql(fence, "fence")?;
        let now_ms = to_sql(now_ms, "now_ms")?;
        let changed = self.execute(&for_postgres(EXPIRE), &[&id, &now_ms, &fence]).await?;
        let mut current = None;
        if changed == 0 {
            let client = self.pool.get().await?;
            let value: i64 = get(&client.query_one(SWEEPER_FENCE, &[]).await?, 0)?;
            current = Some(from_sql(value, "sweeper fence")?);
        }
        let fence = from_sql(fence, "fence")?;
        Ok(lifecycle::expire_outcome(changed, fence, || current.unwrap_or(0)))
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Failure> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT sku, stream_seq, fields, reason, deliveries, at_ms FROM dead_letters \
                 ORDER BY at_ms, sku, stream_seq LIMIT $1",
                &[&limit_to_sql(limit)],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(DeadLetter {
                    sku: get(row, 0)?,
                    stream_seq: from_sql(get(row, 1)?, "stream_seq")?,
                    fields: fields_from_sql(&get::<String>(row, 2)?)?,
                    reason: get(row, 3)?,
                    deliveries: from_sql(get(row, 4)?, "deliveries")?,
                    at_ms: from_sql(get(row, 5)?, "at_ms")?,
                })
            })
            .collect()
    }

    async fn counts(&self, sku: &str) -> Result<SkuOrderCounts, Failure> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT COUNT(*)::BIGINT, \
             COALESCE(SUM(CASE WHEN state = 'pending_payment' THEN qty ELSE 0 END), 0)::BIGINT, \
             COALESCE(SUM(CASE WHEN state = 'paid' THEN qty ELSE 0 END), 0)::BIGINT, \
             COALESCE(SUM(CASE WHEN state = 'expired' THEN qty ELSE 0 END), 0)::BIGINT, \
             COALESCE(SUM(CASE WHEN state = 'cancelled' THEN qty ELSE 0 END), 0)::BIGINT, \
             COALESCE(SUM(CASE WHEN state = 'paid_after_expiry' THEN qty ELSE 0 END), 0)::BIGINT, \
             COUNT(*) FILTER (WHERE state IN {GIVES_BACK_SQL} AND released_at_ms IS NULL \
                 AND release_refused IS NULL)::BIGINT, \
             COALESCE(SUM(CASE WHEN release_refused IS NOT NULL THEN qty ELSE 0 END), 0)::BIGINT, \
             GREATEST(COALESCE(MAX(stream_seq), 0), \
                 (SELECT COALESCE(MAX(stream_seq), 0) FROM dead_letters WHERE sku = $1))::BIGINT \
             FROM orders WHERE sku = $1"
        );
        let row = client.query_one(&sql, &[&sku]).await?;
        Ok(counts_from_sql(integers(&row)?)?)
    }

    async fn stored_seqs(&self, sku: &str, from: u64, to: u64) -> Result<Vec<u64>, Failure> {
        let (from, to) = (to_sql(from, "from")?, to_sql(to, "to")?);
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT stream_seq FROM orders WHERE sku = $1 AND stream_seq BETWEEN $2 AND $3 \
                 UNION SELECT stream_seq FROM dead_letters WHERE sku = $1 AND stream_seq BETWEEN $2 AND $3 \
                 ORDER BY 1",
                &[&sku, &from, &to],
            )
            .await?;
        rows.iter().map(|row| Ok(from_sql(get(row, 0)?, "stream_seq")?)).collect()
    }

    async fn state_counts(&self) -> Result<Vec<(String, OrderState, u64)>, Failure> {
        let client = self.pool.get().await?;
        let rows = client
            .query("SELECT sku, state, COUNT(*)::BIGINT FROM orders GROUP BY sku, state ORDER BY sku, state", &[])
            .await?;
        rows.iter()
            .map(|row| Ok((get(row, 0)?, state_from_sql(&get::<String>(row, 1)?)?, from_sql(get(row, 2)?, "count")?)))
            .collect()
    }
}

#[async_trait::async_trait]
impl OrderStore for PostgresStore {
    async fn insert_batch(&self, orders: &[NewOrder]) -> Result<u64, StoreError> {
        self.bounded(PostgresStore::insert_batch(self, orders)).await
    }

    async fn get(&self, id: &str) -> Result<Option<Order>, StoreError> {
        let sql = format!("SELECT {ORDER_COLUMNS} FROM orders WHERE id = $1");
        self.bounded(async { Ok(self.query_orders(&sql, &[&id]).await?.pop()) }).await
    }

    async fn by_user(&self, user: &str, limit: usize) -> Result<Vec<Order>, StoreError> {
        let sql = format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE user_id = $1 ORDER BY created_at_ms DESC, id DESC LIMIT $2"
        );
        self.bounded(self.query_orders(&sql, &[&user, &limit_to_sql(limit)])).await
    }

    async fn record_payment(&self, payment: &Payment) -> Result<PaymentOutcome, StoreError> {
        self.bounded(PostgresStore::record_payment(self, payment)).await
    }

    async fn settle_awaiting(&self, limit: usize) -> Result<Vec<(String, PaymentOutcome)>, StoreError> {
        self.bounded(PostgresStore::settle_awaiting(self, limit)).await
    }

    async fn payments_of(&self, order_id: &str) -> Result<Vec<PaymentRecord>, StoreError> {
        let sql =
            format!("SELECT {PAYMENT_COLUMNS} FROM payments WHERE order_id = $1 ORDER BY received_at_ms, reference");
        self.bounded(self.query_payments(&sql, &[&order_id])).await
    }

    async fn refunds_owed(&self, limit: usize) -> Result<Vec<PaymentRecord>, StoreError> {
        let sql = format!(
            "SELECT {PAYMENT_COLUMNS} FROM payments WHERE refund = 'owed' ORDER BY received_at_ms, reference LIMIT $1"
        );
        self.bounded(self.query_payments(&sql, &[&limit_to_sql(limit)])).await
    }

    async fn start_payment(&self, id: &str, grace_ms: u64, now_ms: u64) -> Result<StartPayment, StoreError> {
        let (grace, now) = (to_sql(grace_ms, "grace_ms")?, to_sql(now_ms, "now_ms")?);
        let sql = format!("SELECT {ORDER_COLUMNS} FROM orders WHERE id = $1");
        self.bounded(async {
            let changed = self.execute(&for_postgres(START_PAYMENT), &[&id, &now, &grace]).await?;
            lifecycle::changed_once(changed, "starting a payment");
            let order = self.query_orders(&sql, &[&id]).await?.pop();
            Ok(lifecycle::start_payment_outcome(order, now_ms))
        })
        .await
    }

    async fn next_payment_attempt(&self, id: &str, current: u32, now_ms: u64) -> Result<Option<u32>, StoreError> {
        let (now, current) = (to_sql(now_ms, "now_ms")?, i32::try_from(current).unwrap_or(i32::MAX));
        self.bounded(async {
            let changed = self.execute(&for_postgres(NEXT_PAYMENT_ATTEMPT), &[&id, &current, &now]).await?;
            lifecycle::changed_once(changed, "moving to the next payment attempt");
            let client = self.pool.get().await?;
            let row = client.query_opt(&for_postgres(PAYMENT_ATTEMPT), &[&id]).await?;
            let attempt: Option<i32> = row.map(|row| get(&row, 0)).transpose()?;
            Ok(attempt.map(|attempt| attempts_from_sql(attempt, "payment_attempt")).transpose()?)
        })
        .await
    }

    async fn payment_checks_due(&self, now_ms: u64, limit: usize) -> Result<Vec<Order>, StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        let sql = format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE payment_check_at_ms <= $1 AND state IN {CHECKED_SQL} \
             ORDER BY payment_check_at_ms, id LIMIT $2"
        );
        self.bounded(self.query_orders(&sql, &[&now_ms, &limit_to_sql(limit)])).await
    }

    async fn schedule_payment_check(&self, id: &str, next_at_ms: Option<u64>) -> Result<(), StoreError> {
        let next_at_ms = next_at_ms.map(|at| to_sql(at, "next_at_ms")).transpose()?;
        self.bounded(async {
            self.execute(&for_postgres(SCHEDULE_PAYMENT_CHECK), &[&id, &next_at_ms]).await?;
            Ok(())
        })
        .await
    }

    async fn refunds_due(&self, now_ms: u64, limit: usize) -> Result<Vec<PaymentRecord>, StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        let sql = format!(
            "SELECT {PAYMENT_COLUMNS} FROM payments WHERE refund IN ('owed', 'pending') \
             AND COALESCE(refund_at_ms, 0) <= $1 ORDER BY received_at_ms, reference LIMIT $2"
        );
        self.bounded(self.query_payments(&sql, &[&now_ms, &limit_to_sql(limit)])).await
    }

    async fn refund_pending(&self, reference: &str, next_at_ms: u64) -> Result<(), StoreError> {
        let next_at_ms = to_sql(next_at_ms, "next_at_ms")?;
        self.bounded(async {
            let changed = self.execute(&for_postgres(REFUND_PENDING), &[&reference, &next_at_ms]).await?;
            lifecycle::changed_once(changed, "a refund asked");
            Ok(())
        })
        .await
    }

    async fn mark_refunded(&self, reference: &str, now_ms: u64) -> Result<bool, StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.bounded(async {
            let changed = self.execute(&for_postgres(MARK_REFUNDED), &[&reference, &now_ms]).await?;
            Ok(lifecycle::changed_once(changed, "a refund acknowledged"))
        })
        .await
    }

    async fn redrive_payments(&self, now_ms: u64) -> Result<(u64, u64), StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.bounded(async {
            let checks = self.execute(&for_postgres(REDRIVE_CHECKS), &[&now_ms]).await?;
            let refunds = self.execute(&for_postgres(REDRIVE_REFUNDS), &[&now_ms]).await?;
            Ok((checks, refunds))
        })
        .await
    }

    async fn cancel(&self, id: &str, user: &str, now_ms: u64) -> Result<CancelOutcome, StoreError> {
        self.bounded(PostgresStore::cancel(self, id, user, now_ms)).await
    }

    async fn due_for_expiry(&self, now_ms: u64, limit: usize) -> Result<Vec<Order>, StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        let sql = format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE state = 'pending_payment' AND pay_deadline_ms <= $1 \
             AND payment_check_at_ms IS NULL ORDER BY pay_deadline_ms, id LIMIT $2"
        );
        self.bounded(self.query_orders(&sql, &[&now_ms, &limit_to_sql(limit)])).await
    }

    async fn raise_fence(&self, fence: u64) -> Result<(), StoreError> {
        let fence = to_sql(fence, "fence")?;
        self.bounded(async {
            self.execute(&for_postgres(RAISE_FENCE), &[&fence]).await?;
            Ok(())
        })
        .await
    }

    async fn expire(&self, id: &str, fence: u64, now_ms: u64) -> Result<ExpireOutcome, StoreError> {
        self.bounded(PostgresStore::expire(self, id, fence, now_ms)).await
    }

    async fn unreleased(&self, after: Option<&ReleaseCursor>, limit: usize) -> Result<Vec<Order>, StoreError> {
        let (deadline, id) = match after {
            Some(cursor) => (to_sql(cursor.pay_deadline_ms, "cursor deadline")?, cursor.id.clone()),
            None => (-1, String::new()),
        };
        let sql = format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE released_at_ms IS NULL AND release_refused IS NULL \
             AND state IN {GIVES_BACK_SQL} AND (pay_deadline_ms, id) > ($1, $2) \
             ORDER BY pay_deadline_ms, id LIMIT $3"
        );
        self.bounded(self.query_orders(&sql, &[&deadline, &id, &limit_to_sql(limit)])).await
    }

    async fn mark_release_refused(&self, id: &str, reason: &str, now_ms: u64) -> Result<bool, StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.bounded(async {
            let changed = self.execute(&for_postgres(MARK_RELEASE_REFUSED), &[&id, &reason, &now_ms]).await?;
            Ok(lifecycle::changed_once(changed, "a refused release"))
        })
        .await
    }

    async fn mark_released(&self, id: &str, now_ms: u64) -> Result<bool, StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.bounded(async {
            let changed = self.execute(&for_postgres(MARK_RELEASED), &[&id, &now_ms]).await?;
            Ok(lifecycle::changed_once(changed, "a release"))
        })
        .await
    }

    async fn dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        let fields = fields_to_sql(&letter.fields)?;
        let stream_seq = to_sql(letter.stream_seq, "stream_seq")?;
        let deliveries = to_sql(letter.deliveries, "deliveries")?;
        let at_ms = to_sql(letter.at_ms, "at_ms")?;
        self.bounded(async {
            self.execute(
                "INSERT INTO dead_letters (sku, stream_seq, fields, reason, deliveries, at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                &[&letter.sku, &stream_seq, &fields, &letter.reason, &deliveries, &at_ms],
            )
            .await?;
            Ok(())
        })
        .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        self.bounded(PostgresStore::dead_letters(self, limit)).await
    }

    async fn money_counts(&self, sku: &str) -> Result<SkuMoneyCounts, StoreError> {
        self.bounded(async {
            let client = self.pool.get().await?;
            let sql = money_counts_sql("$1").replace("COUNT(*)", "COUNT(*)::BIGINT");
            let row = client.query_one(&sql, &[&sku]).await?;
            Ok(money_counts_from_sql(integers(&row)?)?)
        })
        .await
    }

    async fn counts(&self, sku: &str) -> Result<SkuOrderCounts, StoreError> {
        self.bounded(PostgresStore::counts(self, sku)).await
    }

    async fn stored_seqs(&self, sku: &str, from: u64, to: u64) -> Result<Vec<u64>, StoreError> {
        self.bounded(PostgresStore::stored_seqs(self, sku, from, to)).await
    }

    async fn state_counts(&self) -> Result<Vec<(String, OrderState, u64)>, StoreError> {
        self.bounded(PostgresStore::state_counts(self)).await
    }

    async fn delete_for_test(&self, id: &str) -> Result<(), StoreError> {
        self.bounded(async {
            self.execute("DELETE FROM orders WHERE id = $1", &[&id]).await?;
            Ok(())
        })
        .await
    }

    async fn remember_opened(&self, opened: &OpenedPayment) -> Result<(), StoreError> {
        let (amount, at) = (to_sql(opened.amount, "amount")?, to_sql(opened.created_at_ms, "created_at_ms")?);
        self.bounded(async {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                [&opened.order_id, &opened.payment_id, &opened.pay_url, &amount, &opened.currency, &at];
            self.execute(&for_postgres(REMEMBER_OPENED), &params).await?;
            Ok(())
        })
        .await
    }

    async fn opened_payment(&self, order_id: &str) -> Result<Option<OpenedPayment>, StoreError> {
        let sql = format!("SELECT {OPENED_COLUMNS} FROM payment_starts WHERE order_id = $1");
        self.bounded(async {
            let client = self.pool.get().await?;
            let statement = client.prepare_cached(&sql).await?;
            let Some(row) = client.query_opt(&statement, &[&order_id]).await? else { return Ok(None) };
            let columns: OpenedRow =
                (get(&row, 0)?, get(&row, 1)?, get(&row, 2)?, get(&row, 3)?, get(&row, 4)?, get(&row, 5)?);
            Ok(Some(opened_from_sql(columns)?))
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(async {
            let client = self.pool.get().await?;
            client.simple_query("SELECT 1").await?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_masks_the_password_of_every_form() {
        assert_eq!(redact("postgres://orders:s3cret@db:5432/seckill"), "postgres://orders:***@db:5432/seckill");
        assert_eq!(redact("postgres://orders@db/seckill"), "postgres://orders@db/seckill");
        assert_eq!(redact("host=db user=orders password=s3cret dbname=x"), "host=db user=orders password=*** dbname=x");
        assert_eq!(redact("host=db password='a b' dbname=x"), "host=db password='***' dbname=x");
        assert_eq!(redact("postgres://db/seckill?user=o&password=s3cret"), "postgres://db/seckill?user=o&password=***");
    }
}
