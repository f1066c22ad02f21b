//! The secrets of a `fleet up`: the passwords of the Redis and the PostgreSQL it starts, the
//! payment provider's signing secret, the cluster token and the admin token. Each is the one the
//! operator gives (the config, `NAME` or `NAME_FILE`); else the one kept in
//! `<run dir>/secrets/NAME`, named by the variable it feeds, drawn at random by the first `up`
//! and readable by its owner alone. Every later `up` on that run directory finds them again, and
//! an operator's command finds them with `--run-dir` (`protocol::env_secret`). The children get
//! a kept one as `NAME_FILE`, never its value: not in an argument, an environment or a log.
//! Redis reads its own password from a 0600 config file.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use protocol::env_secret::kept_in;
use protocol::Secret;

/// The file earlier versions kept drawn passwords in, one `<kind> <password>` a line; read so a
/// run directory they made keeps its servers' passwords.
const LEGACY_FILE: &str = "credentials";

/// A secret of the fleet, and the file it is kept in when `up` drew it.
pub struct FleetSecret {
    pub secret: Secret,
    kept_at: Option<PathBuf>,
}

impl FleetSecret {
    /// What a child needs in its environment to read this secret: `NAME_FILE` for a kept one;
    /// nothing for the operator's own (the child inherits it as this process got it).
    pub fn child_env(&self, name: &str) -> Option<(String, OsString)> {
        self.kept_at.as_ref().map(|path| (format!("{name}_FILE"), path.clone().into_os_string()))
    }
}

/// `configured` if the operator gave one; else the secret kept for the variable `name` in the
/// run directory, drawn and kept there when it has none. `legacy` is the secret's kind in the
/// older `credentials` file, if it had one there.
pub fn secret(
    run_dir: &Path,
    name: &str,
    configured: Option<&str>,
    legacy: Option<&str>,
) -> anyhow::Result<FleetSecret> {
    let path = kept_in(run_dir, name);
    if let Some(configured) = configured.filter(|text| !text.is_empty()) {
        let secret = Secret::new(configured)
            .map_err(|weak| anyhow::anyhow!("the secret {name} gives (or its place in the config) {weak}"))?;
        // One drawn by an earlier `up` is stale now: `--run-dir` must not hand it out.
        let _ = fs::remove_file(&path);
        return Ok(FleetSecret { secret, kept_at: None });
    }
    let kept = match fs::read_to_string(&path) {
        Ok(text) => Some(text.trim_end_matches('\n').to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => legacy.and_then(|kind| legacy_password(run_dir, kind)),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let secret = match kept {
        Some(text) => {
            Secret::new(&text).map_err(|weak| anyhow::anyhow!("the secret kept in {} {weak}", path.display()))?
        }
        None => Secret::generate().context("no random source for a secret")?,
    };
    fs::create_dir_all(run_dir.join("secrets"))?;
    fs::set_permissions(run_dir.join("secrets"), fs::Permissions::from_mode(0o700))?;
    if !path.exists() {
        write_private(&path, &format!("{}\n", secret.expose()))?;
    }
    Ok(FleetSecret { secret, kept_at: Some(path) })
}

fn legacy_password(run_dir: &Path, kind: &str) -> Option<String> {
    let text = fs::read_to_string(run_dir.join(LEGACY_FILE)).ok()?;
    text.lines().find_map(|line| Some(line.strip_prefix(kind)?.strip_prefix(' ')?.to_string()))
}

/// Writes the Redis config that holds the password: for the URL's `user`, an ACL user with
/// every right and the default user switched off; without one, the default user's
/// `requirepass`.
pub fn write_redis_auth(path: &Path, user: &str, password: &Secret) -> anyhow::Result<()> {
    let text = if user.is_empty() || user == "default" {
        format!("requirepass {}\n", quoted(password.expose()))
    } else {
        let rule = quoted(&format!(">{}", password.expose()));
        format!("user default off\nuser {} on {rule} ~* &* +@all\n", quoted(user))
    };
    write_private(path, &format!("# Written by `seckill fleet up` on every start.\n{text}"))
}

/// `text` as a double-quoted argument of a Redis config file.
fn quoted(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.extend(c.to_string().bytes().map(|b| format!("\\x{b:02x}"))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Replaces `path` with `text`, readable and writable by its owner alone from the first byte
/// (a new file next to it, renamed over it).
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let fresh = path.with_extension("new");
    let _ = fs::remove_file(&fresh);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&fresh)
        .with_context(|| format!("creating {}", fresh.display()))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    // The umask cannot widen 0600, but an inherited ACL default could: say it again.
    fs::set_permissions(&fresh, fs::Permissions::from_mode(0o600))?;
    fs::rename(&fresh, path).with_context(|| format!("replacing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a configured secret wins and is not written down; without one the first call draws
    /// a strong secret and keeps it in a 0600 file named by its variable, which later calls (a
    /// later `up`) find again; a run directory of an older version keeps its passwords.
    #[test]
    fn a_drawn_secret_is_kept_privately_by_its_variable_and_found_again() {
        let dir = tempfile::tempdir().expect("temp dir");
        let given = secret(dir.path(), "SECKILL_REDIS_PASSWORD", Some("given-0123456789abcdef"), None).unwrap();
        assert_eq!(given.secret.expose(), "given-0123456789abcdef");
        assert!(given.child_env("SECKILL_REDIS_PASSWORD").is_none(), "the child inherits the operator's own");
        assert!(secret(dir.path(), "SECKILL_REDIS_PASSWORD", Some("short"), None).is_err(), "a weak one is refused");
        assert!(!kept_in(dir.path(), "SECKILL_REDIS_PASSWORD").exists(), "a configured secret is not written down");
        let redis = secret(dir.path(), "SECKILL_REDIS_PASSWORD", None, None).unwrap();
        let token = secret(dir.path(), "SECKILL_CLUSTER_TOKEN", None, None).unwrap();
        assert!(redis.secret.expose().len() >= 32 && redis.secret.expose() != token.secret.expose());
        let again = secret(dir.path(), "SECKILL_REDIS_PASSWORD", None, None).unwrap();
        assert_eq!(again.secret.expose(), redis.secret.expose());
        let path = kept_in(dir.path(), "SECKILL_CLUSTER_TOKEN");
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("{}\n", token.secret.expose()));
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        let (variable, value) = token.child_env("SECKILL_CLUSTER_TOKEN").unwrap();
        assert_eq!((variable.as_str(), PathBuf::from(value)), ("SECKILL_CLUSTER_TOKEN_FILE", path));

        let older = tempfile::tempdir().expect("temp dir");
        fs::write(older.path().join(LEGACY_FILE), "redis older-password-0123456789ab\n").unwrap();
        let found = secret(older.path(), "SECKILL_REDIS_PASSWORD", None, Some("redis")).unwrap();
        assert_eq!(found.secret.expose(), "older-password-0123456789ab");
        assert!(kept_in(older.path(), "SECKILL_REDIS_PASSWORD").exists(), "now kept by its variable");
    }

    /// Goal: the Redis config names the password for the right user, quoted, in a 0600 file.
    #[test]
    fn the_redis_auth_file_names_the_user_and_is_private() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("redis.conf");
        let secret = |text: &str| Secret::new(text).unwrap();
        write_redis_auth(&path, "", &secret("p\"w-0123456789abcdef")).unwrap();
        assert!(fs::read_to_string(&path).unwrap().contains("requirepass \"p\\\"w-0123456789abcdef\"\n"));
        write_redis_auth(&path, "seckill", &secret("pw-0123456789abcdef")).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("user default off\nuser \"seckill\" on \">pw-0123456789abcdef\" ~* &* +@all\n"),
            "{text}"
        );
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
