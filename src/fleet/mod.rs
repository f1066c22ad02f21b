//! `seckill fleet up|down`: a whole fleet as separate processes on this machine, from one
//! `cluster.toml`: Redis (AOF on, fsynced on every write under `[ledger] durability = "fsync"`)
//! when the ledger URL points at this machine, or a Redis Sentinel group (`sentinel`) when it
//! is a `redis+sentinel://` URL naming sentinels on this machine, every coordinator member,
//! every node, the sandbox payment provider (`seckill paysim`) when `[payments]` names one on
//! loopback, the order service, and nginx in front. Logs and pids go under a run directory, so `down`
//! can stop exactly what `up` started.
//!
//! Every coordinator member and node gets the cluster token through its environment
//! (`SECKILL_CLUSTER_TOKEN`): the configured one, or one drawn here when none is configured.
//! It is never written to the run directory or a log.
//!
//! The Redis and the PostgreSQL started here need passwords (`credentials`): Redis reads its
//! own from a 0600 file, PostgreSQL allows TCP only with `scram-sha-256` for a role that owns
//! the database, and the children get them by environment (`SECKILL_REDIS_PASSWORD`,
//! `SECKILL_POSTGRES_PASSWORD`). The Sentinel group has none yet (see `sentinel`).
//!
//! Order matters when stopping: nodes first (they drain and hand their leases back while the
//! coordinator can still reallocate), then the coordinator, then nginx, then the sentinels (so
//! stopping the master starts no failover), then Redis (SIGTERM makes it flush its AOF).

use std::fs;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::source::ConfigSource;

mod credentials;
mod sentinel;

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
fn record(pids: &mut String, run_dir: &Path, line: String) -> anyhow::Result<()> {
    pids.push_str(&line);
    fs::write(run_dir.join("pids"), pids.as_bytes())?;
    Ok(())
}

async fn start(
    cluster: &crate::config::Cluster,
    config: &Path,
    run_dir: &Path,
    lb_listen: SocketAddr,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut pids = String::new();
    // The children load the same config: a configured token reaches them as it reached us;
    // otherwise they all get the one drawn here, by environment (not by file, not by argument:
    // `ps` shows arguments to everyone).
    let drawn_token = cluster
        .coordinator
        .as_ref()
        .filter(|group| group.cluster.is_generated())
        .map(|group| (crate::config::CLUSTER_TOKEN_ENV, group.cluster.token().expose().to_string()));
    // Passwords of the servers started here, for every child that reaches them. (Children
    // inherit this process's environment too: an operator's own settings reach them as they
    // reached us.)
    let mut redis_env = None;
    let mut postgres_env = None;

    if let Some(port) = local_redis_port(&cluster.ledger.url) {
        let dir = run_dir.join("redis");
        fs::create_dir_all(&dir)?;
        let (user, configured) = crate::config::credentials_of(&cluster.ledger.url);
        let password = credentials::password(run_dir, "redis", &configured, crate::config::REDIS_PASSWORD_ENV)?;
        let auth = dir.join("auth.conf");
        credentials::write_redis_auth(&auth, &user, &password)?;
        redis_env = Some((crate::config::REDIS_PASSWORD_ENV, password.expose().to_string()));
        let mut redis = Command::new("redis-server");
        // The config file first: Redis takes it only there.
        redis
            .arg(&auth)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--appendonly", "yes", "--save", ""])
            .arg("--dir")
            .arg(&dir);
        // `durability = "fsync"` promises every answered sale is on disk, and the ledger refuses
        // a Redis that does not fsync each write; otherwise Redis' default, once a second.
        if cluster.ledger.durability()? == ledger::Durability::Fsync {
            redis.args(["--appendfsync", "always"]);
        }
        record(&mut pids, run_dir, spawn(redis, run_dir, "redis", "redis")?)?;
        wait_for_port(SocketAddr::from(([127, 0, 0, 1], port))).await.context("redis-server did not start")?;
    }
    if let Some(group) = sentinel::local_group(&cluster.ledger.url)? {
        let fsync = cluster.ledger.durability()? == ledger::Durability::Fsync;
        // Recorded as each process starts: a group that never gets ready is still stopped by
        // `down`.
        sentinel::start(&group, run_dir, fsync, |command, kind, name| {
            record(&mut pids, run_dir, spawn(command, run_dir, kind, name)?)
        })
        .await?;
    }
    if let Some(group) = &cluster.coordinator {
        for member in &group.members {
            let mut process = Command::new(&exe);
            process
                .args(["coordinator", "--id", &member.name, "--config"])
                .arg(config)
                .envs(drawn_token.clone())
                .envs(redis_env.clone());
            record(&mut pids, run_dir, spawn(process, run_dir, "coordinator", &member.name)?)?;
        }
    }
    for (node, _) in &cluster.nodes {
        let mut process = Command::new(&exe);
        process
            .args(["node", "--id", node.id.as_str(), "--config"])
            .arg(config)
            .envs(drawn_token.clone())
            .envs(redis_env.clone());
        record(&mut pids, run_dir, spawn(process, run_dir, "node", node.id.as_str())?)?;
    }
    if let Some((port, database)) = local_postgres(&cluster.orders.store) {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            tracing::info!("[orders] store: something already listens on {addr}; using it, starting no PostgreSQL");
        } else {
            let dir = postgres_dir(run_dir, port);
            let (role, configured) = crate::config::credentials_of(&cluster.orders.store);
            let password =
                credentials::password(run_dir, "postgres", &configured, crate::config::POSTGRES_PASSWORD_ENV)?;
            postgres_env = Some((crate::config::POSTGRES_PASSWORD_ENV, password.expose().to_string()));
            let pid = tokio::task::spawn_blocking(move || {
                let login = backing::postgres::Login { role: &role, password: password.expose() };
                backing::postgres::PostgresServer::start_detached(&dir, port, &database, &login)
            })
            .await?
            .context("starting a private PostgreSQL for [orders] store")?;
            record(&mut pids, run_dir, format!("postgres postgres {pid}\n"))?;
        }
    }
    // An order service that listens needs the payment provider's secret: the operator's, or one
    // drawn and kept in the run directory like the servers' passwords. The sandbox provider
    // started here signs with the same one.
    let payment_secret = match cluster.orders.listen.is_some() || cluster.payments.enabled() {
        true => {
            let configured = crate::config::payment_secret()?.unwrap_or_default();
            let secret = credentials::password(run_dir, "payment", &configured, crate::config::PAYMENT_SECRET_ENV)?;
            Some((crate::config::PAYMENT_SECRET_ENV, secret.expose().to_string()))
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
            let mut paysim = Command::new(&exe);
            paysim.args(["paysim", "--listen", &addr.to_string()]).envs(payment_secret.clone());
            let line = spawn(paysim, run_dir, "paysim", "paysim")?;
            let pid = line.split_whitespace().nth(2).and_then(|pid| pid.parse().ok());
            record(&mut pids, run_dir, line)?;
            wait_for_port_of(addr, pid).await.with_context(|| {
                format!("the sandbox provider did not start; see {}", run_dir.join("logs/paysim.log").display())
            })?;
        }
    }
    // The order service, whose consumers read the order streams of the same Redis; its store is
    // `[orders] store` (PostgreSQL, or SQLite).
    let mut orders = Command::new(&exe);
    // The cluster token too: the order service reads the coordinator's catalogue.
    orders
        .args(["orders", "--config"])
        .arg(config)
        .envs(drawn_token.clone())
        .envs(redis_env)
        .envs(postgres_env)
        .envs(payment_secret);
    let orders_line = spawn(orders, run_dir, "orders", "orders")?;
    let orders_pid = orders_line.split_whitespace().nth(2).and_then(|pid| pid.parse().ok());
    record(&mut pids, run_dir, orders_line)?;
    let prefix = run_dir.join("nginx");
    fs::create_dir_all(&prefix)?;
    let conf = prefix.join("nginx.conf");
    let nginx = match &cluster.coordinator {
        // nginx follows the live nodes, so a node started later on this config (`seckill node
        // --id …`) takes traffic too: lb-sync writes its config and runs it.
        Some(_) => {
            let mut sync = Command::new(&exe);
            sync.args(["lb-sync", "--run-nginx", "--listen", &lb_listen.to_string(), "--config"])
                .arg(config)
                .arg("--nginx-conf")
                .arg(&conf)
                .envs(drawn_token.clone());
            if backing::postgres::is_root() {
                sync.args(["--nginx-user", "root"]);
            }
            sync
        }
        None => {
            let nodes = crate::lb::listed_upstreams(cluster);
            fs::write(&conf, crate::lb::nginx_config(cluster, lb_listen, &nodes))?;
            let mut nginx = Command::new(crate::lb::sync::nginx_binary());
            // Run as root, workers that stay root as every other process of the fleet: nginx
            // would switch them to `nobody`, which cannot reach a run directory under a
            // private one such as /root, and the stock-page cache would answer 500.
            let user = backing::postgres::is_root().then_some("root");
            nginx.arg("-p").arg(&prefix).arg("-c").arg(&conf).args(["-g", &crate::lb::sync::nginx_globals(user)]);
            nginx
        }
    };
    record(&mut pids, run_dir, spawn(nginx, run_dir, "nginx", "nginx")?)?;
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

/// Stops what `up` started, in `STOP_ORDER`, waiting for each to exit.
pub fn down(run_dir: &Path) -> anyhow::Result<()> {
    let path = run_dir.join("pids");
    let pids = fs::read_to_string(&path).with_context(|| format!("no fleet recorded in {}", run_dir.display()))?;
    let entries: Vec<(&str, &str, u32)> = pids
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some((fields.next()?, fields.next()?, fields.next()?.parse().ok()?))
        })
        .collect();
    for kind in STOP_ORDER {
        let group: Vec<_> = entries.iter().filter(|(k, _, _)| *k == kind).collect();
        for (_, name, pid) in &group {
            // PostgreSQL's SIGTERM waits for every client to leave; SIGINT is its fast shutdown.
            signal(*pid, if kind == "postgres" { "-INT" } else { "-TERM" });
            tracing::info!(kind, name, pid, "stopping");
        }
        for (_, name, pid) in group {
            let deadline = Instant::now() + WAIT_MAX;
            while alive(*pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if alive(*pid) {
                tracing::warn!(kind, name, pid, "did not stop in time; killing it");
                signal(*pid, "-KILL");
            }
        }
    }
    fs::remove_file(&path)?;
    Ok(())
}

/// Starts a process in its own process group (so a Ctrl-C in the shell that ran `up` does not
/// reach it), logging to `logs/<name>.log`; returns its line for the pid file.
fn spawn(mut command: Command, run_dir: &Path, kind: &str, name: &str) -> anyhow::Result<String> {
    let log = fs::File::create(run_dir.join("logs").join(format!("{name}.log")))?;
    let child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {kind} {name}"))?;
    Ok(format!("{kind} {name} {}\n", child.id()))
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

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill").args([signal, &pid.to_string()]).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

fn alive(pid: u32) -> bool {
    // A child of this very process (a failed `up` stopping what it started) that exited stays a
    // zombie until this process exits, and `kill -0` still finds it: it is gone all the same.
    // Another's zombie is left to count as alive until its parent reaps it, as `down` always
    // waited for.
    let own_zombie = fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|stat| {
        let mut fields = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace()).into_iter().flatten();
        let state = fields.next();
        let parent = fields.next().and_then(|ppid| ppid.parse::<u32>().ok());
        state == Some("Z") && parent == Some(std::process::id())
    });
    !own_zombie
        && Command::new("kill").args(["-0", &pid.to_string()]).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
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
            anyhow::ensure!(alive(pid), "the process that should listen on {addr} exited");
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
