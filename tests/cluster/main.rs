//! End-to-end tests of the core sale path against a real `redis-server` (each test starts its
//! own on a free loopback port) and real HTTP. One test binary, so the workspace links once.
//!
//! `redis-server` must be installed; `scripts/test` installs it. A missing server fails these
//! tests loudly rather than skipping them.

mod admin;
mod faults;
mod hardening;
mod harness;
mod http_contract;
mod idempotency;
mod ledger_suite;
mod sale;
mod tokens;
