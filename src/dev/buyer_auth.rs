//! Buyers with credentials, for the dev tools (`demo`, `bench`, `load`) and the tests: the
//! `[auth]` table a sale runs under and the identity provider's side, which signs a token per
//! buyer. The product only verifies (the `auth` crate); signing is the shop's job.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use auth::mint::{generate_secret, Minter};

/// The issuer and audience the dev tools' tokens carry.
pub const ISSUER: &str = "seckill-dev-identity";
pub const AUDIENCE: &str = "seckill";

/// How a sale's buyers prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BuyerAuth {
    /// `mode = "none"`: the body's `user` is believed.
    #[default]
    None,
    /// `mode = "jwt"`, HS256 tokens with a secret drawn for the run.
    JwtHs256,
    /// `mode = "jwt"`, ES256 tokens checked against a JWKS file written for the run.
    JwtEs256,
}

/// What one sale needs for its buyers' credentials.
pub struct SaleAuth {
    /// The `[auth]` table for the sale's config.
    pub toml: String,
    pub minter: Arc<Minter>,
}

impl BuyerAuth {
    pub fn name(self) -> &'static str {
        match self {
            BuyerAuth::None => "none",
            BuyerAuth::JwtHs256 => "jwt-hs256",
            BuyerAuth::JwtEs256 => "jwt-es256",
        }
    }

    /// Draws the keys for one sale: an HS256 secret in an environment variable of this sale's
    /// own (sales in one process must not read each other's), or a JWKS file under `dir`.
    pub fn prepare(self, dir: &Path) -> anyhow::Result<Option<SaleAuth>> {
        static SALES: AtomicU64 = AtomicU64::new(0);
        let header = format!("[auth]\nmode = \"jwt\"\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\n");
        match self {
            BuyerAuth::None => Ok(None),
            BuyerAuth::JwtHs256 => {
                let secret = generate_secret().map_err(anyhow::Error::msg)?;
                let env = format!("SECKILL_DEV_HS256_{}_{}", std::process::id(), SALES.fetch_add(1, Ordering::Relaxed));
                std::env::set_var(&env, &secret);
                let minter = Minter::hs256(secret.as_bytes(), ISSUER, AUDIENCE);
                Ok(Some(SaleAuth { toml: format!("{header}hs256_secret_env = \"{env}\"\n"), minter: Arc::new(minter) }))
            }
            BuyerAuth::JwtEs256 => {
                let (minter, jwks) = Minter::es256("dev-1", ISSUER, AUDIENCE).map_err(anyhow::Error::msg)?;
                std::fs::create_dir_all(dir)?;
                let file = dir.join("jwks.json");
                std::fs::write(&file, jwks)?;
                Ok(Some(SaleAuth {
                    toml: format!("{header}jwks_file = {:?}\n", file.display().to_string()),
                    minter: Arc::new(minter),
                }))
            }
        }
    }
}

/// For `seckill load` against a running fleet: under `[auth] mode = "jwt"`, a minter with the
/// fleet's HS256 secret (read from the variable `hs256_secret_env` names), so every buyer
/// presents a valid token of its own.
pub fn load_minter(settings: &auth::Settings) -> anyhow::Result<Option<Arc<Minter>>> {
    match settings {
        auth::Settings::None => Ok(None),
        auth::Settings::Jwt(jwt) => {
            let Some(env) = &jwt.hs256_secret_env else {
                anyhow::bail!(
                    "auth.hs256_secret_env: seckill load signs buyers' tokens with the HS256 secret, and this \
                     config accepts only JWKS keys, whose private halves the identity provider keeps"
                );
            };
            let secret = std::env::var(env).map_err(|_| anyhow::anyhow!("auth.hs256_secret_env: {env} is not set"))?;
            Ok(Some(Arc::new(Minter::hs256(secret.as_bytes(), &jwt.issuer, &jwt.audience))))
        }
        auth::Settings::Gateway(_) => {
            anyhow::bail!("auth.mode: seckill load cannot stand in for the shop's gateway; load the gateway instead")
        }
    }
}
