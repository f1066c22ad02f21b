//! `seckill`: the command-line face of the cluster and the glue that starts it.
//!
//! The work happens in the member crates: `ledger` (safety: the global count in Redis, changed
//! only by atomic scripts) and `node` (speed: local allotments and the HTTP API). This crate
//! reads `cluster.toml` ([`config`]), starts clusters in process ([`cluster`]), and drives flash
//! sales against them ([`load`], [`demo`], [`scenario`]). The command line's own parts: which
//! config a command reads ([`config_source`]), logs ([`logging`]), progress bars ([`progress`])
//! and the admin API's client ([`admin_cli`]). `src/main.rs` only parses arguments.

pub mod admin_cli;
pub mod bench;
pub mod bench_safeguards;
mod chart;
pub mod cluster;
pub mod config;
pub mod config_source;
pub mod demo;
pub mod fleet;
pub mod guard;
pub mod lb;
pub mod load;
pub mod logging;
pub mod progress;
pub mod redis_server;
pub mod scenario;
