//! Addresses: what a process binds (`listen`, a socket address) and where the others reach it
//! (`advertise`, `host:port`, where the host may be a DNS name). They differ wherever a process
//! runs behind a name: in a container it binds `0.0.0.0:8080` and is reached as `node-3:8080`.
//! A name is resolved when it is used, never when the config is read, so processes may start in
//! any order and a name that does not resolve yet is retried, never fatal.

use std::net::SocketAddr;

use super::{invalid, ConfigError};

/// `listen` as another process on this machine reaches it: a wildcard address is not one.
pub fn reachable(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => SocketAddr::from(([127, 0, 0, 1], listen.port())),
        ip if ip.is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, listen.port())),
        _ => listen,
    }
}

/// Checks an `advertise` value: `host:port`, a host (a name, an IPv4 address or a bracketed
/// IPv6 one) and a port from 1 up, nothing else (no scheme, no path). Returns it as given.
pub fn host_port(key: &str, text: &str) -> Result<String, ConfigError> {
    let refuse =
        || invalid(key, format!("{text:?} is not host:port (a DNS name or an IP address, and a port above 0)"));
    let (host, port) = text.rsplit_once(':').ok_or_else(refuse)?;
    let port_ok = port.parse::<u16>().is_ok_and(|port| port > 0);
    let host_ok = match host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host.len() <= 253
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                })
        }
    };
    if !(port_ok && host_ok) {
        return Err(refuse());
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertise_is_a_host_and_a_port() {
        for good in ["node-3:8080", "10.0.0.7:1", "[::1]:8080", "seckill_node_2:8080", "a.b.example:443"] {
            assert_eq!(host_port("k", good).unwrap(), good);
        }
        for bad in ["node-3", "node-3:0", ":8080", "http://node:1", "node:1/x", "::1:80", "no de:1", "[zz]:1", ""] {
            let error = host_port("nodes[0].advertise", bad).unwrap_err().to_string();
            assert!(error.starts_with("nodes[0].advertise"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_wildcard_listen_is_reached_on_loopback() {
        assert_eq!(reachable("0.0.0.0:80".parse().unwrap()).to_string(), "127.0.0.1:80");
        assert_eq!(reachable("[::]:80".parse().unwrap()).to_string(), "[::1]:80");
        assert_eq!(reachable("10.1.2.3:80".parse().unwrap()).to_string(), "10.1.2.3:80");
    }
}
