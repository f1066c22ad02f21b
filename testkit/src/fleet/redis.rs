//! The ledger's Redis servers inside a fleet: which data node is the master, and a failover
//! step by step (kill the master, wait for the promotion, rejoin, wait until whole).

use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Fleet, RedisLayout, POLL_PAUSE};
use crate::redis::{RedisCluster, RedisServer};
use crate::sentinel::SentinelGroup;

/// The ledger's Redis: one server, a Sentinel group and the master the fleet last knew, or a
/// Redis Cluster.
pub(super) enum LedgerServers {
    Single(RedisServer),
    Sentinel { group: SentinelGroup, master: u16 },
    Cluster(RedisCluster),
}

impl LedgerServers {
    pub(super) fn start(layout: RedisLayout) -> anyhow::Result<Self> {
        Ok(match layout {
            RedisLayout::Single => LedgerServers::Single(RedisServer::start()?),
            RedisLayout::Sentinel => {
                let group = SentinelGroup::start(1)?;
                let master = group.master_port().context("the sentinels name no master")?;
                LedgerServers::Sentinel { group, master }
            }
            RedisLayout::Cluster => LedgerServers::Cluster(RedisCluster::start_replicated()?),
        })
    }

    fn replicated(&self) -> bool {
        !matches!(self, LedgerServers::Single(_))
    }

    pub(super) fn servers(&self) -> Vec<&RedisServer> {
        match self {
            LedgerServers::Single(server) => vec![server],
            LedgerServers::Sentinel { group, .. } => group.servers.iter().collect(),
            LedgerServers::Cluster(cluster) => cluster.nodes().iter().collect(),
        }
    }

    pub(super) fn url(&self) -> String {
        match self {
            LedgerServers::Single(server) => server.url(),
            LedgerServers::Sentinel { group, .. } => group.url(),
            LedgerServers::Cluster(cluster) => cluster.url(),
        }
    }
}

impl Fleet {
    /// The one Redis, or under Sentinel the master the sentinels name now (the one the fleet
    /// last knew while they do not agree). None under Cluster, which has a master per shard:
    /// ask [`Fleet::redis_master`].
    pub fn redis(&self) -> Option<&RedisServer> {
        match &self.redis {
            LedgerServers::Single(server) => Some(server),
            LedgerServers::Sentinel { group, master } => {
                let port = group.master_port().unwrap_or(*master);
                group.servers.iter().find(|s| s.port == port)
            }
            LedgerServers::Cluster(_) => None,
        }
    }

    /// The Sentinel group, if the fleet runs one.
    pub fn sentinel(&self) -> Option<&SentinelGroup> {
        match &self.redis {
            LedgerServers::Sentinel { group, .. } => Some(group),
            LedgerServers::Single(_) | LedgerServers::Cluster(_) => None,
        }
    }

    /// The port of the data node that takes writes to `key` now: the one Redis, the master the
    /// sentinels name, or the master of `key`'s slot.
    pub fn redis_master(&self, key: &str) -> anyhow::Result<u16> {
        match &self.redis {
            LedgerServers::Single(server) => Ok(server.port),
            LedgerServers::Sentinel { group, master } => Ok(group.master_port().unwrap_or(*master)),
            LedgerServers::Cluster(cluster) => cluster.master_of(key),
        }
    }

    /// The ledger's data node on `port` (master or replica), to signal, kill or restart.
    pub fn redis_on(&mut self, port: u16) -> Option<&mut RedisServer> {
        match &mut self.redis {
            LedgerServers::Single(server) => Some(server).filter(|s| s.port == port),
            LedgerServers::Sentinel { group, .. } => group.servers.iter_mut().find(|s| s.port == port),
            LedgerServers::Cluster(cluster) => cluster.server_on(port),
        }
    }

    /// On replicated Redis: SIGKILLs the master of `key` (see [`Fleet::redis_master`]) and
    /// returns its port.
    pub fn kill_redis_master(&mut self, key: &str) -> anyhow::Result<u16> {
        anyhow::ensure!(self.redis.replicated(), "the fleet's Redis has no replica");
        let port = self.redis_master(key)?;
        self.redis_on(port).context("the master is not one of the fleet's data nodes")?.kill();
        Ok(port)
    }

    /// On replicated Redis, after the master on `old` died: polls until another data node is
    /// the master of `key` by every sentinel's or cluster node's account, and says so itself.
    /// Returns its port.
    pub async fn wait_redis_promotion(&mut self, old: u16, key: &str, within: Duration) -> anyhow::Result<u16> {
        let deadline = Instant::now() + within;
        anyhow::ensure!(self.redis.replicated(), "the fleet's Redis has no replica");
        let slot = match &self.redis {
            LedgerServers::Cluster(cluster) => Some(cluster.slot_of(key)?),
            LedgerServers::Single(_) | LedgerServers::Sentinel { .. } => None,
        };
        loop {
            let promoted = match &mut self.redis {
                LedgerServers::Single(_) => None,
                LedgerServers::Sentinel { group, master } => {
                    let port = group.failed_over_from(old);
                    if let Some(port) = port {
                        *master = port;
                    }
                    port
                }
                LedgerServers::Cluster(cluster) => slot.and_then(|slot| cluster.failed_over_from(old, slot)),
            };
            if let Some(port) = promoted {
                return Ok(port);
            }
            anyhow::ensure!(Instant::now() < deadline, "no master promoted in place of port {old} within {within:?}");
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// On replicated Redis: restarts the data node on `port` from its AOF if it is down (a
    /// master that died comes back believing it still is one), then waits until the servers
    /// are whole again ([`Fleet::wait_redis_whole`]): the sentinels or the cluster have made it
    /// a replica, and it has synced.
    pub async fn rejoin_redis(&mut self, port: u16, within: Duration) -> anyhow::Result<()> {
        anyhow::ensure!(self.redis.replicated(), "the fleet's Redis has no replica");
        let server = self.redis_on(port).context("no data node on that port")?;
        if server.pid().is_none() {
            server.restart()?;
        }
        self.wait_redis_whole(within).await
    }

    /// Polls until every data node is in its place: under Sentinel, each one other than the
    /// master the sentinels name is that master's replica with its link up (until then, with
    /// `min-replicas-to-write 1`, the master refuses writes); under Cluster, every node sees
    /// every slot served, three masters, and each replica linked. One Redis is always whole.
    /// Every data node must run and none be frozen.
    pub async fn wait_redis_whole(&mut self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let whole = match &self.redis {
                LedgerServers::Single(_) => true,
                LedgerServers::Sentinel { group, .. } => group.is_whole(),
                LedgerServers::Cluster(cluster) => cluster.is_healthy(),
            };
            if whole {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "the ledger's Redis servers are not whole within {within:?}");
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }
}
