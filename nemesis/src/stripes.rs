//! A striped SKU read as one: its stripes are ledgers of their own (`protocol::stripes`), so the
//! run reads each and the checker judges their sum against the SKU's terms, and each stripe's
//! books on their own. An unstriped SKU is its one ledger, read exactly as before.
//!
//! Units a transfer took out of one stripe and has not yet put into another are in none of
//! the stripes' `total` or `remaining`: every figure that must add up to the SKU's total counts
//! them as `in_flight` (Σ `transferred_out` − Σ `transferred_in`). Each stripe's `total +
//! transferred_out − transferred_in` is its created share whatever the read order, so the sum
//! holds even when the stripes were read at different moments around a transfer.

use std::collections::BTreeMap;

use ledger::{SkuId, SkuStatus, SkuTerms};
use serde::Serialize;

/// The ledgers `sku` is kept in when split into `stripes` (`[sku]` for 1), as the coordinator
/// creates them.
pub fn ledgers(sku: &SkuId, total: u64, stripes: u32) -> Vec<SkuId> {
    let terms = SkuTerms { stripes, ..SkuTerms::new(total) };
    protocol::ledgers_of(sku, &terms).into_iter().map(|(ledger, _)| ledger).collect()
}

/// One stripe's books, read with the rest of the final ledger.
#[derive(Clone, Debug, Serialize)]
pub struct StripeBooks {
    /// Its ledger: `s` or `s/i`.
    pub ledger: String,
    pub status: SkuStatus,
    /// Units in its own order stream, if it was readable.
    pub streamed: Option<u64>,
    /// Σ of its per-seller books, if they were readable.
    pub by_seller: Option<u64>,
}

/// The stripes' statuses as one SKU's: counts summed, sellers merged; none for no stripes.
pub fn combine(statuses: &[SkuStatus]) -> Option<SkuStatus> {
    (!statuses.is_empty()).then(|| SkuStatus::combined(statuses))
}

/// Merges per-seller books of several stripes (`<node>#<epoch>` → units): a seller sells on
/// every stripe under one epoch, so its count is the sum.
pub fn merge_sellers(books: impl IntoIterator<Item = BTreeMap<String, u64>>) -> BTreeMap<String, u64> {
    let mut merged = BTreeMap::new();
    for book in books {
        for (seller, units) in book {
            *merged.entry(seller).or_default() += units;
        }
    }
    merged
}

/// Units a transfer took out of a stripe and has not put into another: negative when more
/// came in than went out (a transfer applied twice).
pub fn in_flight(transferred_out: u64, transferred_in: u64) -> i128 {
    i128::from(transferred_out) - i128::from(transferred_in)
}

/// Units still for sale, counting those between stripes: a SKU whose stripes read 0 while a
/// transfer is under way is not sold out.
pub fn unsold(remaining: u64, transferred_out: u64, transferred_in: u64) -> u64 {
    let unsold = i128::from(remaining) + in_flight(transferred_out, transferred_in);
    u64::try_from(unsold.max(0)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stripe_is_the_sku_itself_and_three_name_their_ledgers() {
        let sku = SkuId::new("hot").unwrap();
        assert_eq!(ledgers(&sku, 10, 1), std::slice::from_ref(&sku));
        let names: Vec<String> = ledgers(&sku, 10, 3).iter().map(ToString::to_string).collect();
        assert_eq!(names, ["hot", "hot/1", "hot/2"]);
    }

    fn status(total: u64, sold: u64, node: &str, transferred_out: u64, transferred_in: u64) -> SkuStatus {
        SkuStatus {
            total,
            sold,
            remaining: total - sold,
            released: 1,
            orders: sold + 1,
            per_user_limit: 2,
            sold_by_node: [(ledger::NodeId::new(node).unwrap(), sold + 1)].into(),
            closed: false,
            require_token: false,
            transferred_out,
            transferred_in,
        }
    }

    #[test]
    fn stripes_combine_into_the_skus_books() {
        let sum = combine(&[status(4, 2, "n1", 0, 1), status(2, 2, "n1", 1, 0), status(3, 0, "n2", 0, 0)]).unwrap();
        assert_eq!((sum.total, sum.sold, sum.remaining, sum.released, sum.orders), (9, 4, 5, 3, 7));
        assert_eq!((sum.transferred_out, sum.transferred_in, sum.per_user_limit), (1, 1, 2));
        let by_node: Vec<(String, u64)> = sum.sold_by_node.iter().map(|(n, u)| (n.to_string(), *u)).collect();
        assert_eq!(by_node, [("n1".to_string(), 6), ("n2".to_string(), 1)]);
        assert_eq!(combine(&[status(3, 1, "n1", 0, 0)]), Some(status(3, 1, "n1", 0, 0)), "one stripe: itself");
        assert_eq!(combine(&[]), None);
        let books = [[("n1#1".to_string(), 2)].into(), [("n1#1".to_string(), 1), ("n2#1".to_string(), 4)].into()];
        assert_eq!(merge_sellers(books), [("n1#1".to_string(), 3), ("n2#1".to_string(), 4)].into());
    }

    #[test]
    fn units_between_stripes_are_unsold() {
        assert_eq!(unsold(0, 3, 1), 2);
        assert_eq!(unsold(5, 1, 3), 3, "a read after the transfer in and before the transfer out");
        assert_eq!(unsold(0, 0, 2), 0);
    }
}
