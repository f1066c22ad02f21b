//! Delivering the signed notification of a successful payment to its `callback_url`, as a
//! provider's webhook does: retried with backoff until the receiver answers 2xx or the attempts
//! run out, each attempt signed afresh (`orders::signature`) so a slow retry is never stale.
//! The faults bend it: a delay before the first attempt, a second delivery, none at all, or
//! batches held and sent in reverse.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST};
use hyper::Request;
use hyper_util::rt::TokioIo;
use protocol::sandbox::SIGNATURE_HEADER;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Attempts per delivery before it is given up and counted in `callbacks_failed`.
pub const ATTEMPTS_MAX: u32 = 8;
/// Pause before the second attempt; it doubles up to [`BACKOFF_MAX`]. Eight attempts span about
/// 7 s: long enough to ride out an order service restart in a test, short enough to end.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest one attempt may take, answer included; a receiver slower than this is retried.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of a receiver's answer is read: only its status matters.
const ANSWER_BYTES_MAX: usize = 16 * 1024;

/// Where a callback goes: `http://authority/path`, checked when the payment is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    authority: String,
    path: String,
}

impl Target {
    /// `http://host[:port][/path]`; `None` for anything else (the sandbox speaks no TLS, and
    /// sends no credentials in URLs).
    pub fn parse(url: &str) -> Option<Target> {
        let rest = url.strip_prefix("http://")?;
        let (authority, path) = rest.find(['/', '?']).map_or((rest, "/"), |at| rest.split_at(at));
        let path = if path.starts_with('?') { format!("/{path}") } else { path.to_string() };
        let bad = |c: char| c.is_whitespace() || c.is_control();
        if authority.is_empty() || authority.contains(['@', '#']) || authority.contains(bad) || path.contains(bad) {
            return None;
        }
        let authority = match authority.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => authority.to_string(),
            // No port (and not the tail of an IPv6 literal): HTTP's default.
            _ if !authority.contains(':') || authority.ends_with(']') => format!("{authority}:80"),
            _ => return None,
        };
        Some(Target { authority, path })
    }
}

/// What becomes of one success's notification, drawn when it settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Dropped,
    Once,
    Twice,
}

/// The delivery counters `GET /v1/stats` shows.
#[derive(Debug, Default)]
pub struct Counters {
    sent: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    attempts: AtomicU64,
    in_flight: AtomicU64,
}

/// The delivery counters, read at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackCounts {
    /// Deliveries a receiver answered 2xx (a duplicated success counts twice).
    pub callbacks_sent: u64,
    /// Deliveries given up after [`ATTEMPTS_MAX`] attempts.
    pub callbacks_failed: u64,
    /// Successes never notified (`drop_p`).
    pub callbacks_dropped: u64,
    /// Successes notified twice (`duplicate_p`).
    pub callbacks_duplicated: u64,
    /// HTTP attempts, retries included.
    pub callback_attempts: u64,
    /// Deliveries not finished yet: delayed, held for reordering, or retrying.
    pub callbacks_in_flight: u64,
}

impl Counters {
    pub fn read(&self) -> CallbackCounts {
        CallbackCounts {
            callbacks_sent: self.sent.load(Ordering::Relaxed),
            callbacks_failed: self.failed.load(Ordering::Relaxed),
            callbacks_dropped: self.dropped.load(Ordering::Relaxed),
            callbacks_duplicated: self.duplicated.load(Ordering::Relaxed),
            callback_attempts: self.attempts.load(Ordering::Relaxed),
            callbacks_in_flight: self.in_flight.load(Ordering::Relaxed),
        }
    }
}

/// One notification on its way to one receiver.
#[derive(Clone)]
struct Delivery {
    target: Target,
    body: Bytes,
    /// For logs: which payment it notifies.
    reference: String,
    /// The span of the request that caused it (a buyer's pay), so the order service's spans
    /// for the callback join that trace; `Span::none()` when it is not traced.
    cause: tracing::Span,
}

/// The deliveries of one sandbox.
#[derive(Clone)]
pub struct Callbacks {
    inner: Arc<Inner>,
}

struct Inner {
    secret: Arc<[u8]>,
    counters: Counters,
    /// Under `reorder`: deliveries waiting for their batch's window to close.
    held: Mutex<Vec<Delivery>>,
    stop: watch::Receiver<bool>,
}

impl Callbacks {
    pub fn new(secret: Arc<[u8]>, stop: watch::Receiver<bool>) -> Self {
        Self { inner: Arc::new(Inner { secret, counters: Counters::default(), held: Mutex::new(Vec::new()), stop }) }
    }

    pub fn counts(&self) -> CallbackCounts {
        self.inner.counters.read()
    }

    /// Notifies `target` of a success with `body`, as `fate` says: after `delay`, then at once
    /// or, with `reorder_window`, in that window's batch, reversed.
    pub fn schedule<T: Serialize>(
        &self,
        target: Target,
        reference: &str,
        body: &T,
        fate: Fate,
        delay: Duration,
        reorder_window: Option<Duration>,
    ) {
        let counters = &self.inner.counters;
        let copies = match fate {
            Fate::Dropped => {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(reference, "callback dropped (drop_p)");
                return;
            }
            Fate::Once => 1,
            Fate::Twice => {
                counters.duplicated.fetch_add(1, Ordering::Relaxed);
                2
            }
        };
        let body = match serde_json::to_vec(body) {
            Ok(body) => Bytes::from(body),
            Err(e) => {
                tracing::warn!(reference, "cannot encode a callback: {e}");
                counters.failed.fetch_add(copies, Ordering::Relaxed);
                return;
            }
        };
        counters.in_flight.fetch_add(copies, Ordering::Relaxed);
        let delivery = Delivery { target, body, reference: reference.to_string(), cause: telemetry::current() };
        // Held here rather than in the task below: a spawned task may run after the next
        // payment's, and a batch must hold its successes in the order they were paid.
        if let (Some(window), true) = (reorder_window, delay.is_zero()) {
            self.hold(vec![delivery; copies as usize], window);
            return;
        }
        let this = self.clone();
        self.spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            match reorder_window {
                Some(window) => this.hold(vec![delivery; copies as usize], window),
                // A duplicate follows its first copy, as a provider that lost track of an
                // acknowledgement sends the same event again.
                None => {
                    for _ in 0..copies {
                        this.deliver(&delivery, 0).await;
                    }
                }
            }
        });
    }

    /// Runs `work` until it ends or the sandbox stops.
    fn spawn(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut stop = self.inner.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = work => {}
                () = crate::stopped(&mut stop) => {}
            }
        });
    }

    /// Adds to the batch being held; the first of a batch sends it when `window` has passed.
    fn hold(&self, deliveries: Vec<Delivery>, window: Duration) {
        let first = {
            let mut held = self.inner.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let first = held.is_empty();
            held.extend(deliveries);
            first
        };
        if first {
            let this = self.clone();
            self.spawn(async move {
                tokio::time::sleep(window).await;
                this.flush().await;
            });
        }
    }

    /// Sends the held batch last-first: each first attempt in turn, so the receiver sees them
    /// in reverse; a failed one retries on its own without holding up the rest.
    async fn flush(&self) {
        let batch = std::mem::take(&mut *self.inner.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for delivery in batch.into_iter().rev() {
            if self.attempt(&delivery).await {
                self.finished(true);
            } else {
                let this = self.clone();
                self.spawn(async move { this.deliver(&delivery, 1).await });
            }
        }
    }

    /// Attempts `delivery` from attempt number `done` until a 2xx or [`ATTEMPTS_MAX`].
    async fn deliver(&self, delivery: &Delivery, done: u32) {
        for attempt in done..ATTEMPTS_MAX {
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt)).await;
            }
            if self.attempt(delivery).await {
                self.finished(true);
                return;
            }
        }
        tracing::warn!(
            reference = %delivery.reference,
            "callback to {}{} given up after {ATTEMPTS_MAX} attempts",
            delivery.target.authority,
            delivery.target.path
        );
        self.finished(false);
    }

    fn finished(&self, sent: bool) {
        let counters = &self.inner.counters;
        let counter = if sent { &counters.sent } else { &counters.failed };
        counter.fetch_add(1, Ordering::Relaxed);
        counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// One signed POST; true when the receiver answered 2xx.
    async fn attempt(&self, delivery: &Delivery) -> bool {
        self.inner.counters.attempts.fetch_add(1, Ordering::Relaxed);
        let span = telemetry::child_of(&delivery.cause, "POST callback");
        let posting = tracing::Instrument::instrument(self.post(delivery, &span), span.clone());
        match tokio::time::timeout(ATTEMPT_TIMEOUT, posting).await {
            Ok(Ok(status)) if status.is_success() => true,
            Ok(Ok(status)) => {
                tracing::debug!(reference = %delivery.reference, "callback answered {status}; retrying");
                false
            }
            Ok(Err(e)) => {
                tracing::debug!(reference = %delivery.reference, "callback failed: {e}; retrying");
                false
            }
            Err(_) => {
                tracing::debug!(reference = %delivery.reference, "callback unanswered within {ATTEMPT_TIMEOUT:?}");
                false
            }
        }
    }

    async fn post(&self, delivery: &Delivery, span: &tracing::Span) -> Result<hyper::StatusCode, String> {
        let target = &delivery.target;
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&target.authority))
            .await
            .map_err(|_| format!("connect to {} timed out", target.authority))?
            .map_err(|e| format!("connect to {}: {e}", target.authority))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let signed = auth::timestamped::sign(&self.inner.secret, protocol::unix_ms() / 1000, &delivery.body);
        let mut request = Request::post(&target.path)
            .header(HOST, &target.authority)
            .header(CONTENT_TYPE, "application/json")
            // One connection per attempt: a receiver need not keep it for the next.
            .header(CONNECTION, "close")
            .header(SIGNATURE_HEADER, signed)
            .body(Full::new(delivery.body.clone()))
            .map_err(|e| e.to_string())?;
        telemetry::inject(span, request.headers_mut());
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        // The body is read so the receiver's answer is complete before the connection goes.
        let _ = Limited::new(response.into_body(), ANSWER_BYTES_MAX).collect().await;
        Ok(status)
    }
}

/// The pause before attempt number `attempt` (1 = the first retry).
fn backoff(attempt: u32) -> Duration {
    BACKOFF_FIRST.saturating_mul(1 << attempt.saturating_sub(1).min(16)).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callback_urls_are_plain_http() {
        let parsed = |url: &str| Target::parse(url).map(|t| (t.authority, t.path));
        assert_eq!(
            parsed("http://127.0.0.1:8090/v1/payments/callback"),
            Some(("127.0.0.1:8090".into(), "/v1/payments/callback".into()))
        );
        assert_eq!(parsed("http://localhost"), Some(("localhost:80".into(), "/".into())));
        assert_eq!(parsed("http://[::1]:9/cb?x=1"), Some(("[::1]:9".into(), "/cb?x=1".into())));
        assert_eq!(parsed("http://h:1?x"), Some(("h:1".into(), "/?x".into())));
        for bad in ["https://127.0.0.1:1/", "ftp://h/", "http://", "http://u:p@h:1/", "http://h:x/", "http://h:1/a b"] {
            assert_eq!(parsed(bad), None, "{bad}");
        }
    }

    #[test]
    fn retries_back_off_to_a_ceiling() {
        let pauses: Vec<u64> = (1..ATTEMPTS_MAX).map(|a| backoff(a).as_millis() as u64).collect();
        assert_eq!(pauses, vec![100, 200, 400, 800, 1600, 2000, 2000]);
    }
}
