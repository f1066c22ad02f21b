//! `seckill fleet up|down`: a whole fleet as separate processes on this machine, from one
//! `cluster.toml`: Redis (AOF on, fsynced on every write under `[ledger] durability = "fsync"`)
//! when the ledger URL points at this machine, or a Redis Sentinel group (`sentinel`) when it
//! is a `redis+sentinel://` URL naming sentinels on this machine, every coordinator member,
//! every node, the sandbox payment provider (`seckill paysim`) when `[payments]` names one on
//! loopback, the order service, and nginx in front. Logs and pids go under a run directory, so `down`
//! can stop exactly what `up` started.
//!
//! Secrets (`credentials`): the cluster token, the admin token, the payment secret and the
//! passwords of the Redis and the PostgreSQL started here are the operator's when given, else
//! drawn once and kept in `<run dir>/secrets/<VARIABLE>` (0600), where an operator's command
//! finds them with `--run-dir`. Children get a kept secret as `<VARIABLE>_FILE`. Redis reads
//! its own from a 0600 file; PostgreSQL allows TCP only with `scram-sha-256` for a role that
//! owns the database. The Sentinel group has none yet (see `sentinel`).
//!
//! `restart NAME` stops one process and starts it again as `up` did (`process`); no command
//! here signals a pid the kernel has since given to another process.
//!
//! Order matters when stopping: nodes first (they drain and hand their leases back while the
//! coordinator can still reallocate), then the coordinator, then nginx, then the sentinels (so
//! stopping the master starts no failover), then Redis (SIGTERM makes it flush its AOF).

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::source::ConfigSource;

mod credentials;
mod process;
mod sentinel;

use process::{Entry, Launch};

/// How long `up` waits for a process to listen, and `down` for each process to exit.
const WAIT_MAX: Duration = Duration::from_secs(20);

/// How long `up` waits for a node to be ready. Longer than [`WAIT_MAX`]: on a Sentinel group
/// with `durability = "replica"` a master refuses writes until its replica has synced, which
/// after a failover took the sentinels 5–16 s on this project's 2-core machines, and a node is
/// ready only once the ledger takes its writes.
const READY_MAX: Duration = Duration::from_secs(60);

/// The kinds of process, in the order `down` stops them.
/// The order service stops after the nodes, so it stores the order events of their last sales.
/// The sandbox provider stops after it, so the notifications of the last payments can land.
const STOP_ORDER: [&str; 8] = ["node", "orders", "paysim", "coordinator", "nginx", "postgres", "sentinel", "redis"];

/// Starts the fleet and returns once every node is ready. The processes read the config from
/// its file, or, for the built-in config, from a copy written into the run directory.
pub async fn up(config: &ConfigSource, run_dir: &Path, lb_listen: SocketAddr) -> anyhow::Result<()> {
    let cluster = config.load()?;
    anyhow::ensure!(
        !run_dir.join("pids").exists(),
        "{} already holds a running fleet; run `fleet down` first",
        run_dir.display()
    );
    fs::create_dir_all(run_dir.join("logs"))?;
    // Absolute paths: nginx resolves its config relative to its prefix, and the children may
    // be inspected from anywhere.
    let run_dir = &fs::canonicalize(run_dir)?;
    let config = config.fleet_copy(run_dir)?;
    let started = start(&cluster, &config, run_dir, lb_listen).await;
    if let Err(failed) = started {
        // Whatever started before the failure is recorded in the pid file as it starts: stop it
        // all, so a failed `up` leaves no half fleet behind (Redis, members and nodes running
        // with no balancer in front).
        if run_dir.join("pids").exists() {
            if let Err(e) = down(run_dir) {
                tracing::warn!("fleet up failed, and stopping what it had started failed too: {e:#}");
            }
        }
        return Err(failed.context("fleet up failed; it stopped what it had started"));
    }
    Ok(())
}

/// Appends a started process's line to the pid file at once, so a later failure (or a crash
/// of `up` itself) still leaves every started process for `down` to stop.
fn record(pids: &mut String, run_dir: &Path, entry: Entry) -> anyhow::Result<()> {
    pids.push_str(&entry.line());
    fs::write(run_dir.join("pids"), pids.as_bytes())?;
    Ok(())
}

/// The fleet's secrets the children need, each as the operator gave it or kept under the run
/// directory.
struct Secrets {
    cluster_token: Option<credentials::FleetSecret>,
    admin_token: Option<credentials::FleetSecret>,
}

impl Secrets {
    fn of(cluster: &crate::config::Cluster, run_dir: &Path) -> anyhow::Result<Self> {
        let Some(group) = &cluster.coordinator else { return Ok(Secrets { cluster_token: None, admin_token: None }) };
        // A token the config generated is this process's alone: keep one every child shares.
        let configured = (!group.cluster.is_generated()).then(|| group.cluster.token().expose().to_string());
        let cluster_token =
            credentials::secret(run_dir, crate::config::CLUSTER_TOKEN_ENV, configured.as_deref(), None)?;
        let admin = group.admin_token.as_ref().map(|token| token.expose().to_string());
        let admin_token = credentials::secret(run_dir, crate::config::ADMIN_TOKEN_ENV, admin.as_deref(), None)?;
        Ok(Secrets { cluster_token: Some(cluster_token), admin_token: Some(admin_token) })
    }

    /// What every member, node, order service and lb-sync gets.
    fn tokens(&self) -> [Option<(String, std::ffi::OsString)>; 2] {
        [
            self.cluster_token.as_ref().and_then(|token| token.child_env(crate::config::CLUSTER_TOKEN_ENV)),
            self.admin_token.as_ref().and_then(|token| token.child_env(crate::config::ADMIN_TOKEN_ENV)),
        ]
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "starts every role in dependency order (Redis, PostgreSQL, the provider, members, nodes, the order service, nginx), a few lines each; split, the order would be spread over functions"
)]
async fn start(
    cluster: &crate::config::Cluster,
    config: &Path,
    run_dir: &Path,
    lb_listen: SocketAddr,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut pids = String::new();
    let secrets = Secrets::of(cluster, run_dir)?;
    let tokens = secrets.tokens();
    // Passwords of the servers started here, for every child that reaches them. (Children
    // inherit this process's environment too: an operator's own settings reach them as they
    // reached us.)
    let mut redis_env = None;
    let mut postgres_env = None;

    if let Some(port) = local_redis_port(&cluster.ledger.url) {
        let dir = run_dir.join("redis");
        fs::create_dir_all(&dir)?;
        let (user, configured) = crate::config::credentials_of(&cluster.ledger.url);
        let password =
            credentials::secret(run_dir, crate::config::REDIS_PASSWORD_ENV, Some(&configured), Some("redis"))?;
        let auth = dir.join("auth.conf");
        credentials::write_redis_auth(&auth, &user, &password.secret)?;
        redis_env = password.child_env(crate::config::REDIS_PASSWORD_ENV);
        // The config file first: Redis takes it only there.
        let mut redis = Launch::new("redis", "redis", "redis-server")
            .args([&auth])
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--appendonly", "yes", "--save", ""])
            .args([std::ffi::OsStr::new("--dir"), dir.as_os_str()]);
        // `durability = "fsync"` promises every answered sale is on disk, and the ledger refuses
        // a Redis that does not fsync each write; otherwise Redis' default, once a second.
        if cluster.ledger.durability()? == ledger::Durability::Fsync {
            redis = redis.args(["--appendfsync", "always"]);
        }
        record(&mut pids, run_dir, process::spawn(&redis, run_dir, false)?)?;
        wait_for_port(SocketAddr::from(([127, 0, 0, 1], port))).await.context("redis-server did not start")?;
    }
    if let Some(group) = sentinel::local_group(&cluster.ledger.url)? {
        let fsync = cluster.ledger.durability()? == ledger::Durability::Fsync;
        // Recorded as each process starts: a group that never gets ready is still stopped by
        // `down`.
        sentinel::start(&group, run_dir, fsync, |mut command, kind, name| {
            record(&mut pids, run_dir, process::spawn_command(&mut command, run_dir, kind, name, false)?)
        })
        .await?;
    }
    if let Some(group) = &cluster.coordinator {
        for member in &group.members {
            let launch = Launch::new("coordinator", &member.name, &exe)
                .args(["coordinator", "--id", &member.name, "--config"])
                .args([config])
                .envs(tokens.clone())
                .envs([redis_env.clone()]);
            record(&mut pids, run_dir, process::spawn(&launch, run_dir, false)?)?;
        }
    }
    for (node, place) in &cluster.nodes {
        let launch = Launch::new("node", node.id.as_str(), &exe)
            .args(["node", "--id", node.id.as_str(), "--config"])
            .args([config])
            .envs(tokens.clone())
            .envs([redis_env.clone()])
            .ready_at(place.advertised(place.listen));
        record(&mut pids, run_dir, process::spawn(&launch, run_dir, false)?)?;
    }
    if let Some((port, database)) = local_postgres(&cluster.orders.store) {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            tracing::info!("[orders] store: something already listens on {addr}; using it, starting no PostgreSQL");
        } else {
            let dir = postgres_dir(run_dir, port);
            let (role, configured) = crate::config::credentials_of(&cluster.orders.store);
            let password = credentials::secret(
                run_dir,
                crate::config::POSTGRES_PASSWORD_ENV,
                Some(&configured),
                Some("postgres"),
            )?;
            postgres_env = password.child_env(crate::config::POSTGRES_PASSWORD_ENV);
            let pid = tokio::task::spawn_blocking(move || {
                let login = backing::postgres::Login { role: &role, password: password.secret.expose() };
                backing::postgres::PostgresServer::start_detached(&dir, port, &database, &login)
            })
            .await?
            .context("starting a private PostgreSQL for [orders] store")?;
            record(&mut pids, run_dir, process::entry("postgres", "postgres", pid))?;
        }
    }
    // An order service that listens needs the payment provider's secret: the operator's, or one
    // drawn and kept in the run directory like the servers' passwords. The sandbox provider
    // started here signs with the same one.
    let payment_secret = match cluster.orders.listen.is_some() || cluster.payments.enabled() {
        true => {
            let configured = crate::config::payment_secret()?;
            let secret = credentials::secret(
                run_dir,
                crate::config::PAYMENT_SECRET_ENV,
                configured.as_deref(),
                Some("payment"),
            )?;
            secret.child_env(crate::config::PAYMENT_SECRET_ENV)
        }
        false => None,
    };
    if let Some(addr) = local_sandbox(&cluster.payments) {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            tracing::info!("[payments] url: something already listens on {addr}; using it, starting no sandbox");
        } else {
            anyhow::ensure!(
                cfg!(feature = "lab"),
                "[payments] url names a sandbox provider on this machine ({addr}), and this is the server build, which \
                 leaves the sandbox out: start one with a default build (`seckill paysim`), or set [payments] provider \
                 to a real one"
            );
            let paysim = Launch::new("paysim", "paysim", &exe)
                .args(["paysim", "--listen", &addr.to_string()])
                .envs([payment_secret.clone()]);
            let entry = process::spawn(&paysim, run_dir, false)?;
            let pid = Some(entry.pid);
            record(&mut pids, run_dir, entry)?;
            wait_for_port_of(addr, pid).await.with_context(|| {
                format!("the sandbox provider did not start; see {}", run_dir.join("logs/paysim.log").display())
            })?;
        }
    }
    // The order service, whose consumers read the order streams of the same Redis; its store is
    // `[orders] store` (PostgreSQL, or SQLite).
    // The tokens too: the order service reads the coordinator's catalogue, and its operators'
    // routes take the admin token.
    let orders = Launch::new("orders", "orders", &exe)
        .args(["orders", "--config"])
        .args([config])
        .envs(tokens.clone())
        .envs([redis_env, postgres_env, payment_secret]);
    let orders_entry = process::spawn(&orders, run_dir, false)?;
    let orders_pid = Some(orders_entry.pid);
    record(&mut pids, run_dir, orders_entry)?;
    let prefix = run_dir.join("nginx");
    fs::create_dir_all(&prefix)?;
    let conf = prefix.join("nginx.conf");
    let nginx = match &cluster.coordinator {
        // nginx follows the live nodes, so a node started later on this config (`seckill node
        // --id …`) takes traffic too: lb-sync writes its config and runs it.
        Some(_) => {
            let mut sync = Launch::new("nginx", "nginx", &exe)
                .args(["lb-sync", "--run-nginx", "--listen", &lb_listen.to_string(), "--config"])
                .args([config])
                .args([std::ffi::OsStr::new("--nginx-conf"), conf.as_os_str()])
                .envs(tokens.clone());
            if backing::postgres::is_root() {
                sync = sync.args(["--nginx-user", "root"]);
            }
            sync
        }
        None => {
            let nodes = crate::lb::listed_upstreams(cluster);
            fs::write(&conf, crate::lb::nginx_config(cluster, lb_listen, &nodes))?;
            // Run as root, workers that stay root as every other process of the fleet: nginx
            // would switch them to `nobody`, which cannot reach a run directory under a
            // private one such as /root, and the stock-page cache would answer 500.
            let user = backing::postgres::is_root().then_some("root");
            Launch::new("nginx", "nginx", crate::lb::sync::nginx_binary())
                .args([std::ffi::OsStr::new("-p"), prefix.as_os_str(), "-c".as_ref(), conf.as_os_str()])
                .args(["-g", &crate::lb::sync::nginx_globals(user)])
        }
    };
    record(&mut pids, run_dir, process::spawn(&nginx, run_dir, false)?)?;
    for (node, place) in &cluster.nodes {
        wait_ready(&place.advertised(place.listen))
            .await
            .with_context(|| format!("node {} is not ready; see {}", node.id, run_dir.join("logs").display()))?;
    }
    if let Some(addr) = cluster.orders.listen {
        wait_for_port_of(addr, orders_pid).await.with_context(|| {
            format!("the order service did not start; see {}", run_dir.join("logs/orders.log").display())
        })?;
    }
    wait_for_port(lb_listen).await.context("nginx did not start")?;
    Ok(())
}

/// Stops what `up` started, in `STOP_ORDER`, waiting for each to exit. A recorded pid the
/// kernel has given to another process since is left alone.
pub fn down(run_dir: &Path) -> anyhow::Result<()> {
    let path = run_dir.join("pids");
    let pids = fs::read_to_string(&path).with_context(|| format!("no fleet recorded in {}", run_dir.display()))?;
    let entries = process::parse_pids(&pids);
    for kind in STOP_ORDER {
        let group: Vec<&Entry> = entries.iter().filter(|entry| entry.kind == kind && entry.is_running()).collect();
        for entry in &group {
            tracing::info!(kind, name = %entry.name, pid = entry.pid, "stopping");
            signal(entry, stop_signal(kind));
        }
        for entry in group {
            stop_waiting(entry);
        }
    }
    fs::remove_file(&path)?;
    Ok(())
}

/// PostgreSQL's SIGTERM waits for every client to leave; SIGINT is its fast shutdown.
fn stop_signal(kind: &str) -> &'static str {
    if kind == "postgres" {
        "-INT"
    } else {
        "-TERM"
    }
}

/// Waits for a signalled process to exit, and kills it past [`WAIT_MAX`].
fn stop_waiting(entry: &Entry) {
    let deadline = Instant::now() + WAIT_MAX;
    while entry.is_present() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if entry.is_present() {
        tracing::warn!(kind = %entry.kind, name = %entry.name, pid = entry.pid, "did not stop in time; killing it");
        signal(entry, "-KILL");
    }
}

/// Stops the process `name` of the fleet and starts it again as `up` did, with the same
/// arguments and environment (secrets as `_FILE` paths under the run directory); a node is
/// waited for until it is ready. The pid file then names the new process.
pub async fn restart(run_dir: &Path, name: &str) -> anyhow::Result<u32> {
    let run_dir = &fs::canonicalize(run_dir).with_context(|| format!("no run directory {}", run_dir.display()))?;
    let path = run_dir.join("pids");
    let pids = fs::read_to_string(&path).with_context(|| format!("no fleet recorded in {}", run_dir.display()))?;
    let mut entries = process::parse_pids(&pids);
    let Some(index) = entries.iter().position(|entry| entry.name == name) else {
        let names: Vec<&str> = entries.iter().map(|entry| entry.name.as_str()).collect();
        anyhow::bail!("the fleet in {} has no process {name}; it has {}", run_dir.display(), names.join(", "));
    };
    let launch = process::launch_of(run_dir, name)?;
    let old = entries[index].clone();
    if old.is_running() {
        tracing::info!(kind = %old.kind, name, pid = old.pid, "stopping");
        signal(&old, stop_signal(&old.kind));
        stop_waiting(&old);
    }
    let fresh = process::spawn(&launch, run_dir, true)?;
    let pid = fresh.pid;
    entries[index] = fresh;
    fs::write(&path, entries.iter().map(Entry::line).collect::<String>())?;
    if let Some(addr) = &launch.ready_at {
        wait_ready(addr).await.with_context(|| {
            format!("{name} is not ready; see {}", run_dir.join("logs").join(format!("{name}.log")).display())
        })?;
    }
    Ok(pid)
}

/// The port of a `redis://` URL on this machine; Redis elsewhere is not ours to start.
/// Where the sandbox provider `[payments]` names listens, when `fleet up` is the one to start it:
/// `provider = "sandbox"` on a loopback address of this machine.
fn local_sandbox(payments: &crate::config::PaymentsSection) -> Option<SocketAddr> {
    if payments.provider != "sandbox" {
        return None;
    }
    let authority = payments.url.as_deref()?.strip_prefix("http://")?.trim_end_matches('/');
    let (host, port) = authority.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    match host {
        "localhost" | "127.0.0.1" => Some(SocketAddr::from(([127, 0, 0, 1], port))),
        _ => None,
    }
}

fn local_redis_port(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("redis://")?;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, host_port)| host_port);
    let (host, port) = host_port.rsplit_once(':')?;
    matches!(host, "127.0.0.1" | "localhost").then(|| port.parse().ok()).flatten()
}

/// The port and database of a `postgres://seckill@127.0.0.1:PORT/DB` store URL: a PostgreSQL
/// on this machine, for the role `up` makes (`seckill`, the name testkit's servers use), that
/// `up` may start.
fn local_postgres(url: &str) -> Option<(u16, String)> {
    let rest = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://"))?;
    let (user, rest) = rest.split_once('@')?;
    let (host_port, database) = rest.split_once('/')?;
    let (host, port) = host_port.rsplit_once(':')?;
    let database = database.split('?').next()?.to_string();
    let ours =
        user.split(':').next() == Some(backing::postgres::SUPERUSER) && matches!(host, "127.0.0.1" | "localhost");
    (ours && !database.is_empty()).then(|| port.parse().ok().map(|port| (port, database))).flatten()
}

/// Where a fleet's PostgreSQL keeps its cluster: the run directory, unless this process is root
/// (the server then runs as the `postgres` user, who cannot be assumed to reach the run
/// directory): a directory of its own under the temp dir, named after the port.
fn postgres_dir(run_dir: &Path, port: u16) -> PathBuf {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status.lines().any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(2) == Some("0"))
    });
    if root {
        std::env::temp_dir().join(format!("seckill-fleet-postgres-{port}"))
    } else {
        run_dir.join("postgres")
    }
}

/// Signals the process of `entry`, only if its pid still names it.
fn signal(entry: &Entry, signal: &str) {
    if entry.is_running() {
        let pid = entry.pid.to_string();
        let _ = Command::new("kill").args([signal, &pid]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

async fn wait_for_port(addr: SocketAddr) -> anyhow::Result<()> {
    wait_for_port_of(addr, None).await
}

/// Waits for `addr` to listen; with the pid of the process that should, gives up as soon as it
/// has exited (its log says why) instead of waiting out the deadline.
async fn wait_for_port_of(addr: SocketAddr, pid: Option<u32>) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT_MAX;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "nothing listens on {addr} after {WAIT_MAX:?}");
        if let Some(pid) = pid {
            anyhow::ensure!(process::start_time(pid).is_some(), "the process that should listen on {addr} exited");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn wait_ready(addr: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_MAX;
    loop {
        let status = crate::probe::get(addr, "/ready", Duration::from_secs(5)).await;
        if status.is_ok_and(|status| status == hyper::StatusCode::OK) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "not ready after {READY_MAX:?}: is the ledger ([ledger] url) reachable and taking writes?"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: `down` never signals a pid the kernel gave to another process since `up` recorded
    /// it. Method: a pid file naming a live `sleep` with another start time; after `down` the
    /// `sleep` still runs and the fleet is forgotten.
    #[test]
    fn down_leaves_a_reused_pid_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut stranger = Command::new("sleep").arg("30").spawn().expect("sleep runs");
        let recorded = process::entry("node", "n1", stranger.id());
        let reused = Entry { started: recorded.started.map(|started| started.saturating_sub(1)), ..recorded };
        fs::write(dir.path().join("pids"), reused.line()).expect("pid file");
        down(dir.path()).expect("down");
        let still_running = stranger.try_wait().expect("wait").is_none();
        let _ = stranger.kill();
        let _ = stranger.wait();
        assert!(still_running, "down signalled a process it did not start");
        assert!(!dir.path().join("pids").exists(), "the fleet is forgotten");
    }
}
