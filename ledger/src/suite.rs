//! The ledger contract as executable checks. Every implementation runs all of them (the
//! embedded ledger in this crate's tests, Redis in the workspace's integration tests), which is
//! what keeps the embedded ledger an honest stand-in for the Lua scripts.
//!
//! Each check creates its own SKU (named after the check plus `tag`), so one ledger can run
//! the whole suite, and a failed assertion names the broken rule.
//!
//! The checks sit in one submodule per concern of the contract; `run_all` runs every one that
//! needs no particular ledger, and the rest (a token cap, a short idempotency TTL, two ledgers
//! sharing books) are called on their own by the tests that build such ledgers.

use std::sync::Arc;
use std::time::Duration;

use crate::*;

mod epochs;
mod keys;
mod limits;
mod releases;
mod room;
mod stock;
mod stream;
mod stripes;
mod tokens;

pub use epochs::*;
pub use keys::*;
pub use limits::*;
pub use releases::*;
pub use room::*;
pub use stock::*;
pub use stream::*;
pub use stripes::*;
pub use tokens::*;

fn sku(name: &str, tag: &str) -> SkuId {
    SkuId::new(&format!("{name}-{tag}")).expect("suite SKU names are valid")
}

fn node(name: &str) -> Seller {
    Seller::new(NodeId::new(name).expect("suite node ids are valid"), 1)
}

fn buy(key: &str, user: &str, qty: u32) -> Purchase {
    Purchase {
        key: IdempotencyKey::new(key).expect("valid key"),
        user: UserId::new(user).expect("valid user"),
        qty,
        token: None,
        order_id: None,
    }
}

fn buy_with(key: &str, user: &str, token: &SubmitToken) -> Purchase {
    Purchase { token: Some(token.clone()), ..buy(key, user, 1) }
}

fn user(name: &str) -> UserId {
    UserId::new(name).expect("suite user ids are valid")
}

async fn create(ledger: &dyn Ledger, sku: &SkuId, total: u64, per_user_limit: u32) {
    create_terms(ledger, sku, SkuTerms { per_user_limit, ..SkuTerms::new(total) }).await;
}

/// A SKU whose purchases must present a submit token.
async fn create_with_tokens(ledger: &dyn Ledger, sku: &SkuId, total: u64, per_user_limit: u32) {
    create_terms(ledger, sku, SkuTerms { per_user_limit, require_token: true, ..SkuTerms::new(total) }).await;
}

async fn create_terms(ledger: &dyn Ledger, sku: &SkuId, terms: SkuTerms) {
    let created = ledger.create_sku(sku, &terms).await.expect("create_sku");
    assert!(matches!(created, Created::New(_)), "a fresh SKU must be created new, got {created:?}");
}

/// A token for `user` on `sku` that lives long enough for any check.
async fn token(ledger: &dyn Ledger, sku: &SkuId, user_name: &str) -> SubmitToken {
    ledger.issue_token(sku, &user(user_name), Duration::from_secs(60)).await.expect("issue_token").token
}

fn is_purchased(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Fresh(Decision::Purchased(_)))
}

/// Runs every check against `ledger`. `tag` keeps SKU names unique when a ledger is reused.
pub async fn run_all(ledger: Arc<dyn Ledger>, tag: &str) {
    sells_exactly_the_total(&*ledger, tag).await;
    replays_a_decided_key(&*ledger, tag).await;
    rejects_a_reused_key(&*ledger, tag).await;
    a_key_belongs_to_its_buyer(&*ledger, tag).await;
    holds_the_per_user_limit(&*ledger, tag).await;
    refuses_a_missing_sku(&*ledger, tag).await;
    never_overwrites_on_create(&*ledger, tag).await;
    restock_raises_the_total(&*ledger, tag).await;
    close_ends_the_sale(&*ledger, tag).await;
    batch_decides_in_order(&*ledger, tag).await;
    a_key_repeated_in_one_batch_is_decided_once(&*ledger, tag).await;
    one_buyers_purchases_add_up_within_and_across_batches(&*ledger, tag).await;
    counts_sales_per_epoch(&*ledger, tag).await;
    an_ended_epoch_sells_nothing_more(&*ledger, tag).await;
    counts_stay_exact_at_the_top_of_the_range(&*ledger, tag).await;
    a_token_is_spent_by_its_first_decision(&*ledger, tag).await;
    a_token_binds_its_user_and_its_sku(&*ledger, tag).await;
    an_expired_token_is_refused(&*ledger, tag).await;
    a_refused_purchase_spends_its_token_too(&*ledger, tag).await;
    a_buyer_holds_one_live_token_per_sku(&*ledger, tag).await;
    skus_without_tokens_ignore_them(&*ledger, tag).await;
    one_token_sells_once_under_concurrency(ledger.clone(), tag).await;
    a_replay_in_a_batch_leaves_the_token_to_a_fresh_purchase(&*ledger, tag).await;
    an_order_event_carries_the_pricing_of_its_sale(&*ledger, tag).await;
    a_release_gives_units_back_once(&*ledger, tag).await;
    a_release_needs_the_ledgers_record_of_the_sale(&*ledger, tag).await;
    concurrent_releases_of_one_order_release_once(ledger.clone(), tag).await;
    a_feed_delivers_each_entry_once_until_claimed(&*ledger, tag).await;
    a_feed_trims_only_what_was_acknowledged(&*ledger, tag).await;
    a_batchs_sales_read_alike_through_every_reader(&*ledger, tag).await;
    units_move_between_stripes_once_and_never_oversell(&*ledger, tag).await;
    a_stripe_is_a_ledger_like_any_other(&*ledger, tag).await;
    a_stripe_numbers_orders_apart_from_every_sku(&*ledger, tag).await;
    concurrent_transfers_never_take_sold_units(ledger.clone(), tag).await;
    a_room_draws_by_its_recorded_seed_and_admits_in_line_order(&*ledger, tag).await;
    a_ticket_sells_once_and_sold_out_shuts_the_room_until_units_come_back(&*ledger, tag).await;
    admissions_keep_the_rate_and_the_abandoned_leave(&*ledger, tag).await;
    concurrent_batches_never_oversell(ledger, tag).await;
}

/// Waits until the wall clock is `before` short of a multiple of `window`; returns that
/// multiple (Unix ms).
async fn just_before_a_boundary(window: Duration, before: Duration) -> u64 {
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    let before_ms = u64::try_from(before.as_millis()).unwrap_or(0);
    let now = crate::unix_ms();
    let mut boundary = (now / window_ms + 1) * window_ms;
    if boundary - now < before_ms + 50 {
        boundary += window_ms;
    }
    tokio::time::sleep(Duration::from_millis(boundary - before_ms - crate::unix_ms())).await;
    boundary
}

/// Sells `qty` to `user` under `key` and returns the release that gives it back.
async fn sell_for_release(ledger: &dyn Ledger, sku: &SkuId, key: &str, user_name: &str, qty: u32) -> Release {
    let outcome = ledger.confirm(sku, &node("n1"), &[buy(key, user_name, qty)]).await.expect("confirm");
    let Some(Verdict::Fresh(Decision::Purchased(receipt))) = outcome.verdicts.first() else {
        panic!("the sale must go through, got {:?}", outcome.verdicts);
    };
    release_of(ledger, sku, &receipt.order_id, user_name, qty).await
}

/// The release of order `order_id`, with the sale's time as the ledger's order event has it.
async fn release_of(ledger: &dyn Ledger, sku: &SkuId, order_id: &OrderId, user_name: &str, qty: u32) -> Release {
    let events = ledger.orders(sku, 0, ORDER_EVENTS_MAX).await.expect("order events");
    let event = events.iter().find(|event| event.order_id == *order_id).expect("the sale's order event");
    Release { order_id: order_id.clone(), key: event.key.clone(), user: user(user_name), qty, sold_at_ms: event.at_ms }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn embedded_ledger_keeps_the_contract() {
        run_all(Arc::new(EmbeddedLedger::default()), "embedded").await;
        let capped = EmbeddedLedger::default().with_token_issue_max(3);
        a_buyers_asks_take_one_slot_of_the_token_cap(&capped, "embedded", 3).await;
        let short = Duration::from_secs(1);
        a_release_outlives_the_idempotency_record(&EmbeddedLedger::new(short), "embedded", short).await;
        a_decision_is_replayed_across_a_window_boundary(&EmbeddedLedger::new(short), "embedded", short).await;
        a_later_buyers_record_outlives_the_keys_first(&EmbeddedLedger::new(short), "embedded", short).await;
        // One ledger for both: embedded books are not shared between instances, and its
        // records are not filed in windows anyway.
        let one = EmbeddedLedger::new(short);
        let long = Duration::from_secs(4);
        a_sale_whose_key_is_reused_in_its_window_is_released(&one, &one, "embedded", short, long).await;
    }
}
