//! The Redis ledger's order feed and releases: consumer groups on each SKU's order stream
//! (`XREADGROUP`, `XPENDING` + `XCLAIM`, `XACK`, `XTRIM MINID`) and `release.lua` with its log.
//!
//! Stream entry ids are `0-<seq>` (see `confirm.lua`), so a seq and an entry id convert both
//! ways and `XTRIM MINID 0-<seq>` drops exactly the entries below a seq.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::{Script, Value};

use crate::redis::RedisLedger;
use crate::*;

static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/release.lua")));

/// Fields of one stream entry, as Redis returns them.
type RawEntry = (String, Vec<(String, String)>);

/// An order stream entry as bytes: a value that is not UTF-8 must not fail the whole read.
pub(crate) type RawOrderEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// An `XREADGROUP` reply: per stream, its entries; nil when the wait ended with none.
type GroupReply = Option<Vec<(String, Vec<RawOrderEntry>)>>;

pub(crate) fn seq_of(id: &str) -> Result<u64, LedgerError> {
    id.strip_prefix("0-")
        .and_then(|seq| seq.parse().ok())
        .ok_or_else(|| LedgerError::Corrupt(format!("stream entry id {id:?} is not 0-<seq>")))
}

fn count_of(text: &str, what: &str) -> Result<u64, LedgerError> {
    text.parse().map_err(|_| LedgerError::Corrupt(format!("unreadable {what} {text:?}")))
}

impl RedisLedger {
    /// Up to `count` entries of the stream at `key` after sequence number `after`: stream ids
    /// are `0-<seq>` (`confirm.lua`, `release.lua`), and `(` makes the start exclusive.
    pub(crate) async fn entries_after<T: ::redis::FromRedisValue>(
        &self,
        sku: &SkuId,
        key: &str,
        after: u64,
        count: usize,
    ) -> Result<Vec<T>, LedgerError> {
        let range = ::redis::cmd("XRANGE").arg(key).arg(format!("(0-{after}")).arg("+").arg("COUNT").arg(count).clone();
        self.read(sku, &range).await
    }

    pub(crate) async fn release_units(&self, sku: &SkuId, release: &Release) -> Result<ReleaseOutcome, LedgerError> {
        let keys = self.keys(sku);
        let mut invocation = RELEASE.key(&keys.meta);
        invocation.key(&keys.by_user);
        for window in keys.sales_windows_around(release.sold_at_ms) {
            invocation.key(window);
        }
        invocation.key(&keys.releases).arg(release.order_id.0.as_str()).arg(release.user.as_str()).arg(release.qty);
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

    pub(crate) async fn release_log(
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

    /// `XREADGROUP … >`, creating the group on first use. The wait is kept under the call
    /// deadline, so a quiet stream returns empty instead of timing out.
    pub(crate) async fn group_read(
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
    pub(crate) async fn group_claim(
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

    pub(crate) async fn group_ack(&self, sku: &SkuId, group: &str, seqs: &[u64]) -> Result<(), LedgerError> {
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

    pub(crate) async fn group_lag(&self, sku: &SkuId, group: &str) -> Result<FeedLag, LedgerError> {
        let appended = self.status(sku).await?.orders;
        let (delivered, pending) = match self.group_position(sku, group).await? {
            Some((delivered, _, pending)) => (delivered, pending),
            None => (0, 0),
        };
        Ok(FeedLag { undelivered: appended.saturating_sub(delivered), pending })
    }

    /// Trims below the oldest entry the group still needs and below the newest `retain`; a read
    /// racing the trim only concerns entries past the last delivered one, which stay.
    pub(crate) async fn group_trim(&self, sku: &SkuId, group: &str, retain: u64) -> Result<u64, LedgerError> {
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
