//! `mode = "jwt"`: bearer tokens from the shop's identity provider.
//!
//! The key is chosen by the token's header, but only among keys configured for that algorithm:
//! HS256 only with `hs256_secret_env`'s secret, an asymmetric algorithm only with the JWKS key its
//! `kid` names and only if that key was published for that algorithm. `alg: none` is not an
//! algorithm the library knows, so such a header does not parse. `jsonwebtoken` checks the
//! signature, `iss`, `aud` and that `exp` is present; `exp` and `nbf` are checked here against
//! the caller's clock (so the cache and the check agree on "now").

use std::sync::Arc;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{decode_header, Algorithm, DecodingKey, Validation};
use protocol::UserId;
use serde_json::{Map, Value};

use crate::cache::{self, VerifiedCache};
use crate::jwks::WatchedKeys;
use crate::settings::{secret_from_env, JwtSettings, SettingsError};
use crate::Refusal;

/// Verified tokens remembered at once: a few hundred bytes each, so some tens of MB at most.
const CACHE_CAPACITY: usize = 100_000;

pub(crate) struct JwtVerifier {
    hs256: Option<DecodingKey>,
    jwks: Option<Arc<WatchedKeys>>,
    issuer: String,
    audience: String,
    leeway_s: u64,
    user_claim: String,
    cache: Arc<VerifiedCache>,
}

impl JwtVerifier {
    pub(crate) fn new(settings: &JwtSettings) -> Result<JwtVerifier, SettingsError> {
        let hs256 = match &settings.hs256_secret_env {
            Some(name) => Some(DecodingKey::from_secret(&secret_from_env("auth.hs256_secret_env", name)?)),
            None => None,
        };
        let cache = Arc::new(VerifiedCache::new(CACHE_CAPACITY));
        let jwks = match &settings.jwks_file {
            Some(path) => {
                let cache = cache.clone();
                Some(
                    WatchedKeys::start(path, move || cache.new_generation())
                        .map_err(|e| SettingsError::new("auth.jwks_file", e))?,
                )
            }
            None => None,
        };
        if hs256.is_none() && jwks.is_none() {
            return Err(SettingsError::new(
                "auth.hs256_secret_env",
                "mode = \"jwt\" needs hs256_secret_env or jwks_file",
            ));
        }
        Ok(JwtVerifier {
            hs256,
            jwks,
            issuer: settings.issuer.clone(),
            audience: settings.audience.clone(),
            leeway_s: settings.leeway.as_secs(),
            user_claim: settings.user_claim.clone(),
            cache,
        })
    }

    pub(crate) fn verify(&self, token: &str, now_s: u64) -> Result<UserId, Refusal> {
        let digest = cache::digest(token);
        if let Some(user) = self.cache.get(&digest, now_s) {
            return Ok(user);
        }
        let header = decode_header(token).map_err(|e| Refusal::Malformed(format!("the token's header: {e}")))?;
        let claims = match header.alg {
            Algorithm::HS256 => {
                let key =
                    self.hs256.as_ref().ok_or_else(|| Refusal::Invalid("HS256 tokens are not accepted".into()))?;
                self.decode(token, key, Algorithm::HS256)?
            }
            alg => {
                let (Some(jwks), Some(kid)) = (&self.jwks, header.kid.as_deref()) else {
                    return Err(Refusal::Invalid(format!("{alg:?} tokens need a kid naming a key of the JWKS file")));
                };
                let keys = jwks.keys();
                let key = keys.get(kid).ok_or_else(|| Refusal::Invalid(format!("no published key has kid {kid}")))?;
                if key.algorithm != alg {
                    return Err(Refusal::Invalid(format!(
                        "key {kid} is published for {:?}, not {alg:?}",
                        key.algorithm
                    )));
                }
                self.decode(token, &key.key, alg)?
            }
        };
        let (valid_from_s, valid_until_s) = self.window(&claims)?;
        if !(valid_from_s..valid_until_s).contains(&now_s) {
            return Err(Refusal::OutOfTime);
        }
        let user = match claims.get(&self.user_claim) {
            Some(Value::String(user)) => {
                UserId::new(user).map_err(|e| Refusal::Invalid(format!("claim {}: {e}", self.user_claim)))?
            }
            _ => return Err(Refusal::Invalid(format!("no string claim {}", self.user_claim))),
        };
        self.cache.insert(digest, user.clone(), valid_from_s, valid_until_s, now_s);
        Ok(user)
    }

    fn decode(&self, token: &str, key: &DecodingKey, alg: Algorithm) -> Result<Map<String, Value>, Refusal> {
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        // Checked in `window` against the caller's clock instead.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        match jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation) {
            Ok(data) => Ok(data.claims),
            Err(e) => Err(match e.kind() {
                ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
                    Refusal::Malformed(e.to_string())
                }
                _ => Refusal::Invalid(e.to_string()),
            }),
        }
    }

    /// `[nbf - leeway, exp + leeway)`: the seconds in which the token is accepted.
    fn window(&self, claims: &Map<String, Value>) -> Result<(u64, u64), Refusal> {
        let seconds = |name: &str| claims.get(name).and_then(Value::as_f64).map(|value| value.max(0.0) as u64);
        let exp = seconds("exp").ok_or_else(|| Refusal::Invalid("exp is not a number".into()))?;
        let nbf = if claims.contains_key("nbf") {
            seconds("nbf").ok_or_else(|| Refusal::Invalid("nbf is not a number".into()))?
        } else {
            0
        };
        Ok((nbf.saturating_sub(self.leeway_s), exp.saturating_add(self.leeway_s)))
    }
}
