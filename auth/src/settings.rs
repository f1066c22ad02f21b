//! What an [`crate::Authenticator`] is built from: the validated values of `[auth]` (the TOML
//! section itself is parsed by the binary's config, which names every key in its errors).

use std::path::PathBuf;
use std::time::Duration;

/// The validated `[auth]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Settings {
    #[default]
    None,
    Jwt(JwtSettings),
    Gateway(GatewaySettings),
}

/// `mode = "jwt"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSettings {
    /// The environment variable holding the HS256 secret, if HS256 tokens are accepted.
    pub hs256_secret_env: Option<String>,
    /// A JWKS file of public keys (RS256, ES256, EdDSA), if those are accepted.
    pub jwks_file: Option<PathBuf>,
    pub issuer: String,
    pub audience: String,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
    /// The claim that names the buyer (`sub` by default).
    pub user_claim: String,
}

/// `mode = "gateway"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySettings {
    /// The environment variable holding the gateway's signing secret.
    pub secret_env: String,
    /// How far a signature's timestamp may be from this process's clock, either way.
    pub window: Duration,
}

/// A setting that cannot be put to use: which key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SettingsError {
    pub key: String,
    pub reason: String,
}

impl SettingsError {
    pub fn new(key: &str, reason: impl Into<String>) -> SettingsError {
        SettingsError { key: key.into(), reason: reason.into() }
    }
}

/// The secret in the environment variable `name` (or the file `name_FILE` names), which `key`
/// names: missing or short secrets are refused, since an HMAC key anyone can guess proves
/// nothing.
pub(crate) fn secret_from_env(key: &str, name: &str) -> Result<Vec<u8>, SettingsError> {
    const SECRET_BYTES_MIN: usize = 32;
    let value =
        protocol::env_secret::from_env(name).map_err(|e| SettingsError::new(key, e.to_string()))?.ok_or_else(|| {
            SettingsError::new(
                key,
                format!("neither {name} nor {name}_FILE is set (one holds the secret, the other names its file)"),
            )
        })?;
    if value.len() < SECRET_BYTES_MIN {
        return Err(SettingsError::new(
            key,
            format!("the secret in {name} is shorter than {SECRET_BYTES_MIN} bytes; draw a random one"),
        ));
    }
    Ok(value.into_bytes())
}
