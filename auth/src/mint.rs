//! Signs tokens as an identity provider would, for the tests, the benchmarks and the dev tools
//! (`seckill load`, `demo`, `bench`, the nemesis), which must present buyers under `mode = "jwt"`.
//! The product never mints: real buyers' tokens come from the shop.

use std::sync::atomic::{AtomicU64, Ordering};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};

/// How long minted tokens live: long enough for any dev run, short as real ones should be.
pub const TOKEN_TTL_S: u64 = 3_600;

/// Signs tokens for one issuer and audience with one key.
pub struct Minter {
    key: EncodingKey,
    algorithm: Algorithm,
    kid: Option<String>,
    pub issuer: String,
    pub audience: String,
    /// Makes every token distinct (`jti`), as a provider's are.
    serial: AtomicU64,
}

impl Minter {
    /// HS256 with a shared secret (the one `[auth] hs256_secret_env` names).
    pub fn hs256(secret: &[u8], issuer: &str, audience: &str) -> Minter {
        Minter::with_key(EncodingKey::from_secret(secret), Algorithm::HS256, None, issuer, audience)
    }

    /// ES256 with a fresh P-256 key pair; also returns the JWKS document publishing its public
    /// half under `kid`, for `[auth] jwks_file`.
    pub fn es256(kid: &str, issuer: &str, audience: &str) -> Result<(Minter, String), String> {
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
            .map_err(|_| "no secure random source for a key pair".to_string())?;
        let key = EncodingKey::from_ec_der(pkcs8.as_ref());
        let mut jwk = Jwk::from_encoding_key(&key, Algorithm::ES256).map_err(|e| e.to_string())?;
        jwk.common.key_id = Some(kid.to_string());
        let jwks = serde_json::to_string(&JwkSet { keys: vec![jwk] }).map_err(|e| e.to_string())?;
        Ok((Minter::with_key(key, Algorithm::ES256, Some(kid.to_string()), issuer, audience), jwks))
    }

    fn with_key(key: EncodingKey, algorithm: Algorithm, kid: Option<String>, issuer: &str, audience: &str) -> Minter {
        Minter { key, algorithm, kid, issuer: issuer.into(), audience: audience.into(), serial: AtomicU64::new(0) }
    }

    /// A token for `user`, valid for [`TOKEN_TTL_S`] from `now_s`.
    pub fn token(&self, user: &str, now_s: u64) -> String {
        self.sign(&self.claims(user, now_s))
    }

    /// The claims [`Minter::token`] would sign, for a test to alter before [`Minter::sign`].
    pub fn claims(&self, user: &str, now_s: u64) -> Value {
        let jti = self.serial.fetch_add(1, Ordering::Relaxed);
        json!({
            "iss": self.issuer,
            "aud": self.audience,
            "sub": user,
            "iat": now_s,
            "exp": now_s + TOKEN_TTL_S,
            "jti": format!("{now_s}-{jti}"),
        })
    }

    /// Signs any claims with this minter's key and algorithm.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.algorithm);
        header.kid = self.kid.clone();
        // Signing JSON claims with a well-formed key does not fail; an empty token would be
        // refused as malformed anyway.
        encode(&header, claims, &self.key).unwrap_or_default()
    }
}

impl std::fmt::Debug for Minter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minter")
            .field("algorithm", &self.algorithm)
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

/// A fresh secret for HS256 or the gateway: 32 random bytes, hex.
pub fn generate_secret() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    SystemRandom::new().fill(&mut bytes).map_err(|_| "no secure random source for a secret".to_string())?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}
