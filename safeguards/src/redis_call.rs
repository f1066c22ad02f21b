//! One Redis call under a deadline. The safeguards that keep state on Redis (fleet-wide limits,
//! the blacklist, locks) share the ledger's connection and this bound, so a slow Redis turns into
//! a quick, reported failure instead of a request left waiting.

use std::future::Future;
use std::time::Duration;

/// The call's value, or why there is none: Redis' own error text, or the deadline.
pub(crate) async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}
