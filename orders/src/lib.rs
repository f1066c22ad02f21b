//! The order service: turns each confirmed sale into a durable order, takes the buyer's payment
//! or lets the order expire, and gives an unpaid order's units back to the ledger so they sell
//! again.
//!
//! **Role.** The ledger's `confirm` appends an order event to the SKU's stream in the same atomic
//! step that sells the units (an outbox with no gap). This crate reads those streams and keeps
//! the orders in an [`store::OrderStore`] (PostgreSQL in production, SQLite for zero-setup runs).
//!
//! **Guarantees** (the store's contract suite and the service's tests check them):
//! - Every order event becomes exactly one order: the insert is keyed on the order id, so a
//!   redelivered event is a no-op.
//! - An order moves `pending_payment → paid | expired | cancelled` once, by a compare-and-set; a
//!   payment for an order no longer pending is kept as `paid_after_expiry` (a refund is owed),
//!   never dropped, and never sells the unit a second time.
//! - Every validly signed payment notification is recorded, once per provider reference,
//!   whatever it says: one that cannot settle its order (a wrong amount or currency, after
//!   expiry, a second payment) owes a refund; one for an order not stored yet waits for it, and
//!   the order cannot expire while it waits.
//! - An order's identity is its order id: a key reused after the ledger's idempotency TTL is a
//!   new order. The consumer acknowledges only what it stored or dead-lettered with a reason.
//! - No order's release holds back another's: releases are walked by deadline with a cursor,
//!   and one the ledger refuses is marked with the reason for an operator.
//! - With buyer authentication on (`auth`), an order is shown to and cancelled by its owner
//!   only; to anyone else it is indistinguishable from an unknown id.
//!
//! **Payments** are made with a provider behind [`provider::PaymentProvider`]: create, query,
//! close, refund, each idempotent, an unknown outcome an error never read as an answer. The
//! lifecycle ([`payments`]): an order whose payment started is expired only on the provider's
//! word (the query job), an ended order's open payment is closed, and every refund owed is paid
//! back once, under one refund id per payment (the refund job).
//!
//! **Non-goals.** The store does not hold stock: the ledger alone decides what sells and what
//! returns. It settles no money itself: the provider holds it, and a refund the provider
//! refuses is an operator's.
//!
//! **State machine.** What an event does to an order (a payment, a cancel, an expiry, a refund)
//! is decided once, in pure Rust, by [`lifecycle`], which lists the invariants and asserts them;
//! each store only persists a decision atomically, with statements written once for both SQL
//! dialects, and both sides assert that they agree. `tests/lifecycle/` scripts the machine.
//!
//! **Layout.** Arrows point the way imports go; nothing imports `service` but the binaries:
//!
//! | module | concern |
//! |---|---|
//! | [`model`] | the values: orders, payments, refunds, outcomes, counts |
//! | [`lifecycle`] → model | the state machine's decisions and invariants, pure |
//! | [`store`] → lifecycle, model | [`OrderStore`]: `sqlite`, `postgres`, `transitions` (their shared statements), `codec`, the contract `suite` |
//! | [`signature`] | signing and checking payment callbacks |
//! | [`provider`] → signature | [`provider::PaymentProvider`] and the sandbox's client |
//! | [`payments`] → provider, store, model | starting a payment; the query (`checks`) and `refunds` jobs |
//! | [`consumer`] → store, model | order events from the ledger's streams into the store |
//! | [`sweeper`] → payments, consumer, store, model | expiries, releases, and the payment jobs, under a lock |
//! | [`reconcile`] → sweeper, store, model | the ledger and the store compared, and repaired |
//! | [`outage`] | one log line when the store stops answering, one when it is back |
//! | [`http`] → payments, provider, signature, consumer, outage, store, model | the buyer's and the provider's API, each answer within its time budget |
//! | [`service`] → http, sweeper, consumer, payments, signature, store | one order service, started and stopped together |
//!
//! Wall-clock time is the one every process shares ([`unix_ms`], `protocol::clock`).

pub mod consumer;
pub mod http;
pub mod lifecycle;
pub mod model;
pub mod outage;
pub mod payments;
pub mod provider;
pub mod reconcile;
pub mod service;
pub mod signature;
pub mod store;
pub mod sweeper;

pub use model::*;
pub use service::{OrderService, OrderServiceConfig};
pub use store::{OrderStore, PostgresStore, SqliteStore, StoreError};

/// Wall-clock Unix ms (the one wall clock every process shares): order times, deadlines and
/// signature windows are wall-clock by nature.
pub use protocol::clock::unix_ms;
