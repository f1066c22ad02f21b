//! The inventory node: answers purchases from memory and sends only local winners to the ledger.
//!
//! **Role.** Speed. Each node holds, per SKU, a local allotment in one atomic counter. A
//! purchase that finds the counter empty, or the SKU flagged sold out, is answered without any
//! network call; only a request that wins a local unit goes on to the ledger, and those are
//! confirmed in batches. A burst of 1000x the stock thus costs the ledger about one call per unit
//! sold, not one per request. `mode = "redis-only"` sells the same SKUs without any of that
//! (every purchase one ledger call): the baseline the benchmarks measure against.
//!
//! **Guarantees.**
//! - A local allotment never goes below zero ([`LocalStock`]).
//! - A request answered "purchased" was confirmed by the ledger; the node never decides a sale
//!   on its own, so it cannot oversell whatever its allotment says.
//! - A unit taken but not sold (refused, replayed, ledger down, circuit breaker open, client
//!   gone) goes back to the local stock, so a node's own failures cannot leave stock unsold.
//! - Bad input is a 4xx that touches no state; no request path panics.
//! - With buyer authentication on (`auth`), a purchase or token is for the buyer its credential
//!   proves, never the body's `user`; a request whose credential proves nobody decides nothing.
//!   Answers that are the same for every buyer (sold out, ended, not started) come first.
//! - A purchase of a SKU that requires submit tokens and brings none is refused before the stock
//!   counter; whether a token it brings is valid only the ledger decides.
//! - Under a coordinator, a node sells only while its lease holds (it fences itself before the
//!   coordinator may revoke), and a unit of an ended epoch never returns to the stock.
//! - A SKU's selling mode is fixed when it is added (`Selling`): an allotment always has
//!   its stock, confirm queue and sold-out flag, a ledger-only SKU has none of them.
//! - The request path never waits for a disk: units come from a CAS, an order id from a
//!   reservation the order-id thread made durable beforehand (lock-free), and what blocks on
//!   files (opening an id generator, fsyncing its high-water file) runs on that thread, never on
//!   a Tokio worker. Taking an id may still sleep out a clock step back of at most the rollback
//!   tolerance (5 ms).
//!
//! **Non-goals.** The node does not decide how much allotment it gets: the configured share
//! without a coordinator, the coordinator's grants with one. It does not implement rate limits,
//! blacklists or id generation: those come from the `safeguards` crate, through [`Gate`]
//! ([`SafeguardGate`]) and the order-id generator. It keeps nothing durable but the order-id
//! high-water files: a restarted node starts from zero and is granted again.
//!
//! **Layout.** Dependencies point one way, from the edge down:
//!
//! ```text
//! server     → http, pipeline
//! http       → tokens, room, pipeline, outcome, metrics   (http/room: the room's routes)
//! tokens     → pipeline, stripes, gate, outcome (more `impl Node`: submit tokens)
//! pipeline   → confirmer, breaker, sku, stripes, room, membership, order_ids, metrics, outcome, gate, clock, config, shutdown
//! room       → sku, ticket, shutdown
//! confirmer  → breaker, sku, metrics, shutdown
//! stripes    → sku, clock, config
//! sku        → stock, tally, clock, config
//! breaker    → config
//! metrics    → outcome, gate
//! membership → shutdown                        (it sees `Node` only as a `Leaseholder`)
//! config     → ticket
//! outcome, stock, tally, order_ids, gate, clock, ticket, shutdown → nothing of the crate
//! ```
//!
//! - `outcome`: the vocabulary of answers ([`Outcome`], [`Code`]); imports nothing of the crate.
//! - `stock`: the allotment counter. `tally`: a count every request bumps, in per-thread slots.
//!   `sku`: one SKU, its counters behind named methods, and `Selling` (allotment or ledger-only).
//! - `stripes`: a striped SKU's stripes (each a SKU of its own here): the stripe a buyer buys on,
//!   whether another stripe may still sell when the buyer's is empty (503 `stripe_empty`, not
//!   `sold_out`), a static config's striped SKU split into its stripes.
//! - `confirmer`: batches a SKU's local winners into ledger calls and settles their units.
//! - `breaker`: the ledger circuit breaker; after consecutive failed calls, winners get 503 at
//!   once (their units go back) until one probe finds the ledger answering again.
//! - `pipeline`: the purchase steps, the status refresher and [`Node`], the handle that owns the
//!   SKUs and everything else; `tokens`: submit tokens on the same handle.
//! - `http`: routes, validation and the one mapping of outcomes to status codes; `server`: the
//!   accept loop with its limits and drain.
//! - `room`: the waiting rooms this node serves: its waiters and the ticker that beats for them,
//!   admits and pushes each place (the room itself is the ledger's); `http/room.rs` its routes
//!   (join, status, the server-sent event stream); `ticket`: the signed tickets and waiter
//!   handles every node checks from memory.
//! - `membership`: lease, heartbeats and grants, told to the node through the `Leaseholder`
//!   trait that `Node` implements, and asked of the coordinator through [`Coordinator`];
//!   `order_ids`: Snowflake ids under the leased worker id, with their keeper thread; `metrics`,
//!   `gate` (admission), `clock`, `config`, `shutdown`.
//!
//! `tests/scripts.rs` drives a `Node` on the embedded ledger through the scripts in
//! `tests/scripts/` (goldenscript): purchases, grants, lease lapses, ledger faults, with the
//! node's state printed after each step.

mod breaker;
mod clock;
mod config;
mod confirmer;
mod gate;
mod http;
mod membership;
mod metrics;
mod order_ids;
mod outcome;
mod pipeline;
mod room;
mod server;
mod shutdown;
mod sku;
mod stock;
mod stripes;
mod tally;
mod ticket;
mod tokens;

pub use crate::breaker::BreakerState;
pub use crate::clock::{Clock, SystemClock};
pub use crate::config::{
    BreakerSettings, HttpLimits, Mode, NodeConfig, SkuConfig, CONNECTIONS_PER_ADDRESS_DEFAULT, SOLD_OUT_READ_GAP_MAX,
};
pub use crate::gate::{Admission, Caller, Gate, OpenGate, Reason, SafeguardGate};
pub use crate::membership::{Coordinator, CoordinatorLink};
pub use crate::metrics::prometheus;
pub use crate::outcome::{Code, Outcome};
pub use crate::pipeline::{Node, NodeOptions, PurchaseRequest, StockPage, StripePage};
pub use crate::room::TICKET_HEADER;
pub use crate::server::{serve, DRAIN_MAX};
pub use crate::shutdown::Shutdown;
pub use crate::sku::{AllotmentState, AllotmentStats};
pub use crate::stock::LocalStock;
pub use crate::ticket::TicketKey;
pub use crate::tokens::{TokenOutcome, TokenRequest};
