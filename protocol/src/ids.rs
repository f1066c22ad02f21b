//! Identifiers every process shares: SKUs, nodes, users, idempotency keys, submit tokens.
//!
//! Identifiers are validated once, when they enter the system (config or HTTP), so the rest of
//! the code can put them in Redis keys and log lines without escaping.

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

fn check_id(what: &'static str, text: &str, bytes_max: usize, charset: impl Fn(char) -> bool) -> Result<(), InvalidId> {
    if text.is_empty() {
        return Err(InvalidId { what, reason: "must not be empty" });
    }
    if text.len() > bytes_max {
        return Err(InvalidId { what, reason: "is too long" });
    }
    // Every purchase checks three ids: ASCII text (nearly all of them) is checked a byte at a
    // time, with no UTF-8 decoding, and the charset inlined.
    let allowed =
        if text.is_ascii() { text.bytes().all(|byte| charset(char::from(byte))) } else { text.chars().all(charset) };
    if !allowed {
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
        string_id!($(#[$doc])* $name, $what, $max, $charset, $name::new);
    };
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr, $charset:expr, $from_wire:path) => {
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
                $from_wire(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// A stock-keeping unit on sale, e.g. `phone-128g`. On the wire (and in the raft log) it
    /// may also be a stripe of one, `phone-128g/2` (see [`crate::stripes`]); from users,
    /// through [`SkuId::new`], never.
    SkuId, "sku", ID_BYTES_MAX, is_id_char, SkuId::from_wire
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
    /// submission). Issued by [`the ledger's `issue_token``], consumed by the first purchase that
    /// presents it.
    SubmitToken, "Submit-Token", SUBMIT_TOKEN_BYTES_MAX, is_token_char
);

impl SkuId {
    /// An id built by the crate itself from a validated SKU id (a stripe, `s/i`): it may hold
    /// characters outside the user charset on purpose, so that it can never name a user's SKU.
    pub(crate) fn derived(text: String) -> SkuId {
        SkuId(Arc::from(text))
    }
}

impl SubmitToken {
    /// A fresh token: 128 bits from the operating system's secure random source, in hex. Not a
    /// fast PRNG: presenting a token spends it whoever presents it, so a predictable token could
    /// be burnt by someone else before its owner uses it.
    pub fn generate() -> Result<SubmitToken, getrandom::Error> {
        let mut bytes = [0u8; SUBMIT_TOKEN_RANDOM_BYTES];
        getrandom::fill(&mut bytes)?;
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        debug_assert!(Self::validate(&text).is_ok(), "issued tokens must pass their own validation");
        Ok(SubmitToken(Arc::from(text.as_str())))
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
        assert!(UserId::new("del\u{7f}").is_err(), "ASCII's last control, on the byte path");
        assert!(UserId::new("jürgen\u{85}").is_err(), "a C1 control, on the UTF-8 path");
        assert!(SkuId::new("phone-é").is_err(), "SKU ids are ASCII");
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
}
