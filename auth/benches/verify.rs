//! What verifying a buyer costs per request: a token seen before (the cache: one SHA-256), and a
//! first sight of an HS256 and an ES256 token (a signature check each).

use auth::mint::{generate_secret, Minter};
use auth::{Authenticator, JwtSettings, Settings};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use hyper::header::{HeaderValue, AUTHORIZATION};
use hyper::HeaderMap;

fn settings(hs256_secret_env: Option<&str>, jwks_file: Option<std::path::PathBuf>) -> Settings {
    Settings::Jwt(JwtSettings {
        hs256_secret_env: hs256_secret_env.map(str::to_string),
        jwks_file,
        issuer: "shop".into(),
        audience: "seckill".into(),
        leeway: std::time::Duration::from_secs(30),
        user_claim: "sub".into(),
    })
}

fn headers(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
    headers
}

fn verify(c: &mut Criterion) {
    let now = auth::unix_now_s();
    let secret = generate_secret().unwrap();
    std::env::set_var("SECKILL_BENCH_HS256", &secret);
    let hs256 = Authenticator::from_settings(&settings(Some("SECKILL_BENCH_HS256"), None)).unwrap();
    let hs_minter = Minter::hs256(secret.as_bytes(), "shop", "seckill");
    let (es_minter, jwks) = Minter::es256("k1", "shop", "seckill").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let jwks_file = dir.path().join("jwks.json");
    std::fs::write(&jwks_file, jwks).unwrap();
    let es256 = Authenticator::from_settings(&settings(None, Some(jwks_file))).unwrap();

    let cached = headers(&hs_minter.token("ann", now));
    hs256.verify(&cached, now).unwrap();
    c.bench_function("verify/cached", |b| b.iter(|| hs256.verify(&cached, now).unwrap()));

    // A fresh token (its own jti) each iteration, minted outside the timed part.
    c.bench_function("verify/hs256_first_sight", |b| {
        b.iter_batched(
            || headers(&hs_minter.token("ann", now)),
            |h| hs256.verify(&h, now).unwrap(),
            BatchSize::SmallInput,
        )
    });
    c.bench_function("verify/es256_first_sight", |b| {
        b.iter_batched(
            || headers(&es_minter.token("ann", now)),
            |h| es256.verify(&h, now).unwrap(),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, verify);
criterion_main!(benches);
