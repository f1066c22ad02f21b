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

use crate::ids::{SkuId, UserId};

/// Most stripes one SKU may be split into: past a few dozen masters a SKU gains nothing, and
/// every stripe is a ledger to create, watch and move stock between.
pub const STRIPES_MAX: u32 = 64;

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

/// The stripe `user` always buys on, of a SKU split into `stripes` (0 or 1: stripe 0).
///
/// Nodes of different builds must agree on it, so it is FNV-1a (64-bit) over the user id's
/// bytes, fixed by its published constants, not std's `Hasher`, whose output may change
/// between Rust releases and is seeded per process for `HashMap`.
pub fn stripe_for(user: &UserId, stripes: u32) -> u32 {
    if stripes <= 1 {
        return 0;
    }
    // The remainder is below `stripes`, a u32, so the cast never truncates.
    (fnv1a(user.as_str().as_bytes()) % u64::from(stripes)) as u32
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
