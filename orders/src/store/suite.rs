//! The [`OrderStore`] contract as executable checks. Every implementation runs all of them
//! (SQLite in `tests/sqlite.rs`, a real PostgreSQL in `tests/postgres.rs`), so both keep the same
//! promises, races included.
//!
//! Each check uses its own SKU and order ids (named after the check plus `tag`), so one store can
//! run the whole suite, and again under another tag. The lists that span SKUs (due for expiry,
//! unreleased, dead letters) are checked with times far below the others' ([`T0`]), and the checks
//! of those lists leave nothing behind in them; every check that expires uses [`FENCE`], the
//! highest fence the suite ever raises.

use std::sync::Arc;

use super::{OrderStore, StoreError, INSERT_BATCH_MAX};
use crate::model::*;

mod expiry;
mod intake;
mod payments;
mod provider;
mod races;
mod reconcile;

pub use expiry::*;
pub use intake::*;
pub use payments::*;
pub use provider::*;
pub use races::*;
pub use reconcile::*;

/// The time most checks run at (Unix ms, 2023-11-14); the list checks use times below it.
pub const T0: u64 = 1_700_000_000_000;

/// The fence every expiring check presents: the stale-fence check raises the store's fence to it,
/// so it is never stale.
pub const FENCE: u64 = 1_000_000;

/// Price of one unit in every suite order (minor units).
const PRICE: u64 = 1999;

fn sku(check: &str, tag: &str) -> String {
    format!("{check}-{tag}")
}

/// Order `n` of a check: stream seq `n`, user `user-{tag}`, one unit, created at `T0 + n`, due a
/// minute later.
fn order(check: &str, tag: &str, n: u64) -> NewOrder {
    NewOrder {
        id: format!("{check}-{tag}-{n}"),
        sku: sku(check, tag),
        user: format!("user-{tag}"),
        qty: 1,
        node: "node-a".into(),
        idempotency_key: format!("key-{n}"),
        stream_seq: n,
        unit_price: PRICE,
        currency: "EUR".into(),
        created_at_ms: T0 + n,
        pay_deadline_ms: T0 + 60_000 + n,
    }
}

fn orders(check: &str, tag: &str, count: u64) -> Vec<NewOrder> {
    (1..=count).map(|n| order(check, tag, n)).collect()
}

fn payment(order: &NewOrder, reference: &str) -> Payment {
    Payment {
        order_id: order.id.clone(),
        reference: reference.into(),
        amount: order.amount(),
        currency: order.currency.clone(),
        received_at_ms: T0 + 100_000,
        source: PaymentSource::Callback,
    }
}

async fn insert(store: &dyn OrderStore, orders: &[NewOrder]) {
    let inserted = store.insert_batch(orders).await.expect("insert_batch");
    assert_eq!(inserted, orders.len() as u64, "a batch of new orders must store every one");
}

async fn state(store: &dyn OrderStore, id: &str) -> OrderState {
    store.get(id).await.expect("get").unwrap_or_else(|| panic!("order {id} must be stored")).state
}

/// Runs every check against `store`. `tag` keeps SKUs and ids unique when a store is reused.
pub async fn run_all(store: Arc<dyn OrderStore>, tag: &str) {
    ping_answers(&*store).await;
    insert_stores_each_order_once(&*store, tag).await;
    an_orders_identity_is_its_id_not_its_key(&*store, tag).await;
    a_batch_with_a_duplicate_inside_stores_it_once(&*store, tag).await;
    an_oversized_batch_is_refused(&*store, tag).await;
    by_user_lists_newest_first(&*store, tag).await;
    a_payment_settles_a_pending_order_once(&*store, tag).await;
    a_mismatched_payment_is_recorded_as_a_refund_owed(&*store, tag).await;
    a_payment_before_its_order_waits_and_settles_when_it_arrives(&*store, tag).await;
    a_reused_reference_is_refused(&*store, tag).await;
    money_counts_add_up_per_sku(&*store, tag).await;
    a_stale_fence_is_refused_after_raise_fence(&*store, tag).await;
    a_late_payment_is_kept_as_paid_after_expiry(&*store, tag).await;
    cancel_takes_only_the_owners_pending_order(&*store, tag).await;
    expire_takes_only_pending_orders(&*store, tag).await;
    due_for_expiry_lists_pending_orders_by_deadline(&*store, tag).await;
    unreleased_lists_orders_owing_units_until_released(&*store, tag).await;
    a_dead_letter_twice_is_one(&*store, tag).await;
    counts_and_stored_seqs_cover_orders_and_dead_letters(&*store, tag).await;
    concurrent_duplicate_notifications_decide_once(store.clone(), tag).await;
    pay_and_expire_race_ends_each_order_in_one_state(store.clone(), tag).await;
    starting_a_payment_extends_the_deadline_once_and_hands_expiry_to_the_query_job(&*store, tag).await;
    a_cancel_or_a_payment_settles_the_payment_check(&*store, tag).await;
    a_refund_goes_owed_pending_refunded_once(&*store, tag).await;
    a_payment_found_by_query_is_counted_as_such(&*store, tag).await;
    the_first_opened_payment_of_an_order_is_remembered(&*store, tag).await;
    a_payment_attempt_moves_on_once_per_attempt_seen(&*store, tag).await;
}

pub async fn ping_answers(store: &dyn OrderStore) {
    store.ping().await.expect("ping");
}
