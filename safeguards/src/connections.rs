//! At most so many open connections per client address, so one host cannot take every
//! connection slot of a server. A total bound (`connections_max`) alone lets whoever opens the
//! most connections hold all of them (issue 23: 1,400 connections held all 1,024 slots of the
//! order API for over a minute), and every other client, a payment provider's callback among
//! them, waits in the accept queue until they leave.
//!
//! The bound is taken when a connection is accepted, from the socket's peer, before a byte is
//! read: `X-Forwarded-For` is not there yet, and a connection cannot be admitted on the word of
//! a request it has not sent. Hence the exemptions. Behind a load balancer every connection
//! comes from the balancer's address, so a bound on that address would cap the whole fleet's
//! traffic; the balancer, which bounds its own clients, is exempt instead: the addresses in
//! [`ConnectionsPerAddress::exempt`] (loopback by default, where `seckill fleet up` runs nginx)
//! and, added by each server, its `trusted_proxies`. Their connections count only against the
//! server's total bound.
//!
//! Addresses are counted as limits and bans count them ([`client_ip::subject`]): an IPv4 address
//! as is, an IPv6 address per block (a /64 by default), since one IPv6 host holds a whole block.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::client_ip::{self, TrustedProxies};

/// The per-address bound of one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionsPerAddress {
    /// Open connections one address (IPv6: one block) may hold; 0: no bound.
    pub max: usize,
    /// Peers not bounded per address: load balancers and local proxies, whose connections carry
    /// many clients each.
    pub exempt: TrustedProxies,
    /// Bits of an IPv6 address that name one client (`[safeguards] ipv6_prefix`).
    pub ipv6_prefix: u8,
}

impl ConnectionsPerAddress {
    /// `max` per address, loopback exempt, IPv6 per /64.
    pub fn new(max: usize) -> Self {
        Self { max, exempt: TrustedProxies::loopback(), ipv6_prefix: client_ip::IPV6_PREFIX_DEFAULT }
    }

    /// No per-address bound at all.
    pub fn off() -> Self {
        Self::new(0)
    }
}

/// The open connections of one server, per address. Entries exist only for addresses with a
/// connection open, so the map is bounded by the server's own connection bound.
#[derive(Debug)]
pub struct OpenConnections {
    bound: ConnectionsPerAddress,
    /// A std `Mutex`: held for one map update, never across an `.await`.
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One admitted connection's place in its address's count; given back when dropped, which the
/// server does when the connection ends.
#[derive(Debug)]
#[must_use = "the place is given back as soon as it is dropped"]
pub struct ConnectionSlot {
    /// `None` for exempt peers and when there is no bound: nothing was counted.
    counted: Option<(Arc<OpenConnections>, IpAddr)>,
}

impl OpenConnections {
    pub fn new(bound: ConnectionsPerAddress) -> Arc<Self> {
        Arc::new(Self { bound, open: Mutex::new(HashMap::new()) })
    }

    pub fn bound(&self) -> &ConnectionsPerAddress {
        &self.bound
    }

    /// A place for a new connection from `peer`, or `None` when its address already holds
    /// [`ConnectionsPerAddress::max`] connections.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<ConnectionSlot> {
        if self.bound.max == 0 || self.bound.exempt.contains(peer) {
            return Some(ConnectionSlot { counted: None });
        }
        let subject = client_ip::subject(peer, self.bound.ipv6_prefix);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = open.entry(subject).or_default();
        if *mine >= self.bound.max {
            return None;
        }
        *mine += 1;
        Some(ConnectionSlot { counted: Some((self.clone(), subject)) })
    }

    /// Connections counted for `peer`'s address (its block, for IPv6); 0 for exempt peers.
    pub fn open_from(&self, peer: IpAddr) -> usize {
        let subject = client_ip::subject(peer, self.bound.ipv6_prefix);
        self.open.lock().unwrap_or_else(PoisonError::into_inner).get(&subject).copied().unwrap_or(0)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let Some((connections, subject)) = self.counted.take() else { return };
        let mut open = connections.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(mine) = open.get_mut(&subject) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                open.remove(&subject);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn strict(max: usize) -> Arc<OpenConnections> {
        OpenConnections::new(ConnectionsPerAddress {
            exempt: TrustedProxies::default(),
            ..ConnectionsPerAddress::new(max)
        })
    }

    #[test]
    fn an_address_holds_at_most_max_and_a_closed_connection_frees_its_place() {
        let open = strict(2);
        let first = open.admit(ip("203.0.113.9")).expect("first");
        let _second = open.admit(ip("203.0.113.9")).expect("second");
        assert!(open.admit(ip("203.0.113.9")).is_none(), "a third from the same address");
        assert!(open.admit(ip("203.0.113.10")).is_some(), "another address has places of its own");
        drop(first);
        assert_eq!(open.open_from(ip("203.0.113.9")), 1);
        assert!(open.admit(ip("203.0.113.9")).is_some(), "the freed place is taken again");
    }

    #[test]
    fn ipv6_counts_per_block_and_ipv4_mapped_as_ipv4() {
        let open = strict(1);
        let _held = open.admit(ip("2001:db8:1:2::1")).expect("first of the /64");
        assert!(open.admit(ip("2001:db8:1:2:ffff::9")).is_none(), "the same /64 is one client");
        assert!(open.admit(ip("2001:db8:1:3::1")).is_some(), "the next /64 is another");
        let _v4 = open.admit(ip("198.51.100.7")).expect("IPv4");
        assert!(open.admit(ip("::ffff:198.51.100.7")).is_none(), "IPv4-mapped is the same address");
    }

    #[test]
    fn exempt_peers_and_an_unbounded_server_count_nothing() {
        let open = OpenConnections::new(ConnectionsPerAddress {
            exempt: TrustedProxies::parse(["10.0.0.0/8"]).unwrap(),
            ..ConnectionsPerAddress::new(1)
        });
        let held: Vec<_> = (0..100).map(|_| open.admit(ip("10.1.2.3")).expect("a load balancer")).collect();
        assert_eq!((held.len(), open.open_from(ip("10.1.2.3"))), (100, 0));
        let loopback = OpenConnections::new(ConnectionsPerAddress::new(1));
        let held: Vec<_> = (0..3).map(|_| loopback.admit(ip("127.0.0.1")).expect("loopback, by default")).collect();
        assert_eq!(held.len(), 3);
        assert!(loopback.admit(ip("::1")).is_some());
        let off =
            OpenConnections::new(ConnectionsPerAddress { exempt: TrustedProxies::default(), max: 0, ipv6_prefix: 64 });
        let held: Vec<_> = (0..100).map(|_| off.admit(ip("203.0.113.9")).expect("no bound")).collect();
        assert_eq!(held.len(), 100);
    }

    #[test]
    fn the_map_forgets_addresses_with_nothing_open() {
        let open = strict(4);
        let slots: Vec<_> = (0..50).filter_map(|n| open.admit(IpAddr::from([192, 0, 2, n]))).collect();
        assert_eq!(open.open.lock().unwrap().len(), 50);
        drop(slots);
        assert!(open.open.lock().unwrap().is_empty());
    }
}
