//! Checks on the servers `seckill fleet up` starts: Redis and PostgreSQL refuse whoever lacks the
//! passwords the fleet keeps, and no password shows in a command line or a log.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The passwords `fleet up` drew and kept in `<run dir>/secrets/<VARIABLE>`, which only its
/// owner may read.
pub struct Kept {
    pub redis: String,
    pub postgres: String,
}

pub fn kept_passwords(run_dir: &Path) -> Kept {
    let find = |variable: &str| {
        let path = run_dir.join("secrets").join(variable);
        let mode = std::fs::metadata(&path).expect("fleet up keeps drawn secrets").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{} is for its owner only", path.display());
        std::fs::read_to_string(&path).unwrap().trim_end().to_string()
    };
    let kept = Kept { redis: find("SECKILL_REDIS_PASSWORD"), postgres: find("SECKILL_POSTGRES_PASSWORD") };
    assert!(kept.redis.len() >= 32 && kept.postgres.len() >= 32 && kept.redis != kept.postgres, "strong, distinct");
    kept
}

/// Redis on `port` answers nothing without the password (NOAUTH) or with a wrong one, and
/// answers with it.
pub fn assert_redis_locked(port: u16, password: &str) {
    let ping = |url: String| -> Result<String, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut connection = client.get_connection().map_err(|e| e.to_string())?;
        redis::cmd("PING").query(&mut connection).map_err(|e| e.to_string())
    };
    let anonymous = ping(format!("redis://127.0.0.1:{port}"));
    assert!(anonymous.as_ref().is_err_and(|e| e.contains("NOAUTH")), "Redis without a password: {anonymous:?}");
    let wrong = ping(format!("redis://:wrong-password-0123456789@127.0.0.1:{port}"));
    // redis-rs reports Redis' WRONGPASS as an authentication failure.
    let refused = |e: &String| e.contains("WRONGPASS") || e.contains("AuthenticationFailed");
    assert!(wrong.as_ref().is_err_and(refused), "Redis with a wrong password: {wrong:?}");
    let right = ping(format!("redis://:{password}@127.0.0.1:{port}"));
    assert_eq!(right.as_deref(), Ok("PONG"), "Redis with the kept password");
}

/// PostgreSQL on `port` refuses role `seckill` over TCP without a password and with a wrong
/// one (and each of `refused`), takes `password`, the role is no superuser, and `data_dir`'s
/// pg_hba.conf asks every TCP connection for `scram-sha-256`.
pub fn assert_postgres_locked(port: u16, password: &str, refused: &[&str], data_dir: &Path) {
    let psql = |password: Option<&str>, sql: &str| {
        let mut command = Command::new(testkit::postgres::find_bin().unwrap().join("psql"));
        command
            .args(["-X", "-w", "-At", "-h", "127.0.0.1", "-p", &port.to_string(), "-U", "seckill", "-d", "seckill"])
            .args(["-c", sql])
            .env_remove("PGPASSWORD")
            .env_remove("PGPASSFILE")
            .stdin(Stdio::null());
        if let Some(password) = password {
            command.env("PGPASSWORD", password);
        }
        command.output().unwrap()
    };
    let anonymous = psql(None, "select 1");
    assert!(!anonymous.status.success(), "PostgreSQL without a password let role seckill in");
    for wrong in refused.iter().chain(&["wrong-password-0123456789"]) {
        let tried = psql(Some(wrong), "select 1");
        let refusal = String::from_utf8_lossy(&tried.stderr);
        assert!(!tried.status.success() && refusal.contains("password authentication failed"), "{refusal}");
    }
    let right = psql(Some(password), "select rolsuper from pg_roles where rolname = current_user");
    assert!(right.status.success(), "the kept password: {}", String::from_utf8_lossy(&right.stderr));
    assert_eq!(String::from_utf8_lossy(&right.stdout).trim(), "f", "the order service's role is no superuser");
    let hba = std::fs::read_to_string(data_dir.join("pg_hba.conf")).unwrap();
    let host_rules: Vec<&str> = hba.lines().filter(|line| line.trim_start().starts_with("host")).collect();
    assert!(!host_rules.is_empty(), "{hba}");
    for rule in host_rules {
        assert!(rule.trim_end().ends_with("scram-sha-256"), "a TCP rule without scram-sha-256: {rule}");
    }
}

/// No process of the pid file (`<kind> <name> <pid>` lines) has a secret in its command line.
pub fn assert_no_argv_holds(pids: &str, secrets: &[&str]) {
    for pid in pids.lines().filter_map(|line| line.split_whitespace().nth(2)) {
        let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
        assert!(!argv.is_empty(), "process {pid} runs");
        for secret in secrets {
            assert!(!argv.contains(secret), "a password in the command line of {pid}: {argv}");
        }
    }
}

/// No file under `dirs` (recursively; what is missing is skipped) holds a secret.
pub fn assert_no_log_holds(dirs: &[std::path::PathBuf], secrets: &[&str]) {
    let mut files = 0;
    let mut pending = dirs.to_vec();
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().filter_map(Result::ok).map(|entry| entry.path()));
        } else if let Ok(bytes) = std::fs::read(&path) {
            files += 1;
            let text = String::from_utf8_lossy(&bytes);
            for secret in secrets {
                assert!(!text.contains(secret), "a password in {}", path.display());
            }
        }
    }
    assert!(files > 0, "logs to read in {dirs:?}");
}
