//! `[[skus]]`: each SKU's id, the terms it is sold on (one `protocol::SkuTerms`, the same type
//! the admin API reads) and how its total is placed over this config's nodes.

use std::collections::BTreeMap;

use protocol::{Buffer, NodeId, SkuId, SkuTerms};
use serde::Deserialize;

/// One `[[skus]]` table: the SKU's id, the terms it is sold on (every key of
/// [`protocol::SkuTerms`], which also reads the admin API's JSON), and how its total is placed
/// over this config's nodes.
#[derive(Debug, Clone)]
pub struct SkuEntry {
    pub id: SkuId,
    pub terms: SkuTerms,
    /// Per-node buffer overrides.
    pub node_buffers: BTreeMap<NodeId, Buffer>,
    /// Per-node weights for splitting the total; nodes not named weigh 1.
    pub weights: BTreeMap<NodeId, u32>,
    /// `waiting_room = true`: the SKU takes the `[waiting_room]` rules (filled in by the
    /// loader, which has them).
    pub room_from_fleet: bool,
}

impl<'de> Deserialize<'de> for SkuEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(deserializer)?;
        let id = table.remove("id").ok_or_else(|| D::Error::missing_field("id"))?;
        let node_buffers = take(&mut table, "node_buffers").map_err(D::Error::custom)?.unwrap_or_default();
        let weights = take(&mut table, "weights").map_err(D::Error::custom)?.unwrap_or_default();
        // A table stays for the terms to read; a switch is the fleet's rules or none.
        let room_from_fleet = match table.get("waiting_room") {
            Some(toml::Value::Boolean(on)) => {
                let on = *on;
                table.remove("waiting_room");
                on
            }
            _ => false,
        };
        // Not `SkuId`'s own deserializer: that one also reads the group's stripe names.
        let id = id.as_str().ok_or_else(|| D::Error::custom("id: must be a string"))?;
        Ok(SkuEntry {
            id: SkuId::new(id).map_err(D::Error::custom)?,
            terms: toml::Value::Table(table).try_into().map_err(D::Error::custom)?,
            node_buffers,
            weights,
            room_from_fleet,
        })
    }
}

/// Takes `key` out of `table`, read as a `T`.
fn take<T: serde::de::DeserializeOwned>(table: &mut toml::Table, key: &str) -> Result<Option<T>, toml::de::Error> {
    table.remove(key).map(toml::Value::try_into).transpose()
}

/// Each node's starting allotment: its weighted share of the total (remainders go to the first
/// nodes, so the shares add up to the total exactly) plus its buffer.
pub fn allotments(sku: &SkuEntry, nodes: &[NodeId]) -> BTreeMap<NodeId, u64> {
    let weight = |node: &NodeId| u64::from(sku.weights.get(node).copied().unwrap_or(1));
    let total = sku.terms.total;
    let weight_sum: u64 = nodes.iter().map(weight).sum();
    let shares: Vec<u64> = nodes.iter().map(|node| total * weight(node) / weight_sum.max(1)).collect();
    let mut leftover = total - shares.iter().sum::<u64>();
    nodes
        .iter()
        .zip(shares)
        .map(|(node, mut share)| {
            if leftover > 0 && weight(node) > 0 {
                share += 1;
                leftover -= 1;
            }
            let buffer = sku.node_buffers.get(node).copied().unwrap_or(sku.terms.buffer);
            (node.clone(), share + buffer.units(share))
        })
        .collect()
}
