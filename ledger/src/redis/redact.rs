//! Passwords kept out of every message and log line that names a Redis: [`redact_url`] for the
//! URLs the ledger shows, [`scrub`] for errors of other libraries that may quote them.

/// The URL's password replaced by `***`, for every message and log line that names a Redis:
/// `redis://user:secret@host:1/0` → `redis://user:***@host:1/0`, `redis://:secret@h:1` →
/// `redis://:***@h:1`, a lone `redis://secret@h:1` → `redis://***@h:1`. Text that is not a URL
/// comes back as is; a cluster URL's one credential part is redacted the same way.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((credentials, hosts)) = authority.rsplit_once('@') else { return url.to_string() };
    let hidden = match credentials.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{scheme}://{hidden}@{hosts}{tail}")
}

/// `message` with the URL's credentials, wherever they appear, replaced by `***`: for errors of
/// other libraries, which may quote what they were given.
pub(super) fn scrub(message: &str, url: &str) -> String {
    let credentials = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next()?.rsplit_once('@'))
        .map(|(credentials, _)| credentials);
    let mut scrubbed = message.to_string();
    for secret in credentials.into_iter().flat_map(|c| [c, c.split_once(':').map_or(c, |(_, pw)| pw)]) {
        if !secret.is_empty() {
            scrubbed = scrubbed.replace(secret, "***");
        }
    }
    scrubbed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::{RedisLedgerConfig, RedisTarget};

    #[test]
    fn passwords_never_reach_a_message() {
        assert_eq!(redact_url("redis://user:s3cret@h:1/0"), "redis://user:***@h:1/0");
        assert_eq!(redact_url("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(redact_url("redis://s3cret@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis+cluster://u:s3cret@a:1,b:2"), "redis+cluster://u:***@a:1,b:2");
        assert_eq!(redact_url("redis+sentinel://u:s3cret@a:1,b:2/m"), "redis+sentinel://u:***@a:1,b:2/m");
        assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact_url("embedded"), "embedded");
        for bad in [
            "redis://:s3cret@h:notaport",
            "redis+cluster://:s3cret@a:1,b",
            "redis+cluster://:s3cret@a:1/0",
            "redis+sentinel://:s3cret@a:1,b/m",
            "redis+sentinel://:s3cret@a:1",
        ] {
            let error = RedisTarget::parse(bad).expect_err("must be refused");
            assert!(!error.contains("s3cret"), "{error}");
        }
        let config = RedisLedgerConfig::new("redis://u:s3cret@h:1");
        assert!(!format!("{config:?}").contains("s3cret"));
        let target = RedisTarget::parse("redis+cluster://u:s3cret@a:1,b:2").unwrap();
        assert!(!format!("{target:?}").contains("s3cret"));
        let target = RedisTarget::parse("redis+sentinel://u:s3cret@a:1,b:2/m").unwrap();
        assert!(!format!("{target:?}").contains("s3cret"));
    }
}
