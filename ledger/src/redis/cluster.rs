//! Reaching each master of the ledger's Redis by address: `PING` for readiness, and
//! `CONFIG GET` for the fsync check, have no key to route by, and a Redis Cluster client
//! sends a keyless command only to the masters it holds a live connection to.

use std::collections::BTreeSet;

use ::redis::aio::ConnectionLike;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{AsyncCommands, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

use super::connection::RedisConnection;
use super::RedisLedger;
use crate::*;

impl RedisLedger {
    /// [`LedgerReads::ping`]: on a cluster, every master by address.
    pub(super) async fn ping_servers(&self) -> Result<(), LedgerError> {
        match self.connection() {
            RedisConnection::Single(mut con) => {
                let _: String = self.call(None, async { con.ping().await }).await?;
            }
            RedisConnection::Cluster(mut con) => self.call(None, ping_every_master(&mut con)).await?,
            RedisConnection::Sentinel(mut con) => {
                let _: String = self.call(None, ::redis::cmd("PING").query_async(&mut con)).await?;
            }
        }
        Ok(())
    }
}

/// A cluster connection that sends every command to one master, by address: `CONFIG GET`
/// has no key to route by.
pub(super) struct MasterAt {
    pub(super) con: ClusterConnection,
    pub(super) host: String,
    pub(super) port: u16,
}

impl ConnectionLike for MasterAt {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let route =
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host: self.host.clone(), port: self.port });
        Box::pin(async move { self.con.route_command(cmd.clone(), route).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async { Err(RedisError::from((ErrorKind::Client, "pipelines are not routed by address here"))) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// PINGs, by address, every master that `CLUSTER SLOTS` names. A plain PING is no check: the
/// client fans it out only to masters it holds a live connection to, so with one master down
/// it still succeeds.
async fn ping_every_master(con: &mut ClusterConnection) -> ::redis::RedisResult<()> {
    let slots: Value = ::redis::cmd("CLUSTER").arg("SLOTS").query_async(con).await?;
    let masters =
        slot_masters(&slots).map_err(|reason| RedisError::from((ErrorKind::Client, "CLUSTER SLOTS", reason)))?;
    for (host, port) in masters {
        let ping = ::redis::cmd("PING");
        con.route_command(ping, RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port })).await?;
    }
    Ok(())
}

/// The master (`host`, `port`) of every slot range in a `CLUSTER SLOTS` reply: ranges of
/// `[first, last, [host, port, id, …], replicas…]`.
pub(super) fn slot_masters(slots: &Value) -> Result<BTreeSet<(String, u16)>, String> {
    let Value::Array(ranges) = slots else { return Err(format!("not an array: {slots:?}")) };
    let mut masters = BTreeSet::new();
    for range in ranges {
        let master = match range {
            Value::Array(range) => range.get(2),
            _ => None,
        };
        let Some(Value::Array(master)) = master else { return Err(format!("a range without a master: {range:?}")) };
        let (host, port) = match (master.first(), master.get(1)) {
            (Some(Value::BulkString(host)), Some(Value::Int(port))) => (String::from_utf8_lossy(host), port),
            _ => return Err(format!("a master without host and port: {master:?}")),
        };
        // An empty host means "the node you asked", and `?` an unknown one: neither can be
        // pinged by address. Redis announces the node's IP unless configured otherwise.
        if host.is_empty() || host == "?" {
            return Err(format!("a master announces no address: {master:?}"));
        }
        let port = u16::try_from(*port).map_err(|_| format!("a master with port {port}"))?;
        masters.insert((host.into_owned(), port));
    }
    if masters.is_empty() {
        return Err("no slot has a master".into());
    }
    Ok(masters)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn range(first: i64, last: i64, host: &str, port: i64) -> Value {
        let replica = Value::Array(vec![bulk("127.0.0.9"), Value::Int(9), bulk("id9")]);
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
            replica,
        ])
    }

    #[test]
    fn every_master_of_the_slot_map_is_pinged_once_and_no_replica() {
        let slots = Value::Array(vec![
            range(0, 99, "10.0.0.1", 7000),
            range(100, 199, "10.0.0.2", 7001),
            range(200, 16383, "10.0.0.1", 7000),
        ]);
        let masters: Vec<_> = slot_masters(&slots).unwrap().into_iter().collect();
        assert_eq!(masters, [("10.0.0.1".to_string(), 7000), ("10.0.0.2".to_string(), 7001)]);
    }

    #[test]
    fn a_slot_map_that_cannot_be_pinged_is_an_error() {
        assert!(slot_masters(&Value::Array(vec![])).is_err(), "no masters");
        assert!(slot_masters(&Value::Array(vec![range(0, 16383, "", 7000)])).is_err(), "no address");
        assert!(slot_masters(&Value::Array(vec![range(0, 16383, "?", 7000)])).is_err(), "unknown node");
        assert!(slot_masters(&Value::Int(1)).is_err(), "not a slot map");
    }
}
