//! Every way a JWT or a gateway signature can be wrong is refused, and a JWKS file rotated while
//! the authenticator runs takes effect without a restart. (The same refusals through a real node
//! and order service, with stock and orders checked unchanged, are in the workspace's
//! `tests/cluster/auth.rs`.)

use std::time::{Duration, Instant};

use auth::mint::{generate_secret, Minter};
use auth::{Authenticator, GatewaySettings, JwtSettings, Refusal, Settings};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hyper::header::{HeaderValue, AUTHORIZATION};
use hyper::HeaderMap;
use serde_json::json;

const ISSUER: &str = "https://id.shop.example";
const AUDIENCE: &str = "seckill";

fn jwt_settings(secret_env: Option<&str>, jwks_file: Option<std::path::PathBuf>) -> Settings {
    Settings::Jwt(JwtSettings {
        hs256_secret_env: secret_env.map(str::to_string),
        jwks_file,
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        leeway: Duration::from_secs(30),
        user_claim: "sub".into(),
    })
}

fn bearer(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
    headers
}

/// An HS256 authenticator with its secret in a variable of its own (tests run in parallel).
fn hs256(env: &str) -> (Authenticator, Minter, String) {
    let secret = generate_secret().unwrap();
    std::env::set_var(env, &secret);
    let authenticator = Authenticator::from_settings(&jwt_settings(Some(env), None)).unwrap();
    (authenticator, Minter::hs256(secret.as_bytes(), ISSUER, AUDIENCE), secret)
}

fn unsigned(header: serde_json::Value, claims: &serde_json::Value, signature: &[u8]) -> String {
    let part = |value: &serde_json::Value| URL_SAFE_NO_PAD.encode(value.to_string());
    format!("{}.{}.{}", part(&header), part(claims), URL_SAFE_NO_PAD.encode(signature))
}

#[test]
fn a_valid_token_proves_its_subject() {
    let (authenticator, minter, _) = hs256("SECKILL_TEST_HS256_VALID");
    let now = auth::unix_now_s();
    let user = authenticator.verify(&bearer(&minter.token("ann", now)), now).unwrap();
    assert_eq!(user.unwrap().as_str(), "ann");
}

#[test]
fn every_wrong_token_is_refused() {
    let (authenticator, minter, _) = hs256("SECKILL_TEST_HS256_WRONG");
    let now = auth::unix_now_s();
    let forger = Minter::hs256(generate_secret().unwrap().as_bytes(), ISSUER, AUDIENCE);
    let with = |change: &dyn Fn(&mut serde_json::Value)| {
        let mut claims = minter.claims("ann", now);
        change(&mut claims);
        minter.sign(&claims)
    };
    let cases = [
        ("forged signature", forger.token("ann", now)),
        ("wrong issuer", with(&|c| c["iss"] = json!("https://evil.example"))),
        ("wrong audience", with(&|c| c["aud"] = json!("another-service"))),
        ("expired beyond the leeway", with(&|c| c["exp"] = json!(now - 31))),
        ("not valid yet beyond the leeway", with(&|c| c["nbf"] = json!(now + 31))),
        ("no exp", with(&|c| drop(c.as_object_mut().unwrap().remove("exp")))),
        ("no subject", with(&|c| drop(c.as_object_mut().unwrap().remove("sub")))),
        ("alg none", unsigned(json!({"alg": "none", "typ": "JWT"}), &minter.claims("ann", now), b"")),
        ("garbage", "not.a.token".to_string()),
    ];
    for (case, token) in cases {
        let refused = authenticator.verify(&bearer(&token), now);
        assert!(refused.is_err(), "{case}: {refused:?}");
    }
    assert_eq!(authenticator.verify(&HeaderMap::new(), now), Err(Refusal::Missing));
    let mut basic = HeaderMap::new();
    basic.insert(AUTHORIZATION, HeaderValue::from_static("Basic YW5uOnB3"));
    assert!(matches!(authenticator.verify(&basic, now), Err(Refusal::Malformed(_))));
}

#[test]
fn the_leeway_tolerates_a_small_clock_skew() {
    let (authenticator, minter, _) = hs256("SECKILL_TEST_HS256_LEEWAY");
    let now = auth::unix_now_s();
    let mut claims = minter.claims("ann", now);
    claims["exp"] = json!(now - 10);
    claims["nbf"] = json!(now + 10);
    assert!(authenticator.verify(&bearer(&minter.sign(&claims)), now).is_ok());
}

#[test]
fn a_cached_token_still_expires() {
    let (authenticator, minter, _) = hs256("SECKILL_TEST_HS256_CACHE");
    let now = auth::unix_now_s();
    let token = minter.token("ann", now);
    assert!(authenticator.verify(&bearer(&token), now).is_ok());
    let after = now + auth::mint::TOKEN_TTL_S + 31;
    assert_eq!(authenticator.verify(&bearer(&token), after), Err(Refusal::OutOfTime));
}

#[test]
fn public_keys_pick_by_kid_and_refuse_algorithm_confusion() {
    let dir = tempfile::tempdir().unwrap();
    let (es_minter, jwks) = Minter::es256("k1", ISSUER, AUDIENCE).unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, &jwks).unwrap();
    // HS256 is accepted too, with its own secret: the confusion must not slip through either way.
    let secret = generate_secret().unwrap();
    std::env::set_var("SECKILL_TEST_HS256_CONFUSION", &secret);
    let authenticator =
        Authenticator::from_settings(&jwt_settings(Some("SECKILL_TEST_HS256_CONFUSION"), Some(file))).unwrap();
    let now = auth::unix_now_s();
    assert_eq!(authenticator.verify(&bearer(&es_minter.token("ann", now)), now).unwrap().unwrap().as_str(), "ann");

    // An HS256 token whose "secret" is the published public key, and one naming that key's kid.
    let jwk: serde_json::Value = serde_json::from_str(&jwks).unwrap();
    let public = jwk["keys"][0].to_string();
    let confused = Minter::hs256(public.as_bytes(), ISSUER, AUDIENCE);
    let token = confused.sign(&confused.claims("ann", now));
    assert!(authenticator.verify(&bearer(&token), now).is_err(), "HS256 signed with the public key");
    let token = unsigned(json!({"alg": "HS256", "kid": "k1"}), &confused.claims("ann", now), public.as_bytes());
    assert!(authenticator.verify(&bearer(&token), now).is_err(), "HS256 signed with the public key");

    let (stranger, _) = Minter::es256("k9", ISSUER, AUDIENCE).unwrap();
    let refused = authenticator.verify(&bearer(&stranger.token("ann", now)), now);
    assert!(matches!(refused, Err(Refusal::Invalid(ref why)) if why.contains("k9")), "unknown kid: {refused:?}");
    let (impostor, _) = Minter::es256("k1", ISSUER, AUDIENCE).unwrap();
    assert!(authenticator.verify(&bearer(&impostor.token("ann", now)), now).is_err(), "another key under kid k1");
}

#[test]
fn a_rotated_jwks_file_takes_effect_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    let (old, old_jwks) = Minter::es256("old", ISSUER, AUDIENCE).unwrap();
    let (new, new_jwks) = Minter::es256("new", ISSUER, AUDIENCE).unwrap();
    std::fs::write(&file, &old_jwks).unwrap();
    let authenticator = Authenticator::from_settings(&jwt_settings(None, Some(file.clone()))).unwrap();
    let now = auth::unix_now_s();
    let old_token = old.token("ann", now);
    assert!(authenticator.verify(&bearer(&old_token), now).is_ok());
    assert!(authenticator.verify(&bearer(&new.token("ann", now)), now).is_err());

    // Written to a temp file and renamed, as a deployment does, so no read sees half a file.
    std::fs::write(dir.path().join("next.json"), &new_jwks).unwrap();
    std::fs::rename(dir.path().join("next.json"), &file).unwrap();
    let deadline = Instant::now() + auth::jwks::POLL * 10;
    while authenticator.verify(&bearer(&old_token), now).is_ok() {
        assert!(Instant::now() < deadline, "the old key is still accepted after the rotation");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(authenticator.verify(&bearer(&new.token("ann", now)), now).is_ok());
}

#[test]
fn configuration_errors_name_their_key() {
    let missing = Authenticator::from_settings(&jwt_settings(Some("SECKILL_TEST_UNSET_VARIABLE"), None));
    assert!(matches!(missing, Err(ref e) if e.key == "auth.hs256_secret_env"), "{:?}", missing.err());
    std::env::set_var("SECKILL_TEST_SHORT_SECRET", "short");
    let short = Authenticator::from_settings(&jwt_settings(Some("SECKILL_TEST_SHORT_SECRET"), None));
    assert!(matches!(short, Err(ref e) if e.reason.contains("shorter")));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"s"}]}"#).unwrap();
    let symmetric = Authenticator::from_settings(&jwt_settings(None, Some(bad)));
    assert!(matches!(symmetric, Err(ref e) if e.key == "auth.jwks_file" && e.reason.contains("symmetric")));
    let gateway = Authenticator::from_settings(&Settings::Gateway(GatewaySettings {
        secret_env: "SECKILL_TEST_UNSET_GATEWAY".into(),
        window: Duration::from_secs(60),
    }));
    assert!(matches!(gateway, Err(ref e) if e.key == "auth.gateway_secret_env"));
}

#[test]
fn the_gateway_header_needs_a_fresh_signature() {
    let secret = generate_secret().unwrap();
    std::env::set_var("SECKILL_TEST_GATEWAY", &secret);
    let authenticator = Authenticator::from_settings(&Settings::Gateway(GatewaySettings {
        secret_env: "SECKILL_TEST_GATEWAY".into(),
        window: Duration::from_secs(60),
    }))
    .unwrap();
    let now = auth::unix_now_s();
    let headers = |user: &str, signature: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(auth::GATEWAY_USER_HEADER, HeaderValue::from_str(user).unwrap());
        headers.insert(auth::GATEWAY_SIGNATURE_HEADER, HeaderValue::from_str(signature).unwrap());
        headers
    };
    let good = auth::gateway::sign(secret.as_bytes(), "ann", now);
    assert_eq!(authenticator.verify(&headers("ann", &good), now).unwrap().unwrap().as_str(), "ann");
    let stale = auth::gateway::sign(secret.as_bytes(), "ann", now - 61);
    assert_eq!(authenticator.verify(&headers("ann", &stale), now), Err(Refusal::OutOfTime));
    let forged = auth::gateway::sign(b"not the gateway's secret, 32 bytes", "ann", now);
    assert!(authenticator.verify(&headers("ann", &forged), now).is_err());
    let mut unsigned = HeaderMap::new();
    unsigned.insert(auth::GATEWAY_USER_HEADER, HeaderValue::from_static("ann"));
    assert_eq!(authenticator.verify(&unsigned, now), Err(Refusal::Missing));
}
