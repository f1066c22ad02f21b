//! `seckill`: the product's wiring and its command line, with the developer tooling kept apart.
//!
//! **Role.** The member crates do the work: `ledger` (safety), `node` (speed), `coordinator`
//! (liveness), `orders` (after the sale), `safeguards` and `auth` (protection), `protocol` (the
//! contract they share). This crate reads `cluster.toml` and starts those parts as an operator
//! runs them: in one process (`seckill up`), one process per role (`seckill node`, `coordinator`,
//! `orders`), or a whole fleet on one machine behind nginx (`seckill fleet up`).
//!
//! **Layout.** Three layers; imports point down only:
//!
//! ```text
//! cli/    one module per subcommand group: parses arguments, calls one function below, prints
//!         a table, or one JSON object with --json. No business logic.
//! dev/    developer tooling users run as subcommands: bench, demo, scenarios, the load
//!         command's buyers. Uses the product layer; the product layer never uses it. Built
//!         only with the `lab` feature (on by default), with cli/lab/: the server build
//!         (`--no-default-features`) links no test kit, nemesis or sandbox provider.
//! product wiring:
//!   config/          cluster.toml: parse, check (each error names its key), where it comes from
//!   cluster          start ledger, nodes and coordinator members in process
//!   order_service    start the order service beside the ledger the config names
//!   guard            the safeguards a node or member runs, built from the config
//!   host             this host's own name (a joining node's id and address)
//!   reconcile        the ledger's books against the order store, and their repair
//!   admin            the client of the coordinator's admin API
//!   fleet/, lb/      a fleet as processes, and its nginx config (lb/sync: following the live nodes)
//!   logging          where logs go, and how much
//!   traces           a server's trace export, started from [telemetry] and the OTEL_* variables
//!   shutdown         Ctrl-C or SIGTERM, for every command that runs until stopped
//!   probe            one HTTP GET under a deadline (readiness, `seckill healthcheck`)
//! ```
//!
//! **Guarantees.** Every setting is checked before anything starts, and a bad one is an error
//! that names the key to fix. A command's stdout is a table for a person, or exactly one JSON
//! object with `--json`; logs and progress go to stderr.
//!
//! **Non-goals.** No product logic lives here: a rule about stock, orders or money belongs to the
//! crate that keeps it, where its tests are.

pub mod admin;
pub mod cli;
pub mod cluster;
pub mod config;
#[cfg(feature = "lab")]
pub mod dev;
pub mod fleet;
pub mod guard;
pub mod host;
pub mod lb;
pub mod logging;
pub mod order_service;
pub mod probe;
pub mod reconcile;
pub mod shutdown;
pub mod traces;
