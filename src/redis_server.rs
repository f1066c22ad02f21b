//! A private `redis-server` child process on a free loopback port with its own data directory,
//! for tests, benchmarks and `seckill bench`: never a Redis someone else is using. AOF with
//! fsync on every write, so SIGKILL loses nothing and a restart on the same directory brings
//! every sale back.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long Redis may take to answer PING after start.
const STARTUP_MAX: Duration = Duration::from_secs(10);

pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// `appendfsync` policy: `always` for fault tests, `everysec` for benchmarks (the usual
    /// production setting, and what the Redis-only baseline would run with).
    fsync: &'static str,
}

/// A port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn fresh_dir() -> std::io::Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "seckill-redis-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

impl RedisServer {
    /// Starts Redis with `appendfsync always`.
    pub fn start() -> anyhow::Result<RedisServer> {
        Self::start_with("always")
    }

    pub fn start_with(fsync: &'static str) -> anyhow::Result<RedisServer> {
        let mut server = RedisServer { port: 0, dir: fresh_dir()?, child: None, fsync };
        // The port is free when probed but could be taken before Redis binds it; try a few.
        for _ in 0..5 {
            server.port = free_port()?;
            if server.spawn()? {
                return Ok(server);
            }
        }
        anyhow::bail!("redis-server did not start; see {}", server.dir.display())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> anyhow::Result<bool> {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--appendonly", "yes"])
            .args(["--appendfsync", self.fsync, "--protected-mode", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!("cannot run redis-server ({e}); install it (scripts/test does) or pass a Redis URL")
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + STARTUP_MAX;
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                return Ok(false);
            }
            if self.query::<String>(&redis::cmd("PING")).is_ok() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(false)
    }

    /// Runs one command on a fresh connection.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut connection = redis::Client::open(self.url())?.get_connection()?;
        cmd.query(&mut connection)
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port and directory; the AOF brings the data back.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        anyhow::ensure!(self.spawn()?, "redis-server did not restart on port {}", self.port);
        Ok(())
    }

    /// Starts again on the same port with an empty directory: Redis lost everything.
    pub fn restart_empty(&mut self) -> anyhow::Result<()> {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        self.dir = fresh_dir()?;
        anyhow::ensure!(self.spawn()?, "redis-server did not restart on port {}", self.port);
        Ok(())
    }

    /// SIGSTOP (`"-STOP"`) or SIGCONT (`"-CONT"`): Redis hangs without closing connections.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.child.as_ref().map(Child::id).ok_or_else(|| anyhow::anyhow!("redis is not running"))?;
        anyhow::ensure!(
            Command::new("kill").args([signal, &pid.to_string()]).status()?.success(),
            "kill {signal} {pid} failed"
        );
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Work Redis did, read from `INFO`: every command counts, those run inside scripts included.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct RedisWork {
    pub commands: u64,
    pub cpu_seconds: f64,
}

impl RedisWork {
    /// Reads the counters from the Redis at `url`.
    pub fn read(url: &str) -> anyhow::Result<RedisWork> {
        let mut connection = redis::Client::open(url)?.get_connection()?;
        let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut connection)?;
        let cpu: String = redis::cmd("INFO").arg("cpu").query(&mut connection)?;
        let commands = stats
            .lines()
            .filter(|line| line.starts_with("cmdstat_"))
            .filter_map(|line| line.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
            .sum();
        let field = |name: &str| -> f64 {
            cpu.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok()).unwrap_or(0.0)
        };
        Ok(RedisWork { commands, cpu_seconds: field("used_cpu_sys") + field("used_cpu_user") })
    }

    pub fn since(self, earlier: RedisWork) -> RedisWork {
        RedisWork {
            commands: self.commands.saturating_sub(earlier.commands),
            cpu_seconds: (self.cpu_seconds - earlier.cpu_seconds).max(0.0),
        }
    }
}
