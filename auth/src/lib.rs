//! Verifying buyers: who is asking, proven by the shop, not claimed by the client.
//!
//! **Role.** Every per-buyer rule of a sale (the per-user limit, per-user rate limits and
//! lock-out, user blacklist entries, submit tokens, orders and who may read them) keys on a user
//! id. Without this crate that id is whatever the client writes in the body, so one client can be
//! ten thousand buyers. An [`Authenticator`] turns a request's credential into a verified
//! [`UserId`], in one of three modes (`[auth] mode` in `cluster.toml`):
//!
//! - `none`: no credential; the body's `user` is taken as it is. For demos and benchmarks only.
//! - `jwt`: `Authorization: Bearer <JWT>` issued by the shop's identity provider: HS256 with a
//!   shared secret and/or RS256/ES256/EdDSA public keys from a JWKS file picked by `kid`
//!   ([`jwt`]); the file is re-read when it changes ([`jwks`]), so keys rotate without a restart.
//! - `gateway`: the shop's own authenticating gateway sets `X-Seckill-User` and signs it with a
//!   shared secret and a timestamp ([`gateway`]).
//!
//! **Guarantees.**
//! - A request is attributed to a user only if its credential verified: signature, issuer,
//!   audience, `exp` and `nbf` (within `leeway_s`), and the algorithm the key was published for.
//!   `alg: none` and algorithm confusion (an HS256 token checked against a public key) are
//!   refused; so is a token whose `kid` no published key has.
//! - A refused credential is a [`Refusal`] that says why (for logs), never a panic.
//! - Verified JWTs are remembered in a bounded map from the token's SHA-256 to its user and
//!   expiry (`cache.rs`), so a buyer's retries cost a hash, not a signature check; a key rotation
//!   forgets every token verified under the old keys.
//!
//! **Non-goals.** Issuing credentials to real buyers (the shop's identity provider does; [`mint`]
//! signs tokens only for tests, benchmarks and the dev tools), sessions, cookies, refresh tokens,
//! revocation lists (a token is good until its `exp`: keep `exp` short), and fetching JWKS over
//! the network (the operator's deployment writes the file).
//!
//! **Layout.**
//!
//! ```text
//! jwt     → cache, jwks, settings   (bearer tokens: HS256 secret and/or a watched JWKS)
//! gateway → settings, timestamped   (the shop gateway's HMAC)
//! settings, cache, jwks, timestamped, mint → nothing of the crate
//! ```

mod cache;
pub mod gateway;
pub mod jwks;
pub mod jwt;
pub mod mint;
mod settings;
pub mod timestamped;

use std::sync::Arc;

use hyper::header::AUTHORIZATION;
use hyper::HeaderMap;
pub use protocol::UserId;

pub use crate::settings::{GatewaySettings, JwtSettings, Settings, SettingsError};

/// The header the shop's gateway names the buyer in (`mode = "gateway"`).
pub const GATEWAY_USER_HEADER: &str = "x-seckill-user";
/// The gateway's signature over that header (`t=<unix seconds>,v1=<hex HMAC-SHA256>`).
pub const GATEWAY_SIGNATURE_HEADER: &str = "x-seckill-user-signature";

/// Why a request's credential did not prove a buyer. Shown in logs and debug output, never to
/// the client beyond "unauthenticated": telling a forger which check failed helps the forger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no credential")]
    Missing,
    #[error("the credential is malformed: {0}")]
    Malformed(String),
    #[error("the credential did not verify: {0}")]
    Invalid(String),
    #[error("the credential has expired or is not valid yet")]
    OutOfTime,
}

/// Verifies buyers' credentials in the configured mode. Cheap to clone.
#[derive(Clone)]
pub struct Authenticator {
    mode: Arc<Mode>,
}

enum Mode {
    None,
    Jwt(jwt::JwtVerifier),
    Gateway(gateway::GatewayVerifier),
}

impl Authenticator {
    /// `mode = "none"`: every request's claimed user is taken as it is.
    pub fn none() -> Authenticator {
        Authenticator { mode: Arc::new(Mode::None) }
    }

    /// The authenticator `settings` describe: reads the secrets from the environment variables
    /// they name and the JWKS file, and starts watching that file. Every error names its key.
    pub fn from_settings(settings: &Settings) -> Result<Authenticator, SettingsError> {
        let mode = match settings {
            Settings::None => Mode::None,
            Settings::Jwt(jwt) => Mode::Jwt(jwt::JwtVerifier::new(jwt)?),
            Settings::Gateway(gateway) => Mode::Gateway(gateway::GatewayVerifier::new(gateway)?),
        };
        Ok(Authenticator { mode: Arc::new(mode) })
    }

    /// Whether requests must prove their buyer (`jwt` or `gateway`).
    pub fn is_on(&self) -> bool {
        !matches!(*self.mode, Mode::None)
    }

    /// The mode's name as `cluster.toml` spells it.
    pub fn mode_name(&self) -> &'static str {
        match *self.mode {
            Mode::None => "none",
            Mode::Jwt(_) => "jwt",
            Mode::Gateway(_) => "gateway",
        }
    }

    /// The buyer the request's credential proves, at `now_unix_s`. `Ok(None)` in mode `none`
    /// (the caller takes the claimed user).
    pub fn verify(&self, headers: &HeaderMap, now_unix_s: u64) -> Result<Option<UserId>, Refusal> {
        match &*self.mode {
            Mode::None => Ok(None),
            Mode::Jwt(verifier) => {
                let token = bearer_token(headers)?;
                verifier.verify(token, now_unix_s).map(Some)
            }
            Mode::Gateway(verifier) => {
                let user = headers.get(GATEWAY_USER_HEADER).ok_or(Refusal::Missing)?;
                let signature = headers.get(GATEWAY_SIGNATURE_HEADER).ok_or(Refusal::Missing)?;
                verifier.verify(user.as_bytes(), signature.as_bytes(), now_unix_s).map(Some)
            }
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer_token(headers: &HeaderMap) -> Result<&str, Refusal> {
    let value = headers.get(AUTHORIZATION).ok_or(Refusal::Missing)?;
    let value = value.to_str().map_err(|_| Refusal::Malformed("Authorization is not visible ASCII".into()))?;
    let (scheme, token) = value.split_once(' ').ok_or_else(|| Refusal::Malformed("expected Bearer <token>".into()))?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(Refusal::Malformed("expected Bearer <token>".into()));
    }
    Ok(token.trim())
}

/// Seconds since the Unix epoch, for callers without a clock of their own.
pub fn unix_now_s() -> u64 {
    protocol::clock::unix_ms() / 1000
}
