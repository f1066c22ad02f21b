//! One signing scheme for what a trusted party vouches for over HTTP: `t=<unix seconds>,v1=<hex
//! HMAC-SHA256 over "<t>.<payload>">` with a shared secret. The shop's gateway signs the buyer's
//! id with it ([`crate::gateway`]); the payment provider signs its notifications (the order
//! service's `signature`). Signing the timestamp with the payload bounds a replay of a captured
//! header to the tolerance window; the comparison runs in constant time.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Why a timestamped signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not `t=<unix seconds>,v1=<64 hex digits>`.
    Malformed,
    /// `t` is further than the tolerance from now, either way.
    Stale,
    /// The MAC does not match the payload and `t`.
    Mismatch,
}

/// The header value that vouches for `payload` at `t`.
pub fn sign(secret: &[u8], t: u64, payload: &[u8]) -> String {
    let mac = keyed(secret, t, payload).finalize().into_bytes();
    let hex: String = mac.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("t={t},v1={hex}")
}

/// Checks `header` against `payload` at `now_s`, allowing `tolerance_s` of clock difference.
pub fn verify(secret: &[u8], header: &str, payload: &[u8], now_s: u64, tolerance_s: u64) -> Result<(), Refused> {
    let (mut t, mut v1) = (None, None);
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => t = value.parse::<u64>().ok(),
            Some(("v1", value)) => v1 = unhex(value),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else { return Err(Refused::Malformed) };
    if t.abs_diff(now_s) > tolerance_s {
        return Err(Refused::Stale);
    }
    keyed(secret, t, payload).verify_slice(&v1).map_err(|_| Refused::Mismatch)
}

fn keyed(secret: &[u8], t: u64, payload: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    mac
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok()).collect()
}
