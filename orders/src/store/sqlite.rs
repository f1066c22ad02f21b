//! [`SqliteStore`]: the order store in one SQLite file, for zero-setup runs and tests.
//!
//! One connection behind a std `Mutex`, used only inside `spawn_blocking` (SQLite calls block,
//! and the guard is never held across an `.await`), so every call runs alone and each
//! compare-and-set sees the last committed state. WAL journal with `synchronous=FULL`: a
//! committed order or payment survives a power cut (NORMAL could lose the last commits, and an
//! order lost after the ledger sold its units is a unit nobody pays for or gets back).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};

use super::codec::*;
use super::transitions::*;
use super::{OrderStore, StoreError};
use crate::lifecycle::{self, settle};
use crate::model::*;

/// How long a statement waits for another process holding the file's write lock before it fails
/// as unavailable (only another process can: this one serializes its calls).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct SqliteStore {
    connection: Arc<Mutex<Connection>>,
}

fn unavailable(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::InvalidColumnType(..) => StoreError::Corrupt(e.to_string()),
        e => StoreError::Unavailable(format!("sqlite: {e}")),
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let connection = tokio::task::spawn_blocking(move || {
            let connection = Connection::open(&path)
                .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
            let mode: String =
                connection.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(unavailable)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::Unavailable(format!(
                    "{} cannot use a WAL journal (got {mode})",
                    path.display()
                )));
            }
            Self::prepare(connection)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("sqlite open task failed: {e}")))??;
        Ok(SqliteStore { connection: Arc::new(Mutex::new(connection)) })
    }

    /// A database in memory, gone when the store is dropped: for tests and demos only.
    pub async fn in_memory() -> Result<SqliteStore, StoreError> {
        let connection =
            tokio::task::spawn_blocking(|| Self::prepare(Connection::open_in_memory().map_err(unavailable)?))
                .await
                .map_err(|e| StoreError::Unavailable(format!("sqlite open task failed: {e}")))??;
        Ok(SqliteStore { connection: Arc::new(Mutex::new(connection)) })
    }

    fn prepare(mut connection: Connection) -> Result<Connection, StoreError> {
        connection.pragma_update(None, "synchronous", "FULL").map_err(unavailable)?;
        connection.busy_timeout(BUSY_TIMEOUT).map_err(unavailable)?;
        migrate(&mut connection)?;
        Ok(connection)
    }

    /// Runs `work` on the connection on a blocking thread.
    async fn call<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let connection = self.connection.clone();
        tokio::task::spawn_blocking(move || {
            // A panic inside `work` unwinds through its transaction, whose drop rolls it back, so
            // the connection a poisoned lock guards is still consistent.
            let mut connection = connection.lock().unwrap_or_else(PoisonError::into_inner);
            work(&mut connection)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("sqlite task failed: {e}")))?
    }
}

/// Applies every migration newer than the database's version, each in its own transaction with
/// its `schema_migrations` row.
fn migrate(connection: &mut Connection) -> Result<(), StoreError> {
    let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
    tx.execute_batch("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY NOT NULL)")
        .map_err(unavailable)?;
    let found: i64 = tx
        .query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |row| row.get(0))
        .map_err(unavailable)?;
    check_version(found, SQLITE_MIGRATIONS)?;
    for migration in SQLITE_MIGRATIONS.iter().filter(|m| m.version > found) {
        tx.execute_batch(migration.sql)
            .map_err(|e| StoreError::Unavailable(format!("sqlite migration {} failed: {e}", migration.version)))?;
        tx.execute("INSERT INTO schema_migrations (version) VALUES (?1)", [migration.version]).map_err(unavailable)?;
    }
    tx.commit().map_err(unavailable)
}

fn order_from_row(row: &Row<'_>) -> rusqlite::Result<Result<Order, StoreError>> {
    let state: String = row.get(9)?;
    let decode = || -> Result<Order, StoreError> {
        Ok(Order {
            new: NewOrder {
                id: row.get(0).map_err(unavailable)?,
                sku: row.get(1).map_err(unavailable)?,
                user: row.get(2).map_err(unavailable)?,
                qty: qty_from_sql(row.get(3).map_err(unavailable)?)?,
                node: row.get(4).map_err(unavailable)?,
                idempotency_key: row.get(5).map_err(unavailable)?,
                stream_seq: from_sql(row.get(6).map_err(unavailable)?, "stream_seq")?,
                unit_price: from_sql(row.get(7).map_err(unavailable)?, "unit_price")?,
                currency: row.get(8).map_err(unavailable)?,
                created_at_ms: from_sql(row.get(10).map_err(unavailable)?, "created_at_ms")?,
                pay_deadline_ms: from_sql(row.get(11).map_err(unavailable)?, "pay_deadline_ms")?,
            },
            state: state_from_sql(&state)?,
            payment_ref: row.get(12).map_err(unavailable)?,
            paid_at_ms: opt_from_sql(row.get(13).map_err(unavailable)?, "paid_at_ms")?,
            expired_at_ms: opt_from_sql(row.get(14).map_err(unavailable)?, "expired_at_ms")?,
            cancelled_at_ms: opt_from_sql(row.get(15).map_err(unavailable)?, "cancelled_at_ms")?,
            released_at_ms: opt_from_sql(row.get(16).map_err(unavailable)?, "released_at_ms")?,
            updated_at_ms: from_sql(row.get(17).map_err(unavailable)?, "updated_at_ms")?,
            release_refused: row.get(18).map_err(unavailable)?,
            payment_started_at_ms: opt_from_sql(row.get(19).map_err(unavailable)?, "payment_started_at_ms")?,
            payment_check_at_ms: opt_from_sql(row.get(20).map_err(unavailable)?, "payment_check_at_ms")?,
            payment_checks: attempts_from_sql(row.get(21).map_err(unavailable)?, "payment_checks")?,
            payment_attempt: attempts_from_sql(row.get(22).map_err(unavailable)?, "payment_attempt")?,
        })
    };
    Ok(decode())
}

/// Runs a query for orders and decodes every row.
fn query_orders(connection: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Vec<Order>, StoreError> {
    let mut statement = connection.prepare_cached(sql).map_err(unavailable)?;
    let rows = statement.query_map(params, order_from_row).map_err(unavailable)?;
    let mut orders = Vec::new();
    for row in rows {
        orders.push(row.map_err(unavailable)??);
    }
    Ok(orders)
}

fn state_of(connection: &Connection, id: &str) -> Result<Option<OrderState>, StoreError> {
    let state: Option<String> =
        connection.query_row(ORDER_STATE, [id], |row| row.get(0)).optional().map_err(unavailable)?;
    state.map(|state| state_from_sql(&state)).transpose()
}

/// Claims the payment's reference and applies it, in one write transaction: a reference
/// claimed before answers what its first record did.
fn record_payment(connection: &mut Connection, payment: &Payment) -> Result<PaymentOutcome, StoreError> {
    let amount = to_sql(payment.amount, "amount")?;
    let received_at_ms = to_sql(payment.received_at_ms, "received_at_ms")?;
    let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
    let claimed = tx
        .execute(
            CLAIM_PAYMENT,
            params![
                payment.reference,
                payment.order_id,
                amount,
                payment.currency,
                received_at_ms,
                payment.source.as_str()
            ],
        )
        .map_err(unavailable)?;
    if claimed == 0 {
        let first: FirstPayment = tx
            .query_row(FIRST_PAYMENT, [&payment.reference], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?))
            })
            .map_err(unavailable)?;
        return repeat_of(first, payment);
    }
    let outcome = apply_payment(&tx, payment)?;
    tx.commit().map_err(unavailable)?;
    Ok(outcome)
}

/// Applies a recorded payment (its row says `awaiting_order`) to its order if the order is
/// stored, inside the caller's write transaction: [`settle`] decides, and this persists the
/// decision, the order's transition and the payment's outcome, each exactly once.
fn apply_payment(tx: &Connection, payment: &Payment) -> Result<PaymentOutcome, StoreError> {
    let order: Option<(String, i64, i64, String)> = tx
        .query_row(ORDER_FOR_PAYMENT, [&payment.order_id], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .optional()
        .map_err(unavailable)?;
    let Some((state, unit_price, qty, currency)) = order else { return Ok(PaymentOutcome::AwaitingOrder) };
    let facts = facts_from_sql(&state, unit_price, qty, currency)?;
    let settlement = settle(&facts, payment);
    let received_at_ms = to_sql(payment.received_at_ms, "received_at_ms")?;
    if let Some(to) = settlement.to {
        let changed = tx
            .execute(
                SETTLE_ORDER,
                params![payment.order_id, to.as_str(), payment.reference, received_at_ms, facts.state.as_str()],
            )
            .map_err(unavailable)?;
        debug_assert_eq!(changed, 1, "the write lock keeps the order as decided on until the transition");
    }
    let refund = settlement.refund().map(RefundState::as_str);
    let changed = tx
        .execute(
            SETTLE_PAYMENT,
            params![payment.reference, outcome_to_sql(&settlement.outcome), refund, settlement.refund_reason],
        )
        .map_err(unavailable)?;
    debug_assert_eq!(changed, 1, "a claimed payment is decided once");
    Ok(settlement.outcome)
}

/// A row of `N` integer columns, in order (the counts queries).
fn integers<const N: usize>(row: &Row<'_>) -> rusqlite::Result<[i64; N]> {
    let mut values = [0i64; N];
    for (column, value) in values.iter_mut().enumerate() {
        *value = row.get(column)?;
    }
    Ok(values)
}

fn payment_row(row: &Row<'_>) -> rusqlite::Result<PaymentRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
        row.get(9)?,
    ))
}

fn query_payments(
    connection: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<PaymentRecord>, StoreError> {
    let mut statement = connection.prepare_cached(sql).map_err(unavailable)?;
    let rows = statement.query_map(params, payment_row).map_err(unavailable)?;
    let mut payments = Vec::new();
    for row in rows {
        payments.push(payment_from_sql(row.map_err(unavailable)?)?);
    }
    Ok(payments)
}

fn settle_awaiting(connection: &mut Connection, limit: usize) -> Result<Vec<(String, PaymentOutcome)>, StoreError> {
    let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
    let sql = format!(
        "SELECT {PAYMENT_COLUMNS} FROM payments WHERE outcome = 'awaiting_order' \
         AND EXISTS (SELECT 1 FROM orders WHERE orders.id = payments.order_id) \
         ORDER BY received_at_ms, reference LIMIT ?1"
    );
    let waiting = query_payments(&tx, &sql, [limit_to_sql(limit)])?;
    let mut settled = Vec::with_capacity(waiting.len());
    for record in waiting {
        let payment = Payment {
            order_id: record.order_id,
            reference: record.reference.clone(),
            amount: record.amount,
            currency: record.currency,
            received_at_ms: record.received_at_ms,
            source: record.source,
        };
        let outcome = apply_payment(&tx, &payment)?;
        debug_assert_ne!(
            outcome,
            PaymentOutcome::AwaitingOrder,
            "the payment was selected because its order is stored"
        );
        settled.push((record.reference, outcome));
    }
    tx.commit().map_err(unavailable)?;
    Ok(settled)
}

#[async_trait::async_trait]
impl OrderStore for SqliteStore {
    async fn insert_batch(&self, orders: &[NewOrder]) -> Result<u64, StoreError> {
        check_batch(orders)?;
        let orders = orders.to_vec();
        self.call(move |connection| {
            let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
            let mut inserted = 0u64;
            {
                let mut statement = tx
                    .prepare_cached(
                        "INSERT INTO orders (id, sku, user_id, qty, node, idempotency_key, stream_seq, unit_price, \
                         currency, state, created_at_ms, pay_deadline_ms, updated_at_ms) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'pending_payment', ?10, ?11, ?10) \
                         ON CONFLICT DO NOTHING",
                    )
                    .map_err(unavailable)?;
                for order in &orders {
                    inserted += statement
                        .execute(params![
                            order.id,
                            order.sku,
                            order.user,
                            order.qty,
                            order.node,
                            order.idempotency_key,
                            to_sql(order.stream_seq, "stream_seq")?,
                            to_sql(order.unit_price, "unit_price")?,
                            order.currency,
                            to_sql(order.created_at_ms, "created_at_ms")?,
                            to_sql(order.pay_deadline_ms, "pay_deadline_ms")?,
                        ])
                        .map_err(unavailable)? as u64;
                }
            }
            tx.commit().map_err(unavailable)?;
            Ok(inserted)
        })
        .await
    }

    async fn get(&self, id: &str) -> Result<Option<Order>, StoreError> {
        let id = id.to_string();
        self.call(move |connection| {
            let sql = format!("SELECT {ORDER_COLUMNS} FROM orders WHERE id = ?1");
            Ok(query_orders(connection, &sql, [id])?.pop())
        })
        .await
    }

    async fn by_user(&self, user: &str, limit: usize) -> Result<Vec<Order>, StoreError> {
        let user = user.to_string();
        self.call(move |connection| {
            let sql = format!(
                "SELECT {ORDER_COLUMNS} FROM orders WHERE user_id = ?1 \
                 ORDER BY created_at_ms DESC, id DESC LIMIT ?2"
            );
            query_orders(connection, &sql, params![user, limit_to_sql(limit)])
        })
        .await
    }

    async fn record_payment(&self, payment: &Payment) -> Result<PaymentOutcome, StoreError> {
        let payment = payment.clone();
        self.call(move |connection| record_payment(connection, &payment)).await
    }

    async fn settle_awaiting(&self, limit: usize) -> Result<Vec<(String, PaymentOutcome)>, StoreError> {
        self.call(move |connection| settle_awaiting(connection, limit)).await
    }

    async fn payments_of(&self, order_id: &str) -> Result<Vec<PaymentRecord>, StoreError> {
        let order_id = order_id.to_string();
        self.call(move |connection| {
            let sql = format!(
                "SELECT {PAYMENT_COLUMNS} FROM payments WHERE order_id = ?1 ORDER BY received_at_ms, reference"
            );
            query_payments(connection, &sql, [order_id])
        })
        .await
    }

    async fn refunds_owed(&self, limit: usize) -> Result<Vec<PaymentRecord>, StoreError> {
        self.call(move |connection| {
            let sql = format!(
                "SELECT {PAYMENT_COLUMNS} FROM payments WHERE refund = 'owed' ORDER BY received_at_ms, reference LIMIT ?1"
            );
            query_payments(connection, &sql, [limit_to_sql(limit)])
        })
        .await
    }

    async fn start_payment(&self, id: &str, grace_ms: u64, now_ms: u64) -> Result<StartPayment, StoreError> {
        let id = id.to_string();
        let (grace_ms, now_ms) = (to_sql(grace_ms, "grace_ms")?, to_sql(now_ms, "now_ms")?);
        self.call(move |connection| {
            let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
            let changed = tx.execute(START_PAYMENT, params![id, now_ms, grace_ms]).map_err(unavailable)?;
            lifecycle::changed_once(changed as u64, "starting a payment");
            let sql = format!("SELECT {ORDER_COLUMNS} FROM orders WHERE id = ?1");
            let order = query_orders(&tx, &sql, [&id])?.pop();
            tx.commit().map_err(unavailable)?;
            Ok(lifecycle::start_payment_outcome(order, from_sql(now_ms, "now_ms")?))
        })
        .await
    }

    async fn next_payment_attempt(&self, id: &str, current: u32, now_ms: u64) -> Result<Option<u32>, StoreError> {
        let id = id.to_string();
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
            let changed = tx.execute(NEXT_PAYMENT_ATTEMPT, params![id, current, now_ms]).map_err(unavailable)?;
            lifecycle::changed_once(changed as u64, "moving to the next payment attempt");
            let attempt: Option<i32> =
                tx.query_row(PAYMENT_ATTEMPT, [&id], |row| row.get(0)).optional().map_err(unavailable)?;
            tx.commit().map_err(unavailable)?;
            attempt.map(|attempt| attempts_from_sql(attempt, "payment_attempt")).transpose()
        })
        .await
    }

    async fn payment_checks_due(&self, now_ms: u64, limit: usize) -> Result<Vec<Order>, StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let sql = format!(
                "SELECT {ORDER_COLUMNS} FROM orders WHERE payment_check_at_ms <= ?1 AND state IN {CHECKED_SQL} \
                 ORDER BY payment_check_at_ms, id LIMIT ?2"
            );
            query_orders(connection, &sql, params![now_ms, limit_to_sql(limit)])
        })
        .await
    }

    async fn schedule_payment_check(&self, id: &str, next_at_ms: Option<u64>) -> Result<(), StoreError> {
        let id = id.to_string();
        let next_at_ms = next_at_ms.map(|at| to_sql(at, "next_at_ms")).transpose()?;
        self.call(move |connection| {
            connection.execute(SCHEDULE_PAYMENT_CHECK, params![id, next_at_ms]).map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    async fn refunds_due(&self, now_ms: u64, limit: usize) -> Result<Vec<PaymentRecord>, StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let sql = format!(
                "SELECT {PAYMENT_COLUMNS} FROM payments WHERE refund IN ('owed', 'pending') \
                 AND COALESCE(refund_at_ms, 0) <= ?1 ORDER BY received_at_ms, reference LIMIT ?2"
            );
            query_payments(connection, &sql, params![now_ms, limit_to_sql(limit)])
        })
        .await
    }

    async fn refund_pending(&self, reference: &str, next_at_ms: u64) -> Result<(), StoreError> {
        let reference = reference.to_string();
        let next_at_ms = to_sql(next_at_ms, "next_at_ms")?;
        self.call(move |connection| {
            let changed = connection.execute(REFUND_PENDING, params![reference, next_at_ms]).map_err(unavailable)?;
            lifecycle::changed_once(changed as u64, "a refund asked");
            Ok(())
        })
        .await
    }

    async fn mark_refunded(&self, reference: &str, now_ms: u64) -> Result<bool, StoreError> {
        let reference = reference.to_string();
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let changed = connection.execute(MARK_REFUNDED, params![reference, now_ms]).map_err(unavailable)?;
            Ok(lifecycle::changed_once(changed as u64, "a refund acknowledged"))
        })
        .await
    }

    async fn redrive_payments(&self, now_ms: u64) -> Result<(u64, u64), StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
            let checks = tx.execute(REDRIVE_CHECKS, [now_ms]).map_err(unavailable)? as u64;
            let refunds = tx.execute(REDRIVE_REFUNDS, [now_ms]).map_err(unavailable)? as u64;
            tx.commit().map_err(unavailable)?;
            Ok((checks, refunds))
        })
        .await
    }

    async fn cancel(&self, id: &str, user: &str, now_ms: u64) -> Result<CancelOutcome, StoreError> {
        let (id, user) = (id.to_string(), user.to_string());
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let owner: Option<String> =
                connection.query_row(ORDER_OWNER, [&id], |row| row.get(0)).optional().map_err(unavailable)?;
            if owner.as_deref() != Some(user.as_str()) {
                return Ok(CancelOutcome::UnknownOrder);
            }
            let changed = connection.execute(CANCEL, params![id, now_ms]).map_err(unavailable)?;
            let mut state = None;
            if changed == 0 {
                state = Some(state_of(connection, &id)?);
            }
            Ok(lifecycle::cancel_outcome(changed as u64, || state.flatten()))
        })
        .await
    }

    async fn due_for_expiry(&self, now_ms: u64, limit: usize) -> Result<Vec<Order>, StoreError> {
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let sql = format!(
                "SELECT {ORDER_COLUMNS} FROM orders WHERE state = 'pending_payment' AND pay_deadline_ms <= ?1 \
                 AND payment_check_at_ms IS NULL ORDER BY pay_deadline_ms, id LIMIT ?2"
            );
            query_orders(connection, &sql, params![now_ms, limit_to_sql(limit)])
        })
        .await
    }

    async fn raise_fence(&self, fence: u64) -> Result<(), StoreError> {
        let fence = to_sql(fence, "fence")?;
        self.call(move |connection| {
            connection.execute(RAISE_FENCE, [fence]).map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    async fn expire(&self, id: &str, fence: u64, now_ms: u64) -> Result<ExpireOutcome, StoreError> {
        let id = id.to_string();
        let fence = to_sql(fence, "fence")?;
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let changed = connection.execute(EXPIRE, params![id, now_ms, fence]).map_err(unavailable)?;
            let mut current = None;
            if changed == 0 {
                current =
                    Some(connection.query_row(SWEEPER_FENCE, [], |row| row.get::<_, i64>(0)).map_err(unavailable)?);
            }
            let fence = from_sql(fence, "fence")?;
            let current = current.map(|current| from_sql(current, "sweeper fence")).transpose()?;
            Ok(lifecycle::expire_outcome(changed as u64, fence, || current.unwrap_or(0)))
        })
        .await
    }

    async fn unreleased(&self, after: Option<&ReleaseCursor>, limit: usize) -> Result<Vec<Order>, StoreError> {
        let (deadline, id) = match after {
            Some(cursor) => (to_sql(cursor.pay_deadline_ms, "cursor deadline")?, cursor.id.clone()),
            None => (-1, String::new()),
        };
        self.call(move |connection| {
            let sql = format!(
                "SELECT {ORDER_COLUMNS} FROM orders WHERE released_at_ms IS NULL AND release_refused IS NULL \
                 AND state IN {GIVES_BACK_SQL} AND (pay_deadline_ms, id) > (?1, ?2) \
                 ORDER BY pay_deadline_ms, id LIMIT ?3"
            );
            query_orders(connection, &sql, params![deadline, id, limit_to_sql(limit)])
        })
        .await
    }

    async fn mark_release_refused(&self, id: &str, reason: &str, now_ms: u64) -> Result<bool, StoreError> {
        let (id, reason) = (id.to_string(), reason.to_string());
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let changed = connection.execute(MARK_RELEASE_REFUSED, params![id, reason, now_ms]).map_err(unavailable)?;
            Ok(lifecycle::changed_once(changed as u64, "a refused release"))
        })
        .await
    }

    async fn mark_released(&self, id: &str, now_ms: u64) -> Result<bool, StoreError> {
        let id = id.to_string();
        let now_ms = to_sql(now_ms, "now_ms")?;
        self.call(move |connection| {
            let changed = connection.execute(MARK_RELEASED, params![id, now_ms]).map_err(unavailable)?;
            Ok(lifecycle::changed_once(changed as u64, "a release"))
        })
        .await
    }

    async fn dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        let fields = fields_to_sql(&letter.fields)?;
        let values = (
            letter.sku.clone(),
            to_sql(letter.stream_seq, "stream_seq")?,
            fields,
            letter.reason.clone(),
            to_sql(letter.deliveries, "deliveries")?,
            to_sql(letter.at_ms, "at_ms")?,
        );
        self.call(move |connection| {
            connection
                .execute(
                    "INSERT INTO dead_letters (sku, stream_seq, fields, reason, deliveries, at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
                    params![values.0, values.1, values.2, values.3, values.4, values.5],
                )
                .map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        self.call(move |connection| {
            let mut statement = connection
                .prepare_cached(
                    "SELECT sku, stream_seq, fields, reason, deliveries, at_ms FROM dead_letters \
                     ORDER BY at_ms, sku, stream_seq LIMIT ?1",
                )
                .map_err(unavailable)?;
            let rows = statement
                .query_map([limit_to_sql(limit)], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                        row.get::<_, i64>(4)?,
                        row.get::<_, i64>(5)?,
                    ))
                })
                .map_err(unavailable)?;
            let mut letters = Vec::new();
            for row in rows {
                let (sku, stream_seq, fields, reason, deliveries, at_ms) = row.map_err(unavailable)?;
                letters.push(DeadLetter {
                    sku,
                    stream_seq: from_sql(stream_seq, "stream_seq")?,
                    fields: fields_from_sql(&fields)?,
                    reason,
                    deliveries: from_sql(deliveries, "deliveries")?,
                    at_ms: from_sql(at_ms, "at_ms")?,
                });
            }
            Ok(letters)
        })
        .await
    }

    async fn money_counts(&self, sku: &str) -> Result<SkuMoneyCounts, StoreError> {
        let sku = sku.to_string();
        self.call(move |connection| {
            let values = connection.query_row(&money_counts_sql("?1"), [&sku], integers).map_err(unavailable)?;
            money_counts_from_sql(values)
        })
        .await
    }

    async fn counts(&self, sku: &str) -> Result<SkuOrderCounts, StoreError> {
        let sku = sku.to_string();
        self.call(move |connection| {
            let sql = format!(
                "SELECT COUNT(*), \
                 COALESCE(SUM(CASE WHEN state = 'pending_payment' THEN qty ELSE 0 END), 0), \
                 COALESCE(SUM(CASE WHEN state = 'paid' THEN qty ELSE 0 END), 0), \
                 COALESCE(SUM(CASE WHEN state = 'expired' THEN qty ELSE 0 END), 0), \
                 COALESCE(SUM(CASE WHEN state = 'cancelled' THEN qty ELSE 0 END), 0), \
                 COALESCE(SUM(CASE WHEN state = 'paid_after_expiry' THEN qty ELSE 0 END), 0), \
                 COALESCE(SUM(CASE WHEN state IN {GIVES_BACK_SQL} AND released_at_ms IS NULL \
                     AND release_refused IS NULL THEN 1 ELSE 0 END), 0), \
                 COALESCE(SUM(CASE WHEN release_refused IS NOT NULL THEN qty ELSE 0 END), 0), \
                 MAX(COALESCE(MAX(stream_seq), 0), \
                     (SELECT COALESCE(MAX(stream_seq), 0) FROM dead_letters WHERE sku = ?1)) \
                 FROM orders WHERE sku = ?1"
            );
            let values = connection.query_row(&sql, [&sku], integers).map_err(unavailable)?;
            counts_from_sql(values)
        })
        .await
    }

    async fn stored_seqs(&self, sku: &str, from: u64, to: u64) -> Result<Vec<u64>, StoreError> {
        let sku = sku.to_string();
        let (from, to) = (to_sql(from, "from")?, to_sql(to, "to")?);
        self.call(move |connection| {
            let mut statement = connection
                .prepare_cached(
                    "SELECT stream_seq FROM orders WHERE sku = ?1 AND stream_seq BETWEEN ?2 AND ?3 \
                     UNION SELECT stream_seq FROM dead_letters WHERE sku = ?1 AND stream_seq BETWEEN ?2 AND ?3 \
                     ORDER BY 1",
                )
                .map_err(unavailable)?;
            let rows = statement.query_map(params![sku, from, to], |row| row.get::<_, i64>(0)).map_err(unavailable)?;
            let mut seqs = Vec::new();
            for row in rows {
                seqs.push(from_sql(row.map_err(unavailable)?, "stream_seq")?);
            }
            Ok(seqs)
        })
        .await
    }

    async fn state_counts(&self) -> Result<Vec<(String, OrderState, u64)>, StoreError> {
        self.call(move |connection| {
            let mut statement = connection
                .prepare_cached("SELECT sku, state, COUNT(*) FROM orders GROUP BY sku, state ORDER BY sku, state")
                .map_err(unavailable)?;
            let rows = statement
                .query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?, row.get::<_, i64>(2)?)))
                .map_err(unavailable)?;
            let mut counts = Vec::new();
            for row in rows {
                let (sku, state, count) = row.map_err(unavailable)?;
                counts.push((sku, state_from_sql(&state)?, from_sql(count, "count")?));
            }
            Ok(counts)
        })
        .await
    }

    async fn delete_for_test(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_string();
        self.call(move |connection| {
            connection.execute("DELETE FROM orders WHERE id = ?1", [id]).map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    async fn remember_opened(&self, opened: &OpenedPayment) -> Result<(), StoreError> {
        let (amount, at) = (to_sql(opened.amount, "amount")?, to_sql(opened.created_at_ms, "created_at_ms")?);
        let opened = opened.clone();
        self.call(move |connection| {
            let params =
                rusqlite::params![opened.order_id, opened.payment_id, opened.pay_url, amount, opened.currency, at];
            connection.execute(REMEMBER_OPENED, params).map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    async fn opened_payment(&self, order_id: &str) -> Result<Option<OpenedPayment>, StoreError> {
        let order_id = order_id.to_string();
        self.call(move |connection| {
            let sql = format!("SELECT {OPENED_COLUMNS} FROM payment_starts WHERE order_id = ?1");
            let row = connection
                .query_row(&sql, [order_id], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?))
                })
                .optional()
                .map_err(unavailable)?;
            row.map(opened_from_sql).transpose()
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.call(|connection| connection.query_row("SELECT 1", [], |_| Ok(())).map_err(unavailable)).await
    }
}
