//! `mode = "gateway"`: the shop's authenticating gateway names the buyer in `X-Seckill-User` and
//! signs it: `X-Seckill-User-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<id>">`
//! with a secret shared with seckill. The timestamp bounds a replay to `gateway_window_s`; the
//! signature binds the user to it, so neither can be swapped.

use hmac::{Hmac, Mac};
use protocol::UserId;
use sha2::Sha256;

use crate::settings::{secret_from_env, GatewaySettings, SettingsError};
use crate::Refusal;

pub(crate) struct GatewayVerifier {
    secret: Vec<u8>,
    window_s: u64,
}

impl GatewayVerifier {
    pub(crate) fn new(settings: &GatewaySettings) -> Result<GatewayVerifier, SettingsError> {
        let secret = secret_from_env("auth.gateway_secret_env", &settings.secret_env)?;
        Ok(GatewayVerifier { secret, window_s: settings.window.as_secs() })
    }

    pub(crate) fn verify(&self, user: &[u8], signature: &[u8], now_s: u64) -> Result<UserId, Refusal> {
        let user = std::str::from_utf8(user).map_err(|_| Refusal::Malformed("the user is not UTF-8".into()))?;
        let user = UserId::new(user).map_err(|e| Refusal::Malformed(e.to_string()))?;
        let signature =
            std::str::from_utf8(signature).map_err(|_| Refusal::Malformed("the signature is not ASCII".into()))?;
        let (t, mac) = parse(signature)?;
        if t.abs_diff(now_s) > self.window_s {
            return Err(Refusal::OutOfTime);
        }
        // `verify_slice` compares in constant time.
        mac_over(&self.secret, t, user.as_str())
            .verify_slice(&mac)
            .map_err(|_| Refusal::Invalid("the gateway signature does not match".into()))?;
        Ok(user)
    }
}

fn mac_over(secret: &[u8], t: u64, user: &str) -> Hmac<Sha256> {
    // Any key length is valid for HMAC, so this never fails.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(user.as_bytes());
    mac
}

/// `t=<seconds>,v1=<64 hex digits>`.
fn parse(header: &str) -> Result<(u64, Vec<u8>), Refusal> {
    let malformed = || Refusal::Malformed("expected t=<unix seconds>,v1=<hex HMAC-SHA256>".into());
    let (mut t, mut v1) = (None, None);
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => t = value.parse::<u64>().ok(),
            Some(("v1", value)) => v1 = decode_hex(value),
            _ => {}
        }
    }
    match (t, v1) {
        (Some(t), Some(mac)) if mac.len() == 32 => Ok((t, mac)),
        _ => Err(malformed()),
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// The signature header a gateway sends for `user` at `t` (for the dev tools and tests).
pub fn sign(secret: &[u8], user: &str, t: u64) -> String {
    let mac = mac_over(secret, t, user).finalize().into_bytes();
    let hex: String = mac.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("t={t},v1={hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier() -> GatewayVerifier {
        GatewayVerifier { secret: b"0123456789abcdef0123456789abcdef".to_vec(), window_s: 60 }
    }

    #[test]
    fn a_fresh_signature_proves_its_user_and_nothing_else_does() {
        let v = verifier();
        let good = sign(&v.secret, "ann", 1_000);
        assert_eq!(v.verify(b"ann", good.as_bytes(), 1_030).unwrap().as_str(), "ann");
        assert!(matches!(v.verify(b"bob", good.as_bytes(), 1_030), Err(Refusal::Invalid(_))), "swapped user");
        assert_eq!(v.verify(b"ann", good.as_bytes(), 1_061), Err(Refusal::OutOfTime), "stale");
        assert_eq!(v.verify(b"ann", good.as_bytes(), 939), Err(Refusal::OutOfTime), "from the future");
        let forged = sign(b"another secret of thirty-two bytes!", "ann", 1_000);
        assert!(matches!(v.verify(b"ann", forged.as_bytes(), 1_000), Err(Refusal::Invalid(_))));
        assert!(matches!(v.verify(b"ann", b"t=1000", 1_000), Err(Refusal::Malformed(_))));
        assert!(matches!(v.verify(b"ann", b"t=1000,v1=zz", 1_000), Err(Refusal::Malformed(_))));
    }
}
