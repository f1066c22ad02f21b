//! The order service on real Redis and a real PostgreSQL (private servers from testkit: free
//! loopback ports, temp dirs, killed on drop): the consumer, the sweeper, reconciliation and the
//! HTTP API, each test with servers of its own. Sales are made with `confirm` on the Redis
//! ledger directly; no node is needed to put order events in the stream.
//!
//! `redis-server` and Debian's `postgresql` must be installed; `scripts/test` installs them. A
//! missing server fails these tests loudly rather than skipping them. `paysim` runs the sandbox
//! payment provider as a process and needs neither.

// A test reads as one scenario from its set-up to its last check: the 70-line bound
// (too_many_lines) is for the code under test.
#![allow(clippy::too_many_lines)]

mod connections;
mod consumer;
mod demo;
mod harness;
mod http_api;
mod payments;
mod paysim;
mod reconcile;
mod sweeper;
