//! Real nginx in front of a fleet, configured by `seckill lb-config nginx` and started exactly as
//! the config's header says: `nginx -p <dir> -c <dir>/nginx.conf` on a fresh empty directory.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::fleet::Fleet;

/// How long nginx may take to start, or to stop.
const NGINX_WAIT_MAX: Duration = Duration::from_secs(10);

/// Who runs nginx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAs {
    /// The test's own user. As root, nginx runs its workers as `nobody`.
    Me,
    /// `nobody`, a user without privileges (the test must run as root to switch to it).
    Nobody,
}

impl RunAs {
    /// `Me`, and `Nobody` too when the test runs as root, so both ways nginx treats its
    /// directories are tried.
    pub fn every_available() -> Vec<RunAs> {
        if id(&["-u"]) == 0 {
            vec![RunAs::Me, RunAs::Nobody]
        } else {
            vec![RunAs::Me]
        }
    }
}

/// A daemonized nginx (the header's command starts one), stopped on drop.
pub struct Nginx {
    pub addr: SocketAddr,
    /// The prefix: the fresh directory the config runs in.
    dir: tempfile::TempDir,
    /// The master's pid, from the pid file.
    pid: u32,
}

/// The nginx binary: on PATH, or where Debian puts it (`/usr/sbin` is not on every PATH).
fn binary() -> PathBuf {
    let on_path = Command::new("sh").args(["-c", "command -v nginx"]).output().ok().filter(|o| o.status.success());
    on_path
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"))
}

/// `id <args>` as a number (uids and gids).
fn id(args: &[&str]) -> u32 {
    let output = Command::new("id").args(args).output().expect("run id(1)");
    String::from_utf8_lossy(&output.stdout).trim().parse().unwrap_or_else(|_| panic!("id {args:?}: {output:?}"))
}

impl Nginx {
    /// nginx as the test's own user.
    pub async fn start(fleet: &Fleet) -> Nginx {
        Self::start_as(fleet, RunAs::Me).await
    }

    /// Generates the config with the CLI into a fresh empty directory and runs the command of
    /// the config's own header, word for word, as `run_as`.
    pub async fn start_as(fleet: &Fleet, run_as: RunAs) -> Nginx {
        Self::start_from(&fleet.config_path(), run_as).await
    }

    /// nginx as the test's own user, configured from `config` rather than the fleet's shared
    /// `cluster.toml`: an order service's config, say, whose `[orders] listen` and `[payments]`
    /// add the order API's and the sandbox's routes.
    pub async fn start_with_config(config: &Path) -> Nginx {
        Self::start_from(config, RunAs::Me).await
    }

    async fn start_from(config: &Path, run_as: RunAs) -> Nginx {
        let port = testkit::redis::free_port().expect("free port");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // A directory as `mkdir` makes it (mode 755), which the header asks for when nginx runs
        // as root; tempfile's own 700 would lock its workers (user nobody) out.
        let dir = tempfile::Builder::new()
            .prefix("nginx-")
            .permissions(std::fs::Permissions::from_mode(0o755))
            .tempdir()
            .expect("nginx dir");
        let generated = Command::new(env!("CARGO_BIN_EXE_seckill"))
            .args(["lb-config", "nginx", "--listen", &addr.to_string(), "--config"])
            .arg(config)
            .output()
            .expect("seckill lb-config");
        assert!(generated.status.success(), "lb-config failed: {}", String::from_utf8_lossy(&generated.stderr));
        let text = String::from_utf8(generated.stdout).expect("the config is UTF-8");
        std::fs::write(dir.path().join("nginx.conf"), &text).expect("write nginx.conf");
        if run_as == RunAs::Nobody {
            std::os::unix::fs::chown(dir.path(), Some(id(&["-u", "nobody"])), Some(id(&["-g", "nobody"])))
                .expect("chown the nginx dir to nobody");
        }

        let words = header_command(&text, dir.path());
        let mut command = tokio::process::Command::new(binary());
        command.args(&words[1..]).kill_on_drop(true);
        if run_as == RunAs::Nobody {
            // std drops the supplementary groups too when it switches away from root.
            command.uid(id(&["-u", "nobody"])).gid(id(&["-g", "nobody"]));
        }
        let started = tokio::time::timeout(NGINX_WAIT_MAX, command.output())
            .await
            .unwrap_or_else(|_| panic!("`{}` did not return within {NGINX_WAIT_MAX:?}", words.join(" ")))
            .unwrap_or_else(|e| panic!("cannot run nginx ({}): {e}; scripts/test installs it", binary().display()));
        assert!(
            started.status.success(),
            "`{}` as {run_as:?} failed on a fresh directory: {}",
            words.join(" "),
            String::from_utf8_lossy(&started.stderr)
        );
        let pid_file = dir.path().join("nginx.pid");
        let deadline = Instant::now() + NGINX_WAIT_MAX;
        let pid = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse().ok()) {
                break pid;
            }
            assert!(Instant::now() < deadline, "nginx wrote no pid file");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let nginx = Nginx { addr, dir, pid };
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(Instant::now() < deadline, "nginx did not listen on {addr}: {}", nginx.error_log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        nginx
    }

    /// What nginx logged (warnings and worse).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

/// The `Run:` line of the config's header, with `<dir>` filled in, split into words.
fn header_command(config: &str, dir: &Path) -> Vec<String> {
    let line = config
        .lines()
        .take_while(|line| line.starts_with('#'))
        .find_map(|line| line.strip_prefix("# Run:"))
        .unwrap_or_else(|| panic!("the config's header says nothing about how to run it:\n{config}"));
    let words: Vec<String> =
        line.split_whitespace().map(|word| word.replace("<dir>", &dir.display().to_string())).collect();
    assert_eq!(words.first().map(String::as_str), Some("nginx"), "the header runs nginx: {line}");
    words
}

impl Drop for Nginx {
    /// SIGTERM, nginx's fast shutdown: the master stops its workers and removes its pid file.
    /// SIGKILL on the master would orphan the workers, still listening.
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.pid.to_string()]).status();
        let pid_file = self.dir.path().join("nginx.pid");
        let deadline = Instant::now() + NGINX_WAIT_MAX;
        while pid_file.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if pid_file.exists() {
            eprintln!("nginx {} did not stop in time; killing its process group", self.pid);
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.pid)]).status();
        }
        if std::thread::panicking() {
            eprintln!("---- nginx error.log ----\n{}", self.error_log());
        }
    }
}
