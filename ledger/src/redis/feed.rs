//! [`OrderFeed`] on Redis: consumer groups on each SKU's order stream (`XREADGROUP`,
//! `XPENDING` + `XCLAIM`, `XACK`, `XTRIM MINID`); releases are in `releases.rs`.

use std::time::Duration;

use ::redis::Value;

use super::stream::{seq_of, RawOrderEntry};
use super::RedisLedger;
use crate::*;

/// An `XREADGROUP` reply: per stream, its entries; nil when the wait ended with none.
type GroupReply = Option<Vec<(String, Vec<RawOrderEntry>)>>;

#[async_trait::async_trait]
impl OrderFeed for RedisLedger {
    async fn release(&self, sku: &SkuId, release: &Release) -> Result<ReleaseOutcome, LedgerError> {
        self.release_units(sku, release).await
    }

    async fn releases(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<ReleaseEvent>, LedgerError> {
        self.release_log(sku, after, limit).await
    }

    async fn feed_read(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        self.group_read(sku, group, consumer, count, block).await
    }

    async fn feed_claim(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        self.group_claim(sku, group, consumer, min_idle, count).await
    }

    async fn feed_ack(&self, sku: &SkuId, group: &str, seqs: &[u64]) -> Result<(), LedgerError> {
        self.group_ack(sku, group, seqs).await
    }

    async fn feed_lag(&self, sku: &SkuId, group: &str) -> Result<FeedLag, LedgerError> {
        self.group_lag(sku, group).await
    }

    async fn feed_trim(&self, sku: &SkuId, group: &str, retain: u64) -> Result<u64, LedgerError> {
        self.group_trim(sku, group, retain).await
    }
}

impl RedisLedger {
    /// `XREADGROUP … >`, creating the group on first use. The wait is kept under the call
    /// deadline, so a quiet stream returns empty instead of timing out.
    async fn group_read(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        let keys = self.keys(sku);
        let block_ms = block.min(self.block_max()).as_millis().max(1) as u64;
        let read = || {
            let mut cmd = ::redis::cmd("XREADGROUP");
            cmd.arg("GROUP").arg(group).arg(consumer).arg("COUNT").arg(count.max(1));
            cmd.arg("BLOCK").arg(block_ms).arg("STREAMS").arg(&keys.orders).arg(">");
            cmd
        };
        let reply: Result<GroupReply, LedgerError> = self.read(sku, &read()).await;
        let reply = match reply {
            Err(LedgerError::Unavailable(text)) if text.contains("NOGROUP") => {
                self.create_group(sku, group).await?;
                self.read(sku, &read()).await?
            }
            other => other?,
        };
        let entries = reply.into_iter().flatten().flat_map(|(_, entries)| entries);
        entries.map(|(id, fields)| Ok(FeedEntry::from_raw(seq_of(&id)?, fields, 1))).collect()
    }

    async fn create_group(&self, sku: &SkuId, group: &str) -> Result<(), LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let cmd = ::redis::cmd("XGROUP").arg("CREATE").arg(&keys.orders).arg(group).arg("0").arg("MKSTREAM").clone();
        match self.call::<String>(Some(sku), cmd.query_async(&mut con)).await {
            // Another consumer created it first.
            Err(LedgerError::Unavailable(text)) if text.contains("BUSYGROUP") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// `XPENDING … IDLE` finds the idle entries with their delivery counts, `XCLAIM` takes them;
    /// an entry another consumer claims in between is simply not returned by `XCLAIM`.
    async fn group_claim(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        let keys = self.keys(sku);
        let idle_ms = min_idle.as_millis() as u64;
        let mut con = self.connection();
        let pending: Result<Vec<(String, String, u64, u64)>, LedgerError> = self
            .call(
                Some(sku),
                ::redis::cmd("XPENDING")
                    .arg(&keys.orders)
                    .arg(group)
                    .arg("IDLE")
                    .arg(idle_ms)
                    .arg("-")
                    .arg("+")
                    .arg(count.max(1))
                    .query_async(&mut con),
            )
            .await;
        let pending = match pending {
            Err(LedgerError::Unavailable(text)) if text.contains("NOGROUP") => return Ok(Vec::new()),
            other => other?,
        };
        if pending.is_empty() {
            return Ok(Vec::new());
        }
        let mut claim = ::redis::cmd("XCLAIM");
        claim.arg(&keys.orders).arg(group).arg(consumer).arg(idle_ms);
        for (id, ..) in &pending {
            claim.arg(id);
        }
        let claimed: Vec<Option<RawOrderEntry>> = self.read(sku, &claim).await?;
        claimed
            .into_iter()
            .flatten()
            .map(|(id, fields)| {
                let deliveries = pending.iter().find(|(pending_id, ..)| *pending_id == id).map_or(1, |p| p.3 + 1);
                Ok(FeedEntry::from_raw(seq_of(&id)?, fields, deliveries))
            })
            .collect()
    }

    async fn group_ack(&self, sku: &SkuId, group: &str, seqs: &[u64]) -> Result<(), LedgerError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let keys = self.keys(sku);
        let mut ack = ::redis::cmd("XACK");
        ack.arg(&keys.orders).arg(group);
        for seq in seqs {
            ack.arg(format!("0-{seq}"));
        }
        let mut con = self.connection();
        let _acked: u64 = self.call(Some(sku), ack.query_async(&mut con)).await?;
        Ok(())
    }

    /// The group's last delivered seq and its oldest pending seq; `None` if the group does not
    /// exist.
    async fn group_position(&self, sku: &SkuId, group: &str) -> Result<Option<(u64, Option<u64>, u64)>, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let groups: Result<Vec<Vec<Value>>, LedgerError> =
            self.call(Some(sku), ::redis::cmd("XINFO").arg("GROUPS").arg(&keys.orders).query_async(&mut con)).await;
        let groups = match groups {
            // No stream yet: nothing sold, nothing to be behind on.
            Err(LedgerError::Unavailable(text)) if text.contains("no such key") => return Ok(None),
            other => other?,
        };
        let text = |value: &Value| match value {
            Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Value::SimpleString(text) => Some(text.clone()),
            _ => None,
        };
        let mut last_delivered = None;
        for fields in &groups {
            let field = |name: &str| {
                fields.chunks(2).find(|pair| text(&pair[0]).as_deref() == Some(name)).and_then(|pair| pair.get(1))
            };
            if field("name").and_then(text).as_deref() == Some(group) {
                let id = field("last-delivered-id").and_then(text).unwrap_or_else(|| "0-0".into());
                last_delivered = Some(seq_of(&id)?);
            }
        }
        let Some(last_delivered) = last_delivered else { return Ok(None) };
        let summary: (u64, Option<String>, Option<String>, Value) =
            self.call(Some(sku), ::redis::cmd("XPENDING").arg(&keys.orders).arg(group).query_async(&mut con)).await?;
        let oldest_pending = summary.1.as_deref().map(seq_of).transpose()?;
        Ok(Some((last_delivered, oldest_pending, summary.0)))
    }

    async fn group_lag(&self, sku: &SkuId, group: &str) -> Result<FeedLag, LedgerError> {
        let appended = self.status(sku).await?.orders;
        let (delivered, pending) = match self.group_position(sku, group).await? {
            Some((delivered, _, pending)) => (delivered, pending),
            None => (0, 0),
        };
        Ok(FeedLag { undelivered: appended.saturating_sub(delivered), pending })
    }

    /// Trims below the oldest entry the group still needs and below the newest `retain`; a read
    /// racing the trim only concerns entries past the last delivered one, which stay.
    async fn group_trim(&self, sku: &SkuId, group: &str, retain: u64) -> Result<u64, LedgerError> {
        let Some((delivered, oldest_pending, _)) = self.group_position(sku, group).await? else { return Ok(0) };
        let appended = self.status(sku).await?.orders;
        let needed_from = oldest_pending.unwrap_or(delivered + 1);
        let keep_from = needed_from.min(appended.saturating_sub(retain) + 1);
        let keys = self.keys(sku);
        let mut con = self.connection();
        self.call(
            Some(sku),
            ::redis::cmd("XTRIM").arg(&keys.orders).arg("MINID").arg(format!("0-{keep_from}")).query_async(&mut con),
        )
        .await
    }
}
