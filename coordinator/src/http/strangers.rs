//! The connections that have not yet presented the cluster token (probes, scrapes, strangers):
//! they may hold only a bounded share of the member's connections, in all and per address, so
//! strangers cannot crowd out members and nodes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Connections that have not yet presented the cluster token. Past this (or past
/// [`UNPROVEN_PER_ADDRESS_MAX`] from one address), new connections are closed at once, so
/// strangers can hold at most this many slots and `CONNECTIONS_MAX` − this stay for members and
/// nodes, whose proven connections are kept alive. hyper's header timeout also bounds idleness
/// (it runs while a connection waits for its next request), so a stranger's slot frees within
/// `HEADER_TIMEOUT`.
pub(super) const UNPROVEN_CONNECTIONS_MAX: usize = 256;

/// Connections from one address that have not yet presented the token: one host cannot take
/// the whole strangers' share.
const UNPROVEN_PER_ADDRESS_MAX: usize = 32;

/// The connections that have not proven themselves, in all and per address.
#[derive(Default)]
pub(super) struct Strangers {
    /// Total and per-address counts. A std `Mutex`: held for a map update, never across `.await`.
    counts: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One connection's place among the strangers; released when the connection presents the
/// token or ends.
pub(super) struct Unproven {
    strangers: Arc<Strangers>,
    addr: IpAddr,
    released: AtomicBool,
}

impl Strangers {
    /// A place for a new connection from `addr`; `None` when strangers' share is full.
    pub(super) fn admit(self: &Arc<Self>, addr: IpAddr) -> Option<Unproven> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, by_addr) = &mut *counts;
        let mine = by_addr.entry(addr).or_default();
        if *total >= UNPROVEN_CONNECTIONS_MAX || *mine >= UNPROVEN_PER_ADDRESS_MAX {
            return None;
        }
        *mine += 1;
        *total += 1;
        Some(Unproven { strangers: self.clone(), addr, released: AtomicBool::new(false) })
    }
}

impl Unproven {
    /// The connection presented the token: it no longer counts against strangers' share.
    pub(super) fn release(&self) {
        // Relaxed: the flag only makes the release happen once; the counts it guards are
        // under the mutex.
        if self.released.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut counts = self.strangers.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, by_addr) = &mut *counts;
        *total -= 1;
        if let Some(mine) = by_addr.get_mut(&self.addr) {
            *mine -= 1;
            if *mine == 0 {
                by_addr.remove(&self.addr);
            }
        }
    }
}

impl Drop for Unproven {
    fn drop(&mut self) {
        self.release();
    }
}
