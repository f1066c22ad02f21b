//! What seckill's tests, benchmarks and dev commands need and the product does not.
//!
//! **Role.** A kit, kept out of the product crates: nothing in `protocol`, `ledger`, `node`,
//! `coordinator` or `safeguards` depends on it, and the `seckill` binary links it only for its
//! dev commands (`load`, `bench`, `demo`, `nemesis`), behind its `lab` feature: the server build
//! (`--no-default-features`) links none of it.
//!
//! - [`redis`]: private `redis-server` processes (one, or a three-master cluster) on free
//!   loopback ports in temp dirs, stopped when dropped; and the work a Redis did, from `INFO`.
//! - [`postgres`]: a private PostgreSQL (Debian's newest installed) on a free loopback port in a
//!   temp dir, fsync on, stopped, restarted or killed at will and removed when dropped (the
//!   `backing` crate's, which `fleet up` shares for its detached server).
//! - [`sentinel`]: a master, its replicas and three Redis Sentinels, with short failover timings.
//! - [`load`]: a load generator of retrying buyers over keep-alive HTTP/1.
//! - [`chart`]: SVG bar charts for benchmark reports.
//! - [`progress`]: progress bars for long runs, drawn only when a person watches.
//! - [`proxy`]: a fault-injecting TCP proxy (drop, delay, blackhole, one-way) switched at run
//!   time.
//! - [`fleet`]: a fleet of `seckill` processes (coordinator members, nodes) over a private Redis,
//!   optionally with a proxy on every link of every node, for fault tests and the nemesis.
//! - [`http`]: one-shot HTTP GETs under a deadline, for polling the processes a harness started.
//! - [`hogs`]: clients that hold a server's connections on purpose (pipelining and never
//!   reading), from any loopback address, for the tests of connection bounds.
//! - [`compose`]: the Compose fleet of `deploy/`, brought up by `deploy/up` and driven through
//!   the docker CLI: kill, pause, cut off from the network, replace a container.
//! - [`otlp`]: a trace collector (OTLP/HTTP receiver) that keeps the spans it is sent.
//! - [`browser`]: a headless chromium driven over WebDriver by a private chromedriver, for the
//!   tests of the sale page: text by element id, clicks, waits, screenshots, console errors.
//!
//! **Guarantees.** Every server it starts listens on loopback only (the Compose fleet's
//! containers on their own private network), on a port the kernel picked, with its data in a
//! temp dir (the Compose fleet's in volumes it removes); it never connects to a server it did not start unless a caller
//! hands it a URL.
//!
//! **Layout.** Servers at the bottom, the fleet on top:
//!
//! ```text
//! fleet    → http, postgres, proxy, redis, sentinel
//! sentinel → redis
//! browser → load, redis
//! http → load → progress
//! compose → redis (a free port)
//! chart, hogs, otlp, proxy, redis, postgres (from `backing`) → nothing of the crate
//! ```

pub mod browser;
pub mod chart;
pub mod compose;
pub mod fleet;
pub mod hogs;
pub mod http;
pub mod load;
pub mod otlp;
/// PostgreSQL lives in `backing`, which `fleet up` shares; tests reach it here as before.
pub use backing::postgres;
pub mod progress;
pub mod proxy;
pub mod redis;
pub mod sentinel;
