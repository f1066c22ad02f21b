//! Payment notifications are signed by the provider: `Seckill-Signature: t=<unix seconds>,
//! v1=<hex HMAC-SHA256 over "<t>.<raw body>" with the shared secret>`. Signing the timestamp with
//! the body bounds replays of a captured notification to the tolerance window (a replay within
//! it is harmless anyway: payments are idempotent by reference). The comparison runs in
//! constant time.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const SIGNATURE_HEADER: &str = "seckill-signature";

/// How far a notification's timestamp may be from this server's clock.
pub const TOLERANCE_S: u64 = 300;

/// Why a signature was refused; each maps to one 4xx.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the Seckill-Signature header is missing")]
    Missing,
    #[error("the Seckill-Signature header is not `t=<unix seconds>,v1=<hex>`")]
    Malformed,
    #[error("the signature's timestamp is more than 300 s from now: a stale or replayed notification")]
    Stale,
    #[error("the signature does not match the body")]
    Mismatch,
}

/// The header value a provider sends for `body` at `t`: what tests and `seckill` tools sign with.
pub fn sign(secret: &[u8], t: u64, body: &[u8]) -> String {
    format!("t={t},v1={}", hex(&mac(secret, t, body)))
}

/// Checks `header` against `body` at `now_s`.
pub fn verify(secret: &[u8], header: Option<&str>, body: &[u8], now_s: u64) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let (mut t, mut v1) = (None, None);
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => t = value.parse::<u64>().ok(),
            Some(("v1", value)) => v1 = unhex(value),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else { return Err(SignatureError::Malformed) };
    if t.abs_diff(now_s) > TOLERANCE_S {
        return Err(SignatureError::Stale);
    }
    let mut mac = keyed(secret);
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&v1).map_err(|_| SignatureError::Mismatch)
}

fn keyed(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC accepts every key length"))
}

fn mac(secret: &[u8], t: u64, body: &[u8]) -> Vec<u8> {
    let mut mac = keyed(secret);
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_body_verifies_and_any_change_is_refused() {
        let (secret, body, t) = (b"shh".as_slice(), br#"{"order_id":"o1"}"#.as_slice(), 1_700_000_000);
        let header = sign(secret, t, body);
        assert_eq!(verify(secret, Some(&header), body, t + 10), Ok(()));
        assert_eq!(verify(secret, Some(&header), br#"{"order_id":"o2"}"#, t), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"other", Some(&header), body, t), Err(SignatureError::Mismatch));
        assert_eq!(verify(secret, Some(&header), body, t + TOLERANCE_S + 1), Err(SignatureError::Stale));
        assert_eq!(verify(secret, None, body, t), Err(SignatureError::Missing));
        for bad in ["", "t=1", "v1=00", "t=x,v1=00", "t=1,v1=0g", "t=1,v1=abc"] {
            assert_eq!(verify(secret, Some(bad), body, 1), Err(SignatureError::Malformed), "{bad}");
        }
        // The timestamp is signed: moving it breaks the signature.
        let moved = header.replace(&format!("t={t}"), &format!("t={}", t + 1));
        assert_eq!(verify(secret, Some(&moved), body, t), Err(SignatureError::Mismatch));
    }
}
