//! The passwords of the Redis and the PostgreSQL `fleet up` starts. Each is the one the config
//! gives (in its URL, or by `SECKILL_REDIS_PASSWORD` / `SECKILL_POSTGRES_PASSWORD`, which
//! `Cluster::load` puts there); else the one kept in `<run dir>/credentials`, drawn at random by
//! the first `up` and readable by its owner alone, so every later `up` on that run directory
//! finds its servers' passwords again. The children get them by environment, never by argument
//! and never in a log; Redis reads its own from a 0600 file, never from its command line.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::Context;
use protocol::Secret;

/// The file under the run directory that keeps drawn passwords, one `<kind> <password>` a line.
const FILE: &str = "credentials";

/// `configured` if the config gave one; else the password of `kind` kept in the run
/// directory, drawn and kept there when it has none. `env` names where an operator gives it,
/// for the error that refuses a weak one.
pub fn password(run_dir: &Path, kind: &str, configured: &str, env: &str) -> anyhow::Result<Secret> {
    if !configured.is_empty() {
        return Secret::new(configured)
            .map_err(|weak| anyhow::anyhow!("the {kind} password (from the config's URL or {env}) {weak}"));
    }
    let path = run_dir.join(FILE);
    let kept = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let found = kept.lines().find_map(|line| line.strip_prefix(kind)?.strip_prefix(' '));
    if let Some(password) = found {
        return Secret::new(password)
            .map_err(|weak| anyhow::anyhow!("the {kind} password kept in {} {weak}", path.display()));
    }
    let drawn = Secret::generate().context("no random source for a password")?;
    write_private(&path, &format!("{kept}{kind} {}\n", drawn.expose()))?;
    Ok(drawn)
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

    /// Goal: a configured password wins; without one the first call draws a strong password and
    /// keeps it in a 0600 file, and later calls (a later `up`) get the same one back, per kind.
    #[test]
    fn a_drawn_password_is_kept_privately_and_found_again() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(
            password(dir.path(), "redis", "given-0123456789abcdef", "ENV").unwrap().expose(),
            "given-0123456789abcdef"
        );
        assert!(password(dir.path(), "redis", "short", "ENV").is_err(), "a weak password is refused");
        assert!(!dir.path().join(FILE).exists(), "a configured password is not written down");
        let redis = password(dir.path(), "redis", "", "ENV").unwrap();
        let postgres = password(dir.path(), "postgres", "", "ENV").unwrap();
        assert!(redis.expose().len() >= 32 && redis.expose() != postgres.expose());
        assert_eq!(password(dir.path(), "redis", "", "ENV").unwrap().expose(), redis.expose());
        assert_eq!(password(dir.path(), "postgres", "", "ENV").unwrap().expose(), postgres.expose());
        let mode = fs::metadata(dir.path().join(FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
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
