//! `seckill lb-sync`: nginx follows the coordinator's live nodes. Once a period it asks the
//! members which nodes are leased (`/api/nodes`), resolves each one's advertised name, and when
//! the set of addresses changed it writes nginx's config anew and reloads nginx, which drains
//! its old workers: a node that joins takes traffic within a period of its registration, one
//! that leaves or vanishes stops getting any once its lease is gone.
//!
//! Why a sync process and not nginx's own resolver: open-source nginx before 1.27.3 (Debian 12
//! ships 1.22) resolves an upstream's names only when it loads its config, refuses the whole
//! config when one does not resolve, and has no way to learn of a node it was never told about.
//!
//! With `--run-nginx` it runs nginx as its child and reloads it by SIGHUP: one process to start
//! in a container, whose exit (nginx's too) the container's restart policy sees. Without, it
//! reloads an nginx started elsewhere with `nginx -s reload`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use protocol::CoordinatorClient;

use super::{nginx_config, Upstream};
use crate::config::Cluster;

/// How to sync.
pub struct SyncOptions {
    /// Where nginx listens.
    pub listen: SocketAddr,
    /// The config file written; its folder is nginx's prefix (`nginx -p DIR -c PATH`).
    pub conf: PathBuf,
    /// How often the live nodes are read.
    pub every: Duration,
    /// Run nginx as a child (and reload it by signal), or reload one running already.
    pub run_nginx: bool,
    /// Write the config once, reload, and return.
    pub once: bool,
    /// The user nginx's workers run as when it runs as root (`user` on its command line);
    /// `None`: nginx's default, `nobody`.
    pub nginx_user: Option<String>,
}

/// Debian puts nginx in /usr/sbin, which is not on every PATH.
pub fn nginx_binary() -> PathBuf {
    let debian = PathBuf::from("/usr/sbin/nginx");
    if debian.exists() {
        debian
    } else {
        PathBuf::from("nginx")
    }
}

/// Directives added on nginx's command line: in the foreground, so the pid a supervisor sees is
/// the master's; and the workers' user, if given.
pub fn nginx_globals(user: Option<&str>) -> String {
    match user {
        Some(user) => format!("daemon off; user {user};"),
        None => "daemon off;".to_string(),
    }
}

/// Runs until SIGTERM or Ctrl-C (or once, with `options.once`).
pub async fn run(cluster: &Cluster, client: &CoordinatorClient, options: &SyncOptions) -> anyhow::Result<()> {
    let prefix = options.conf.parent().context("--nginx-conf names no folder")?.to_path_buf();
    std::fs::create_dir_all(&prefix).with_context(|| format!("creating {}", prefix.display()))?;
    let globals = nginx_globals(options.nginx_user.as_deref());
    let mut nginx = Nginx { prefix, conf: options.conf.clone(), globals, child: None };
    let mut written: Option<Vec<Upstream>> = None;
    let mut stop = std::pin::pin!(crate::shutdown::stop_requested());
    loop {
        match live_upstreams(client).await {
            Ok(nodes) if written.as_ref() != Some(&nodes) => {
                let text = nginx_config(cluster, options.listen, &nodes);
                match nginx.write(&text).and_then(|()| nginx.reload(options.run_nginx)) {
                    Ok(()) => {
                        describe_change(written.as_deref(), &nodes);
                        written = Some(nodes);
                    }
                    // Tried again next period: nginx may be starting still (no pid file yet).
                    Err(e) if !options.once => tracing::warn!("updating nginx: {e:#}"),
                    Err(e) => return Err(e),
                }
            }
            Ok(_) => {}
            // Keep serving the last list: the members may be electing, or out of reach of the
            // balancer only; nginx's own health checks still skip a node that stopped.
            Err(e) => tracing::warn!("reading the live nodes: {e:#}"),
        }
        if options.once {
            anyhow::ensure!(written.is_some(), "no member answered with the live nodes");
            return Ok(());
        }
        nginx.check_alive()?;
        tokio::select! {
            () = tokio::time::sleep(options.every) => {}
            stopped = &mut stop => {
                stopped?;
                nginx.quit();
                return Ok(());
            }
        }
    }
}

/// The leased nodes, each at an address its name resolved to, in id order. A name that does
/// not resolve yet (a container still starting) is left out until it does.
async fn live_upstreams(client: &CoordinatorClient) -> anyhow::Result<Vec<Upstream>> {
    let answer = client.nodes().await?;
    let mut upstreams = Vec::with_capacity(answer.nodes.len());
    for node in answer.nodes {
        match tokio::net::lookup_host(&node.addr).await.map(|mut found| found.next()) {
            Ok(Some(addr)) => upstreams.push(Upstream { id: node.id.to_string(), addr: addr.to_string() }),
            Ok(None) | Err(_) => tracing::debug!(node = %node.id, addr = %node.addr, "does not resolve yet"),
        }
    }
    upstreams.sort();
    Ok(upstreams)
}

fn describe_change(before: Option<&[Upstream]>, now: &[Upstream]) {
    let names = |list: &[Upstream]| list.iter().map(|u| format!("{} ({})", u.id, u.addr)).collect::<Vec<_>>();
    let (before, now) = (names(before.unwrap_or_default()), names(now));
    let added: Vec<&String> = now.iter().filter(|n| !before.contains(n)).collect();
    let removed: Vec<&String> = before.iter().filter(|n| !now.contains(n)).collect();
    tracing::info!(nodes = now.len(), ?added, ?removed, "load balancer follows the live nodes");
}

/// The nginx this sync writes for, and, with `--run-nginx`, runs.
struct Nginx {
    prefix: PathBuf,
    conf: PathBuf,
    /// What `nginx_globals` gave, for the child.
    globals: String,
    child: Option<Child>,
}

impl Nginx {
    /// Writes the config beside the old one, has nginx check it, then puts it in place: a
    /// config nginx would refuse never replaces one it runs.
    fn write(&self, text: &str) -> anyhow::Result<()> {
        let staged = self.conf.with_extension("conf.new");
        std::fs::write(&staged, text).with_context(|| format!("writing {}", staged.display()))?;
        let checked = self.command(&staged).arg("-t").stdout(Stdio::null()).output().context("running nginx -t")?;
        anyhow::ensure!(
            checked.status.success(),
            "nginx refused the generated config: {}",
            String::from_utf8_lossy(&checked.stderr).trim()
        );
        std::fs::rename(&staged, &self.conf).with_context(|| format!("replacing {}", self.conf.display()))
    }

    /// Starts nginx on the first call when it runs as a child; reloads it after that. Signals
    /// go through `nginx -s`, which reads the master's pid from the prefix: a container's image
    /// need not carry `kill`.
    fn reload(&mut self, run_nginx: bool) -> anyhow::Result<()> {
        if !run_nginx || self.child.is_some() {
            return self.signal("reload");
        }
        let child = self
            .command(&self.conf)
            .args(["-g", &self.globals])
            .stdin(Stdio::null())
            .spawn()
            .context("starting nginx")?;
        self.child = Some(child);
        Ok(())
    }

    fn command(&self, conf: &Path) -> Command {
        let mut command = Command::new(nginx_binary());
        command.arg("-p").arg(&self.prefix).arg("-c").arg(conf);
        command
    }

    /// A child nginx that exited ends the sync: it would balance nothing.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(child) = &mut self.child {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("nginx exited ({status}); see {}", self.prefix.join("error.log").display());
            }
        }
        Ok(())
    }

    /// Graceful stop of a child nginx (`quit`: finish the requests in flight, then exit).
    fn quit(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Err(e) = self.signal("quit") {
                tracing::warn!("stopping nginx: {e:#}");
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }

    /// `nginx -s SIGNAL` on this prefix's master.
    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let output = self
            .command(&self.conf)
            .args(["-s", signal])
            .output()
            .with_context(|| format!("running nginx -s {signal}"))?;
        anyhow::ensure!(
            output.status.success(),
            "nginx -s {signal} failed ({}): is nginx running with prefix {}?",
            String::from_utf8_lossy(&output.stderr).trim(),
            self.prefix.display()
        );
        Ok(())
    }
}
