//! How durable a decision is when the buyer hears it: `[ledger] durability`. The Redis ledger
//! answers once a write script ran on the master; what survives a crash after that depends on
//! Redis' persistence and replication, which this module names, checks and waits for.
//!
//! - [`Durability::None`]: the ledger trusts Redis as it is configured. With the usual
//!   `appendfsync everysec`, a host crash (or power loss) drops up to a second of acknowledged
//!   sales, and a replica promoted after the master died may lack the latest ones: `sold`, the
//!   per-user counts and the idempotency records roll back and those units can be sold again.
//! - [`Durability::Fsync`]: the master must run `appendonly yes` and `appendfsync always`, so
//!   every write script is on its disk before Redis answers it. A crash or restart of the master
//!   on the same disk loses no acknowledged sale. The ledger checks both settings when it starts
//!   (`CONFIG GET`) and refuses to run, naming the setting, if either differs or cannot be read.
//!   It says nothing about replicas: a failover to a replica can still lose the last writes.
//! - [`Durability::Replica`]: after every write script the ledger sends `WAIT replicas
//!   timeout_ms` on the same connection, in the same pipeline, and answers success only when at
//!   least `replicas` replicas acknowledged the write. Fewer in time is
//!   [`LedgerError::NotReplicated`](crate::LedgerError::NotReplicated): the decision is stored
//!   on the master (nothing is undone) and the buyer gets 503; the retry with the same key
//!   replays it and waits again. A failover to an acknowledging replica then loses no answered
//!   sale. Reads that someone acts on (order events, the consumer group's deliveries) and
//!   replays of stored decisions wait the same way, behind a write to the SKU's fence key, so
//!   nothing a failover can undo is handed out (see `RedisLedger::fenced`); `status` is not
//!   fenced, since safety never depends on it. `WAIT` means "received", not "fsynced" by the
//!   replica; pair it with `Fsync` on the replicas' hosts for power-loss safety.
//!
//! Behind Redis Sentinel (`redis+sentinel://`), `Replica` is what makes a failover lose no
//! answered sale: the promoted replica is one that acknowledged it. `Fsync` is checked on the
//! master of the moment only.
//!
//! On a Redis Cluster (`redis+cluster://`), `Fsync` is checked on every master, and `Replica`
//! waits on the shard that ran the write: `WAIT` rides in the script's pipeline to the master of
//! the SKU's slot, so `replicas` counts that master's replicas (see `RedisLedger`'s module,
//! `redis/mod.rs`). When a master dies the cluster promotes one of its replicas; with
//! `Replica`, every answered sale of the shard is on it.
//!
//! Non-goals: the embedded ledger has no Redis behind it and takes only `None`.

use std::time::Duration;

/// What a decision has survived when the ledger answers it. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Redis as configured; no check, no wait (the default, and the behaviour before the
    /// setting existed).
    #[default]
    None,
    /// The master's AOF is fsynced on every write: checked at start.
    Fsync,
    /// Every write is acknowledged by `replicas` replicas within `timeout`, or the call fails
    /// with `NotReplicated`.
    Replica { replicas: u32, timeout: Duration },
}

impl Durability {
    /// The name `[ledger] durability` takes.
    pub fn name(&self) -> &'static str {
        match self {
            Durability::None => "none",
            Durability::Fsync => "fsync",
            Durability::Replica { .. } => "replica",
        }
    }
}

/// The settings `Durability::Fsync` needs on the server, each with the value it must have.
pub(crate) const FSYNC_SETTINGS: [(&str, &str); 2] = [("appendonly", "yes"), ("appendfsync", "always")];

/// Why a server's `CONFIG GET` answer does not allow `Durability::Fsync`, naming the setting;
/// `None` when it does. `config` holds the pairs `CONFIG GET` returned.
pub(crate) fn fsync_mismatch(server: &str, config: &[(String, String)]) -> Option<String> {
    for (name, wanted) in FSYNC_SETTINGS {
        let value = config.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str());
        match value {
            Some(value) if value.eq_ignore_ascii_case(wanted) => {}
            Some(value) => {
                return Some(format!(
                    "durability = \"fsync\" needs Redis {server} to run `{name} {wanted}`, but it runs `{name} \
                     {value}`: start it with --{name} {wanted} (or CONFIG SET {name} {wanted}), or choose another \
                     durability"
                ))
            }
            None => {
                return Some(format!(
                    "durability = \"fsync\" needs Redis {server} to run `{name} {wanted}`, but CONFIG GET {name} \
                     returned nothing"
                ))
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn fsync_needs_both_settings_and_names_the_wrong_one() {
        assert_eq!(fsync_mismatch("s", &pairs(&[("appendonly", "yes"), ("appendfsync", "always")])), None);
        let everysec = fsync_mismatch("s", &pairs(&[("appendonly", "yes"), ("appendfsync", "everysec")]));
        assert!(everysec.is_some_and(|e| e.contains("appendfsync always") && e.contains("everysec")));
        let no_aof = fsync_mismatch("s", &pairs(&[("appendonly", "no"), ("appendfsync", "always")]));
        assert!(no_aof.is_some_and(|e| e.contains("appendonly yes")));
        assert!(fsync_mismatch("s", &[]).is_some_and(|e| e.contains("returned nothing")));
    }
}
