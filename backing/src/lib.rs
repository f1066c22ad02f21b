//! The backing servers seckill starts on one machine, beside its own processes: a PostgreSQL
//! cluster (`postgres`), and the free loopback ports they and the fleet's processes listen on
//! (`ports`).
//!
//! **Role.** `seckill fleet up` runs the order store's PostgreSQL as a detached, secured server
//! that outlives it; the test kit runs private ones that live as long as a test. Both start the
//! same way (Debian's binaries, `initdb`, `setpriv` to the `postgres` user when root), so that
//! code lives once, here, in a crate the server build links, rather than in the test kit, which
//! it must not.
//!
//! **Guarantees.** A detached server takes passwords over TCP only (`scram-sha-256`), its
//! superuser only through a private Unix socket, and no password ever reaches a command line or
//! its log. A test's server never touches a server someone else runs: its cluster is new, in a
//! temp dir, on a port that was free.
//!
//! **Non-goals.** Redis and nginx are started by their callers (`fleet up`, the test kit): their
//! start is a command line, not a cluster to make. No server here is for production hosts,
//! which run their databases their own way; `fleet up` is one machine's fleet.
//!
//! **Layout.**
//!
//! ```text
//! postgres → ports   (a cluster: make, start, secure, stop)
//! ports    → nothing of the crate
//! ```

pub mod ports;
pub mod postgres;

pub use ports::free_port;
