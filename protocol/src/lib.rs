//! The contract every seckill process shares: the identifiers, the terms a SKU is sold on, the
//! messages between nodes and the coordinator (with their answers), and the client that sends
//! them.
//!
//! **Role.** One place for every type that crosses a process boundary between node,
//! coordinator, ledger-facing code and the config loader, so a new field on a SKU is one edit
//! here (and its rule in [`SkuTerms::validate`]), not a conversion in every crate.
//! The one wall [`clock`] every process reads lives here too, so a test pins time the same way
//! in every crate, and so does the [`pace`] every background reader keeps (reading figures
//! that do not move ever less often).
//!
//! **Guarantees.**
//! - Identifiers are validated when built ([`SkuId::new`] …): whatever holds one can put it in a
//!   Redis key or a log line as is.
//! - [`SkuTerms`] are checked by one `validate`, whichever door they came in by (TOML, admin
//!   JSON); their serialized form is the raft log's, fixed across releases (new fields get
//!   defaults).
//! - Node↔coordinator messages carry [`PROTOCOL_VERSION`]; a member refuses a version it does not
//!   speak instead of misreading it.
//!
//! **Non-goals.** No raft, no Redis, no server: the coordinator's raft records
//! (`Command`/`Outcome`) are private to it and only mapped to these answers at its edge. The only
//! I/O here is the [`CoordinatorClient`] and its [`connection`] (with its [`credential`], the
//! cluster token, and optional mutual [`tls`]).
//!
//! **Layout.** Vocabulary below, I/O on top; imports point down:
//!
//! ```text
//! client     → connection, credential, fleet, locks, tls   (the coordinator client)
//! connection → credential, tls                            (one HTTP/1 connection, maybe TLS)
//! fleet      → ids, terms                                 (node ↔ coordinator messages)
//! stripes    → ids, terms                                 (a hot SKU split over hash slots)
//! terms      → room                                       (a waiting room's rules)
//! sandbox    → percent                                    (the sandbox payment provider's bodies)
//! ids, room, locks, percent, credential, env_secret, tls, clock, pace → nothing of the crate (clock: the one wall clock)
//! ```

pub mod client;
pub mod clock;
pub mod connection;
pub mod credential;
pub mod env_secret;
pub mod fleet;
pub mod ids;
pub mod locks;
pub mod pace;
pub mod percent;
pub mod room;
pub mod sandbox;
pub mod stripes;
pub mod terms;
pub mod tls;

pub use crate::client::{ClientError, CoordinatorClient};
pub use crate::clock::{unix_ms, Clock, SystemClock};
pub use crate::credential::{ClusterCredential, Secret};
pub use crate::fleet::{
    Assignment, HeartbeatRequest, LeaseAnswer, LeaveAnswer, LeaveRequest, Refusal, RegisterRequest, SkuReport,
    PROTOCOL_VERSION,
};
pub use crate::ids::{IdempotencyKey, InvalidId, NodeId, SkuId, SubmitToken, UserId};
pub use crate::room::RoomRules;
pub use crate::stripes::{ledgers_of, stripe_for, stripe_for_str, STRIPES_MAX};
pub use crate::terms::{
    Buffer, InvalidTerms, SkuTerms, PAY_TIMEOUT_DEFAULT, PAY_TIMEOUT_MAX, TOKEN_TTL_DEFAULT, TOKEN_TTL_MAX, TOTAL_MAX,
};
