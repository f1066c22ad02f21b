//! The inventory node: answers purchases from memory and sends only local winners to the ledger.
//!
//! **Role.** Speed. Each node holds, per SKU, a local allotment in one atomic counter. A
//! purchase that finds the counter empty, or the SKU flagged sold out, is answered without any
//! network call; only a request that wins a local unit goes on to the ledger, and those are
//! confirmed in batches. A burst of 1000x the stock thus costs the ledger about one call per unit
//! sold, not one per request.
//!
//! **Guarantees.**
//! - A local allotment never goes below zero ([`LocalStock`]).
//! - A request answered "purchased" was confirmed by the ledger; the node never decides a sale
//!   on its own, so it cannot oversell whatever its allotment says.
//! - A unit taken but not sold (refused, replayed, ledger down, client gone) goes back to the
//!   local stock, so a node's own failures cannot leave stock unsold.
//! - Bad input is a 4xx that touches no state; no request path panics.
//! - A purchase of a SKU that requires submit tokens and brings none is refused before the stock
//!   counter; whether a token it brings is valid only the ledger decides.
//!
//! - Under a coordinator, a node sells only while its lease holds (it fences itself before the
//!   coordinator may revoke), and a unit of an ended epoch never returns to the stock.
//!
//! **Non-goals.** The node does not decide how much allotment it gets: the configured share
//! without a coordinator, the coordinator's grants with one. It does not implement rate limits,
//! blacklists or id generation: those come from the `safeguards` crate, through [`Gate`]
//! ([`SafeguardGate`]) and the order-id generator.
//!
//! Layout: `stock` (the counter), `sku` (per-SKU state), `pipeline` (the purchase steps and
//! [`Node`]), `confirmer` (batching), `http` (routes and status codes), `server` (accept loop),
//! `membership` (lease and grants), `tokens` (submit tokens), `order_ids` (Snowflake ids under
//! the leased worker id), `metrics`, `gate` (admission), `clock`, `shutdown`.

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
mod server;
mod shutdown;
mod sku;
mod stock;
mod tokens;

pub use crate::clock::{Clock, SystemClock};
pub use crate::config::{HttpLimits, Mode, NodeConfig, SkuConfig};
pub use crate::gate::{Admission, Caller, Gate, OpenGate, Reason, SafeguardGate};
pub use crate::membership::CoordinatorLink;
pub use crate::metrics::prometheus;
pub use crate::outcome::{Code, Outcome};
pub use crate::pipeline::{Node, NodeOptions, PurchaseRequest, StockPage};
pub use crate::server::{serve, DRAIN_MAX};
pub use crate::shutdown::Shutdown;
pub use crate::sku::AllotmentStats;
pub use crate::stock::LocalStock;
pub use crate::tokens::{TokenOutcome, TokenRequest};
