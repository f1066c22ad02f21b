//! The start-up check of [`Durability::Fsync`]: every master's `CONFIG GET` must show the
//! settings `durability.rs` names, or the ledger refuses to run.

use ::redis::aio::ConnectionLike;
use ::redis::Value;

use super::cluster::{slot_masters, MasterAt};
use super::config::RedisLedgerConfig;
use super::connection::RedisConnection;
use super::redact::redact_url;
use super::RedisLedger;
use crate::durability::{fsync_mismatch, FSYNC_SETTINGS};
use crate::*;

impl RedisLedger {
    /// Refuses to run when the server does not keep what `durability` promises: under
    /// [`Durability::Fsync`], every master must answer `CONFIG GET` with `appendonly yes` and
    /// `appendfsync always`. The error names the setting that is wrong, or says that `CONFIG`
    /// was refused (renamed, or denied to the ledger's user); an unreachable Redis is
    /// [`LedgerError::Unavailable`]. `None` and `Replica` need no check (a `Replica` shortfall
    /// shows on every write).
    pub async fn check_durability(&self) -> Result<(), LedgerError> {
        if self.config.durability != Durability::Fsync {
            return Ok(());
        }
        let shown = redact_url(&self.config.url);
        match self.connection() {
            RedisConnection::Single(mut con) => check_fsync(&shown, &mut con, &self.config).await,
            // The master of the moment; a replica promoted later is not checked, so run every
            // data node behind the sentinels with the same settings.
            RedisConnection::Sentinel(mut con) => check_fsync(&shown, &mut con, &self.config).await,
            RedisConnection::Cluster(mut con) => {
                let slots: Value = self.call(None, ::redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut con)).await?;
                let masters = slot_masters(&slots).map_err(LedgerError::Unavailable)?;
                for (host, port) in masters {
                    let mut node = MasterAt { con: con.clone(), host: host.clone(), port };
                    check_fsync(&format!("{host}:{port}"), &mut node, &self.config).await?;
                }
                Ok(())
            }
        }
    }
}

/// Reads the `FSYNC_SETTINGS` of one server with `CONFIG GET` and refuses a mismatch.
async fn check_fsync(
    server: &str,
    con: &mut impl ConnectionLike,
    config: &RedisLedgerConfig,
) -> Result<(), LedgerError> {
    let mut pairs = Vec::new();
    for (name, _) in FSYNC_SETTINGS {
        let read = tokio::time::timeout(
            config.call_timeout,
            ::redis::cmd("CONFIG").arg("GET").arg(name).query_async::<Vec<(String, String)>>(con),
        )
        .await;
        match read {
            Err(_) => {
                return Err(LedgerError::Unavailable(format!(
                    "durability = \"fsync\": Redis {server} did not answer CONFIG GET {name} within {:?}",
                    config.call_timeout
                )))
            }
            Ok(Ok(answer)) => pairs.extend(answer),
            Ok(Err(e))
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() =>
            {
                return Err(LedgerError::Unavailable(format!(
                    "durability = \"fsync\": cannot read Redis {server}'s settings: {e}"
                )))
            }
            Ok(Err(e)) => {
                return Err(LedgerError::Misconfigured(format!(
                    "durability = \"fsync\" must read Redis {server}'s `{name}` with CONFIG GET, and Redis refused: \
                     {e}. Is CONFIG renamed (rename-command) or denied to the ledger's user? Allow it, or choose \
                     another durability"
                )))
            }
        }
    }
    match fsync_mismatch(server, &pairs) {
        Some(reason) => Err(LedgerError::Misconfigured(reason)),
        None => Ok(()),
    }
}
