//! Which address a request comes from, for per-address limits and blacklists. Behind a load
//! balancer every socket address is the balancer's, so `X-Forwarded-For` must be read, but only
//! as far as it was written by proxies we trust: anything to the left of the first untrusted hop
//! was written by the client and could be anything.
//!
//! Limits and bans key on [`subject`], not on the bare address: one IPv6 host is usually handed
//! a whole /64, so keying on the full address would give an abuser 2^64 fresh identities.

use std::net::IpAddr;

/// Proxies whose `X-Forwarded-For` entries are believed: addresses or CIDR blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<(IpAddr, u8)>);

impl TrustedProxies {
    /// Parses `"10.0.0.0/8"`, `"127.0.0.1"`, `"::1"`, `"fd00::/8"`.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut blocks = Vec::new();
        for entry in entries {
            let (addr, bits) = match entry.split_once('/') {
                Some((addr, bits)) => (addr, Some(bits)),
                None => (entry, None),
            };
            let addr: IpAddr = addr.trim().parse().map_err(|_| format!("{entry:?} is not an address or CIDR block"))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let bits = match bits {
                Some(bits) => bits
                    .trim()
                    .parse()
                    .ok()
                    .filter(|b| *b <= max)
                    .ok_or_else(|| format!("{entry:?}: bad prefix length"))?,
                None => max,
            };
            blocks.push((addr, bits));
        }
        Ok(Self(blocks))
    }

    /// `127.0.0.0/8` and `::1` (IPv4-mapped loopback counts as IPv4): processes on this host.
    pub fn loopback() -> Self {
        Self(vec![(IpAddr::from([127, 0, 0, 0]), 8), (IpAddr::from(std::net::Ipv6Addr::LOCALHOST), 128)])
    }

    /// Every block of `self` and of `other`.
    pub fn union(&self, other: &TrustedProxies) -> Self {
        let mut blocks = self.0.clone();
        blocks.extend(other.0.iter().filter(|block| !self.0.contains(block)));
        Self(blocks)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|(block, bits)| in_block(ip, *block, *bits))
    }
}

fn in_block(ip: IpAddr, block: IpAddr, bits: u8) -> bool {
    match (ip.to_canonical(), block) {
        (IpAddr::V4(ip), IpAddr::V4(block)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(block) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(block)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(block) & mask
        }
        _ => false,
    }
}

/// Bits of an IPv6 address that name one subscriber: ISPs hand out a /64 (or more) per customer.
pub const IPV6_PREFIX_DEFAULT: u8 = 64;

/// The address limits and bans key on: an IPv4 address (or an IPv4-mapped IPv6 one) as is, an
/// IPv6 address cut to its first `v6_prefix` bits (the network address of its block).
pub fn subject(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(v6_prefix.min(128))).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

/// The client's address: the socket peer, unless the peer is a trusted proxy; then the
/// rightmost `X-Forwarded-For` entry that is not a trusted proxy itself. `forwarded_for` holds
/// every `X-Forwarded-For` header value in order. An unreadable entry ends the walk at the last
/// hop we could read, never at something to its left.
pub fn client_ip<'a>(
    peer: IpAddr,
    forwarded_for: impl IntoIterator<Item = &'a str>,
    trusted: &TrustedProxies,
) -> IpAddr {
    if !trusted.contains(peer) {
        return peer;
    }
    let hops: Vec<&str> = forwarded_for.into_iter().flat_map(|value| value.split(',')).collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Ok(ip) = hop.trim().parse::<IpAddr>() else { return client };
        client = ip;
        if !trusted.contains(ip) {
            return ip;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted = TrustedProxies::parse(["127.0.0.1", "10.0.0.0/8"]).unwrap();
        assert_eq!(
            client_ip(ip("203.0.113.9"), ["1.2.3.4"], &trusted),
            ip("203.0.113.9"),
            "untrusted peer: its own address"
        );
        assert_eq!(client_ip(ip("127.0.0.1"), ["1.2.3.4"], &trusted), ip("1.2.3.4"));
        assert_eq!(
            client_ip(ip("127.0.0.1"), ["6.6.6.6, 1.2.3.4, 10.1.2.3"], &trusted),
            ip("1.2.3.4"),
            "the rightmost untrusted hop; 6.6.6.6 was written by the client"
        );
        assert_eq!(client_ip(ip("127.0.0.1"), ["1.2.3.4", "10.0.0.7"], &trusted), ip("1.2.3.4"), "several headers");
        assert_eq!(client_ip(ip("127.0.0.1"), ["junk, 10.0.0.7"], &trusted), ip("10.0.0.7"), "unreadable: stop");
        assert_eq!(client_ip(ip("127.0.0.1"), [], &trusted), ip("127.0.0.1"), "no header: the proxy itself");
    }

    #[test]
    fn ipv6_addresses_count_per_block_and_ipv4_per_address() {
        let a = subject(ip("2001:db8:1:2:aaaa::1"), 64);
        assert_eq!(a, ip("2001:db8:1:2::"));
        assert_eq!(subject(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), 64), a, "the same /64");
        assert_ne!(subject(ip("2001:db8:1:3::1"), 64), a, "the next /64");
        assert_eq!(subject(ip("2001:db8:1:3::1"), 48), ip("2001:db8:1::"), "a configurable prefix");
        assert_eq!(subject(ip("2001:db8::1"), 128), ip("2001:db8::1"));
        assert_eq!(subject(ip("203.0.113.9"), 64), ip("203.0.113.9"));
        assert_eq!(subject(ip("::ffff:203.0.113.9"), 64), ip("203.0.113.9"), "IPv4-mapped is IPv4");
    }

    #[test]
    fn cidr_blocks_match_by_prefix() {
        let trusted = TrustedProxies::parse(["192.168.0.0/16", "fd00::/8", "::1"]).unwrap();
        assert!(trusted.contains(ip("192.168.44.1")));
        assert!(!trusted.contains(ip("192.169.0.1")));
        assert!(trusted.contains(ip("fd12::1")) && trusted.contains(ip("::1")));
        assert!(trusted.contains(ip("::ffff:192.168.1.1")), "IPv4-mapped addresses count as IPv4");
        let loopback = TrustedProxies::loopback();
        assert!(
            loopback.contains(ip("127.0.0.1")) && loopback.contains(ip("127.8.9.10")) && loopback.contains(ip("::1"))
        );
        assert!(loopback.contains(ip("::ffff:127.0.0.2")) && !loopback.contains(ip("128.0.0.1")));
        let both = loopback.union(&trusted);
        assert!(both.contains(ip("127.0.0.1")) && both.contains(ip("192.168.44.1")) && !both.contains(ip("10.0.0.1")));
        assert!(TrustedProxies::parse(["10.0.0.0/33"]).is_err());
        assert!(TrustedProxies::parse(["not-an-ip"]).is_err());
    }
}
