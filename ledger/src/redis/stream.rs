//! Reading a SKU's streams (its order events, its release log) by sequence number. Stream
//! entry ids are `0-<seq>` (see `confirm.lua`, `release.lua`), so a seq and an entry id convert
//! both ways and `XTRIM MINID 0-<seq>` drops exactly the entries below a seq.

use super::RedisLedger;
use crate::*;

/// An order stream entry as bytes: a value that is not UTF-8 must not fail the whole read.
pub(super) type RawOrderEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// The seq of a stream entry id `0-<seq>`.
pub(super) fn seq_of(id: &str) -> Result<u64, LedgerError> {
    id.strip_prefix("0-")
        .and_then(|seq| seq.parse().ok())
        .ok_or_else(|| LedgerError::Corrupt(format!("stream entry id {id:?} is not 0-<seq>")))
}

impl RedisLedger {
    /// Up to `count` entries of the stream at `key` after sequence number `after`: stream ids
    /// are `0-<seq>` (`confirm.lua`, `release.lua`), and `(` makes the start exclusive.
    pub(super) async fn entries_after<T: ::redis::FromRedisValue>(
        &self,
        sku: &SkuId,
        key: &str,
        after: u64,
        count: usize,
    ) -> Result<Vec<T>, LedgerError> {
        let range = ::redis::cmd("XRANGE").arg(key).arg(format!("(0-{after}")).arg("+").arg("COUNT").arg(count).clone();
        self.read(sku, &range).await
    }

    /// [`LedgerReads::orders`]: pages of the order stream, skipping (with a warning) an entry
    /// that is not an order event.
    pub(super) async fn order_events(
        &self,
        sku: &SkuId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<OrderEvent>, LedgerError> {
        let keys = self.keys(sku);
        let limit = limit.min(ORDER_EVENTS_MAX);
        let mut events = Vec::new();
        let mut after = after;
        while events.len() < limit {
            let want = limit - events.len();
            let entries: Vec<RawOrderEntry> = self.entries_after(sku, &keys.orders, after, want).await?;
            let got = entries.len();
            for (id, fields) in entries {
                let seq = seq_of(&id)?;
                after = seq;
                match FeedEntry::from_raw(seq, fields, 0).event() {
                    Ok(event) => events.push(event),
                    Err(reason) => tracing::warn!(%sku, seq, "order stream entry skipped: {reason}"),
                }
            }
            if got < want {
                break;
            }
        }
        Ok(events)
    }
}
