//! Shared secrets between the fleet's processes: the cluster token every member and node presents
//! on `/raft/*` and `/api/*`, and the operators' admin token.
//!
//! **Guarantees.**
//! - A secret never prints: [`Secret`]'s `Debug` and `Display` show `<redacted>`, so a config
//!   dumped with `{:?}`, a log line or an error cannot carry it.
//! - Checking a presented token leaks nothing about the expected one, not even its length: both
//!   are hashed to SHA-256 digests (fixed length) and the digests are compared in constant time.
//!   Every accepted digest is compared, whichever matches, so the time does not tell which of two
//!   accepted tokens a caller holds either.
//! - A [`ClusterCredential`] accepts the token it presents plus at most one more, so the token can
//!   be rotated by rolling restarts without a moment when two processes disagree (SECURITY.md).
//!
//! **Non-goals.** Confidentiality on the wire: a token travels in a header in the clear unless
//! the traffic runs over TLS or a private network (SECURITY.md says which).

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shorter secrets can be guessed; 16 random characters cannot.
pub const SECRET_MIN_BYTES: usize = 16;
/// A header line is not the place for a document.
pub const SECRET_MAX_BYTES: usize = 256;
/// Random bytes in a generated token (hex-encoded: twice as many characters).
const GENERATED_BYTES: usize = 32;

/// The header the cluster token travels in, as `Bearer <token>` (the admin API's header too, on
/// its own routes).
pub const AUTHORIZATION: &str = "authorization";

/// A secret string: a token or a password. Never printed.
/// Not `PartialEq`: comparing secrets goes through digests ([`accepts`]), never `==`.
#[derive(Clone)]
pub struct Secret(Arc<str>);

/// Why a text cannot be a secret; names the rule, never the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("needs {SECRET_MIN_BYTES} to {SECRET_MAX_BYTES} visible ASCII characters, no spaces")]
pub struct WeakSecret;

impl Secret {
    /// Accepts `text` if it is long enough to resist guessing and fits a header.
    pub fn new(text: &str) -> Result<Secret, WeakSecret> {
        let fits = (SECRET_MIN_BYTES..=SECRET_MAX_BYTES).contains(&text.len());
        if !fits || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(WeakSecret);
        }
        Ok(Secret(Arc::from(text)))
    }

    /// A fresh random token from the OS's secure source.
    pub fn generate() -> Result<Secret, getrandom::Error> {
        let mut bytes = [0u8; GENERATED_BYTES];
        getrandom::fill(&mut bytes)?;
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Secret(Arc::from(text.as_str())))
    }

    /// The secret itself, for the one place that sends it (a header, an environment variable of
    /// a child process).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `Bearer <secret>`, the `Authorization` header value.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }

    pub fn digest(&self) -> SecretDigest {
        SecretDigest::of(self.0.as_bytes())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The SHA-256 of a secret: what a server keeps to check presented secrets against.
#[derive(Clone, Copy)]
pub struct SecretDigest([u8; 32]);

impl SecretDigest {
    pub fn of(bytes: &[u8]) -> SecretDigest {
        SecretDigest(Sha256::digest(bytes).into())
    }

    /// Constant time in the contents; both sides are 32 bytes, so the length tells nothing.
    pub fn matches(&self, other: &SecretDigest) -> bool {
        bool::from(self.0.ct_eq(&other.0))
    }
}

impl fmt::Debug for SecretDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretDigest(<redacted>)")
    }
}

/// The secret in an `Authorization: Bearer <secret>` header value, or empty bytes (which match
/// no secret: secrets are never empty).
pub fn bearer_of(header: Option<&[u8]>) -> &[u8] {
    header.and_then(|value| value.strip_prefix(b"Bearer ")).unwrap_or_default()
}

/// Whether `presented` (raw bytes from a request) is one of `accepted`. Hashes first, so the
/// comparison is of fixed length; compares against every accepted digest without stopping at
/// the first match.
pub fn accepts(accepted: &[SecretDigest], presented: &[u8]) -> bool {
    let presented = SecretDigest::of(presented);
    accepted.iter().fold(false, |found, digest| found | digest.matches(&presented))
}

/// The cluster credential of one process: the token it presents to members, and the tokens a
/// member accepts (the same one, plus one more during a rotation).
#[derive(Debug, Clone)]
pub struct ClusterCredential {
    presented: Secret,
    accepted: Vec<SecretDigest>,
    /// Drawn at start because none was configured: good only inside one process, where every
    /// part received the same value. A process that must talk to others refuses such a one.
    generated: bool,
}

impl ClusterCredential {
    /// Presents and accepts `token`, and accepts `also_accepted` too (a rotation in progress).
    pub fn new(token: Secret, also_accepted: Option<Secret>) -> ClusterCredential {
        let mut accepted = vec![token.digest()];
        accepted.extend(also_accepted.map(|extra| extra.digest()));
        ClusterCredential { presented: token, accepted, generated: false }
    }

    /// A random credential for a fleet that lives in one process.
    pub fn generate() -> Result<ClusterCredential, getrandom::Error> {
        Ok(ClusterCredential { generated: true, ..ClusterCredential::new(Secret::generate()?, None) })
    }

    /// The token this process presents.
    pub fn token(&self) -> &Secret {
        &self.presented
    }

    pub fn is_generated(&self) -> bool {
        self.generated
    }

    /// Whether an `Authorization` header value carries an accepted token.
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        accepts(&self.accepted, bearer_of(authorization))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("correct-horse-battery-staple").unwrap();
        assert!(!format!("{secret:?} {secret}").contains("horse"));
        let credential = ClusterCredential::new(secret, None);
        assert!(!format!("{credential:?}").contains("horse"));
    }

    #[test]
    fn weak_secrets_are_refused() {
        for weak in ["", "short", "has a space in it!", "tab\tinside-the-secret", &"x".repeat(SECRET_MAX_BYTES + 1)] {
            assert!(Secret::new(weak).is_err(), "{weak:?}");
        }
        assert!(Secret::generate().unwrap().expose().len() >= SECRET_MIN_BYTES);
    }

    #[test]
    fn a_credential_admits_its_token_and_the_one_being_rotated_in() {
        let old = Secret::new("old-token-0123456789").unwrap();
        let new = Secret::new("new-token-0123456789").unwrap();
        let rotating = ClusterCredential::new(old.clone(), Some(new.clone()));
        assert!(rotating.admits(Some(old.bearer().as_bytes())));
        assert!(rotating.admits(Some(new.bearer().as_bytes())));
        let plain = ClusterCredential::new(old.clone(), None);
        assert!(!plain.admits(Some(new.bearer().as_bytes())));
        assert!(!plain.admits(None));
        assert!(!plain.admits(Some(b"Bearer ")));
        assert!(!plain.admits(Some(old.expose().as_bytes())), "the Bearer scheme is required");
        assert!(!plain.admits(Some(b"Bearer old-token-012345678")), "a prefix is not the token");
    }
}
