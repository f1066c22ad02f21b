//! Fleet-wide safeguards that run around the stock: who may buy, how often, under which order id,
//! and which background job may run where.
//!
//! **Role.** Protection. The ledger keeps the count right and the coordinator keeps stock moving;
//! this crate keeps abuse and duplication away from both. Every check that runs on the purchase
//! path answers from memory; the cluster-wide parts are synchronised through Redis or the
//! coordinator off that path, or by one atomic Lua call when a limit must hold across nodes.
//!
//! **Guarantees.**
//! - Rate limits ([`ratelimit`]): GCRA per user and per client address in memory (state bounded:
//!   idle keys are pruned), the lock-out rule, and a fleet-wide per-user GCRA in one Lua call
//!   on Redis time. Client addresses come from `X-Forwarded-For` only through trusted proxies
//!   ([`client_ip`]).
//! - Connections ([`connections`], [`write_deadline`]): at most so many open connections per
//!   client address (IPv6 per block), load balancers and loopback exempt; a connection whose
//!   client stops reading its answers is closed after the write timeout instead of holding its
//!   slot. The node's and the order service's HTTP servers both use them.
//! - Blacklist ([`blacklist`]): checked in memory; a change in the store (Redis) reaches every
//!   node within one sync period; automatic bans block the offender on the banning node at once.
//! - Order ids ([`idgen`]): 64-bit Snowflake-layout ids (41 bits of ms since 2026-01-01 UTC,
//!   10 bits of worker id leased from the coordinator, 12 bits of sequence), strictly
//!   increasing per generator, unique across generators with distinct worker ids, never
//!   repeated after a clock step back or a restart (a durable high-water mark runs ahead of
//!   every id). A small step back is waited out, a large one refused and counted. The mark is
//!   extended by the caller taking ids, or by a thread of its own so that an async caller never
//!   waits for the disk.
//! - Locks ([`lock`]): at most one owner holds a live lock; every acquisition carries a fencing
//!   token strictly above every earlier one for that name; a dead holder's lock frees itself
//!   after its ttl; a holder that cannot renew is told (its work is cancelled) before the ttl
//!   runs out. Redis or the coordinator (raft) backs them, behind one trait.
//!
//! **Non-goals.** No stock decisions: a safeguard can only refuse a request before it reaches
//! the stock counter, never sell one. A lock alone does not protect data from a paused holder:
//! writes must carry the fencing token (see [`lock`]).
//!
//! **Layout.** One folder or file per safeguard; they share only the address reader:
//!
//! ```text
//! blacklist/  → client_ip, ratelimit   (the list, its store, automatic bans)
//! connections → client_ip              (per-address connection caps)
//! accept      → connections, write_deadline   (the accept loop every HTTP server but the coordinator runs)
//! ratelimit/, lock/, idgen, client_ip, write_deadline → nothing of the crate
//! redis_call: the timeout every Redis call here runs under; testing: fakes for callers' tests
//! ```
//!
//! Metrics (all counters, `seckill_` prefix like the node's): `seckill_idgen_ids_total{worker}`,
//! `seckill_idgen_refused_total{worker,reason=clock_rollback|clock_out_of_range|high_water}`,
//! `seckill_idgen_clock_rollback_total{worker,outcome=waited|refused}`,
//! `seckill_idgen_sequence_exhausted_total{worker}`,
//! `seckill_idgen_reservations_total{worker,outcome=written|failed}`,
//! `seckill_lock_events_total{backend,event=acquired|reentered|contended|released|renewed|lost|failed}`.
//! Every setting is listed in the README under "Order ids and locks".

pub mod accept;
pub mod blacklist;
pub mod client_ip;
pub mod connections;
pub mod idgen;
pub mod lock;
pub mod ratelimit;
mod redis_call;
pub mod testing;
pub mod write_deadline;

pub use crate::idgen::{
    decode, Clock, IdError, IdGenerator, IdGeneratorConfig, IdParts, SnowflakeId, SystemClock, WORKER_IDS_MAX,
};
pub use crate::lock::{
    Acquisition, CancellationToken, CoordinatorLockBackend, DistributedLock, Exclusive, Extension, FencingToken,
    HoldId, LocalLockBackend, LockBackend, LockError, LockGuard, LockName, LockSettings, OwnerToken, RedisLockBackend,
    Release,
};
