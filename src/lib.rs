//! `seckill`: the command-line face of the cluster and the glue that starts it.
//!
//! The work happens in the member crates: `ledger` (safety: the global count in Redis, changed
//! only by atomic scripts) and `node` (speed: local allotments and the HTTP API). This crate
//! reads `cluster.toml` ([`config`]), starts clusters in process ([`cluster`]) or as processes
//! ([`fleet`]), and drives flash sales against them ([`demo`], [`scenario`], [`mod@bench`]) with the
//! `testkit` crate's load generator and private Redis servers. `src/main.rs` only parses
//! arguments.

pub mod admin_cli;
pub mod bench;
pub mod bench_auth;
pub mod bench_coordinator;
pub mod bench_crowd;
pub mod bench_durability;
pub mod bench_orders;
pub mod bench_payments;
pub mod bench_safeguards;
pub mod bench_sold_out;
pub mod buyer_auth;
pub mod cluster;
pub mod config;
pub mod config_source;
pub mod demo;
pub mod demo_orders;
pub mod demo_payments;
pub mod demo_sale;
pub mod fleet;
pub mod guard;
pub mod lb;
pub mod logging;
pub mod order_pipeline;
pub mod order_service;
pub mod payers;
pub mod scenario;
