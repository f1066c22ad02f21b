//! The client of the sandbox payment provider, `seckill paysim` (docs/payments.md): a small
//! Stripe-like JSON API over plain HTTP/1 on loopback. [`wire`] is its format, shared with the
//! server so the two cannot drift apart.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::{
    CreatePayment, PaymentProvider, PaymentStatus, ProviderError, ProviderPayment, RefundRequest, RefundStatus,
    SettledPayment, SettledRefund, SettlementReport,
};

/// The sandbox's JSON bodies and the escaping of its one query parameter.
pub use protocol::sandbox as wire;

/// Longest wait to open a connection: the sandbox runs on this machine, so a slow connect means
/// it is down or stuck.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest a whole call may take unless set otherwise ([`SandboxProvider::with_timeout`]).
const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Largest answer read: a payment or a refund is a few hundred bytes.
const ANSWER_BYTES_MAX: usize = 64 * 1024;
/// Idle keep-alive connections kept for the next calls; more are closed after their call.
const IDLE_CONNECTIONS_MAX: usize = 8;
/// An idle connection older than this is closed rather than reused: the sandbox closes
/// connections idle for 5 s, and a request sent just as it does would fail for nothing.
const IDLE_REUSE_MAX: Duration = Duration::from_secs(2);

/// The sandbox provider's client: [`PaymentProvider`] over its HTTP API.
pub struct SandboxProvider {
    /// `host:port` of the sandbox.
    authority: String,
    timeout: Duration,
    /// Keep-alive connections between calls, with the time each was last used.
    idle: std::sync::Mutex<Vec<(Instant, SendRequest<Full<Bytes>>)>>,
}

impl SandboxProvider {
    /// A client of the sandbox at `base_url` (`http://127.0.0.1:8095`). Refused for anything
    /// but `http://host:port` with an optional trailing `/`: the sandbox speaks no TLS.
    pub fn new(base_url: &str) -> Result<Self, ProviderError> {
        let authority = base_url
            .strip_prefix("http://")
            .map(|rest| rest.strip_suffix('/').unwrap_or(rest))
            .filter(|authority| {
                !authority.is_empty()
                    && !authority.contains(['/', '?', '#', '@'])
                    && authority
                        .rsplit_once(':')
                        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
            })
            .ok_or_else(|| {
                ProviderError::Refused(format!("the sandbox's base URL is http://host:port, not {base_url:?}"))
            })?;
        Ok(Self {
            authority: authority.to_string(),
            timeout: CALL_TIMEOUT_DEFAULT,
            idle: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Bounds every call, connection included, by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The base URL this client calls.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.authority)
    }

    /// One call within the timeout: the status and the body, or `Unavailable` when no whole
    /// answer came (the call may still have happened).
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), ProviderError> {
        let what = format!("{method} {}{path}", self.base_url());
        match tokio::time::timeout(self.timeout, self.exchange(method, path, body)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(ProviderError::Unavailable(format!("{what}: {e}"))),
            Err(_) => Err(ProviderError::Unavailable(format!("{what}: no answer within {:?}", self.timeout))),
        }
    }

    async fn exchange(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<(StatusCode, Bytes), String> {
        let mut sender = self.sender().await?;
        let mut request = Request::builder().method(method).uri(path).header(HOST, &self.authority);
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let mut request = request.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| e.to_string())?;
        telemetry::inject(&telemetry::current(), request.headers_mut());
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = Limited::new(response.into_body(), ANSWER_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        // Only a connection whose answer was read whole can carry the next request.
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < IDLE_CONNECTIONS_MAX {
                idle.push((Instant::now(), sender));
            }
        }
        Ok((status, body))
    }

    /// An idle connection that is still open, else a new one.
    async fn sender(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        loop {
            let idle = match self.idle.lock() {
                Ok(mut idle) => idle.pop(),
                Err(_) => None,
            };
            let Some((used_at, mut sender)) = idle else { break };
            if used_at.elapsed() < IDLE_REUSE_MAX && !sender.is_closed() && sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.authority))
            .await
            .map_err(|_| format!("connect timed out after {CONNECT_TIMEOUT:?}"))?
            .map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("sandbox provider connection ended: {e}");
            }
        });
        Ok(sender)
    }
}

/// What a non-2xx answer means: a 4xx is the provider's final no, anything else leaves the
/// outcome unknown.
fn refusal(status: StatusCode, body: &[u8]) -> ProviderError {
    let (code, detail) = match serde_json::from_slice::<wire::ErrorBody>(body) {
        Ok(error) => (Some(error.error.clone()), format!("{status} {}: {}", error.error, error.message)),
        Err(_) => (None, format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)]))),
    };
    if status == StatusCode::CONFLICT && code.as_deref() == Some(wire::ORDER_ID_REUSED) {
        return ProviderError::ReferenceTaken(detail);
    }
    if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::REQUEST_TIMEOUT {
        ProviderError::Refused(detail)
    } else {
        ProviderError::Unavailable(detail)
    }
}

/// A 2xx answer's body; one that cannot be read leaves the outcome unknown.
fn parsed<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ProviderError> {
    serde_json::from_slice(body).map_err(|e| ProviderError::Unavailable(format!("an unreadable answer: {e}")))
}

fn payment_status(payment: &wire::PaymentBody) -> PaymentStatus {
    match payment.status {
        wire::Status::Pending => PaymentStatus::Pending,
        wire::Status::Succeeded => PaymentStatus::Succeeded {
            reference: payment.id.clone(),
            amount: payment.amount,
            currency: payment.currency.clone(),
        },
        wire::Status::Failed => {
            PaymentStatus::Failed { reason: payment.reason.clone().unwrap_or_else(|| "failed".to_string()) }
        }
    }
}

/// An answer about an order's payment: the payment, or the sandbox's own "no payment". Any
/// other 404 (a wrong base URL, another server) says nothing about the order.
fn order_payment(status: StatusCode, answer: &[u8]) -> Result<PaymentStatus, ProviderError> {
    if status == StatusCode::NOT_FOUND {
        return match serde_json::from_slice::<wire::ErrorBody>(answer) {
            Ok(error) if error.error == wire::NO_PAYMENT => Ok(PaymentStatus::NotFound),
            _ => Err(refusal(status, answer)),
        };
    }
    if !status.is_success() {
        return Err(refusal(status, answer));
    }
    Ok(payment_status(&parsed::<wire::PaymentBody>(answer)?))
}

fn json_body<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, ProviderError> {
    serde_json::to_vec(value).map_err(|e| ProviderError::Refused(format!("cannot encode the request: {e}")))
}

#[async_trait]
impl PaymentProvider for SandboxProvider {
    async fn create(&self, payment: &CreatePayment) -> Result<ProviderPayment, ProviderError> {
        let body = json_body(&wire::CreateBody {
            order_id: payment.order_id.clone(),
            amount: payment.amount,
            currency: payment.currency.clone(),
            callback_url: payment.callback_url.clone(),
        })?;
        let (status, answer) = self.call(Method::POST, "/v1/payments", Some(body)).await?;
        if !status.is_success() {
            return Err(refusal(status, &answer));
        }
        let created: wire::PaymentBody = parsed(&answer)?;
        Ok(ProviderPayment {
            status: payment_status(&created),
            id: created.id,
            order_id: created.order_id,
            pay_url: Some(created.pay_url),
        })
    }

    async fn query(&self, order_id: &str) -> Result<PaymentStatus, ProviderError> {
        let path = format!("/v1/payments?order_id={}", wire::percent_encode(order_id));
        let (status, answer) = self.call(Method::GET, &path, None).await?;
        order_payment(status, &answer)
    }

    async fn close(&self, order_id: &str) -> Result<PaymentStatus, ProviderError> {
        let body = json_body(&wire::CloseBody { order_id: order_id.to_string() })?;
        let (status, answer) = self.call(Method::POST, "/v1/payments/close", Some(body)).await?;
        order_payment(status, &answer)
    }

    async fn refund(&self, refund: &RefundRequest) -> Result<RefundStatus, ProviderError> {
        let body = json_body(&wire::RefundBody {
            refund_id: refund.refund_id.clone(),
            reference: refund.reference.clone(),
            amount: refund.amount,
            currency: refund.currency.clone(),
        })?;
        let (status, answer) = self.call(Method::POST, "/v1/refunds", Some(body)).await?;
        if !status.is_success() {
            return Err(refusal(status, &answer));
        }
        let answered: wire::RefundAnswer = parsed(&answer)?;
        Ok(match answered.status {
            wire::RefundState::Succeeded => RefundStatus::Succeeded,
            wire::RefundState::Pending => RefundStatus::Pending,
            wire::RefundState::Failed => {
                RefundStatus::Failed { reason: answered.reason.unwrap_or_else(|| "failed".to_string()) }
            }
        })
    }

    async fn settlements(&self, from_ms: u64, to_ms: u64) -> Result<SettlementReport, ProviderError> {
        let path = format!("/v1/settlements?from_ms={from_ms}&to_ms={to_ms}");
        let (status, answer) = self.call(Method::GET, &path, None).await?;
        if !status.is_success() {
            return Err(refusal(status, &answer));
        }
        let books: wire::Settlements = parsed(&answer)?;
        let payments = books
            .payments
            .into_iter()
            .map(|payment| SettledPayment {
                succeeded: payment.status == wire::Status::Succeeded,
                at_ms: payment.settled_at_ms.unwrap_or(payment.created_at_ms),
                reference: payment.id,
                order_id: payment.order_id,
                amount: payment.amount,
                currency: payment.currency,
            })
            .collect();
        let refunds = books
            .refunds
            .into_iter()
            .map(|refund| SettledRefund {
                succeeded: refund.status == wire::RefundState::Succeeded,
                refund_id: refund.refund_id,
                reference: refund.reference,
                amount: refund.amount,
                currency: refund.currency,
            })
            .collect();
        Ok(SettlementReport { payments, refunds })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_http_host_and_port_is_a_base_url() {
        for good in ["http://127.0.0.1:8095", "http://127.0.0.1:8095/", "http://localhost:1"] {
            assert!(SandboxProvider::new(good).is_ok(), "{good}");
        }
        for bad in ["", "127.0.0.1:8095", "https://127.0.0.1:8095", "http://127.0.0.1", "http://h:1/v1", "http://:1"] {
            assert!(matches!(SandboxProvider::new(bad), Err(ProviderError::Refused(_))), "{bad}");
        }
    }

    #[test]
    fn a_4xx_is_final_and_everything_else_unknown() {
        let body = br#"{"error":"exceeds_payment","message":"more than was paid"}"#;
        assert!(
            matches!(refusal(StatusCode::UNPROCESSABLE_ENTITY, body), ProviderError::Refused(m) if m.contains("exceeds_payment"))
        );
        for unknown in [StatusCode::SERVICE_UNAVAILABLE, StatusCode::TOO_MANY_REQUESTS, StatusCode::BAD_GATEWAY] {
            assert!(matches!(refusal(unknown, b"<html>"), ProviderError::Unavailable(_)), "{unknown}");
        }
        assert!(matches!(parsed::<wire::PaymentBody>(b"{\"id\":"), Err(ProviderError::Unavailable(_))));
    }

    #[test]
    fn order_ids_survive_the_query_string() {
        for id in ["sku-1", "a b&c=d", "ü:/%"] {
            assert_eq!(wire::percent_decode(&wire::percent_encode(id)).as_deref(), Some(id));
        }
        assert_eq!(wire::percent_decode("%zz"), None);
    }
}
