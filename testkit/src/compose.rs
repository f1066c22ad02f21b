//! The Compose fleet (`deploy/compose.yaml`) for tests and the nemesis: brought up by
//! `deploy/up` under a project of the caller's, on host ports picked free, and driven through
//! the `docker` CLI at the container and network level: kill, pause, stop and start, cut off
//! from the network and back, replaced by a fresh container.
//!
//! The host reaches every container at its address on the fleet's bridge network (Linux routes
//! a bridge's subnet to the host), so a harness sends purchases to each node and reads Redis,
//! PostgreSQL and the members as the fleet's own processes do, without published ports.
//!
//! Docker is asked for every address afresh: a container that was replaced, or reconnected,
//! may have another one.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// The variable that makes a missing Docker daemon fail a test instead of skipping it (CI).
pub const REQUIRE_DOCKER_ENV: &str = "SECKILL_REQUIRE_DOCKER";

/// The fleet's network, as `deploy/compose.yaml` names it (Compose prefixes the project).
const NETWORK: &str = "fleet";

/// Fixed addresses of `deploy/compose.yaml` (the rest are Docker's to hand out).
pub const SENTINELS: [&str; 3] = ["10.211.0.21", "10.211.0.22", "10.211.0.23"];
pub const POSTGRES: &str = "10.211.0.30";

/// Ports the fleet's processes listen on inside their containers.
pub const NODE_PORT: u16 = 8080;
pub const MEMBER_PORT: u16 = 7000;
pub const ORDERS_PORT: u16 = 8090;
pub const PAYSIM_PORT: u16 = 8095;

/// Whether a Docker daemon answers. Without one, a test prints one line and returns, unless
/// [`REQUIRE_DOCKER_ENV`] is set, when it fails.
pub fn docker_available(test: &str) -> bool {
    let answers = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !answers {
        assert!(
            std::env::var(REQUIRE_DOCKER_ENV).is_err(),
            "{test}: no Docker daemon answers `docker info`, and {REQUIRE_DOCKER_ENV} is set"
        );
        eprintln!("{test}: skipped, no Docker daemon answers `docker info`");
    }
    answers
}

/// What to bring up.
#[derive(Clone, Debug)]
pub struct ComposeSpec {
    /// The repository, whose `deploy/` holds the Compose file, the config and the scripts.
    pub repo: PathBuf,
    /// The Compose project: containers, volumes and the network are named after it.
    pub project: String,
    /// `seckill` built without the lab, for the server image; and with it, for the lab image.
    /// None: `deploy/build-images` compiles them.
    pub server_binary: Option<PathBuf>,
    pub lab_binary: Option<PathBuf>,
    pub nodes: usize,
    /// The config every process reads; none: `deploy/cluster.toml`.
    pub config: Option<PathBuf>,
}

/// A container of the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    /// Its name as Docker knows it (`<project>_node_2`).
    pub name: String,
    /// Its host name: for a node, the node's id.
    pub hostname: String,
    /// Its address on the fleet's network; none while it is cut off from it.
    pub ip: Option<IpAddr>,
    pub running: bool,
    pub paused: bool,
    /// `healthy`, `unhealthy`, `starting`, or `none` without a health check.
    pub health: String,
}

/// A fleet brought up by `deploy/up`.
pub struct ComposeFleet {
    spec: ComposeSpec,
    /// The host ports and project name `deploy/up` was started with.
    env: Vec<(String, String)>,
    /// What `deploy/up` printed: nginx and the members' admin ports on the host.
    pub lb: SocketAddr,
    pub admin: Vec<SocketAddr>,
    secrets: BTreeMap<String, PathBuf>,
}

impl ComposeFleet {
    /// Builds what images are missing, draws missing secrets and brings the fleet up; returns
    /// once every container is healthy.
    pub fn up(spec: &ComposeSpec) -> anyhow::Result<ComposeFleet> {
        let mut env = vec![("SECKILL_COMPOSE_PROJECT".to_string(), spec.project.clone())];
        for (name, binary) in [("SECKILL_SERVER_BINARY", &spec.server_binary), ("SECKILL_LAB_BINARY", &spec.lab_binary)]
        {
            if let Some(binary) = binary {
                env.push((name.to_string(), binary.display().to_string()));
            }
        }
        if let Some(config) = &spec.config {
            env.push(("SECKILL_CONFIG".to_string(), config.display().to_string()));
        }
        for name in ["SECKILL_HTTP_PORT", "SECKILL_ORDERS_PORT", "SECKILL_PROMETHEUS_PORT"].into_iter().chain([
            "SECKILL_ADMIN_PORT_1",
            "SECKILL_ADMIN_PORT_2",
            "SECKILL_ADMIN_PORT_3",
        ]) {
            env.push((name.to_string(), crate::redis::free_port()?.to_string()));
        }
        let mut fleet = ComposeFleet {
            spec: spec.clone(),
            env,
            lb: ([127, 0, 0, 1], 0).into(),
            admin: Vec::new(),
            secrets: BTreeMap::new(),
        };
        let printed = fleet.deploy_up(Some(spec.nodes))?;
        fleet.read_up_answer(&printed)?;
        Ok(fleet)
    }

    /// Changes the node count: more nodes join, or some are stopped (they hand their leases
    /// back); returns once every container is healthy.
    pub fn scale_nodes(&self, nodes: usize) -> anyhow::Result<()> {
        self.deploy_up(Some(nodes)).map(drop)
    }

    fn deploy_up(&self, nodes: Option<usize>) -> anyhow::Result<String> {
        let mut up = Command::new(self.spec.repo.join("deploy/up"));
        if let Some(nodes) = nodes {
            up.args(["--scale-nodes", &nodes.to_string()]);
        }
        let output = up.envs(self.env.iter().cloned()).stdin(Stdio::null()).output().context("running deploy/up")?;
        anyhow::ensure!(
            output.status.success(),
            "deploy/up failed:\n{}",
            tail(&String::from_utf8_lossy(&output.stderr), 40)
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn read_up_answer(&mut self, printed: &str) -> anyhow::Result<()> {
        let line = printed.lines().last().context("deploy/up printed nothing")?;
        let answer: serde_json::Value = serde_json::from_str(line).context("deploy/up's last line is not JSON")?;
        self.lb = answer["lb"].as_str().context("no lb")?.parse()?;
        self.admin = answer["admin"]
            .as_array()
            .context("no admin")?
            .iter()
            .filter_map(|addr| addr.as_str()?.parse().ok())
            .collect();
        let secrets = answer["secrets"].as_object().context("no secrets")?;
        self.secrets = secrets.iter().filter_map(|(name, path)| Some((name.clone(), path.as_str()?.into()))).collect();
        Ok(())
    }

    /// Stops the fleet and removes its volumes.
    pub fn down(&self) -> anyhow::Result<()> {
        let output = Command::new(self.spec.repo.join("deploy/down"))
            .arg("--volumes")
            .envs(self.env.iter().cloned())
            .output()
            .context("running deploy/down")?;
        anyhow::ensure!(output.status.success(), "deploy/down failed: {}", String::from_utf8_lossy(&output.stderr));
        Ok(())
    }

    /// A secret `deploy/up` drew, by its file's name (`admin_token`, `redis_password`, …).
    pub fn secret(&self, name: &str) -> anyhow::Result<String> {
        let path = self.secrets.get(name).with_context(|| format!("no secret {name}"))?;
        Ok(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?.trim().to_string())
    }

    /// Runs the Compose tool on the fleet's file and project.
    pub fn compose(&self, args: &[&str]) -> anyhow::Result<String> {
        let file = self.spec.repo.join("deploy/compose.yaml");
        let v2 = Command::new("docker").args(["compose", "version"]).output().is_ok_and(|o| o.status.success());
        let mut command = if v2 {
            let mut command = Command::new("docker");
            command.arg("compose");
            command
        } else {
            Command::new("docker-compose")
        };
        command.arg("-p").arg(&self.spec.project).arg("-f").arg(&file).args(args).envs(self.env.iter().cloned());
        succeeded(command.output().context("running docker compose")?, &format!("compose {}", args.join(" ")))
    }

    /// Every container of `service`, running or not, in name order.
    pub fn containers(&self, service: &str) -> anyhow::Result<Vec<Container>> {
        let ids = self.compose(&["ps", "-a", "-q", service])?;
        let mut containers: Vec<Container> =
            ids.split_whitespace().map(|id| self.inspect(id)).collect::<anyhow::Result<_>>()?;
        containers.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(containers)
    }

    /// The one container of a service that has one (`c1`, `redis-1`, `lb`, …).
    pub fn container(&self, service: &str) -> anyhow::Result<Container> {
        self.containers(service)?.into_iter().next().with_context(|| format!("no container of {service}"))
    }

    /// A container as Docker sees it now.
    pub fn inspect(&self, id: &str) -> anyhow::Result<Container> {
        let network = format!("{}_{NETWORK}", self.spec.project);
        let format = format!(
            "{{{{.Id}}}} {{{{.Name}}}} {{{{.Config.Hostname}}}} {{{{.State.Running}}}} {{{{.State.Paused}}}} \
             {{{{if .State.Health}}}}{{{{.State.Health.Status}}}}{{{{else}}}}none{{{{end}}}} \
             {{{{with index .NetworkSettings.Networks \"{network}\"}}}}{{{{.IPAddress}}}}{{{{end}}}}"
        );
        let printed = docker(&["inspect", "-f", &format, id])?;
        let fields: Vec<&str> = printed.split_whitespace().collect();
        anyhow::ensure!(fields.len() >= 6, "docker inspect {id} said {printed:?}");
        Ok(Container {
            id: fields[0].to_string(),
            name: fields[1].trim_start_matches('/').to_string(),
            hostname: fields[2].to_string(),
            running: fields[3] == "true",
            paused: fields[4] == "true",
            health: fields[5].to_string(),
            ip: fields.get(6).and_then(|ip| ip.parse().ok()),
        })
    }

    /// Each running node: its id (its container's host name) and its address.
    pub fn node_addrs(&self) -> anyhow::Result<Vec<(String, SocketAddr)>> {
        Ok(self
            .containers("node")?
            .into_iter()
            .filter(|c| c.running)
            .filter_map(|c| Some((c.hostname, SocketAddr::new(c.ip?, NODE_PORT))))
            .collect())
    }

    /// The members, by name, at their addresses.
    pub fn member_addrs(&self) -> anyhow::Result<Vec<(String, SocketAddr)>> {
        let mut members = Vec::new();
        for name in ["c1", "c2", "c3"] {
            let ip = self.container(name)?.ip.with_context(|| format!("{name} has no address"))?;
            members.push((name.to_string(), SocketAddr::new(ip, MEMBER_PORT)));
        }
        Ok(members)
    }

    /// The order services' APIs, by name.
    pub fn orders_apis(&self) -> anyhow::Result<Vec<(String, SocketAddr)>> {
        let mut apis = Vec::new();
        for name in ["orders-1", "orders-2"] {
            let ip = self.container(name)?.ip.with_context(|| format!("{name} has no address"))?;
            apis.push((name.to_string(), SocketAddr::new(ip, ORDERS_PORT)));
        }
        Ok(apis)
    }

    pub fn paysim_addr(&self) -> anyhow::Result<SocketAddr> {
        let ip = self.container("paysim")?.ip.context("paysim has no address")?;
        Ok(SocketAddr::new(ip, PAYSIM_PORT))
    }

    /// The ledger as the host reaches it: the sentinels by their fixed addresses, which name
    /// the master by its fixed one.
    pub fn ledger_url(&self) -> anyhow::Result<String> {
        let password = self.secret("redis_password")?;
        let sentinels: Vec<String> = SENTINELS.iter().map(|ip| format!("{ip}:26379")).collect();
        Ok(format!("redis+sentinel://:{password}@{}/ledger", sentinels.join(",")))
    }

    /// The order store as the host reaches it.
    pub fn store_url(&self) -> anyhow::Result<String> {
        Ok(format!("postgres://seckill:{}@{POSTGRES}:5432/seckill", self.secret("postgres_password")?))
    }

    /// SIGKILL to the container's processes: gone without a goodbye (its restart policy does
    /// not bring it back: Docker counts a kill as the operator's).
    pub fn kill(&self, container: &Container) -> anyhow::Result<()> {
        docker(&["kill", &container.id]).map(drop)
    }

    /// SIGTERM, then the stop grace period: a node drains and hands its lease back.
    pub fn stop(&self, container: &Container) -> anyhow::Result<()> {
        docker(&["stop", &container.id]).map(drop)
    }

    /// Removes a stopped container for good (a replacement's first half).
    pub fn remove(&self, container: &Container) -> anyhow::Result<()> {
        docker(&["rm", "-f", &container.id]).map(drop)
    }

    /// The address the sentinels name as the ledger's master (the first that answers).
    pub fn redis_master_ip(&self) -> Option<IpAddr> {
        SENTINELS.iter().find_map(|sentinel| {
            let client = redis::Client::open(format!("redis://{sentinel}:26379")).ok()?;
            let mut connection = client.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
            connection.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
            let (ip, _port): (String, String) =
                redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg("ledger").query(&mut connection).ok()?;
            ip.parse().ok()
        })
    }

    pub fn start(&self, container: &Container) -> anyhow::Result<()> {
        docker(&["start", &container.id]).map(drop)
    }

    /// Every process of the container frozen (the cgroup freezer), as a machine that stopped
    /// answering would be.
    pub fn pause(&self, container: &Container) -> anyhow::Result<()> {
        docker(&["pause", &container.id]).map(drop)
    }

    pub fn unpause(&self, container: &Container) -> anyhow::Result<()> {
        docker(&["unpause", &container.id]).map(drop)
    }

    /// Cuts the container off the fleet's network: a host partitioned from every other.
    pub fn disconnect(&self, container: &Container) -> anyhow::Result<()> {
        docker(&["network", "disconnect", "--force", &self.network(), &container.id]).map(drop)
    }

    /// Puts it back, at `ip` when it had a fixed address (the others get one from Docker).
    pub fn connect(&self, container: &Container, ip: Option<IpAddr>) -> anyhow::Result<()> {
        let network = self.network();
        let ip = ip.map(|ip| ip.to_string());
        let mut args = vec!["network", "connect"];
        if let Some(ip) = &ip {
            args.extend(["--ip", ip.as_str()]);
        }
        // The service name stays an alias: the others find it by it again.
        let service = self.service_of(container)?;
        args.extend(["--alias", service.as_str(), &network, &container.id]);
        docker(&args).map(drop)
    }

    /// Replaces the containers of `service` with fresh ones from the current image, without
    /// touching what they depend on: a rolling upgrade's step.
    pub fn recreate(&self, service: &str) -> anyhow::Result<()> {
        self.compose(&["up", "-d", "--no-deps", "--force-recreate", service]).map(drop)
    }

    /// Waits until `service`'s containers other than `known` (ids) exist and all run and report
    /// healthy: the fresh ones a scale or a replacement made, whatever a concurrent fault does
    /// to the others (a paused node stays unhealthy until its fault ends).
    pub fn wait_new_healthy(
        &self,
        service: &str,
        known: &std::collections::BTreeSet<String>,
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let fresh: Vec<Container> =
                self.containers(service)?.into_iter().filter(|c| !known.contains(&c.id)).collect();
            if !fresh.is_empty() && fresh.iter().all(|c| c.running && c.health == "healthy") {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "new {service} containers not healthy after {within:?}: {fresh:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until `service`'s containers all run and report healthy.
    pub fn wait_healthy(&self, service: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let containers = self.containers(service)?;
            if !containers.is_empty() && containers.iter().all(|c| c.running && c.health == "healthy") {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "{service} not healthy after {within:?}: {containers:?}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The last `lines` of a container's log.
    pub fn logs(&self, container: &Container, lines: usize) -> String {
        let output = Command::new("docker").args(["logs", "--tail", &lines.to_string(), &container.id]).output();
        output.map_or_else(
            |e| format!("(docker logs failed: {e})"),
            |o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        )
    }

    /// Every container's log, to `dir/<container>.log`.
    pub fn copy_logs(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        for id in self.compose(&["ps", "-a", "-q"])?.split_whitespace() {
            let container = self.inspect(id)?;
            std::fs::write(dir.join(format!("{}.log", container.name)), self.logs(&container, 100_000))?;
        }
        Ok(())
    }

    fn network(&self) -> String {
        format!("{}_{NETWORK}", self.spec.project)
    }

    fn service_of(&self, container: &Container) -> anyhow::Result<String> {
        docker(&["inspect", "-f", "{{index .Config.Labels \"com.docker.compose.service\"}}", &container.id])
            .map(|service| service.trim().to_string())
    }
}

fn docker(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("docker").args(args).output().context("running docker")?;
    succeeded(output, &format!("docker {}", args.join(" ")))
}

fn succeeded(output: Output, what: &str) -> anyhow::Result<String> {
    anyhow::ensure!(output.status.success(), "{what} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
