//! `mode = "gateway"`: the shop's authenticating gateway names the buyer in `X-Seckill-User` and
//! signs it: `X-Seckill-User-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<id>">`
//! with a secret shared with seckill. The timestamp bounds a replay to `gateway_window_s`; the
//! signature binds the user to it, so neither can be swapped.

use protocol::UserId;

use crate::settings::{secret_from_env, GatewaySettings, SettingsError};
use crate::timestamped::{self, Refused};
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
        timestamped::verify(&self.secret, signature, user.as_str().as_bytes(), now_s, self.window_s).map_err(
            |refused| match refused {
                Refused::Malformed => Refusal::Malformed("expected t=<unix seconds>,v1=<hex HMAC-SHA256>".into()),
                Refused::Stale => Refusal::OutOfTime,
                Refused::Mismatch => Refusal::Invalid("the gateway signature does not match".into()),
            },
        )?;
        Ok(user)
    }
}

/// The signature header a gateway sends for `user` at `t` (for the dev tools and tests).
pub fn sign(secret: &[u8], user: &str, t: u64) -> String {
    timestamped::sign(secret, t, user.as_bytes())
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
