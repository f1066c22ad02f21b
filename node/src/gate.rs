//! The admission seam: rate limits and blacklists plug in here, between the sold-out check and
//! the stock counter, so that abuse is turned away before it can hold a unit.

use std::net::IpAddr;
use std::time::Duration;

/// Who is asking, as far as the node can tell (validated ids, borrowed from the request).
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub sku: &'a str,
    pub user: &'a str,
    pub ip: IpAddr,
}

/// Whether a caller may go on to the stock counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admit,
    /// Too many requests; the caller may try again after this long.
    RateLimited {
        retry_after: Duration,
    },
    /// The user or address is on a blacklist.
    Blocked,
}

/// Decides admission. Runs on every request that gets past the sold-out flag, so it must answer
/// from memory.
pub trait Gate: Send + Sync + 'static {
    fn admit(&self, caller: Caller<'_>) -> Admission;
}

/// Lets everyone through: the default until limits are configured.
#[derive(Debug, Default, Clone, Copy)]
pub struct OpenGate;

impl Gate for OpenGate {
    fn admit(&self, _caller: Caller<'_>) -> Admission {
        Admission::Admit
    }
}
