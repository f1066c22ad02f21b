//! Fleet-wide safeguards that run around the stock: who may buy, how often, under which order id,
//! and which background job may run where.
//!
//! **Role.** Protection. The ledger keeps the count right and the coordinator keeps stock moving;
//! this crate keeps abuse and duplication away from both. Every check that runs on the purchase
//! path answers from memory; the cluster-wide parts are synchronised through Redis or the
//! coordinator off that path, or by one atomic Lua call when a limit must hold across nodes.
//!
//! **Non-goals.** No stock decisions: a safeguard can only refuse a request before it reaches
//! the stock counter, never sell one.

pub mod blacklist;
pub mod client_ip;
pub mod ratelimit;
