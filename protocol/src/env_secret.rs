//! Secrets from the environment, as containers and service managers hand them over: `NAME`
//! holds the secret itself, or `NAME_FILE` names a file that does (the Docker and Kubernetes
//! convention, and what systemd's `LoadCredential` gives as `$CREDENTIALS_DIRECTORY/…`). A file
//! keeps the secret out of `docker inspect`, `/proc/PID/environ` and the image's layers.

//!
//! A third place, for the operator's commands: the secrets directory a `seckill fleet up` keeps
//! (`<run dir>/secrets/NAME`, one 0600 file per variable), named once by `--run-dir`
//! ([`use_secrets_dir`]). It is read only when neither `NAME` nor `NAME_FILE` is set.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The directory [`use_secrets_dir`] named, if any.
static SECRETS_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Where `fleet up` keeps the secret `name` under its run directory `run_dir`.
pub fn kept_in(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join("secrets").join(name)
}

/// From now on, a secret set neither directly nor by file is read from `run_dir`'s secrets
/// directory when that holds it. The first call wins: one process, one run directory.
pub fn use_secrets_dir(run_dir: &Path) {
    let _ = SECRETS_DIR.set(run_dir.join("secrets"));
}

/// What an operator is told when the secret `name` is missing: the two variables, and where a
/// `fleet up` keeps the one it drew.
pub fn where_to_find(name: &str) -> String {
    match SECRETS_DIR.get() {
        Some(dir) => format!("set {name} or {name}_FILE; {} does not hold it", dir.join(name).display()),
        None => format!(
            "set {name} or {name}_FILE, or pass --run-dir DIR of the `seckill fleet up` that drew it (it keeps it \
             in DIR/secrets/{name})"
        ),
    }
}

/// Why a secret could not be read; names the variables and the file, never the secret.
#[derive(Debug, thiserror::Error)]
pub enum EnvSecretError {
    #[error("{name} and {name}_FILE are both set: give the secret one way")]
    Both { name: String },
    #[error("{name}_FILE names {path}, which cannot be read: {source}")]
    Unreadable { name: String, path: PathBuf, source: std::io::Error },
    #[error("{name}_FILE names {path}, which is empty")]
    Empty { name: String, path: PathBuf },
}

/// The secret `name` carries, directly or through `name_FILE`, else the secrets directory's
/// file of that name; `None` when none is set (an empty variable counts as unset). One trailing newline of a file is not part of the secret:
/// `echo secret > file` writes one.
pub fn from_env(name: &str) -> Result<Option<String>, EnvSecretError> {
    let set = |variable: &str| std::env::var(variable).ok().filter(|value| !value.is_empty());
    let file_variable = format!("{name}_FILE");
    match (set(name), set(&file_variable)) {
        (Some(_), Some(_)) => Err(EnvSecretError::Both { name: name.to_string() }),
        (Some(value), None) => Ok(Some(value)),
        (None, Some(path)) => read_secret_file(name, PathBuf::from(path)).map(Some),
        (None, None) => match SECRETS_DIR.get().map(|dir| dir.join(name)).filter(|path| path.exists()) {
            Some(path) => read_secret_file(name, path).map(Some),
            None => Ok(None),
        },
    }
}

fn read_secret_file(name: &str, path: PathBuf) -> Result<String, EnvSecretError> {
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(source) => return Err(EnvSecretError::Unreadable { name: name.to_string(), path, source }),
    };
    let secret = text.strip_suffix('\n').map(|line| line.strip_suffix('\r').unwrap_or(line)).unwrap_or(&text);
    if secret.is_empty() {
        return Err(EnvSecretError::Empty { name: name.to_string(), path });
    }
    Ok(secret.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each case uses variables of its own: tests run on threads of one process, which share
    /// the environment.
    #[test]
    fn a_secret_comes_from_the_variable_or_its_file_never_both() {
        let dir = std::env::temp_dir().join(format!("seckill-env-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-the-file-0123456789\n").unwrap();
        std::env::set_var("SECKILL_TEST_DIRECT", "direct-0123456789");
        std::env::set_var("SECKILL_TEST_FILED_FILE", &file);
        std::env::set_var("SECKILL_TEST_BOTH", "x");
        std::env::set_var("SECKILL_TEST_BOTH_FILE", &file);
        std::env::set_var("SECKILL_TEST_MISSING_FILE", dir.join("absent"));
        std::env::set_var("SECKILL_TEST_EMPTY", "");
        assert_eq!(from_env("SECKILL_TEST_DIRECT").unwrap().as_deref(), Some("direct-0123456789"));
        assert_eq!(from_env("SECKILL_TEST_FILED").unwrap().as_deref(), Some("from-the-file-0123456789"));
        assert_eq!(from_env("SECKILL_TEST_EMPTY").unwrap(), None, "an empty variable is unset");
        assert_eq!(from_env("SECKILL_TEST_UNSET").unwrap(), None);
        let both = from_env("SECKILL_TEST_BOTH").unwrap_err().to_string();
        assert!(both.contains("SECKILL_TEST_BOTH and SECKILL_TEST_BOTH_FILE"), "{both}");
        let missing = from_env("SECKILL_TEST_MISSING").unwrap_err().to_string();
        assert!(missing.contains("SECKILL_TEST_MISSING_FILE") && missing.contains("absent"), "{missing}");
        std::fs::write(&file, "\r\n").unwrap();
        assert!(matches!(from_env("SECKILL_TEST_FILED"), Err(EnvSecretError::Empty { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
