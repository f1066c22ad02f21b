//! Where a trace starts or continues: the sampling decision at a process's edge, and the
//! `traceparent` header read on the way in and written on the way out.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hyper::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Whether an exporter is installed; nothing is traced until one is.
static ON: AtomicBool = AtomicBool::new(false);
/// The share of requests without a `traceparent` that are traced, as a threshold on a random
/// `u64` (`u64::MAX` traces every one).
static RATIO_THRESHOLD: AtomicU64 = AtomicU64::new(0);

pub(crate) fn turn_on(ratio: f64) {
    RATIO_THRESHOLD.store(threshold(ratio), Ordering::Relaxed);
    ON.store(true, Ordering::Release);
}

/// `ratio` of `u64::MAX`, so a coin toss is one random draw and one compare.
fn threshold(ratio: f64) -> u64 {
    if ratio >= 1.0 {
        u64::MAX
    } else if ratio > 0.0 {
        // The float's precision is all a sampling ratio needs.
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "0 < ratio < 1")]
        let threshold = (ratio * u64::MAX as f64) as u64;
        threshold
    } else {
        0
    }
}

/// Pauses or resumes tracing after `install`, so a benchmark can alternate "off" and "on" in
/// one process: paused, a request pays what it pays with no exporter at all.
pub fn set_paused(paused: bool) {
    ON.store(!paused, Ordering::Release);
}

/// Whether this process exports traces.
#[inline]
pub fn is_on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The span of a request arriving at this process: continues the caller's trace when its
/// `traceparent` says sampled, starts one with the configured ratio when there is none, and is
/// [`Span::none`] otherwise (every span under it then costs nothing).
#[inline]
pub fn server_span(name: &str, headers: &HeaderMap) -> Span {
    if !is_on() {
        return Span::none();
    }
    sampled_server_span(name, headers)
}

/// [`server_span`] once tracing is on: the sampling decision, then the span.
fn sampled_server_span(name: &str, headers: &HeaderMap) -> Span {
    let remote = headers.get("traceparent").map(|_| TraceContextPropagator::new().extract(&HeaderExtractor(headers)));
    // A malformed `traceparent` is as if there were none.
    let parent = match remote.filter(|context| context.span().span_context().is_valid()) {
        Some(context) if context.span().span_context().is_sampled() => Some(context),
        Some(_) => return Span::none(),
        None if fastrand::u64(..) < RATIO_THRESHOLD.load(Ordering::Relaxed) || ratio_is_all() => None,
        None => return Span::none(),
    };
    let span = tracing::info_span!(
        target: "otel",
        "request",
        otel.name = name,
        otel.kind = "server",
        http.response.status_code = tracing::field::Empty,
        seckill.outcome = tracing::field::Empty,
    );
    if let Some(parent) = parent {
        // Fails only when the span is disabled, which then has nothing to link.
        let _ = span.set_parent(parent);
    }
    span
}

/// The root span of a background job's step that moves money (a refund): rare enough to trace
/// every one while tracing is on, with no request to continue.
pub fn job_span(name: &'static str) -> Span {
    if !is_on() {
        return Span::none();
    }
    tracing::info_span!(
        target: "otel",
        parent: None,
        "job",
        otel.name = name,
        otel.kind = "internal",
        seckill.outcome = tracing::field::Empty,
    )
}

fn ratio_is_all() -> bool {
    RATIO_THRESHOLD.load(Ordering::Relaxed) == u64::MAX
}

/// A span that is not traced, to borrow for the life of the process (for callers that build
/// requests with no span of their own: benchmarks, scripted tests).
pub fn untraced() -> &'static Span {
    static UNTRACED: std::sync::LazyLock<Span> = std::sync::LazyLock::new(Span::none);
    &UNTRACED
}

/// Whether `span` is traced (built and sampled): what the spans below it check first.
#[inline]
pub fn traced(span: &Span) -> bool {
    !span.is_none() && !span.is_disabled()
}

/// A step under the current span, or [`Span::none`] when the current span is not traced.
pub fn child(name: &'static str) -> Span {
    child_of(&current(), name)
}

/// The current span when tracing is on, for work handed to another task; else
/// [`Span::none`], without looking it up.
pub fn current() -> Span {
    if is_on() {
        Span::current()
    } else {
        Span::none()
    }
}

/// A step under `parent` (which may live in another task), or [`Span::none`] when `parent` is
/// not traced.
pub fn child_of(parent: &Span, name: &'static str) -> Span {
    if !is_on() || !traced(parent) {
        return Span::none();
    }
    tracing::info_span!(
        target: "otel",
        parent: parent,
        "step",
        otel.name = name,
        http.response.status_code = tracing::field::Empty,
        seckill.outcome = tracing::field::Empty,
    )
}

/// Records an attribute on a traced span; a no-op on an untraced one.
pub fn record(span: &Span, key: &'static str, value: impl Into<opentelemetry::Value>) {
    if traced(span) {
        span.set_attribute(key, value);
    }
}

/// Writes `span`'s `traceparent` into an outgoing request's headers, so the callee's spans join
/// this trace. Nothing when `span` is not traced.
pub fn inject(span: &Span, headers: &mut HeaderMap) {
    if !is_on() || !traced(span) {
        return;
    }
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeaderInjector(headers));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the ratio's ends are exact (0 traces none, 1 every one) and the middle is
    /// proportional. Method: the thresholds.
    #[test]
    fn a_ratio_becomes_a_threshold_on_a_random_u64() {
        assert_eq!(threshold(0.0), 0);
        assert_eq!(threshold(-1.0), 0);
        assert_eq!(threshold(1.0), u64::MAX);
        assert_eq!(threshold(7.0), u64::MAX);
        let one_percent = threshold(0.01);
        assert!(one_percent > u64::MAX / 101 && one_percent < u64::MAX / 99, "{one_percent}");
    }

    /// Goal: with no exporter installed nothing is traced, whatever the request says.
    #[test]
    fn nothing_is_traced_before_an_exporter_is_installed() {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".parse().unwrap());
        assert!(!is_on());
        assert!(server_span("POST /v1/purchase", &headers).is_none());
        assert!(child("decision").is_none());
        let mut outgoing = HeaderMap::new();
        inject(&current(), &mut outgoing);
        assert!(outgoing.is_empty());
    }
}
