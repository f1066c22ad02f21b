//! Passwords for the ledger's Redis and the order store's PostgreSQL, from the environment
//! (`SECKILL_REDIS_PASSWORD`, `SECKILL_POSTGRES_PASSWORD`) into the URLs of a loaded config, so
//! a `cluster.toml` can be shared and a password never has to sit in it or on a command line.
//! `fleet up` hands the ones it uses to its children this way.
//!
//! A password from the environment replaces one in the URL and keeps the URL's user (an ACL
//! user for Redis, the role for PostgreSQL).

/// The password (of the URL's user, else Redis' default user) every ledger URL is given.
pub const REDIS_PASSWORD_ENV: &str = "SECKILL_REDIS_PASSWORD";
/// The password of the role `[orders] store` names, when it is a `postgres://` URL.
pub const POSTGRES_PASSWORD_ENV: &str = "SECKILL_POSTGRES_PASSWORD";

/// Puts the environment's passwords (each from its variable or the file `NAME_FILE` names) into
/// the ledger URL and the order store URL.
pub(super) fn apply_env(ledger_url: &mut String, store: &mut String) -> Result<(), super::ConfigError> {
    let from_env =
        |name: &str, key: &str| protocol::env_secret::from_env(name).map_err(|e| super::invalid(key, e.to_string()));
    if let Some(password) = from_env(REDIS_PASSWORD_ENV, "ledger.url")? {
        if ledger_url.as_str() != "embedded" {
            *ledger_url = with_password(ledger_url, &password);
        }
    }
    if let Some(password) = from_env(POSTGRES_PASSWORD_ENV, "orders.store")? {
        if store.starts_with("postgres://") || store.starts_with("postgresql://") {
            *store = with_password(store, &password);
        }
    }
    Ok(())
}

/// `url` with `password` (percent-encoded) as its password, keeping its user. Works on every
/// URL whose credentials end at the last `@` before the first `/` or `?` (`redis://`,
/// `redis+cluster://`, `redis+sentinel://`, `postgres://`).
pub fn with_password(url: &str, password: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (credentials.split(':').next().unwrap_or_default(), hosts),
        None => ("", authority),
    };
    format!("{scheme}://{user}:{}@{hosts}{tail}", percent_encode(password))
}

/// The user and password of `url`, percent-decoded; empty when absent.
pub fn credentials_of(url: &str) -> (String, String) {
    let Some((_, rest)) = url.split_once("://") else { return Default::default() };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let Some((credentials, _)) = authority.rsplit_once('@') else { return Default::default() };
    let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
    (percent_decode(user), percent_decode(password))
}

/// Every byte but RFC 3986's unreserved ones as `%XX`: safe in a URL's userinfo.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes.get(at + 1..at + 3).and_then(|pair| std::str::from_utf8(pair).ok());
        match (bytes[at], hex.and_then(|pair| u8::from_str_radix(pair, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                at += 3;
            }
            (byte, _) => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a password reaches every form of URL the config takes, keeps the URL's user and
    /// survives characters that mean something in a URL. Method: insert, then read back.
    #[test]
    fn a_password_goes_into_every_url_form_and_reads_back() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis://:pw@127.0.0.1:6379"),
            ("redis://:old@127.0.0.1:6379/0", "redis://:pw@127.0.0.1:6379/0"),
            ("redis://seckill:old@h:1", "redis://seckill:pw@h:1"),
            ("redis://seckill@h:1", "redis://seckill:pw@h:1"),
            ("redis+cluster://h:1,h:2", "redis+cluster://:pw@h:1,h:2"),
            ("redis+sentinel://h:1,h:2/ledger", "redis+sentinel://:pw@h:1,h:2/ledger"),
            (
                "postgres://seckill@127.0.0.1:5432/db?sslmode=disable",
                "postgres://seckill:pw@127.0.0.1:5432/db?sslmode=disable",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(with_password(url, "pw"), want);
        }
        let odd = "p@ss:w/rd?% ü";
        let url = with_password("postgres://seckill@127.0.0.1:5432/db", odd);
        assert!(url.ends_with("@127.0.0.1:5432/db"), "{url}");
        assert_eq!(credentials_of(&url), ("seckill".to_string(), odd.to_string()));
        assert_eq!(credentials_of("redis://127.0.0.1:1"), (String::new(), String::new()));
        assert_eq!(credentials_of("redis://:pw@127.0.0.1:1"), (String::new(), "pw".to_string()));
    }
}
