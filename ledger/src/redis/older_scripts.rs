//! Confirm scripts other than `lua/confirm.lua`, run on the same books: the scripts before it,
//! for the rolling-upgrade tests (tests/cluster/ledger_suite.rs), and candidate versions, for
//! `examples/confirm_cost.rs`. Behind the `suite` feature: no part of the product.

use ::redis::Script;

use super::sales::parse_confirm_reply;
use super::RedisLedger;
use crate::*;

/// How a confirm script takes its purchases, for [`RedisLedger::confirm_by`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgumentShape {
    /// `lua/confirm.lua`'s: five arguments per purchase (key, user, qty, order id, token), no
    /// key names.
    Current,
    /// The scripts before it: the seller's sales hash as a fifth key, three key names per
    /// purchase (legacy record, token, holder) and four arguments (key, user, qty, order id).
    KeysPerPurchase,
}

impl RedisLedger {
    /// [`SalesLedger::confirm`] with `script` in place of `lua/confirm.lua`, its purchases in
    /// `shape`.
    pub async fn confirm_by(
        &self,
        script: &Script,
        shape: ArgumentShape,
        sku: &SkuId,
        seller: &Seller,
        purchases: &[Purchase],
    ) -> Result<BatchOutcome, LedgerError> {
        if shape == ArgumentShape::Current {
            return self.run_confirm(script, sku, seller, purchases).await;
        }
        assert!(purchases.len() <= BATCH_MAX, "confirm takes at most BATCH_MAX purchases");
        let keys = self.keys(sku);
        let mut invocation = script.key(&keys.meta);
        invocation.key(&keys.by_epoch).key(&keys.by_user).key(&keys.orders);
        invocation.key(keys.sales_window(crate::unix_ms()));
        self.confirm_head(&mut invocation, sku, seller);
        for purchase in purchases {
            let token = purchase.token.as_ref().map_or("", SubmitToken::as_str);
            invocation.key(format!("{}{}", keys.record_prefix, purchase.key));
            invocation.key(format!("{}{token}", keys.token_prefix));
            invocation.key(format!("{}{}", keys.holder_prefix, purchase.user));
            invocation.arg(purchase.key.as_str()).arg(purchase.user.as_str()).arg(purchase.qty);
            invocation.arg(purchase.order_id.as_ref().map_or("", |id| id.0.as_str()));
        }
        let reply: Vec<String> = self.write(sku, &invocation).await?;
        parse_confirm_reply(&reply, purchases.len())
    }
}
