//! The global ledger: the one place that knows how many units of a SKU are left.
//!
//! **Role.** Safety. Nodes sell from local allotments for speed, but every local sale is
//! confirmed here before the buyer hears "purchased", and the ledger confirms a sale only while
//! `remaining >= qty`. So however allotments are handed out, over-granted or duplicated after a
//! failover, the fleet never sells more than a SKU's total.
//!
//! **Clients.** Three processes use the ledger, and each holds only the trait of what it calls,
//! so a fake for one client (or a backend for one job) implements only that:
//! - the node holds [`SalesLedger`]: [`issue_token`](SalesLedger::issue_token),
//!   [`confirm`](SalesLedger::confirm), and the waiting room's
//!   [`room_join`](SalesLedger::room_join), [`room_tick`](SalesLedger::room_tick) and
//!   [`room_admissions`](SalesLedger::room_admissions);
//! - the coordinator holds [`CatalogueLedger`]: [`create_sku`](CatalogueLedger::create_sku),
//!   [`restock_to`](CatalogueLedger::restock_to), [`set_pricing`](CatalogueLedger::set_pricing),
//!   [`close`](CatalogueLedger::close), [`end_epoch`](CatalogueLedger::end_epoch),
//!   [`sold_by`](CatalogueLedger::sold_by), and moving unsold units between the stripes of a
//!   striped SKU, [`transfer_out`](CatalogueLedger::transfer_out) and
//!   [`transfer_in`](CatalogueLedger::transfer_in);
//! - the order service holds [`OrderFeed`]: the consumer group's
//!   [`feed_read`](OrderFeed::feed_read), [`feed_claim`](OrderFeed::feed_claim),
//!   [`feed_ack`](OrderFeed::feed_ack), [`feed_lag`](OrderFeed::feed_lag) and
//!   [`feed_trim`](OrderFeed::feed_trim), and [`release`](OrderFeed::release) with its log,
//!   [`releases`](OrderFeed::releases).
//!
//! All three build on [`LedgerReads`], the reads that change nothing:
//! [`status`](LedgerReads::status), [`orders`](LedgerReads::orders) and
//! [`ping`](LedgerReads::ping). [`Ledger`] is all of it: the wiring builds one and hands each
//! client its part (`Arc<dyn Ledger>` upcasts to `Arc<dyn SalesLedger>` and the others), and
//! `suite` checks it.
//!
//! **Guarantees** (every implementation; `suite` checks them against each one):
//! - `sold + remaining == total` after every operation; `remaining` never goes below zero.
//! - A batch ([`SalesLedger::confirm`]) is one atomic step: no other writer sees it half done.
//! - An idempotency key decides at most once per SKU and buyer: a retry with the same qty gets
//!   the stored decision back ([`Verdict::Replayed`]); another qty gets [`Verdict::KeyReused`]
//!   and changes nothing. A key is its buyer's: another buyer's purchase under it is decided
//!   on its own and takes nothing from the key's other buyers. Decisions are kept for a
//!   configurable TTL.
//! - A user never buys more than the SKU's per-user limit.
//! - Every sale appends an [`OrderEvent`] in the same atomic step (read back by
//!   [`LedgerReads::orders`] and [`OrderFeed::feed_read`]).
//! - An order's units go back ([`OrderFeed::release`]) at most once, and only for a sale the
//!   ledger recorded; `sold` counts units sold and not given back.
//! - A seller epoch ended by [`CatalogueLedger::end_epoch`] sells nothing more: its count is final.
//! - A SKU created with `require_token` decides a fresh purchase only after consuming a live
//!   [`SubmitToken`] issued to the same user for the same SKU, in the same atomic step (the
//!   token is gone whatever the decision). A purchase without one is decided
//!   [`Decision::TokenInvalid`]; a token presented by another user is refused and left to its
//!   owner. Replays of a decided key never look at the token.
//! - A waiting room ([`room`]) admits in line order, never more than `admit_factor` × the units
//!   left as live tickets, at most `admit_per_s` a second (plus a quarter of a second's burst),
//!   and a ticket is a submit token: spent by the purchase that uses it, once.
//! - A buyer holds at most one live token per SKU: asking again
//!   ([`SalesLedger::issue_token`]) returns the held token.
//! - A transfer between stripes ([`CatalogueLedger::transfer_out`], then
//!   [`CatalogueLedger::transfer_in`]) happens at most once per transfer id on each side, takes
//!   only unsold units, and keeps `sold + remaining == total` on both.
//! - A SKU whose ledger is missing is refused ([`LedgerError::Missing`]), never recreated by a
//!   sale; [`CatalogueLedger::create_sku`] never overwrites an existing ledger.
//!
//! **Implementations.** [`RedisLedger`] runs Lua scripts (`lua/*.lua`) on one Redis or on a
//! Redis Cluster ([`RedisTarget`]): every key of a SKU carries the hash tag `{sku}`, so a batch
//! touches one slot, and the cluster client sends it to the master that owns that slot; or on
//! the master that Redis Sentinel names, followed across a failover.
//! [`EmbeddedLedger`] keeps the same books in process, for demos and single-process runs.
//!
//! **Durability** ([`Durability`], `[ledger] durability`): what an answered decision has
//! survived. `None` trusts Redis as configured; `Fsync` requires (and checks at start, with
//! [`RedisLedger::check_durability`]) `appendonly yes` + `appendfsync always`, so a master crash
//! loses no answered decision; `Replica` waits after every write script until `replicas` replicas
//! have it (`WAIT`, pipelined with the script on the same connection), else the call fails with
//! [`LedgerError::NotReplicated`] while the decision stays stored for the retry to replay.
//!
//! **Non-goals.** Idempotency keys are scoped per SKU (a key reused for another SKU is a new
//! purchase there), because the ledger never makes a cross-SKU (cross-slot) call. The ledger
//! does not hand out allotments or know which nodes are alive: that is the coordinator's job.
//!
//! **Layout.** Imports point down this list; nothing imports a module above it, and every
//! module may use this file (the traits, constants and re-exported ids):
//! - `lib.rs`: the client traits and [`Ledger`], the constants, the re-exports.
//! - `suite` (feature `suite`, for tests only: it is no part of the product): the contract as
//!   tests, run on every implementation; uses this file only.
//! - `embedded`: [`EmbeddedLedger`] (`embedded/room.rs`: its waiting rooms). Uses `types`,
//!   `room`.
//! - `redis/`: [`RedisLedger`] and how it reaches Redis (one server, Cluster, Sentinel), one
//!   file per concern, its own layout in `redis/mod.rs`; the Lua scripts are `lua/*.lua`.
//!   Uses `durability`, `types`, `room`.
//! - [`room`]: the waiting room's vocabulary ([`Place`], [`RoomFigures`], [`Admission`]), its
//!   rules, and the draw's order anyone can recompute. Uses nothing.
//! - `durability`: [`Durability`] and the server settings `Fsync` needs. Uses nothing.
//! - `types`: the values the contract speaks in ([`Purchase`], [`Verdict`], [`OrderEvent`],
//!   …) and how a decision is stored.
//! - `error`: [`LedgerError`].

mod durability;
mod embedded;
mod error;
mod redis;
pub mod room;
#[cfg(any(test, feature = "suite"))]
pub mod suite;
mod types;

pub use crate::durability::Durability;
pub use crate::embedded::EmbeddedLedger;
pub use crate::error::LedgerError;
#[cfg(feature = "suite")]
pub use crate::redis::ArgumentShape;
pub use crate::redis::{
    redact_url, ClusterSeeds, RedisConnection, RedisLedger, RedisLedgerConfig, RedisTarget, SentinelConnection,
    SentinelSeeds, CLUSTER_SCHEME, SENTINEL_SCHEME,
};
pub use crate::room::{Admission, Draw, Place, RoomCall, RoomFigures, RoomView};
pub use crate::types::*;
/// The ids and SKU terms the ledger's contract speaks in; defined in `protocol`, which every
/// process shares.
pub use protocol::ids::{
    IdempotencyKey, InvalidId, NodeId, SkuId, SubmitToken, UserId, IDEMPOTENCY_KEY_BYTES_MAX, ID_BYTES_MAX,
    SUBMIT_TOKEN_BYTES_MAX, USER_BYTES_MAX,
};
pub use protocol::{RoomRules, SkuTerms, TOKEN_TTL_DEFAULT, TOKEN_TTL_MAX, TOTAL_MAX};

use std::time::Duration;

/// How long a stored decision answers retries, unless configured otherwise: a day outlives any
/// flash sale and any client's retry loop.
pub const IDEMPOTENCY_TTL_DEFAULT: Duration = Duration::from_secs(24 * 60 * 60);

/// How long the ledger keeps each sale's record, against which its release is checked, unless
/// configured otherwise (`[ledger] sale_record_ttl_s`). An unpaid order can be given back for
/// this long after its sale: its pay timeout plus however long the order service may be down,
/// so two days outlive the longest pay timeout ([`protocol::PAY_TIMEOUT_MAX`], 12 hours) by a
/// day and a half of outage.
pub const SALE_RECORD_TTL_DEFAULT: Duration = Duration::from_secs(48 * 60 * 60);

/// A Redis ledger files sale records in one hash per SKU and window of this length (by the
/// seller's clock), so a whole window expires at once: Redis 7.0 has no per-field TTL. A release
/// looks in the window of the sale's time and its two neighbours, which absorbs any clock skew
/// between a node and Redis below one window.
pub const SALE_WINDOW: Duration = Duration::from_secs(60 * 60);

/// Draws of a fresh token before `issue_token` gives up. One collision of 128 random bits is
/// already beyond belief; a second means the random source is broken, and issuing must stop.
const TOKEN_DRAWS_MAX: usize = 2;

/// Submit tokens one SKU issues per window of one token TTL, by default. Every token lives at
/// most one TTL, so at most two windows' worth are live at once: with ~200 bytes per token key in
/// Redis, the default bounds a SKU's tokens to about 2 × 100,000 × 200 B = 40 MB, whatever the
/// callers do. A sale expecting more buyers per TTL raises it (`[ledger] token_issue_max`).
pub const TOKEN_ISSUE_MAX_DEFAULT: u64 = 100_000;

// Wall-clock ms; only the token windows read it, and a clock step only shifts a window.
use protocol::clock::unix_ms;

/// The issuing window a token drawn at `now_ms` counts against, and the ms left in it.
fn token_window(now_ms: u64, ttl: Duration) -> (u64, u64) {
    let window_ms = ttl.as_millis().max(1) as u64;
    (now_ms / window_ms, window_ms - now_ms % window_ms)
}

/// Most purchases one `confirm` call takes. Bounds the script's run time on Redis (it blocks
/// every other client while it runs) and the size of one request.
pub const BATCH_MAX: usize = 256;

/// Most order events one `orders` call returns.
pub const ORDER_EVENTS_MAX: usize = 100_000;

/// One SKU's books over its `stripes` ledgers ([`SkuStatus::combined`]): what a reader that
/// sees the SKU, not its stripes, reports (stock pages, the nemesis, the demo).
pub async fn sku_status<L: LedgerReads + ?Sized>(
    ledger: &L,
    sku: &SkuId,
    stripes: u32,
) -> Result<SkuStatus, LedgerError> {
    let mut statuses = Vec::new();
    for index in 0..stripes.max(1) {
        statuses.push(ledger.status(&sku.stripe(index)).await?);
    }
    Ok(SkuStatus::combined(&statuses))
}

/// The reads every client makes: the SKU's counts, its order events, and whether the ledger
/// answers. None of them changes anything, so each client trait below builds on this one.
#[async_trait::async_trait]
pub trait LedgerReads: Send + Sync + 'static {
    /// The SKU's current counts. A stale read is fine for display; safety never depends on it.
    async fn status(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError>;

    /// The SKU's order events with `seq > after`, in stream order, at most `limit` (capped at
    /// [`ORDER_EVENTS_MAX`]). `after = 0` reads from the start.
    async fn orders(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<OrderEvent>, LedgerError>;

    /// Succeeds when the ledger answers; readiness checks use it.
    async fn ping(&self) -> Result<(), LedgerError>;

    /// The waiting room of `sku` as it stands, read without changing it (no heartbeat, no
    /// admission): for operators. `None` when its room never ran. A missing SKU is
    /// [`LedgerError::Missing`].
    async fn room_figures(&self, sku: &SkuId) -> Result<Option<RoomFigures>, LedgerError>;
}

/// What a node asks of the ledger while it sells: submit tokens for its buyers, and the
/// confirmation of every sale before the buyer hears "purchased".
#[async_trait::async_trait]
pub trait SalesLedger: LedgerReads {
    /// Hands `user` a [`SubmitToken`] for one purchase of `sku`. A buyer holds at most one live
    /// token per SKU: while the token issued to `user` earlier is neither spent by a purchase
    /// nor expired, it is returned again with what is left of its life, and the ask costs
    /// nothing of the cap below; otherwise a fresh token, live for `ttl` (at most
    /// [`TOKEN_TTL_MAX`]). The token is stored in the SKU's own keyspace, so a token of one SKU
    /// is unknown to every other. A missing SKU is [`LedgerError::Missing`]; issuing never
    /// creates a SKU. Tokens are issued whether or not the SKU requires them: a SKU that does not
    /// never reads them, and they expire unused. At most the configured number of fresh tokens
    /// per SKU are issued per window of one `ttl` ([`TOKEN_ISSUE_MAX_DEFAULT`]), which bounds the
    /// memory tokens take; past it, [`LedgerError::TokensExhausted`].
    async fn issue_token(&self, sku: &SkuId, user: &UserId, ttl: Duration) -> Result<IssuedToken, LedgerError>;

    /// Decides each purchase of the batch in order, atomically. `purchases` holds at most
    /// [`BATCH_MAX`] items; `seller` is recorded as the seller of every sale in it.
    async fn confirm(&self, sku: &SkuId, seller: &Seller, purchases: &[Purchase]) -> Result<BatchOutcome, LedgerError>;

    /// Puts each of `users` (at most [`room::ROOM_TICK_USERS_MAX`]), in order, in the waiting
    /// room of `sku` ([`room`]): in the pre-queue before the start, at the line's end after it;
    /// a buyer already in the room keeps its place (the call is its heartbeat). Nobody joins a
    /// closed or sold-out SKU: its place stays [`Place::Absent`]. Then, like a tick, draws and
    /// admits what is due, and answers each one's place. A missing SKU is
    /// [`LedgerError::Missing`].
    async fn room_join(&self, sku: &SkuId, call: RoomCall<'_>, users: &[UserId]) -> Result<RoomView, LedgerError>;

    /// One round of the room: heartbeats for the waiters in `present` (at most
    /// [`room::ROOM_TICK_USERS_MAX`]), the abandoned leave, the pre-queue is drawn once the sale
    /// started, and the line's head is admitted as the rules allow; answers each named buyer's
    /// place.
    async fn room_tick(&self, sku: &SkuId, call: RoomCall<'_>, present: &[UserId]) -> Result<RoomView, LedgerError>;

    /// The room's admissions from seq `after + 1` on, at most `limit`: its audit log.
    async fn room_admissions(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<Admission>, LedgerError>;
}

/// What the coordinator asks of the ledger: the SKU's books (create, restock, price, close) and
/// the final count of a seller epoch it ends.
#[async_trait::async_trait]
pub trait CatalogueLedger: LedgerReads {
    /// Creates the SKU's ledger with `terms.total` remaining, the per-user limit and whether
    /// submit tokens are required, or returns the existing one unchanged. The other terms are
    /// the nodes' and the coordinator's business.
    async fn create_sku(&self, sku: &SkuId, terms: &SkuTerms) -> Result<Created, LedgerError>;

    /// Raises an existing SKU's total (and remaining by as much) to `total`. A total at or below
    /// the current one changes nothing, so a retried restock cannot add units twice.
    async fn restock_to(&self, sku: &SkuId, total: u64) -> Result<SkuStatus, LedgerError>;

    /// Sets the terms the SKU's orders are priced on from the next sale on (its order events
    /// carry them); orders already sold keep theirs. [`LedgerError::Missing`] for an unknown SKU.
    async fn set_pricing(&self, sku: &SkuId, pricing: &Pricing) -> Result<(), LedgerError>;

    /// Ends the sale for good: every later purchase is decided [`Decision::Ended`], whatever the
    /// stock. Sales decided before it stand. Closing twice is closing once.
    async fn close(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError>;

    /// Ends `seller`'s epoch for this SKU and returns the units it sold in it. From then on every
    /// `confirm` from that node with this epoch or an older one fails with
    /// [`LedgerError::EpochEnded`], so the count is final: the coordinator subtracts it from
    /// what it granted the epoch and hands out the rest, and a node that was only paused cannot
    /// sell those units a second time. Ending an epoch again changes nothing.
    async fn end_epoch(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError>;

    /// Units `seller` (that node, in that epoch) has sold so far.
    async fn sold_by(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError>;

    /// Takes up to `most` unsold units out of `stripe` (a ledger of one stripe of a striped
    /// SKU, see [`protocol::stripes`]) in one atomic step and returns how many it took: the
    /// least of `most` and `remaining`, so it never takes a unit sold or a unit not there.
    /// `total` and `remaining` drop by it and `transferred_out` grows by it. The count is
    /// recorded under `transfer`: a repeat of the same id returns it and changes nothing, even
    /// if `remaining` moved since, so a caller that lost the answer asks again safely. A closed
    /// stripe gives nothing (and records 0 for the id). [`LedgerError::Missing`] for an unknown
    /// stripe. The units are in flight until [`transfer_in`](Self::transfer_in) puts them into
    /// another stripe: the caller must record the answer before it moves on.
    async fn transfer_out(&self, stripe: &SkuId, transfer: u64, most: u64) -> Result<u64, LedgerError>;

    /// Puts `units` taken by [`transfer_out`](Self::transfer_out) into `stripe`: `total`,
    /// `remaining` and `transferred_in` grow by them, once per `transfer` id (a repeat changes
    /// nothing and returns the status). A closed stripe takes them too, so the counts of every
    /// stripe still add up to the SKU's, though it never sells them.
    /// [`LedgerError::Missing`] for an unknown stripe.
    async fn transfer_in(&self, stripe: &SkuId, transfer: u64, units: u64) -> Result<SkuStatus, LedgerError>;
}

/// What the order service asks of the ledger after the sale: the order stream read through a
/// consumer group, and giving an unpaid order's units back.
#[async_trait::async_trait]
pub trait OrderFeed: LedgerReads {
    /// Gives an unpaid order's units back: `remaining` grows and `sold` drops by `qty`,
    /// `released` grows, the user's bought count drops (so the buyer may buy again), and the
    /// release is logged ([`OrderFeed::releases`]), in one atomic step. Refused
    /// ([`ReleaseOutcome::NeverSold`]) unless the ledger's record of the sale of
    /// `release.order_id` says this user bought `qty`; done at most once per order id
    /// ([`ReleaseOutcome::AlreadyReleased`]), whoever calls. The record is kept by order id for
    /// the sale record TTL ([`SALE_RECORD_TTL_DEFAULT`]), independent of the idempotency TTL:
    /// a key reused after its TTL is a new sale with its own order and its own record.
    async fn release(&self, sku: &SkuId, release: &Release) -> Result<ReleaseOutcome, LedgerError>;

    /// The SKU's release log with `seq > after`, in order, at most `limit` (capped at
    /// [`ORDER_EVENTS_MAX`]).
    async fn releases(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<ReleaseEvent>, LedgerError>;

    /// The order stream read by a consumer group (Redis Streams semantics): up to `count`
    /// entries never delivered to `group`, now pending for `consumer` until acknowledged,
    /// waiting up to `block` for the first. Creates the group at the stream's start if needed.
    async fn feed_read(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<FeedEntry>, LedgerError>;

    /// Takes over up to `count` entries that some consumer of `group` was delivered more than
    /// `min_idle` ago and never acknowledged (it died, or the entry keeps failing); each
    /// entry's `deliveries` includes this one. Entries trimmed meanwhile are dropped from the
    /// pending list and not returned.
    async fn feed_claim(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<FeedEntry>, LedgerError>;

    /// Acknowledges entries: `group` is done with them.
    async fn feed_ack(&self, sku: &SkuId, group: &str, seqs: &[u64]) -> Result<(), LedgerError>;

    /// How far `group` is behind (zero if it does not exist yet and the stream is empty).
    async fn feed_lag(&self, sku: &SkuId, group: &str) -> Result<FeedLag, LedgerError>;

    /// Drops stream entries `group` has acknowledged, but keeps the newest `retain`: nodes read
    /// the stream to replay a retried purchase from memory, so the newest stay for them.
    /// Returns how many entries went.
    async fn feed_trim(&self, sku: &SkuId, group: &str, retain: u64) -> Result<u64, LedgerError>;
}

/// The contract every ledger keeps: all three clients' traits in one, for the wiring that
/// builds a ledger and hands each client its part (`Arc<dyn Ledger>` upcasts to
/// `Arc<dyn SalesLedger>` and the others), and for `suite`, the executable form of this
/// contract, which must pass against every implementation. See the crate docs for the
/// guarantees. Implemented for every type that implements the three.
pub trait Ledger: SalesLedger + CatalogueLedger + OrderFeed {}

impl<T: SalesLedger + CatalogueLedger + OrderFeed> Ledger for T {}
