//! The coordinator: an openraft group that keeps the fleet selling when nodes die.
//!
//! **Role.** Liveness. Nodes hold leases and report their local stock by heartbeat; when a lease
//! runs out, the leader bumps the node's epoch (its allotment is revoked) and grants the units it
//! left unsold to live nodes, and it keeps, for every SKU, Σ(local remaining of live nodes) ≥
//! the ledger's remaining count, so nothing goes unsold.
//!
//! **Guarantees.**
//! - Every decision is a raft log entry, durable on a majority before it takes effect; the
//!   state machine ([`ClusterState`]) is deterministic (the leader stamps time into commands)
//!   and asserts its invariants on every change. Lease renewals are not decisions: they live
//!   in the leader's memory (`leases`), so a steady fleet writes nothing to raft.
//! - An epoch, once ended, never sells again: nodes fence themselves before the coordinator
//!   revokes (lease − margin on the node's clock vs lease + grace on the leader's), and grants
//!   name the epoch they are for.
//! - Lapsed nodes are expired within lease + grace (+ one lease when most nodes lapse at once:
//!   the bounded brake, see `policy`), so a dead node's stock always moves.
//! - Worker ids are unique among live nodes.
//!
//! **Non-goals.** Safety. The coordinator can over-grant (a stale report, a racing sale): the
//! ledger caps sales at the total whatever the allotments say. It never touches a purchase; nodes
//! talk to it a few times a second, not per request. Nodes speak to it only through the types of
//! `protocol`; the raft records are private here.
//!
//! **Layout.** One wiring file, handlers that start nothing (openraft's example `lib.rs`).
//! Imports point one way, down this list; nothing imports `member`.
//!
//! | module | what it holds | imports |
//! |---|---|---|
//! | `member` | the wiring: opens the store, starts raft, builds the `Context`, starts the HTTP server, the control loop, the stripes' transfers and the watchdog | `context`, `http`, `control`, `stripes`, `watchdog`, `network`, `store`, `config` |
//! | `http/` | the member's HTTP server, split by caller: `mod` (accept loop, authentication, dispatch), `raft` (raft RPC from peers), `node_api` (register, heartbeat, leave, state, catalogue), `locks` (the lock API), `admin/` (the operators' API: `skus`, `blacklist`, members), `probes` (`/health`, `/metrics`) | `context`, `membership`, `policy`, `stripes`, `state` |
//! | `control` | the leader's loop: the policy's I/O | `context`, `policy`, `state` |
//! | `stripes` | the leader's loop moving units between the stripes of striped SKUs, each transfer exactly once; a striped SKU's status as one SKU | `context`, `state` |
//! | `watchdog` | starts an election when a split vote repeats | `context` |
//! | `membership` | replacing a member that lost its disk | `context` |
//! | `context` | what handlers and loops share, behind named methods: raft, the state machine's reads, the lease book, ledger, blacklist, tokens, metrics | `leases`, `quorum`, `store`, `state`, `config` |
//! | `leases` | renewals in the leader's memory, and why that is safe | `state` |
//! | `quorum` | leadership proof for them | (the crate's `Raft` type) |
//! | `policy` | the leader's rules, pure | `state` |
//! | `network` | raft RPC over HTTP, the client side | (the crate's `TypeConfig`) |
//! | `store/` | durable log and snapshots | `state` |
//! | `state/` | the state machine: fleet, catalogue, locks; imports nothing of the crate | — |
//! | `config` | the settings | — |

pub mod config;
mod context;
mod control;
mod http;
mod leases;
mod member;
mod membership;
mod network;
mod policy;
mod quorum;
mod state;
pub mod store;
mod stripes;
mod watchdog;

pub use crate::config::{CoordinatorConfig, MemberAddr, SkuPlan};
pub use crate::context::MemberStatus;
pub use crate::member::{Member, StartError, StatusProbe};
pub use crate::policy::even_starting;
pub use crate::state::{CatalogueEntry, ClusterState, NodeRecord};

use std::io::Cursor;

openraft::declare_raft_types!(
    /// The raft types of the coordinator group: member ids are `u64` (1-based positions in
    /// `[coordinator] members`), log records and their outcomes are the private `Command` and
    /// `Outcome` of the state machine.
    pub TypeConfig:
        D = state::Command,
        R = state::Outcome,
);

/// The raft handle of a member.
pub type Raft = openraft::Raft<TypeConfig>;
