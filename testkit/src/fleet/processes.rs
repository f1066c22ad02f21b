//! The seckill processes of a fleet under the caller's hand: spawned with their environment,
//! SIGKILLed, frozen and thawed, and a member's disk wiped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use super::{Fleet, Role, BUYER_SECRET_ENV, PAYMENT_SECRET};

/// Where a member reads the admin token (see `[coordinator] admin_token` in the README).
const ADMIN_TOKEN_ENV: &str = "SECKILL_ADMIN_TOKEN";

/// Where the order services and the sandbox read [`PAYMENT_SECRET`].
const PAYMENT_SECRET_ENV: &str = "SECKILL_PAYMENT_SECRET";

impl Role {
    fn command(self) -> &'static str {
        match self {
            Role::Member => "coordinator",
            Role::Node => "node",
            Role::Orders => "orders",
            Role::Paysim => "paysim",
        }
    }
}

impl Fleet {
    /// Starts every member, then every node, then the sandbox and the order services.
    pub fn start_all(&mut self) -> anyhow::Result<()> {
        let names = self.member_names().into_iter().chain(self.node_names());
        for name in names.chain(self.names(Role::Paysim)).chain(self.orders_names()) {
            self.start_process(&name)?;
        }
        Ok(())
    }

    /// Spawns `name` (a member, a node or an order service) if it is not running.
    pub fn start_process(&mut self, name: &str) -> anyhow::Result<()> {
        let (exe, rust_log, token) = (self.exe.clone(), self.rust_log.clone(), self.admin_token.clone());
        let buyer_secret = self.buyer_secret.clone();
        let process = self.process_mut(name)?;
        if process.child.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&process.log)?;
        let mut command = Command::new(&exe);
        match token {
            Some(token) => command.env(ADMIN_TOKEN_ENV, token),
            None => command.env_remove(ADMIN_TOKEN_ENV),
        };
        match buyer_secret {
            Some(secret) => command.env(BUYER_SECRET_ENV, secret),
            None => command.env_remove(BUYER_SECRET_ENV),
        };
        if let Some((lib, skew)) = &process.skew {
            command
                .env("LD_PRELOAD", lib)
                .env("FAKETIME", format!("{skew:+}"))
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        if matches!(process.role, Role::Orders | Role::Paysim) {
            command.env(PAYMENT_SECRET_ENV, PAYMENT_SECRET);
        }
        command.arg(process.role.command());
        match process.role {
            // The sandbox has no config; its seed is fixed, so a schedule's draws replay.
            Role::Paysim => command.args(["--listen", &process.addr.to_string(), "--seed", "1"]),
            // The order service has no fleet id: its config names its consumer.
            Role::Orders => command.arg("--config").arg(&process.config),
            Role::Member | Role::Node => command.args(["--id", name]).arg("--config").arg(&process.config),
        };
        let child = command
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot run {}", exe.display()))?;
        process.child = Some(child);
        process.paused = false;
        Ok(())
    }

    /// SIGKILL, frozen or not: no drain, no goodbye.
    pub fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let process = self.process_mut(name)?;
        if let Some(mut child) = process.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        process.paused = false;
        Ok(())
    }

    /// The OS process id of `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.process(name).ok()?.child.as_ref().map(std::process::Child::id)
    }

    /// SIGSTOP: the process keeps its sockets and its state, and does nothing.
    pub fn pause(&mut self, name: &str) -> anyhow::Result<()> {
        self.signal(name, "-STOP")?;
        self.process_mut(name)?.paused = true;
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self, name: &str) -> anyhow::Result<()> {
        self.signal(name, "-CONT")?;
        self.process_mut(name)?.paused = false;
        Ok(())
    }

    /// Sends `signal` (as `kill` takes it: `-TERM`, `-STOP`…) to `name`. Prefer [`Fleet::kill`],
    /// [`Fleet::pause`] and [`Fleet::resume`], which keep track of the process's state.
    pub fn signal(&self, name: &str, signal: &str) -> anyhow::Result<()> {
        let pid =
            self.process(name)?.child.as_ref().map(Child::id).with_context(|| format!("{name} is not running"))?;
        anyhow::ensure!(
            Command::new("kill").args([signal, &pid.to_string()]).status()?.success(),
            "kill {signal} {pid} ({name}) failed"
        );
        Ok(())
    }

    /// Where member `name` keeps its raft log, vote and snapshots.
    pub fn member_data_dir(&self, name: &str) -> PathBuf {
        self.data_dir.join(name)
    }

    /// Kills member `name` and deletes its raft directory: the disk is lost. Restart it with
    /// [`Fleet::start_process`].
    pub fn wipe_member(&mut self, name: &str) -> anyhow::Result<()> {
        anyhow::ensure!(self.process(name)?.role == Role::Member, "{name} is not a member");
        self.kill(name)?;
        let dir = self.member_data_dir(name);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).with_context(|| dir.display().to_string()),
            _ => Ok(()),
        }
    }

    /// Whether `name` has a process (frozen or not).
    pub fn is_running(&self, name: &str) -> bool {
        self.processes.get(name).is_some_and(|p| p.child.is_some())
    }

    pub fn is_paused(&self, name: &str) -> bool {
        self.processes.get(name).is_some_and(|p| p.paused)
    }

    /// Running and not frozen: it can answer.
    pub fn is_live(&self, name: &str) -> bool {
        self.is_running(name) && !self.is_paused(name)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for process in self.processes.values_mut() {
            if let Some(mut child) = process.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
