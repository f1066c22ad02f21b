//! [`SalesLedger`] on Redis: submit tokens (`token.lua`) and the confirmation of a node's
//! batch (`confirm.lua`), each one script run.

use std::time::Duration;

use ::redis::Script;

use super::call::parse_count;
use super::scripts::{CONFIRM, TOKEN};
use super::RedisLedger;
use crate::types::stored;
use crate::*;

#[async_trait::async_trait]
impl SalesLedger for RedisLedger {
    async fn issue_token(&self, sku: &SkuId, user: &UserId, ttl: Duration) -> Result<IssuedToken, LedgerError> {
        let keys = self.keys(sku);
        let ttl = ttl.min(TOKEN_TTL_MAX);
        let ttl_ms = ttl.as_millis().max(1) as u64;
        let (window, retry_after_ms) = crate::token_window(crate::unix_ms(), ttl);
        for _ in 0..TOKEN_DRAWS_MAX {
            let token = SubmitToken::generate()
                .map_err(|e| LedgerError::Unavailable(format!("no secure random source for a token: {e}")))?;
            let mut invocation = TOKEN.key(&keys.meta);
            invocation
                .key(format!("{}{token}", keys.token_prefix))
                .key(format!("{}{window}", keys.token_prefix.replace(":token:", ":tokens:")))
                .key(format!("{}{user}", keys.holder_prefix))
                .arg(user.as_str())
                .arg(ttl_ms)
                .arg(self.config.token_issue_max)
                .arg(token.as_str());
            let (status, text, left_ms): (i64, String, i64) = self.write(sku, &invocation).await?;
            match status {
                -1 => return Err(LedgerError::TokensExhausted { retry_after_ms }),
                0 => continue,
                1 | 2 => {
                    let token = SubmitToken::new(&text)
                        .map_err(|e| LedgerError::Corrupt(format!("the token a buyer holds is unreadable: {e}")))?;
                    let expires_in = Duration::from_millis(u64::try_from(left_ms).unwrap_or(0));
                    return Ok(IssuedToken { token, expires_in });
                }
                other => return Err(LedgerError::Corrupt(format!("token.lua answered status {other}"))),
            }
        }
        Err(LedgerError::Corrupt(
            "fresh submit tokens keep colliding with stored ones; is the random source broken?".into(),
        ))
    }

    async fn confirm(&self, sku: &SkuId, seller: &Seller, purchases: &[Purchase]) -> Result<BatchOutcome, LedgerError> {
        self.run_confirm(&CONFIRM, sku, seller, purchases).await
    }

    async fn room_join(&self, sku: &SkuId, call: RoomCall<'_>, users: &[UserId]) -> Result<RoomView, LedgerError> {
        self.room_call(sku, "join", call, users).await
    }

    async fn room_tick(&self, sku: &SkuId, call: RoomCall<'_>, present: &[UserId]) -> Result<RoomView, LedgerError> {
        self.room_call(sku, "tick", call, present).await
    }

    async fn room_admissions(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<Admission>, LedgerError> {
        self.room_log(sku, after, limit).await
    }
}

impl RedisLedger {
    /// One run of `script` on a batch, with `lua/confirm.lua`'s arguments: the SKU's keys, then
    /// five arguments per purchase (key, user, qty, order id, token).
    pub(super) async fn run_confirm(
        &self,
        script: &Script,
        sku: &SkuId,
        seller: &Seller,
        purchases: &[Purchase],
    ) -> Result<BatchOutcome, LedgerError> {
        assert!(purchases.len() <= BATCH_MAX, "confirm takes at most BATCH_MAX purchases");
        let keys = self.keys(sku);
        let mut invocation = script.key(&keys.meta);
        invocation.key(&keys.by_epoch).key(&keys.by_user).key(&keys.orders);
        self.confirm_head(&mut invocation, sku, seller);
        for purchase in purchases {
            let token = purchase.token.as_ref().map_or("", SubmitToken::as_str);
            invocation.arg(purchase.key.as_str()).arg(purchase.user.as_str()).arg(purchase.qty);
            invocation.arg(purchase.order_id.as_ref().map_or("", |id| id.0.as_str()));
            invocation.arg(token);
        }
        let reply: Vec<String> = self.write(sku, &invocation).await?;
        parse_confirm_reply(&reply, purchases.len())
    }

    /// The arguments every confirm script takes before its purchases.
    pub(super) fn confirm_head(&self, invocation: &mut ::redis::ScriptInvocation<'_>, sku: &SkuId, seller: &Seller) {
        invocation.arg(sku.as_str()).arg(seller.node.as_str()).arg(self.config.idempotency_ttl.as_secs().max(1));
        invocation.arg(seller.epoch_key()).arg(seller.epoch);
        invocation.arg(u64::try_from(self.config.sale_record_ttl.as_millis()).unwrap_or(u64::MAX).max(1));
    }
}

/// A confirm script's reply: a verdict pair per purchase, then sold, remaining, released.
pub(super) fn parse_confirm_reply(reply: &[String], purchases: usize) -> Result<BatchOutcome, LedgerError> {
    if reply.len() != purchases * 2 + 3 {
        return Err(LedgerError::Corrupt(format!("confirm returned {} fields for {purchases} purchases", reply.len())));
    }
    let verdicts = reply[..purchases * 2]
        .chunks(2)
        .map(|pair| match pair[0].as_str() {
            "fresh" => parse_decision(&pair[1]).map(Verdict::Fresh),
            "replayed" => parse_decision(&pair[1]).map(Verdict::Replayed),
            "key_reused" => Ok(Verdict::KeyReused),
            other => Err(LedgerError::Corrupt(format!("unknown verdict {other:?}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sold = parse_count(reply.get(purchases * 2), "sold")?;
    let remaining = parse_count(reply.get(purchases * 2 + 1), "remaining")?;
    let released = parse_count(reply.get(purchases * 2 + 2), "released")?;
    Ok(BatchOutcome { verdicts, sold, remaining, released })
}

fn parse_decision(text: &str) -> Result<Decision, LedgerError> {
    stored::decode(text).ok_or_else(|| LedgerError::Corrupt(format!("unreadable stored decision {text:?}")))
}
