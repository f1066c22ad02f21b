//! What a Redis error means to the caller: our scripts' own codes (`SECKILL_*`) become the
//! [`LedgerError`] that says what to do; anything else is a transport or server fault, whose
//! outcome is unknown.

use ::redis::RedisError;

use crate::*;

pub(super) fn unavailable(e: &RedisError) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

/// Script errors carry our own codes; anything else is a transport or server fault that the
/// caller treats as "outcome unknown, retry".
pub(super) fn classify(e: &RedisError, sku: Option<&SkuId>) -> LedgerError {
    let text = e.to_string();
    match sku {
        Some(sku) if text.contains("SECKILL_MISSING") => LedgerError::Missing(sku.clone()),
        _ if text.contains("SECKILL_CORRUPT") => LedgerError::Corrupt(text),
        _ if text.contains("SECKILL_EPOCH_ENDED") => LedgerError::EpochEnded(text),
        _ => unavailable(e),
    }
}
