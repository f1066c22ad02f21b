//! End-to-end tests of the core sale path against a real `redis-server` (each test starts its
//! own on a free loopback port) and real HTTP. One test binary, so the workspace links once.
//!
//! `redis-server` (and, for `redis_cluster` and `redis_cluster_replicas`, `redis-cli`; for
//! `prometheus`, `prometheus`) must be installed; `scripts/test` installs them. A missing binary
//! fails these tests loudly rather than skipping them.

// A test reads as one scenario from its set-up to its last check: the 70-line bound
// (too_many_lines) is for the code under test.
#![allow(clippy::too_many_lines)]

mod admin;
mod admin_cli;
mod auth;
mod breaker;
mod durability;
mod failover_sale;
mod faults;
mod gate;
mod hardening;
mod harness;
mod hot_sku;
mod http_contract;
mod idempotency;
mod ledger_suite;
mod names;
mod order_ids;
mod prometheus;
mod redis_cluster;
mod redis_cluster_replicas;
mod room;
mod sale;
mod security;
mod sentinel;
mod striped_sale;
mod stripes;
mod tokens;
