use crate::SkuId;

/// What went wrong talking to the ledger; each variant tells the caller what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    /// The ledger has no record of this SKU (never created, or Redis lost its data). Refuse to
    /// sell it: a missing ledger is never treated as stock.
    #[error("the ledger has no record of SKU {0}")]
    Missing(SkuId),
    /// The ledger could not be reached or did not answer in time. Nothing is known about the
    /// outcome; retry with the same idempotency keys and the stored outcome decides.
    #[error("the ledger is unavailable: {0}")]
    Unavailable(String),
    /// `durability = "replica"`: the write ran and its decisions are stored on the master, but
    /// fewer than `wanted` replicas acknowledged it within the wait (`WAIT`), so a failover now
    /// could lose it. Tell the buyer nothing was promised (503) and retry with the same
    /// idempotency keys: the retry replays the stored decisions and waits for the replicas again.
    #[error("the write reached {acked} of {wanted} replicas in time")]
    NotReplicated { acked: u64, wanted: u64 },
    /// The Redis server does not keep what the configured durability promises (`fsync` without
    /// `appendfsync always`), or would not say (`CONFIG` refused). The message names the
    /// setting. Do not start: fix the server or the configured durability.
    #[error("the ledger's Redis is not configured for the chosen durability: {0}")]
    Misconfigured(String),
    /// The seller's epoch was ended by the coordinator (`CatalogueLedger::end_epoch`): nothing it sends
    /// is decided. The node must drop its allotment and register again; its buyers retry
    /// elsewhere with the same keys.
    #[error("the seller's epoch has ended: {0}")]
    EpochEnded(String),
    /// The ledger's own invariant (`sold + remaining == total`) is broken. Stop selling and
    /// alert an operator.
    #[error("the ledger is corrupt: {0}")]
    Corrupt(String),
    /// The SKU issued as many submit tokens as one window allows (the bound on the memory they
    /// take). Nothing was stored; the caller may ask again after `retry_after_ms`.
    #[error("the SKU issued its submit tokens for now; retry in {retry_after_ms} ms")]
    TokensExhausted { retry_after_ms: u64 },
}
