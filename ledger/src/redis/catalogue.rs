//! [`CatalogueLedger`] on Redis: the SKU's books (`create.lua`, `restock.lua`, `pricing.lua`,
//! `close.lua`), seller epochs (`end_epoch.lua`, the `by_epoch` hash), units moved between the
//! stripes of a striped SKU (`transfer_out.lua`, `transfer_in.lua`), and the status every
//! client reads.

use std::collections::BTreeMap;

use super::call::parse_count;
use super::scripts::{CLOSE, CREATE, END_EPOCH, PRICING, RESTOCK, TRANSFER_IN, TRANSFER_OUT};
use super::RedisLedger;
use crate::*;

#[async_trait::async_trait]
impl CatalogueLedger for RedisLedger {
    async fn create_sku(&self, sku: &SkuId, terms: &SkuTerms) -> Result<Created, LedgerError> {
        let keys = self.keys(sku);
        let mut invocation = CREATE.key(&keys.meta);
        invocation.arg(terms.total).arg(terms.per_user_limit).arg(u8::from(terms.requires_token()));
        invocation.arg(terms.price).arg(terms.currency.as_str()).arg(terms.pay_timeout_s);
        let created: i64 = self.write(sku, &invocation).await?;
        let status = self.status(sku).await?;
        Ok(if created == 1 { Created::New(status) } else { Created::Existing(status) })
    }

    async fn restock_to(&self, sku: &SkuId, total: u64) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(sku);
        let _total: i64 = self.write(sku, RESTOCK.key(&keys.meta).arg(total)).await?;
        self.status(sku).await
    }

    async fn set_pricing(&self, sku: &SkuId, pricing: &Pricing) -> Result<(), LedgerError> {
        let keys = self.keys(sku);
        let mut invocation = PRICING.key(&keys.meta);
        invocation.arg(pricing.price).arg(pricing.currency.as_str()).arg(pricing.pay_timeout_s);
        let _set: i64 = self.write(sku, &invocation).await?;
        Ok(())
    }

    async fn close(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(sku);
        let _closed: i64 = self.write(sku, &CLOSE.key(&keys.meta)).await?;
        self.status(sku).await
    }

    async fn end_epoch(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        let keys = self.keys(sku);
        let mut invocation = END_EPOCH.key(&keys.meta);
        invocation.key(&keys.by_epoch).arg(seller.node.as_str()).arg(seller.epoch).arg(seller.epoch_key());
        self.write(sku, &invocation).await
    }

    async fn sold_by(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let (exists, sold): (bool, Option<u64>) = self
            .call(
                Some(sku),
                ::redis::pipe().exists(&keys.meta).hget(&keys.by_epoch, seller.epoch_key()).query_async(&mut con),
            )
            .await?;
        if !exists {
            return Err(LedgerError::Missing(sku.clone()));
        }
        Ok(sold.unwrap_or(0))
    }

    async fn transfer_out(&self, stripe: &SkuId, transfer: u64, most: u64) -> Result<u64, LedgerError> {
        let keys = self.keys(stripe);
        let mut invocation = TRANSFER_OUT.key(&keys.meta);
        invocation.key(&keys.transfers).arg(transfer).arg(most);
        let taken: String = self.write(stripe, &invocation).await?;
        parse_count(Some(&taken), "units transferred out")
    }

    async fn transfer_in(&self, stripe: &SkuId, transfer: u64, units: u64) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(stripe);
        let mut invocation = TRANSFER_IN.key(&keys.meta);
        invocation.key(&keys.transfers).arg(transfer).arg(units);
        let _added: i64 = self.write(stripe, &invocation).await?;
        self.status(stripe).await
    }
}

impl RedisLedger {
    /// [`LedgerReads::status`]: `meta` and `by_epoch` in one pipeline, `sold_by_node` summed
    /// over each node's epochs, and `sold + remaining == total` checked before anyone sees it.
    pub(super) async fn read_status(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        let keys = self.keys(sku);
        let mut con = self.connection();
        let (meta, by_epoch): (BTreeMap<String, String>, BTreeMap<String, u64>) = self
            .call(Some(sku), ::redis::pipe().hgetall(&keys.meta).hgetall(&keys.by_epoch).query_async(&mut con))
            .await?;
        if meta.is_empty() {
            return Err(LedgerError::Missing(sku.clone()));
        }
        let field = |name: &str| parse_count(meta.get(name), name);
        // Absent until the first release or transfer.
        let optional = |name: &str| meta.get(name).map_or(Ok(0), |_| field(name));
        let mut sold_by_node: BTreeMap<NodeId, u64> = BTreeMap::new();
        for (seller, sold) in by_epoch {
            let node = seller.rsplit_once('#').map_or(seller.as_str(), |(node, _)| node);
            let node = NodeId::new(node).map_err(|_| LedgerError::Corrupt(format!("bad seller {seller:?}")))?;
            *sold_by_node.entry(node).or_insert(0) += sold;
        }
        let status = SkuStatus {
            total: field("total")?,
            sold: field("sold")?,
            remaining: field("remaining")?,
            per_user_limit: u32::try_from(field("per_user_limit")?)
                .map_err(|_| LedgerError::Corrupt("per_user_limit".into()))?,
            sold_by_node,
            closed: meta.get("closed").is_some_and(|closed| closed == "1"),
            require_token: meta.get("require_token").is_some_and(|required| required == "1"),
            released: optional("released")?,
            orders: field("order_seq")?,
            transferred_out: optional("transferred_out")?,
            transferred_in: optional("transferred_in")?,
        };
        if status.sold + status.remaining != status.total {
            return Err(LedgerError::Corrupt(format!("{sku}: sold + remaining ~= total")));
        }
        Ok(status)
    }
}
