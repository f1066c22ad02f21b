//! Striped SKUs: a hot SKU's stock split into sub-ledgers on different Redis hash slots, so a
//! Redis Cluster spreads its sales over several masters.
//!
//! A stripe is itself a SKU ledger, named from the SKU, so every ledger script works on a
//! stripe unchanged: stripe 0 of `s` is `s` itself (one stripe is exactly the unstriped layout,
//! and a SKU's existing books are its stripe 0), stripe i ≥ 1 is `s/i`. `/` is outside the
//! charset of user SKU ids, so a stripe never collides with a user's SKU, and its Redis keys
//! (`prefix:{s/i}:…`) carry their own hash tag.
//!
//! A buyer always buys on the same stripe ([`stripe_for`]): the per-user limit and the
//! idempotency keys are kept per ledger, so they hold for a striped SKU only while each buyer
//! stays on one stripe.

use crate::ids::{InvalidId, SkuId, UserId};

pub use crate::terms::STRIPES_MAX;

/// Separates a SKU id from its stripe index; not a user SKU character (see [`SkuId::new`]).
const STRIPE_SEPARATOR: char = '/';

impl SkuId {
    /// The ledger of stripe `index` of this SKU: the SKU itself for 0, `"{self}/{index}"` after.
    /// Meant for a plain SKU: a stripe of a stripe is not a stripe of the parent.
    pub fn stripe(&self, index: u32) -> SkuId {
        debug_assert!(!self.as_str().contains(STRIPE_SEPARATOR), "stripes are taken of a plain SKU");
        if index == 0 {
            return self.clone();
        }
        SkuId::derived(format!("{self}{STRIPE_SEPARATOR}{index}"))
    }

    /// The SKU this ledger is a stripe of, and its index: `(self, 0)` for a plain SKU.
    pub fn stripe_parent(&self) -> (SkuId, u32) {
        let Some((parent, index)) = self.as_str().rsplit_once(STRIPE_SEPARATOR) else {
            return (self.clone(), 0);
        };
        // Only `stripe` builds ids with the separator, so anything else is a plain SKU.
        match index.parse::<u32>() {
            Ok(index) if index > 0 && !parent.is_empty() => (SkuId::derived(parent.to_string()), index),
            _ => (self.clone(), 0),
        }
    }
}

impl SkuId {
    /// A SKU id as the group's own messages carry it: a user SKU id, or a stripe of one
    /// (`s/i`, i from 1 to [`STRIPES_MAX`] - 1), which only the group itself names.
    pub fn from_wire(text: &str) -> Result<SkuId, InvalidId> {
        let Some((parent, index)) = text.rsplit_once(STRIPE_SEPARATOR) else {
            return SkuId::new(text);
        };
        SkuId::validate(parent)?;
        match index.parse::<u32>() {
            // One stripe, one name: `s/01` and `s/+1` are refused.
            Ok(number) if (1..STRIPES_MAX).contains(&number) && number.to_string() == index => {
                Ok(SkuId::derived(text.to_string()))
            }
            _ => Err(InvalidId { what: "sku", reason: "has a stripe index outside 1..64" }),
        }
    }

    /// Whether this id names a stripe past the first (`s/i`), not a SKU a user can name.
    pub fn is_stripe(&self) -> bool {
        self.as_str().contains(STRIPE_SEPARATOR)
    }
}

/// Every ledger a SKU sold on `terms` is kept in, with its terms: the SKU itself when it is not
/// striped, else each stripe (`s`, `s/1`, …) with its share of the total. What the order
/// service consumes and reconcile checks, one order stream per ledger.
pub fn ledgers_of(sku: &SkuId, terms: &crate::SkuTerms) -> Vec<(SkuId, crate::SkuTerms)> {
    (0u32..).zip(terms.stripe_terms()).map(|(index, stripe_terms)| (sku.stripe(index), stripe_terms)).collect()
}

/// The stripe `user` always buys on, of a SKU split into `stripes` (0 or 1: stripe 0).
///
/// Nodes of different builds must agree on it, so it is FNV-1a (64-bit) over the user id's
/// bytes, fixed by its published constants, not std's `Hasher`, whose output may change
/// between Rust releases and is seeded per process for `HashMap`.
pub fn stripe_for(user: &UserId, stripes: u32) -> u32 {
    stripe_for_str(user.as_str(), stripes)
}

/// [`stripe_for`] of a user id already validated (`UserId::validate`) but not built: a node
/// routes each purchase of a striped SKU and builds owned ids only for requests that reach the
/// ledger.
pub fn stripe_for_str(user: &str, stripes: u32) -> u32 {
    if stripes <= 1 {
        return 0;
    }
    // The remainder is below `stripes`, a u32, so the cast never truncates.
    (fnv1a(user.as_bytes()) % u64::from(stripes)) as u32
}

/// FNV-1a, 64-bit: <http://www.isthe.com/chongo/tech/comp/fnv/>.
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserId {
        UserId::new(name).unwrap()
    }

    #[test]
    fn the_wire_carries_stripes_and_users_cannot_name_them() {
        let sku = SkuId::new("hot").unwrap();
        assert_eq!(SkuId::from_wire("hot/1").unwrap(), sku.stripe(1));
        assert_eq!(SkuId::from_wire("hot").unwrap(), sku);
        for bad in ["hot/0", "hot/64", "hot/01", "hot/+1", "hot/x", "/1", "a{b}/1", "hot/1/2"] {
            assert!(SkuId::from_wire(bad).is_err(), "{bad} is no stripe");
        }
        let parsed: SkuId = serde_json::from_str("\"hot/3\"").unwrap();
        assert_eq!((parsed.is_stripe(), parsed.stripe_parent()), (true, (sku.clone(), 3)));
        assert!(SkuId::new("hot/1").is_err(), "users name SKUs, never stripes");
        assert!(!sku.is_stripe());
    }

    #[test]
    fn stripe_terms_split_the_total_and_travel_only_when_striped() {
        let terms = crate::SkuTerms { stripes: 3, ..crate::SkuTerms::new(10) };
        let totals: Vec<u64> = terms.stripe_terms().iter().map(|stripe| stripe.total).collect();
        assert_eq!(totals, [4, 3, 3]);
        let plain = serde_json::to_string(&crate::SkuTerms::new(10)).unwrap();
        assert!(!plain.contains("stripes"), "an unstriped SKU's terms read as before: {plain}");
        let striped: crate::SkuTerms = serde_json::from_str(&serde_json::to_string(&terms).unwrap()).unwrap();
        assert_eq!(striped.stripes, 3);
        assert!(crate::SkuTerms { stripes: 0, ..terms.clone() }.validate().is_err());
        assert!(crate::SkuTerms { stripes: 65, ..terms.clone() }.validate().is_err());
        assert!(crate::SkuTerms { stripes: 11, ..terms }.validate().is_err(), "more stripes than units");
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// Fixed answers, computed outside Rust: a change here means nodes of this build and the
    /// last would send one buyer to two stripes.
    #[test]
    fn a_buyers_stripe_is_stable_across_builds() {
        let expected = [("alice", 2, 1, 7), ("bob", 0, 2, 20), ("user-42", 0, 2, 11), ("名字", 1, 5, 18)];
        for (name, of_3, of_7, of_64) in expected {
            let stripes = [3, 7, 64].map(|k| stripe_for(&user(name), k));
            assert_eq!(stripes, [of_3, of_7, of_64], "{name}");
        }
        assert_eq!(stripe_for(&user("alice"), 0), 0, "no stripes: stripe 0");
        assert_eq!(stripe_for(&user("alice"), 1), 0);
    }

    #[test]
    fn buyers_spread_evenly_over_the_stripes() {
        let mut counts = [0u32; 3];
        for n in 0..100_000 {
            counts[stripe_for(&user(&format!("user-{n}")), 3) as usize] += 1;
        }
        let third = 100_000.0 / 3.0;
        for count in counts {
            assert!((f64::from(count) - third).abs() <= third * 0.02, "{counts:?}");
        }
    }

    #[test]
    fn a_stripe_names_its_parent_and_index() {
        let sku = SkuId::new("phone-128g").unwrap();
        assert_eq!(sku.stripe(0), sku, "stripe 0 is the SKU's own ledger");
        assert_eq!(sku.stripe(3).as_str(), "phone-128g/3");
        for index in [0, 1, 2, STRIPES_MAX - 1] {
            assert_eq!(sku.stripe(index).stripe_parent(), (sku.clone(), index));
        }
        assert_eq!(sku.stripe_parent(), (sku.clone(), 0), "a plain SKU is its own stripe 0");
        assert!(SkuId::new(sku.stripe(1).as_str()).is_err(), "no user SKU id can name a stripe");
    }
}
