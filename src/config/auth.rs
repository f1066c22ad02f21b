//! `[auth]`: who the buyer is. One table, read by the nodes and the order service alike; the
//! secrets it names live in environment variables, never in this file.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{invalid, ConfigError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// `none` (the body's `user` is believed: demos and benchmarks only), `jwt` or `gateway`.
    pub mode: String,
    pub hs256_secret_env: Option<String>,
    pub jwks_file: Option<PathBuf>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub leeway_s: u64,
    pub user_claim: String,
    pub gateway_secret_env: Option<String>,
    pub gateway_window_s: u64,
}

impl Default for AuthSection {
    fn default() -> Self {
        Self {
            mode: "none".into(),
            hs256_secret_env: None,
            jwks_file: None,
            issuer: None,
            audience: None,
            leeway_s: 30,
            user_claim: "sub".into(),
            gateway_secret_env: None,
            gateway_window_s: 60,
        }
    }
}

/// Longest tolerated clock skew or signature age: beyond it a stolen credential lives on.
const SKEW_MAX_S: u64 = 600;

impl AuthSection {
    /// The validated settings; the secrets themselves are read when a process builds its
    /// authenticator (`auth::Authenticator::from_settings`), which names the key of any that is
    /// missing.
    pub fn validate(&self) -> Result<auth::Settings, ConfigError> {
        let jwt_keys = self.hs256_secret_env.is_some() || self.jwks_file.is_some();
        let jwt_only = jwt_keys || self.issuer.is_some() || self.audience.is_some();
        match self.mode.as_str() {
            "none" | "gateway" if jwt_only => {
                Err(invalid("auth.mode", "hs256_secret_env, jwks_file, issuer and audience need mode = \"jwt\""))
            }
            "none" if self.gateway_secret_env.is_some() => {
                Err(invalid("auth.gateway_secret_env", "needs mode = \"gateway\""))
            }
            "none" => Ok(auth::Settings::None),
            "jwt" => self.jwt(jwt_keys),
            "gateway" => self.gateway(),
            other => Err(invalid("auth.mode", format!("{other:?} is not \"none\", \"jwt\" or \"gateway\""))),
        }
    }

    fn jwt(&self, has_keys: bool) -> Result<auth::Settings, ConfigError> {
        if self.gateway_secret_env.is_some() {
            return Err(invalid("auth.gateway_secret_env", "needs mode = \"gateway\""));
        }
        if !has_keys {
            return Err(invalid("auth.hs256_secret_env", "mode = \"jwt\" needs hs256_secret_env and/or jwks_file"));
        }
        let required = |key: &str, value: &Option<String>| match value.as_deref().map(str::trim) {
            Some(value) if !value.is_empty() => Ok(value.to_string()),
            _ => Err(invalid(format!("auth.{key}"), "is required with mode = \"jwt\" (tokens are checked against it)")),
        };
        if self.leeway_s > SKEW_MAX_S {
            return Err(invalid("auth.leeway_s", format!("at most {SKEW_MAX_S}")));
        }
        if self.user_claim.is_empty() {
            return Err(invalid("auth.user_claim", "names the claim that is the buyer, e.g. \"sub\""));
        }
        Ok(auth::Settings::Jwt(auth::JwtSettings {
            hs256_secret_env: self.hs256_secret_env.clone(),
            jwks_file: self.jwks_file.clone(),
            issuer: required("issuer", &self.issuer)?,
            audience: required("audience", &self.audience)?,
            leeway: Duration::from_secs(self.leeway_s),
            user_claim: self.user_claim.clone(),
        }))
    }

    fn gateway(&self) -> Result<auth::Settings, ConfigError> {
        let Some(secret_env) = self.gateway_secret_env.clone() else {
            return Err(invalid("auth.gateway_secret_env", "is required with mode = \"gateway\""));
        };
        if self.gateway_window_s == 0 || self.gateway_window_s > SKEW_MAX_S {
            return Err(invalid("auth.gateway_window_s", format!("between 1 and {SKEW_MAX_S}")));
        }
        Ok(auth::Settings::Gateway(auth::GatewaySettings {
            secret_env,
            window: Duration::from_secs(self.gateway_window_s),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<auth::Settings, ConfigError> {
        toml::from_str::<AuthSection>(text).map_err(|e| invalid("auth", e.message().to_string()))?.validate()
    }

    #[test]
    fn every_error_names_its_key() {
        let key = |text: &str| parse(text).unwrap_err().key;
        assert_eq!(key(r#"mode = "saml""#), "auth.mode");
        assert_eq!(key(r#"mode = "jwt""#), "auth.hs256_secret_env");
        assert_eq!(key("mode = \"jwt\"\nhs256_secret_env = \"S\"\naudience = \"a\""), "auth.issuer");
        assert_eq!(key("mode = \"jwt\"\nhs256_secret_env = \"S\"\nissuer = \"i\""), "auth.audience");
        assert_eq!(
            key("mode = \"jwt\"\njwks_file = \"k\"\nissuer = \"i\"\naudience = \"a\"\nleeway_s = 601"),
            "auth.leeway_s"
        );
        assert_eq!(key(r#"mode = "gateway""#), "auth.gateway_secret_env");
        assert_eq!(
            key("mode = \"gateway\"\ngateway_secret_env = \"G\"\ngateway_window_s = 0"),
            "auth.gateway_window_s"
        );
        assert_eq!(key("hs256_secret_env = \"S\""), "auth.mode");
        assert!(parse("mode = \"none\"\nsecret = \"x\"").is_err(), "unknown keys are errors");
    }

    #[test]
    fn defaults_are_none_and_the_documented_values() {
        assert_eq!(parse("").unwrap(), auth::Settings::None);
        let jwt = parse("mode = \"jwt\"\nhs256_secret_env = \"S\"\nissuer = \"i\"\naudience = \"a\"").unwrap();
        let auth::Settings::Jwt(jwt) = jwt else { panic!("not jwt") };
        assert_eq!((jwt.leeway.as_secs(), jwt.user_claim.as_str()), (30, "sub"));
        let gateway = parse("mode = \"gateway\"\ngateway_secret_env = \"G\"").unwrap();
        let auth::Settings::Gateway(gateway) = gateway else { panic!("not gateway") };
        assert_eq!(gateway.window.as_secs(), 60);
    }
}
