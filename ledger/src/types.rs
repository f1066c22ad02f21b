//! Identifiers and values shared by every ledger, node and the CLI.
//!
//! Identifiers are validated once, when they enter the system (config or HTTP), so the rest of
//! the code can put them in Redis keys and log lines without escaping.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Longest SKU or node id: both are embedded in every Redis key of a SKU.
pub const ID_BYTES_MAX: usize = 64;
/// Longest idempotency key, as the HTTP contract fixes it.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 128;
/// Longest user id; user ids are hash fields in the ledger, so they must stay small.
pub const USER_BYTES_MAX: usize = 128;
/// Longest submit token. Issued tokens are 32 hex digits (128 random bits); the bound leaves
/// room for a longer format without letting a client put a large string into a Redis key.
pub const SUBMIT_TOKEN_BYTES_MAX: usize = 64;
/// Random bytes in an issued submit token: 128 bits cannot be guessed or collide in practice.
const SUBMIT_TOKEN_RANDOM_BYTES: usize = 16;

/// Why an identifier was refused; the message names the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {reason}")]
pub struct InvalidId {
    pub what: &'static str,
    pub reason: &'static str,
}

fn check_id(what: &'static str, text: &str, bytes_max: usize, charset: fn(char) -> bool) -> Result<(), InvalidId> {
    if text.is_empty() {
        return Err(InvalidId { what, reason: "must not be empty" });
    }
    if text.len() > bytes_max {
        return Err(InvalidId { what, reason: "is too long" });
    }
    if !text.chars().all(charset) {
        return Err(InvalidId { what, reason: "has a character outside the allowed set" });
    }
    Ok(())
}

/// SKU and node ids become part of Redis keys and hash tags, so braces, spaces and control
/// characters are out.
fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')
}

/// Submit tokens are lowercase hex, as issued: they become part of a Redis key, and a fixed
/// alphabet keeps braces (hash tags) and separators out.
fn is_token_char(c: char) -> bool {
    c.is_ascii_digit() || ('a'..='f').contains(&c)
}

/// Users and idempotency keys come from clients; anything printable is fine, but control
/// characters are reserved as field separators inside stored outcomes.
fn is_client_char(c: char) -> bool {
    !c.is_control()
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr, $charset:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(text: &str) -> Result<Self, InvalidId> {
                Self::validate(text)?;
                Ok(Self(Arc::from(text)))
            }

            /// Checks `text` without allocating: the hot path validates first and builds
            /// the id only if the request gets as far as the ledger.
            pub fn validate(text: &str) -> Result<(), InvalidId> {
                check_id($what, text, $max, $charset)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        /// Hash and equality are those of the text, so maps keyed by the id can be
        /// searched with a `&str`.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Self::new(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// A stock-keeping unit on sale, e.g. `phone-128g`.
    SkuId, "sku", ID_BYTES_MAX, is_id_char
);
string_id!(
    /// An inventory node, e.g. `n1`; recorded with every sale it makes.
    NodeId, "node id", ID_BYTES_MAX, is_id_char
);
string_id!(
    /// The buyer, as the shop's front end identifies them.
    UserId, "user", USER_BYTES_MAX, is_client_char
);
string_id!(
    /// The client's name for one purchase attempt: retries reuse it, so it decides at most once.
    IdempotencyKey, "Idempotency-Key", IDEMPOTENCY_KEY_BYTES_MAX, is_client_char
);

string_id!(
    /// A one-time permission to submit one purchase of one SKU by one user (anti-duplicate
    /// submission). Issued by [`crate::Ledger::issue_token`], consumed by the first purchase that
    /// presents it.
    SubmitToken, "Submit-Token", SUBMIT_TOKEN_BYTES_MAX, is_token_char
);

impl SubmitToken {
    /// A fresh token: 128 bits from the operating system's secure random source, in hex. Not a
    /// fast PRNG: presenting a token spends it whoever presents it, so a predictable token could
    /// be burnt by someone else before its owner uses it.
    pub(crate) fn generate() -> Result<SubmitToken, getrandom::Error> {
        let mut bytes = [0u8; SUBMIT_TOKEN_RANDOM_BYTES];
        getrandom::fill(&mut bytes)?;
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        debug_assert!(Self::validate(&text).is_ok(), "issued tokens must pass their own validation");
        Ok(SubmitToken(Arc::from(text.as_str())))
    }
}

/// The order id of one confirmed sale: the selling node's Snowflake id, or the ledger's
/// `<sku>-<seq>`; unique per ledger either way. Digits, letters and `-` only, so it fits the
/// stored decision's separators.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OrderId(pub String);

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who sold: a node in one epoch of its membership. Epochs let the books tell apart what a node
/// sold before it was declared dead from what it sold after rejoining; 0 is "no coordinator".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Seller {
    pub node: NodeId,
    pub epoch: u64,
}

impl Seller {
    pub fn new(node: NodeId, epoch: u64) -> Self {
        Self { node, epoch }
    }

    /// The key of this seller's count in the per-epoch books.
    pub fn epoch_key(&self) -> String {
        format!("{}#{}", self.node, self.epoch)
    }
}

/// What the ledger needs to know about a sale: how much, and how much one user may buy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkuSpec {
    pub sku: SkuId,
    pub total: u64,
    /// Units one user may buy over the whole sale; 0 means no limit.
    pub per_user_limit: u32,
    /// Every purchase must present a submit token ([`SubmitToken`]). Kept in the ledger, not
    /// only in node configs, so a node with a stale config cannot skip the check.
    pub require_token: bool,
}

/// One local sale that a node asks the ledger to confirm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Purchase {
    pub key: IdempotencyKey,
    pub user: UserId,
    pub qty: u32,
    /// The submit token presented with it; only read for a SKU that requires tokens.
    pub token: Option<SubmitToken>,
    /// The id the seller gives the order if this purchase sells (a Snowflake id, unique across
    /// the fleet); `None`: the ledger numbers it `<sku>-<seq>`. Not part of the fingerprint: a
    /// retry brings a new id and gets the stored one back.
    pub order_id: Option<OrderId>,
}

impl Purchase {
    /// What must match for a retry to count as the same purchase (the SKU is implied: keys are
    /// scoped per SKU). The unit separator cannot occur in a user id.
    ///
    /// The submit token is deliberately not part of it: the first decision consumes the token,
    /// and a retry with the same key and payload must still replay that decision, whether it
    /// carries the spent token, another one or none.
    pub fn fingerprint(&self) -> String {
        format!("{}\u{1f}{}", self.user, self.qty)
    }
}

/// A confirmed sale.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Receipt {
    pub order_id: OrderId,
    /// The node that sold it; replays report the original node, not the one replaying.
    pub node: NodeId,
    pub qty: u32,
}

/// How the ledger decided one purchase. Stored under the idempotency key, so a retry gets the
/// same answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Purchased(Receipt),
    SoldOut,
    UserLimit,
    /// The sale was closed before this purchase was decided.
    Ended,
    /// The SKU requires a submit token and this purchase had none that was live, unspent and
    /// issued to this user for this SKU.
    TokenInvalid,
}

/// The ledger's answer to one purchase of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Decided now, by this call.
    Fresh(Decision),
    /// Decided earlier for the same key and the same payload; this is the stored decision.
    Replayed(Decision),
    /// The key was used before for a different payload; nothing changed.
    KeyReused,
}

/// The ledger's answer to one batch: a verdict per purchase, in order, and the SKU's counts
/// after the batch (nodes cache them for the stock page).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchOutcome {
    pub verdicts: Vec<Verdict>,
    pub sold: u64,
    pub remaining: u64,
}

/// A SKU's global counts as the ledger holds them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkuStatus {
    pub total: u64,
    pub sold: u64,
    pub remaining: u64,
    pub per_user_limit: u32,
    pub sold_by_node: BTreeMap<NodeId, u64>,
    /// The sale was closed: the ledger sells nothing more.
    pub closed: bool,
    /// Purchases must present a submit token.
    pub require_token: bool,
}

/// Whether `create_sku` made a new ledger or found one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    New(SkuStatus),
    /// The SKU already had a ledger; it was left exactly as it was.
    Existing(SkuStatus),
}

/// One entry of a SKU's order stream, appended by the same atomic step that sold the units.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OrderEvent {
    /// Position in the SKU's stream: 1 for the first sale, then +1 per sale. Readers resume
    /// from the last `seq` they saw.
    pub seq: u64,
    pub order_id: OrderId,
    pub key: IdempotencyKey,
    pub user: UserId,
    pub qty: u32,
    pub node: NodeId,
}

/// Stored decisions are one string: fingerprint, then the decision, fields split by the record
/// separator (a control character, which ids cannot contain). Both ledgers use this encoding so
/// that the Lua script and the Rust code agree byte for byte.
pub(crate) mod stored {
    use super::*;

    pub const SEP: char = '\u{1e}';

    pub fn encode(decision: &Decision) -> String {
        match decision {
            Decision::Purchased(r) => format!("purchased{SEP}{}{SEP}{}{SEP}{}", r.order_id, r.node, r.qty),
            Decision::SoldOut => "sold_out".to_string(),
            Decision::UserLimit => "user_limit".to_string(),
            Decision::Ended => "ended".to_string(),
            Decision::TokenInvalid => "token_invalid".to_string(),
        }
    }

    pub fn decode(text: &str) -> Option<Decision> {
        let mut fields = text.split(SEP);
        match fields.next()? {
            "purchased" => {
                let order_id = OrderId(fields.next()?.to_string());
                let node = NodeId::new(fields.next()?).ok()?;
                let qty = fields.next()?.parse().ok()?;
                Some(Decision::Purchased(Receipt { order_id, node, qty }))
            }
            "sold_out" => Some(Decision::SoldOut),
            "user_limit" => Some(Decision::UserLimit),
            "ended" => Some(Decision::Ended),
            "token_invalid" => Some(Decision::TokenInvalid),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_reject_what_would_break_keys() {
        assert!(SkuId::new("phone-128g").is_ok());
        assert!(SkuId::new("").is_err());
        assert!(SkuId::new("a{b}").is_err(), "braces would change the Redis hash tag");
        assert!(SkuId::new(&"x".repeat(ID_BYTES_MAX + 1)).is_err());
        assert!(UserId::new("名字 with spaces").is_ok());
        assert!(UserId::new("tab\there").is_err());
        assert!(IdempotencyKey::new(&"k".repeat(IDEMPOTENCY_KEY_BYTES_MAX)).is_ok());
        assert!(IdempotencyKey::new(&"k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1)).is_err());
        assert!(SubmitToken::new("0123456789abcdef").is_ok());
        assert!(SubmitToken::new("").is_err(), "an empty token would name the SKU's token prefix itself");
        assert!(SubmitToken::new("ABCDEF").is_err(), "issued tokens are lowercase hex");
        assert!(SubmitToken::new("ab}{cd").is_err());
        assert!(SubmitToken::new(&"a".repeat(SUBMIT_TOKEN_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn generated_tokens_are_valid_and_distinct() {
        let (a, b) = (SubmitToken::generate().unwrap(), SubmitToken::generate().unwrap());
        assert_eq!(a.as_str().len(), 2 * SUBMIT_TOKEN_RANDOM_BYTES);
        assert!(SubmitToken::validate(a.as_str()).is_ok());
        assert_ne!(a, b);
    }

    #[test]
    fn stored_decisions_round_trip() {
        let receipt = Receipt { order_id: OrderId("s-7".into()), node: NodeId::new("n2").unwrap(), qty: 3 };
        for decision in [
            Decision::Purchased(receipt),
            Decision::SoldOut,
            Decision::UserLimit,
            Decision::Ended,
            Decision::TokenInvalid,
        ] {
            assert_eq!(stored::decode(&stored::encode(&decision)), Some(decision));
        }
        assert_eq!(stored::decode("garbage"), None);
    }
}
