//! Free listening ports. A port is only free when probed: another process may take it before
//! the caller binds it, so callers that start a server on one retry with another.

use std::net::TcpListener;

/// Listening ports are drawn below this; the kernel hands out ephemeral ports (outgoing
/// connections, binds to port 0) from 32768 up on Linux by default.
const LISTEN_PORTS: std::ops::Range<u16> = 10_000..32_768;

/// Draws of a listening port before falling back to one the kernel picks.
const LISTEN_PORT_PROBES_MAX: usize = 200;

/// A port that was free a moment ago, below the kernel's ephemeral range where it can: a
/// process restarted on it later (a killed node, Redis) must find it free again, and an
/// ephemeral port may meanwhile have become the local end of some outgoing connection, or a
/// proxy's listener.
pub fn free_port() -> std::io::Result<u16> {
    for _ in 0..LISTEN_PORT_PROBES_MAX {
        let port = fastrand::u16(LISTEN_PORTS);
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return Ok(listener.local_addr()?.port());
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
