//! Signed room credentials, checked from memory by any node of the fleet:
//! - a **ticket** (`<token>.<expires ms>.<mac>`) lets its buyer buy once: the token inside is a
//!   ledger submit token, so the ledger spends it with the sale; the MAC binds it to the SKU and
//!   the buyer, so a node refuses a forged, expired or borrowed ticket without a ledger call;
//! - a **waiter** handle (`<user>.<expires ms>.<mac>`) names the buyer on the room's event
//!   stream, which a browser opens without headers (EventSource), so it cannot carry the
//!   buyer's credential: the node checked that at the join and signs the result.
//!
//! The key is derived from the cluster token, which every node of a fleet shares; a process
//! without a coordinator draws its own (its nodes share the process).

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Bytes of the MAC kept: 128 bits, beyond forging.
const MAC_BYTES: usize = 16;

#[derive(Clone)]
pub struct TicketKey([u8; 32]);

impl fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TicketKey(<redacted>)")
    }
}

impl TicketKey {
    /// The key of every process sharing `secret` (the cluster token). Derived, not the secret
    /// itself, so a MAC never tells anything about the token that guards `/raft` and `/api`.
    pub fn derive(secret: &[u8]) -> TicketKey {
        let mut hasher = Sha256::new();
        hasher.update(b"seckill room tickets v1\0");
        hasher.update(secret);
        TicketKey(hasher.finalize().into())
    }

    /// A key of this process alone.
    pub fn random() -> TicketKey {
        let mut key = [0u8; 32];
        // A process without a secure random source cannot serve anyone; falling back to the
        // clock would make tickets forgeable, so fail loudly at start.
        getrandom::fill(&mut key).unwrap_or_else(|e| panic!("no secure random source for the ticket key: {e}"));
        TicketKey(key)
    }

    fn mac(&self, kind: &str, parts: &[&str]) -> String {
        // Keys of any length are accepted by HMAC: this cannot fail.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else { return String::new() };
        mac.update(kind.as_bytes());
        for part in parts {
            // A separator no id may contain keeps ("ab","c") and ("a","bc") apart.
            mac.update(b"\n");
            mac.update(part.as_bytes());
        }
        mac.finalize().into_bytes()[..MAC_BYTES].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Splits `<head>.<expires>.<mac>` (the head may hold dots: user ids do) and checks the MAC
    /// over `parts` + head + expiry and that it is unexpired at `now_ms`. Returns the head.
    fn open<'a>(&self, kind: &str, text: &'a str, parts: &[&str], now_ms: u64) -> Option<&'a str> {
        let (rest, mac) = text.rsplit_once('.')?;
        let (head, expires) = rest.rsplit_once('.')?;
        let expires_ms: u64 = expires.parse().ok()?;
        let mut signed: Vec<&str> = parts.to_vec();
        signed.extend([head, expires]);
        let expected = self.mac(kind, &signed);
        let matches: bool = expected.as_bytes().ct_eq(mac.as_bytes()).into();
        (matches && now_ms < expires_ms).then_some(head)
    }

    pub fn ticket(&self, sku: &str, user: &str, token: &str, expires_ms: u64) -> String {
        let expires = expires_ms.to_string();
        format!("{token}.{expires}.{}", self.mac("ticket", &[sku, user, token, &expires]))
    }

    /// The submit token inside `ticket`, if it is this SKU's, this buyer's, signed here and
    /// unexpired.
    pub fn token_of<'a>(&self, sku: &str, user: &str, ticket: &'a str, now_ms: u64) -> Option<&'a str> {
        let (token, _) = ticket.split_once('.')?;
        self.open("ticket", ticket, &[sku, user], now_ms).filter(|head| *head == token)
    }

    pub fn waiter(&self, sku: &str, user: &str, expires_ms: u64) -> String {
        let expires = expires_ms.to_string();
        format!("{user}.{expires}.{}", self.mac("waiter", &[sku, user, &expires]))
    }

    /// The buyer a waiter handle names, if it was signed here for this SKU and is unexpired.
    pub fn waiter_of<'a>(&self, sku: &str, handle: &'a str, now_ms: u64) -> Option<&'a str> {
        self.open("waiter", handle, &[sku], now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_opens_only_for_its_sku_buyer_and_time() {
        let key = TicketKey::derive(b"cluster-token-of-the-fleet");
        let ticket = key.ticket("phone", "ann.b", "0123abcd", 2_000);
        assert_eq!(key.token_of("phone", "ann.b", &ticket, 1_999), Some("0123abcd"));
        assert_eq!(key.token_of("phone", "ann.b", &ticket, 2_000), None, "expired");
        assert_eq!(key.token_of("phone", "bob", &ticket, 1_000), None, "another buyer's");
        assert_eq!(key.token_of("tv", "ann.b", &ticket, 1_000), None, "another SKU's");
        assert_eq!(TicketKey::derive(b"another-fleet").token_of("phone", "ann.b", &ticket, 1_000), None);
        let forged = ticket.replacen("2000", "9999", 1);
        assert_eq!(key.token_of("phone", "ann.b", &forged, 1_000), None, "a later expiry breaks the MAC");
        assert_eq!(key.token_of("phone", "ann.b", "garbage", 1_000), None);
    }

    #[test]
    fn a_waiter_handle_names_its_buyer_even_with_dots() {
        let key = TicketKey::random();
        let handle = key.waiter("phone", "a.b.c", 5_000);
        assert_eq!(key.waiter_of("phone", &handle, 10), Some("a.b.c"));
        assert_eq!(key.waiter_of("tv", &handle, 10), None);
        assert_eq!(key.waiter_of("phone", &handle.replacen("a.b.c", "a.b.d", 1), 10), None);
        assert_eq!(format!("{key:?}"), "TicketKey(<redacted>)");
    }
}
