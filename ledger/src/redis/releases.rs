//! Giving an unpaid order's units back on Redis (`release.lua`, checked against the sale's
//! record: its idempotency record, or in a sales hash for sales of older scripts) and reading
//! the release log it appends to.

use super::scripts::RELEASE;
use super::stream::seq_of;
use super::RedisLedger;
use crate::*;

/// Fields of one stream entry, as Redis returns them.
type RawEntry = (String, Vec<(String, String)>);

fn count_of(text: &str, what: &str) -> Result<u64, LedgerError> {
    text.parse().map_err(|_| LedgerError::Corrupt(format!("unreadable {what} {text:?}")))
}

impl RedisLedger {
    pub(super) async fn release_units(&self, sku: &SkuId, release: &Release) -> Result<ReleaseOutcome, LedgerError> {
        let keys = self.keys(sku);
        let mut invocation = RELEASE.key(&keys.meta);
        invocation.key(&keys.by_user);
        for window in keys.sales_windows_around(release.sold_at_ms) {
            invocation.key(window);
        }
        invocation.key(&keys.releases).arg(release.order_id.0.as_str()).arg(release.user.as_str()).arg(release.qty);
        invocation.arg(release.key.as_str()).arg(release.sold_at_ms);
        let reply: Vec<String> = self.write(sku, &invocation).await?;
        match reply.as_slice() {
            [outcome, remaining, _released] => match outcome.as_str() {
                "released" => Ok(ReleaseOutcome::Released { remaining: count_of(remaining, "remaining")? }),
                "already" => Ok(ReleaseOutcome::AlreadyReleased),
                "never_sold" => Ok(ReleaseOutcome::NeverSold),
                other => Err(LedgerError::Corrupt(format!("release answered {other:?}"))),
            },
            other => Err(LedgerError::Corrupt(format!("release returned {} fields", other.len()))),
        }
    }

    pub(super) async fn release_log(
        &self,
        sku: &SkuId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ReleaseEvent>, LedgerError> {
        let keys = self.keys(sku);
        let entries: Vec<RawEntry> =
            self.entries_after(sku, &keys.releases, after, limit.min(ORDER_EVENTS_MAX)).await?;
        entries
            .into_iter()
            .map(|(id, fields)| {
                let get = |name: &str| {
                    fields
                        .iter()
                        .find(|(field, _)| field == name)
                        .map(|(_, value)| value.as_str())
                        .ok_or_else(|| LedgerError::Corrupt(format!("release {id} lacks {name}")))
                };
                let bad = |what: &str| LedgerError::Corrupt(format!("release {id} has a bad {what}"));
                Ok(ReleaseEvent {
                    seq: seq_of(&id)?,
                    order_id: OrderId(get("order_id")?.to_string()),
                    user: UserId::new(get("user")?).map_err(|_| bad("user"))?,
                    qty: get("qty")?.parse().map_err(|_| bad("qty"))?,
                })
            })
            .collect()
    }
}
