//! Opt-in traces for every seckill role, exported over OTLP/HTTP (protobuf) to the collector an
//! operator names with `OTEL_EXPORTER_OTLP_ENDPOINT` or `[telemetry] endpoint`.
//!
//! **Role.** One purchase or one payment can be followed across processes: a node's span for
//! the HTTP request, its decision, the confirmer batch that carried it and the ledger call; the
//! order service's span for a callback, its store write and a refund; the sandbox provider's
//! span for the payment it took. Spans are linked across processes by the W3C `traceparent`
//! header, read on the way in and written on the way out.
//!
//! **Guarantees.**
//! - With tracing off (the default) a request pays one relaxed atomic load: no span is built.
//! - The sampling decision is made once, at the edge, before any span exists: a request whose
//!   `traceparent` says "sampled" is traced, one that says "not sampled" is not, and one without
//!   is traced with the configured ratio. Every span below the edge is built only under a
//!   traced parent, so a 1% sample costs the other 99% nothing but the coin toss.
//! - Exporting never blocks a request: spans queue in the SDK's batch processor (bounded, the
//!   oldest dropped when full) and leave from its own thread.
//!
//! **Non-goals.** No metrics or logs over OTLP (metrics stay on Prometheus, logs on stderr); no
//! gRPC transport; no tail sampling.
//!
//! **Layout.**
//! - `edge`: the sampling decision and `traceparent` in and out; the span helpers every crate
//!   calls.
//! - `export`: the settings, the exporter and the subscriber layer the binary installs.
//! - `post`: the exporter's HTTP client, over the workspace's hyper.

mod edge;
mod export;
mod post;

pub use edge::{child, child_of, current, inject, is_on, job_span, record, server_span, set_paused, traced, untraced};
pub use export::{install, layer, Exporting, Settings, SPAN_TARGET};
