//! The identity provider's public keys, from a JWKS file (`[auth] jwks_file`), watched so that a
//! rotation takes effect without a restart.
//!
//! Each key is published for one algorithm (its `alg`, or the one its type implies: RSA →
//! RS256, P-256 → ES256, Ed25519 → EdDSA), and a token is checked only with the algorithm its
//! key was published for: that is what refuses algorithm confusion. Symmetric (`oct`) keys are
//! refused outright: a secret has no place in a file of public keys.
//!
//! A background thread re-reads the file every [`POLL`]; when its bytes change and parse, the new
//! set replaces the old at once and the owner is told (to forget tokens verified under old keys).
//! A file that does not parse keeps the last good set, with a warning: a half-written file must
//! not lock every buyer out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};

/// How often the file is read for changes: a rotated key is in force within this.
pub const POLL: Duration = Duration::from_millis(500);

/// One published key.
#[derive(Clone)]
pub struct PublicKey {
    pub key: DecodingKey,
    pub algorithm: Algorithm,
}

/// The keys of one version of the file, by `kid`.
#[derive(Clone, Default)]
pub struct KeySet {
    keys: HashMap<String, PublicKey>,
}

impl KeySet {
    /// Parses a JWKS document. Every key needs a `kid`, a supported asymmetric algorithm and
    /// valid parameters; one bad key refuses the whole set, naming it.
    pub fn parse(text: &str) -> Result<KeySet, String> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
        let mut keys = HashMap::new();
        for (index, jwk) in set.keys.iter().enumerate() {
            let kid = jwk.common.key_id.clone().ok_or_else(|| format!("key {index} has no kid"))?;
            let implied = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => Algorithm::ES256,
                AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P384 => Algorithm::ES384,
                AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => Algorithm::EdDSA,
                AlgorithmParameters::OctetKey(_) => {
                    return Err(format!("key {kid} is symmetric (oct): a JWKS file holds public keys only"))
                }
                _ => return Err(format!("key {kid} has an unsupported type or curve")),
            };
            let algorithm = match jwk.common.key_algorithm {
                // `alg` names the same algorithms as a token header, by the same names.
                Some(declared) => serde_json::to_value(declared)
                    .ok()
                    .and_then(|name| name.as_str()?.parse::<Algorithm>().ok())
                    .ok_or_else(|| format!("key {kid}: unsupported alg"))?,
                None => implied,
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {kid}: {e}"))?;
            if key.family() != algorithm.family() {
                return Err(format!("key {kid}: its alg {algorithm:?} does not fit its key type"));
            }
            keys.insert(kid, PublicKey { key, algorithm });
        }
        Ok(KeySet { keys })
    }

    pub fn get(&self, kid: &str) -> Option<&PublicKey> {
        self.keys.get(kid)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The current key set of a watched file.
pub struct WatchedKeys {
    path: PathBuf,
    current: ArcSwap<KeySet>,
}

impl WatchedKeys {
    /// Loads the file (an error if it cannot be read or parsed) and starts the thread that
    /// watches it; `on_change` runs after each replacement. The thread ends when the returned
    /// handle's last clone is dropped.
    pub fn start(path: &Path, on_change: impl Fn() + Send + 'static) -> Result<Arc<WatchedKeys>, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let set = KeySet::parse(&text)?;
        let watched = Arc::new(WatchedKeys { path: path.to_path_buf(), current: ArcSwap::from_pointee(set) });
        let weak = Arc::downgrade(&watched);
        std::thread::Builder::new()
            .name("jwks-watch".into())
            .spawn(move || watch(weak, text, on_change))
            .map_err(|e| format!("cannot start the thread that watches {}: {e}", path.display()))?;
        Ok(watched)
    }

    /// The keys in force now.
    pub fn keys(&self) -> arc_swap::Guard<Arc<KeySet>> {
        self.current.load()
    }
}

fn watch(watched: Weak<WatchedKeys>, mut last: String, on_change: impl Fn()) {
    loop {
        std::thread::sleep(POLL);
        let Some(watched) = watched.upgrade() else { return };
        let Ok(text) = std::fs::read_to_string(&watched.path) else { continue };
        if text == last {
            continue;
        }
        match KeySet::parse(&text) {
            Ok(set) => {
                tracing::info!(file = %watched.path.display(), keys = set.len(), "the JWKS file changed; its keys are in force");
                watched.current.store(Arc::new(set));
                on_change();
            }
            Err(e) => {
                tracing::warn!(file = %watched.path.display(), "the JWKS file changed but does not parse ({e}); keeping the previous keys");
            }
        }
        last = text;
    }
}
