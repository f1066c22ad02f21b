//! Waits on a running fleet and reads of it: readiness, the members' state and leader, and
//! the processes' logs.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{Fleet, PAYSIM, POLL_PAUSE};

/// Longest one poll of a process (`/ready`, `/api/state`) may take: a frozen process must not
/// stall the caller.
const PROBE_MAX: Duration = Duration::from_millis(500);

impl Fleet {
    /// Waits until node `name` answers `/ready` with 200.
    pub async fn wait_node_ready(&self, name: &str, within: Duration) -> anyhow::Result<()> {
        let addr = self.addr(name)?;
        let deadline = Instant::now() + within;
        loop {
            if let Ok((200, _)) = crate::http::get(addr, "/ready", PROBE_MAX).await {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "node {name} not ready after {within:?}");
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// Waits until every running node answers `/ready` with 200, and the sandbox (if any)
    /// `/health`.
    pub async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        for name in self.node_names() {
            if self.is_running(&name) {
                self.wait_node_ready(&name, within).await?;
            }
        }
        if let Some(addr) = self.paysim_addr().filter(|_| self.is_running(PAYSIM)) {
            let deadline = Instant::now() + within;
            while !matches!(crate::http::get(addr, "/health", PROBE_MAX).await, Ok((200, _))) {
                anyhow::ensure!(Instant::now() < deadline, "the sandbox provider not healthy after {within:?}");
                tokio::time::sleep(POLL_PAUSE).await;
            }
        }
        Ok(())
    }

    /// `/api/state` of member `name`, if it answers within a probe's time.
    pub async fn member_status(&self, name: &str) -> Option<serde_json::Value> {
        if !self.is_live(name) {
            return None;
        }
        crate::http::get_json_with(self.addr(name).ok()?, "/api/state", Some(&self.cluster_token), PROBE_MAX).await.ok()
    }

    /// The leader's name, as the live member with the newest term sees it. Not the first
    /// answer: a member whose raft has stopped keeps reporting the leader of its last term.
    pub async fn leader(&self) -> Option<String> {
        let mut newest: Option<(u64, u64)> = None;
        for name in self.member_names() {
            let Some(status) = self.member_status(&name).await else { continue };
            if let (Some(term), Some(id)) = (status["term"].as_u64(), status["leader"].as_u64()) {
                if newest.is_none_or(|(best, _)| term > best) {
                    newest = Some((term, id));
                }
            }
        }
        newest.map(|(_, id)| format!("c{id}"))
    }

    /// The fleet part of the cluster state (nodes, epochs, grants) as the leader applied it.
    pub async fn fleet_state(&self) -> Option<serde_json::Value> {
        let leader = self.leader().await?;
        self.member_status(&leader).await.map(|s| s["applied"]["state"]["fleet"].clone())
    }

    /// The last `lines` lines of `name`'s log.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let Ok(process) = self.process(name) else { return String::new() };
        let text = std::fs::read_to_string(&process.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Copies every process's log (and the configs), and each Redis data node's as
    /// `redis-<port>.log`, into `to`, which outlives the fleet.
    pub fn copy_logs(&self, to: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(to)?;
        for server in self.redis.servers() {
            // A server that never wrote a line has no log yet.
            let _ = std::fs::copy(server.log_path(), to.join(format!("redis-{}.log", server.port)));
        }
        for entry in std::fs::read_dir(self.dir.path())? {
            let path = entry?.path();
            if path.extension().is_some_and(|ext| ext == "log" || ext == "toml") {
                if let Some(file) = path.file_name() {
                    std::fs::copy(&path, to.join(file))?;
                }
            }
        }
        Ok(())
    }
}
