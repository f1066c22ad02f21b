//! Payment notifications are signed by the provider: `Seckill-Signature: t=<unix seconds>,
//! v1=<hex HMAC-SHA256 over "<t>.<raw body>" with the shared secret>` (`auth::timestamped`, the
//! scheme the shop's gateway signs buyers with too). A replay of a captured notification within
//! the tolerance window is harmless: payments are idempotent by reference.

use auth::timestamped::{self, Refused};

pub use protocol::sandbox::SIGNATURE_HEADER;

/// How far a notification's timestamp may be from this server's clock, unless configured
/// otherwise (`[orders] callback_window_s`). It bounds both a replay's life and the clock skew
/// between the provider and this service: a service clock off by more refuses every callback
/// (the provider retries; `seckill_orders_payments_total{outcome="bad_signature"}` climbs), so
/// run NTP and widen it only as far as the skew you cannot fix. Replays inside it are harmless:
/// payments are idempotent by reference.
pub const TOLERANCE_S: u64 = 300;

/// The widest window a config may set: a day of skew is a broken clock, not a setting.
pub const TOLERANCE_MAX_S: u64 = 86_400;

/// Why a signature was refused; each maps to one 4xx.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the Seckill-Signature header is missing")]
    Missing,
    #[error("the Seckill-Signature header is not `t=<unix seconds>,v1=<hex>`")]
    Malformed,
    #[error(
        "the signature's timestamp is outside the callback window: a stale or replayed notification, or a clock off"
    )]
    Stale,
    #[error("the signature does not match the body")]
    Mismatch,
}

/// The header value a provider sends for `body` at `t`: what tests and `seckill` tools sign with.
pub fn sign(secret: &[u8], t: u64, body: &[u8]) -> String {
    timestamped::sign(secret, t, body)
}

/// Checks `header` against `body` at `now_s`, allowing `window_s` of difference.
pub fn verify(
    secret: &[u8],
    header: Option<&str>,
    body: &[u8],
    now_s: u64,
    window_s: u64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    timestamped::verify(secret, header, body, now_s, window_s).map_err(|refused| match refused {
        Refused::Malformed => SignatureError::Malformed,
        Refused::Stale => SignatureError::Stale,
        Refused::Mismatch => SignatureError::Mismatch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_body_verifies_and_any_change_is_refused() {
        let (secret, body, t) = (b"shh".as_slice(), br#"{"order_id":"o1"}"#.as_slice(), 1_700_000_000);
        let header = sign(secret, t, body);
        let w = TOLERANCE_S;
        assert_eq!(verify(secret, Some(&header), body, t + 10, w), Ok(()));
        assert_eq!(verify(secret, Some(&header), br#"{"order_id":"o2"}"#, t, w), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"other", Some(&header), body, t, w), Err(SignatureError::Mismatch));
        assert_eq!(verify(secret, Some(&header), body, t + w + 1, w), Err(SignatureError::Stale));
        assert_eq!(verify(secret, Some(&header), body, t + w, w), Ok(()), "at the window's edge");
        assert_eq!(verify(secret, Some(&header), body, t + 900, 900), Ok(()), "a wider window");
        assert_eq!(verify(secret, None, body, t, w), Err(SignatureError::Missing));
        for bad in ["", "t=1", "v1=00", "t=x,v1=00", "t=1,v1=0g", "t=1,v1=abc"] {
            assert_eq!(verify(secret, Some(bad), body, 1, w), Err(SignatureError::Malformed), "{bad}");
        }
        // The timestamp is signed: moving it breaks the signature.
        let moved = header.replace(&format!("t={t}"), &format!("t={}", t + 1));
        assert_eq!(verify(secret, Some(&moved), body, t, w), Err(SignatureError::Mismatch));
    }
}
