//! Reading a SKU's streams (its order events, its release log) by sequence number. Stream
//! entry ids are `0-<seq>` (see `confirm.lua`, `release.lua`): a release's seq, or the seq of
//! the last order an order stream entry holds (one entry per confirmed batch). So `XRANGE
//! (0-<after>` returns every entry holding an order past `after`, and `XTRIM MINID 0-<seq>`
//! drops exactly the entries holding only orders below `seq`.

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

    /// [`LedgerReads::orders`]: pages of the order stream, each entry expanded into its orders
    /// (those at or before `after`, in the entry `after` falls inside, skipped), skipping with
    /// a warning an entry that does not read as order events.
    pub(super) async fn order_events(
        &self,
        sku: &SkuId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<OrderEvent>, LedgerError> {
        let keys = self.keys(sku);
        let limit = limit.min(ORDER_EVENTS_MAX);
        let mut events = Vec::new();
        let mut from = after;
        while events.len() < limit {
            // An entry holds one order or more: asking for as many entries as orders wanted
            // reads at most one page too much, never too little.
            let want = limit - events.len();
            let entries: Vec<RawOrderEntry> = self.entries_after(sku, &keys.orders, from, want).await?;
            let got = entries.len();
            for (id, fields) in entries {
                let seq = seq_of(&id)?;
                from = seq;
                match FeedEntry::from_raw(seq, fields, 0).events() {
                    Ok(held) => events.extend(held.into_iter().filter(|event| event.seq > after)),
                    Err(reason) => tracing::warn!(%sku, seq, "order stream entry skipped: {reason}"),
                }
            }
            if got < want {
                break;
            }
        }
        // The page ends at `limit` orders; the next one resumes after the last returned seq and
        // skips what this one returned of a split entry.
        events.truncate(limit);
        Ok(events)
    }
}
