//! A detached server's authentication: TCP only with a password (`scram-sha-256`, never
//! `trust`), for a login role that owns the database and is no superuser. The superuser
//! (`postgres`) is reached only through the Unix socket, which `unix_socket_permissions = 0700`
//! in a 0700 directory leaves to the server's own OS user (and root): that is how the caller
//! creates the role and sets its password. The superuser's TCP password is drawn at `initdb`
//! and kept nowhere.
//!
//! Passwords never appear in a command line: `initdb` reads the superuser's from a 0600 file
//! removed right after, and the role's goes to `psql` on its standard input, in a session that
//! keeps its statements out of the server log even when one fails.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context;

use super::{is_root, PostgresServer, OS_USER};

/// The superuser of a secured cluster, reached only through the socket.
const ADMIN: &str = "postgres";

/// Settings a secured server starts with, on top of the usual ones.
pub(super) const SERVER_SETTINGS: &[&str] =
    &["-c", "unix_socket_permissions=0700", "-c", "password_encryption=scram-sha-256"];

/// The role clients log in as, and its password.
pub struct Login<'a> {
    pub role: &'a str,
    pub password: &'a str,
}

impl std::fmt::Debug for Login<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login").field("role", &self.role).field("password", &"<redacted>").finish()
    }
}

/// Creates `dir` readable by the server's OS user alone.
pub(super) fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    if is_root() {
        let status = Command::new("chown").arg(format!("{OS_USER}:{OS_USER}")).arg(dir).status()?;
        anyhow::ensure!(status.success(), "chown {OS_USER} {} failed", dir.display());
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod 700 {}", dir.display()))
}

impl PostgresServer {
    pub(super) fn initdb_secured(&self) -> anyhow::Result<()> {
        let pwfile = self.dir.join("initdb-pwfile");
        write_private(&pwfile, &random_hex()?)?;
        let auth = ["-U", ADMIN, "--auth-local=trust", "--auth-host=scram-sha-256", "--pwfile"];
        let pwfile_arg = pwfile.to_string_lossy().into_owned();
        let made = self.run_initdb(&[&auth[..], &[&pwfile_arg]].concat());
        let removed = std::fs::remove_file(&pwfile);
        made?;
        removed.with_context(|| format!("removing {}", pwfile.display()))
    }

    /// A cluster made before `fleet up` had passwords trusts every TCP connection: it must not
    /// run as if it were secured.
    pub(super) fn refuse_trust_over_tcp(&self) -> anyhow::Result<()> {
        let hba = self.data_dir().join("pg_hba.conf");
        let text = std::fs::read_to_string(&hba).with_context(|| format!("reading {}", hba.display()))?;
        let trusting = text.lines().map(str::trim).any(|line| {
            let mut fields = line.split_whitespace();
            fields.next().is_some_and(|kind| kind.starts_with("host")) && fields.any(|field| field == "trust")
        });
        anyhow::ensure!(
            !trusting,
            "{} trusts TCP connections without a password (made by an older `fleet up`): move its orders elsewhere \
             and delete {}, or set pg_hba.conf to scram-sha-256 and give role passwords yourself",
            hba.display(),
            self.dir.display()
        );
        Ok(())
    }

    /// Creates `login.role` if missing (LOGIN, no superuser), sets its password, and creates
    /// `database` owned by it if missing; through the socket, as the superuser.
    pub(super) fn set_login(&self, login: &Login, database: &str) -> anyhow::Result<()> {
        let (role, db) = (identifier(login.role), identifier(database));
        // The password is in the last statement; the settings before it keep every statement of
        // the session out of the log, whatever happens.
        let script = format!(
            "SET log_statement = 'none';\n\
             SET log_min_error_statement = 'panic';\n\
             SET password_encryption = 'scram-sha-256';\n\
             SELECT 'CREATE ROLE {role} LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {role_text})\\gexec\n\
             SELECT 'CREATE DATABASE {db} OWNER {role}' WHERE NOT EXISTS \
             (SELECT FROM pg_database WHERE datname = {db_text})\\gexec\n\
             ALTER ROLE {role} WITH LOGIN NOSUPERUSER PASSWORD {password};\n",
            role_text = literal(login.role),
            db_text = literal(database),
            password = literal(login.password),
        );
        let mut psql = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-U", ADMIN, "-d", "postgres"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run psql")?;
        let written = psql.stdin.take().context("psql has no stdin")?.write_all(script.as_bytes());
        let output = psql.wait_with_output()?;
        written.context("writing to psql")?;
        anyhow::ensure!(output.status.success(), "psql: {}", String::from_utf8_lossy(&output.stderr).trim());
        Ok(())
    }
}

/// `text` as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `text` as a quoted SQL identifier.
fn identifier(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

/// Writes `text` to a new file only its owner (the server's OS user) can read.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())?;
    if is_root() {
        let status = Command::new("chown").arg(format!("{OS_USER}:{OS_USER}")).arg(path).status()?;
        anyhow::ensure!(status.success(), "chown {OS_USER} {} failed", path.display());
    }
    Ok(())
}

/// 32 random bytes from the kernel, as hex.
fn random_hex() -> anyhow::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
