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

use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Bytes of the MAC kept: 128 bits, beyond forging.
const MAC_BYTES: usize = 16;

/// The HMAC state with the key already in, cloned for each MAC: no key schedule, and nothing
/// that can fail, on a purchase.
#[derive(Clone)]
pub struct TicketKey(Hmac<Sha256>);

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
        TicketKey::of(hasher.finalize().into())
    }

    /// A key of this process alone.
    pub fn random() -> TicketKey {
        let mut key = [0u8; 32];
        // A process without a secure random source cannot serve anyone; falling back to the
        // clock would make tickets forgeable, so fail loudly at start.
        getrandom::fill(&mut key).unwrap_or_else(|e| panic!("no secure random source for the ticket key: {e}"));
        TicketKey::of(key)
    }

    fn of(key: [u8; 32]) -> TicketKey {
        // HMAC pads a key shorter than SHA-256's 64-byte block with zeros: the same MACs as
        // keying with the 32 bytes, through the constructor that cannot fail.
        let mut block = [0u8; 64];
        block[..32].copy_from_slice(&key);
        TicketKey(<Hmac<Sha256> as KeyInit>::new(&block.into()))
    }

    /// The MAC state over `kind` and each of `parts`, a separator no id may contain between
    /// them, so ("ab","c") and ("a","bc") differ.
    fn mac<'a>(&self, kind: &str, parts: impl IntoIterator<Item = &'a str>) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        mac.update(kind.as_bytes());
        for part in parts {
            mac.update(b"\n");
            mac.update(part.as_bytes());
        }
        mac
    }

    fn sign(&self, kind: &str, parts: &[&str]) -> String {
        let tag = self.mac(kind, parts.iter().copied()).finalize().into_bytes();
        let mut hex = String::with_capacity(2 * MAC_BYTES);
        for byte in &tag[..MAC_BYTES] {
            hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
            hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
        }
        hex
    }

    /// Splits `<head>.<expires>.<mac>` (the head may hold dots: user ids do) and checks that it
    /// is unexpired at `now_ms` and that the MAC over `parts` + head + expiry holds (in
    /// constant time). Returns the head.
    fn open<'a>(&self, kind: &str, text: &'a str, parts: &[&str], now_ms: u64) -> Option<&'a str> {
        let (rest, mac) = text.rsplit_once('.')?;
        let (head, expires) = rest.rsplit_once('.')?;
        let expires_ms: u64 = expires.parse().ok()?;
        if now_ms >= expires_ms {
            return None;
        }
        let tag = unhex(mac)?;
        let signed = parts.iter().copied().chain([head, expires]);
        self.mac(kind, signed).verify_truncated_left(&tag).ok()?;
        Some(head)
    }

    pub fn ticket(&self, sku: &str, user: &str, token: &str, expires_ms: u64) -> String {
        let expires = expires_ms.to_string();
        format!("{token}.{expires}.{}", self.sign("ticket", &[sku, user, token, &expires]))
    }

    /// The submit token inside `ticket`, if it is this SKU's, this buyer's, signed here and
    /// unexpired.
    pub fn token_of<'a>(&self, sku: &str, user: &str, ticket: &'a str, now_ms: u64) -> Option<&'a str> {
        let (token, _) = ticket.split_once('.')?;
        self.open("ticket", ticket, &[sku, user], now_ms).filter(|head| *head == token)
    }

    pub fn waiter(&self, sku: &str, user: &str, expires_ms: u64) -> String {
        let expires = expires_ms.to_string();
        format!("{user}.{expires}.{}", self.sign("waiter", &[sku, user, &expires]))
    }

    /// The buyer a waiter handle names, if it was signed here for this SKU and is unexpired.
    pub fn waiter_of<'a>(&self, sku: &str, handle: &'a str, now_ms: u64) -> Option<&'a str> {
        self.open("waiter", handle, &[sku], now_ms)
    }
}

/// The MAC's bytes from their lowercase hex; `None` unless exactly [`MAC_BYTES`] of them.
fn unhex(text: &str) -> Option<[u8; MAC_BYTES]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * MAC_BYTES {
        return None;
    }
    let nibble = |digit: u8| match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0u8; MAC_BYTES];
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(bytes)
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
