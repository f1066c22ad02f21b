//! A private PostgreSQL for tests, never one someone else is using: [`PostgresServer`] is one
//! `postgres` child from Debian's package (the newest installed under `/usr/lib/postgresql`),
//! its cluster made by `initdb` in a temp dir, listening on a free loopback port and on a Unix
//! socket in that dir, with fsync on (so SIGKILL loses no committed transaction).
//!
//! PostgreSQL refuses to run as root: when this process is root, `initdb` and `postgres` run as
//! the `postgres` OS user (`setpriv`, which execs, so the child is the server itself).
//!
//! **Authentication.** A test's server trusts every connection, which is fine for a private
//! server in a temp dir that lives as long as the test. A detached one (`fleet up`'s, which
//! outlives its caller and holds real orders) does not: see `secured.rs`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::ports::free_port;

mod secured;

pub use secured::Login;

/// How long a (re)started server may take to accept connections: crash recovery after a kill
/// included, on a loaded test machine.
const STARTUP_MAX: Duration = Duration::from_secs(60);

/// How long a fast shutdown may take before the server is killed.
const SHUTDOWN_MAX: Duration = Duration::from_secs(30);

/// Where Debian installs each major version's binaries.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// The superuser `initdb` creates, and the user [`PostgresServer::url`] connects as.
pub const SUPERUSER: &str = "seckill";

/// The database [`PostgresServer::start`] creates.
pub const DATABASE: &str = "seckill";

/// The OS user PostgreSQL runs as when this process is root.
const OS_USER: &str = "postgres";

pub struct PostgresServer {
    pub port: u16,
    /// The temp dir: `data/` (the cluster), the Unix socket and `postgres.log`.
    dir: PathBuf,
    bin: PathBuf,
    child: Option<Child>,
    /// Outlives this handle ([`PostgresServer::start_detached`]): Drop leaves it running. Such
    /// a server is also [`secured`]: passwords over TCP, its socket for its OS user only.
    detached: bool,
}

/// The newest installed major version's `bin/` with `initdb` and `postgres` in it.
pub fn find_bin() -> anyhow::Result<PathBuf> {
    let entries = std::fs::read_dir(DEBIAN_ROOT)
        .with_context(|| format!("no {DEBIAN_ROOT}: install Debian's postgresql (scripts/test does)"))?;
    let mut versions: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file()).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .with_context(|| format!("no {DEBIAN_ROOT}/*/bin/initdb: install Debian's postgresql (scripts/test does)"))
}

/// Whether this process runs as root (effective uid 0), read from `/proc/self/status`.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            .is_some_and(|effective| effective == "0")
    })
}

/// `program` run as the `postgres` OS user when root, else as this user.
fn server_command(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("setpriv");
        command.args([&format!("--reuid={OS_USER}"), &format!("--regid={OS_USER}"), "--init-groups", "--"]);
        command.arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn fresh_dir() -> anyhow::Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "seckill-postgres-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    if is_root() {
        let status = Command::new("chown").arg(format!("{OS_USER}:{OS_USER}")).arg(&dir).status()?;
        anyhow::ensure!(status.success(), "chown {OS_USER} {} failed", dir.display());
    }
    Ok(dir)
}

impl PostgresServer {
    /// Makes a cluster, starts it and creates the database [`DATABASE`].
    pub fn start() -> anyhow::Result<PostgresServer> {
        let bin = find_bin()?;
        let dir = fresh_dir()?;
        let mut server = PostgresServer { port: 0, dir, bin, child: None, detached: false };
        server.initdb()?;
        // The port is free when probed but could be taken before PostgreSQL binds it; try a few.
        let mut started = false;
        for _ in 0..5 {
            server.port = free_port()?;
            if server.spawn()? {
                started = true;
                break;
            }
        }
        anyhow::ensure!(started, "postgres did not start; see {}", server.log_path().display());
        server.create_database(DATABASE)?;
        Ok(server)
    }

    /// A server that outlives this process (`seckill fleet up`): its cluster under `dir`, made
    /// by `initdb` on first use and kept across restarts, on `port`, with database `database`
    /// owned by `login`'s role, which logs in with `login`'s password (set again on every start,
    /// so a new one takes effect with a restart). Returns the postmaster's pid; stop it with
    /// SIGINT (fast shutdown). When this process is root the server runs as the `postgres`
    /// user, who must be able to reach `dir`.
    pub fn start_detached(dir: &Path, port: u16, database: &str, login: &Login) -> anyhow::Result<u32> {
        let bin = find_bin()?;
        secured::private_dir(dir)?;
        let mut server = PostgresServer { port, dir: dir.to_path_buf(), bin, child: None, detached: true };
        if server.data_dir().join("PG_VERSION").exists() {
            server.refuse_trust_over_tcp()?;
        } else {
            server.initdb_secured()?;
        }
        anyhow::ensure!(server.spawn()?, "postgres did not start on port {port}; see {}", server.log_path().display());
        let pid = server.pid().context("postgres exited at once")?;
        if let Err(e) = server.set_login(login, database) {
            // Not recorded by the caller yet: left running, nothing would ever stop it.
            let _ = server.stop();
            return Err(e.context(format!(
                "setting up role {:?} and database {database:?} on the PostgreSQL of {}",
                login.role,
                dir.display()
            )));
        }
        Ok(pid)
    }

    /// `postgres://seckill@127.0.0.1:PORT/seckill`.
    pub fn url(&self) -> String {
        self.url_of(DATABASE)
    }

    /// The URL of another database on this server.
    pub fn url_of(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates an empty database (`createdb`), for a test that needs one of its own.
    pub fn create_database(&self, name: &str) -> anyhow::Result<()> {
        let output = Command::new(self.bin.join("createdb"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", SUPERUSER, name])
            .stdin(Stdio::null())
            .output()
            .context("cannot run createdb")?;
        anyhow::ensure!(output.status.success(), "createdb {name}: {}", String::from_utf8_lossy(&output.stderr));
        Ok(())
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    fn initdb(&self) -> anyhow::Result<()> {
        // --no-sync: initdb's own flush only matters if the machine crashes during the test,
        // which loses the temp dir anyway; the server runs with fsync on.
        self.run_initdb(&["-U", SUPERUSER, "--auth=trust", "--no-sync"])
    }

    fn run_initdb(&self, auth: &[&str]) -> anyhow::Result<()> {
        let output = server_command(&self.bin.join("initdb"))
            .arg("-D")
            .arg(self.data_dir())
            .args(auth)
            .args(["--encoding=UTF8", "--locale=C"])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .context("cannot run initdb")?;
        anyhow::ensure!(
            output.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }

    /// Starts `postgres` and polls `pg_isready` until it accepts connections. False if it
    /// exited (port taken) or did not get ready in time.
    fn spawn(&mut self) -> anyhow::Result<bool> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path())?;
        let mut command = server_command(&self.bin.join("postgres"));
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on"])
            .args(if self.detached { secured::SERVER_SETTINGS } else { &[] })
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own process group: a Ctrl-C meant for the test (or for `fleet up`) is not its.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        self.child = Some(command.spawn().context("cannot run postgres")?);
        let deadline = Instant::now() + STARTUP_MAX;
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Ok(false);
            }
            if self.is_ready() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Ok(false)
    }

    fn is_ready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", SUPERUSER, "-d", "postgres"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// The postmaster's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Fast shutdown (SIGINT): open transactions roll back, committed data stays. Kills the
    /// server if it has not stopped within 30 s.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        let signalled = Command::new("kill").args(["-INT", &child.id().to_string()]).status()?.success();
        let deadline = Instant::now() + SHUTDOWN_MAX;
        while signalled && Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
        self.kill();
        anyhow::bail!("postgres on port {} did not stop within {SHUTDOWN_MAX:?}; killed", self.port)
    }

    /// Starts again on the same directory and port (stopping it first if it runs); crash
    /// recovery replays the WAL after a kill.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        // After a kill, the old backends may take a moment to exit and free the shared memory
        // the new postmaster checks; spawn fails fast then, so try until the deadline.
        let deadline = Instant::now() + STARTUP_MAX;
        loop {
            if self.spawn()? {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "postgres did not restart on port {}; see {}",
                self.port,
                self.log_path().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGSTOP to the postmaster and every backend: the server keeps its connections and
    /// answers nothing, as a stuck disk or a long GC pause of its VM would. [`Self::thaw`]
    /// resumes it.
    pub fn freeze(&self) {
        self.signal_all("-STOP");
    }

    /// SIGCONT after [`Self::freeze`].
    pub fn thaw(&self) {
        self.signal_all("-CONT");
    }

    fn signal_all(&self, signal: &str) {
        if let Some(child) = &self.child {
            let pid = child.id();
            let mut targets = vec![pid];
            targets.extend(children_of(pid));
            let _ = Command::new("kill")
                .arg(signal)
                .args(targets.iter().map(u32::to_string))
                .stderr(Stdio::null())
                .status();
        }
    }

    /// SIGKILL to the postmaster and every backend at once, as a crash of the machine would:
    /// no shutdown checkpoint, no goodbye. (Each backend is its own process group, so the
    /// postmaster's children are found in `/proc`; the postmaster is stopped first so it forks
    /// no new one meanwhile.)
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id();
            let _ = Command::new("kill").args(["-STOP", &pid.to_string()]).stderr(Stdio::null()).status();
            let mut targets = children_of(pid);
            targets.push(pid);
            let _ = Command::new("kill")
                .arg("-KILL")
                .args(targets.iter().map(u32::to_string))
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The processes whose parent is `parent`, from `/proc/<pid>/stat` (`pid (comm) state ppid …`,
/// where comm may hold spaces and parentheses, so the fields are read after the last `)`).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (_, fields) = stat.rsplit_once(')')?;
            let ppid: u32 = fields.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
