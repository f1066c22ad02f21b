//! One reusable HTTP/1 connection to one address, for the JSON calls nodes make to coordinator
//! members (and members to each other): reopened when it breaks, every call bounded by a
//! deadline. Transport failures are classified so callers can tell "nobody there" (refused,
//! unresolvable: try another member) from "lost in transit" (the call may have happened).
//! Every request carries the cluster token (`Authorization: Bearer`): members refuse any
//! `/raft/*` or `/api/*` call without it. With [`Tls`] the connection runs over mutual TLS.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::credential::{Secret, AUTHORIZATION};
use crate::tls::{Io, Tls};

/// Longest time to open a connection; a peer that takes longer is treated as unreachable.
const CONNECT_MAX: Duration = Duration::from_millis(500);

/// Why a call failed before the peer could answer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot reach {0}: {1}")]
    Unreachable(String, String),
    #[error("call to {0} failed: {1}")]
    Network(String, String),
}

/// A reusable HTTP/1 connection to one address.
pub struct Connection {
    addr: String,
    /// The cluster token this process presents.
    token: Secret,
    /// Mutual TLS to the member, when the fleet runs it.
    tls: Option<Tls>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    pub fn new(addr: impl Into<String>, token: Secret) -> Self {
        Self { addr: addr.into(), token, tls: None, sender: None }
    }

    /// Runs the connection over mutual TLS when `tls` is set.
    pub fn with_tls(mut self, tls: Option<Tls>) -> Self {
        self.tls = tls;
        self
    }

    /// POSTs `body` as JSON to `path` and returns the status and body, within `deadline`. A
    /// failed or timed-out call drops the connection: a request may still be in flight on it.
    pub async fn post(
        &mut self,
        path: &str,
        body: Bytes,
        deadline: Duration,
    ) -> Result<(StatusCode, Bytes), TransportError> {
        self.call(hyper::Method::POST, path, body, deadline).await
    }

    /// GETs `path` and returns the status and body, within `deadline`.
    pub async fn get(&mut self, path: &str, deadline: Duration) -> Result<(StatusCode, Bytes), TransportError> {
        self.call(hyper::Method::GET, path, Bytes::new(), deadline).await
    }

    async fn call(
        &mut self,
        method: hyper::Method,
        path: &str,
        body: Bytes,
        deadline: Duration,
    ) -> Result<(StatusCode, Bytes), TransportError> {
        let addr = self.addr.clone();
        match tokio::time::timeout(deadline, self.exchange(method, &addr, path, body)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => {
                self.sender = None;
                Err(e)
            }
            Err(_) => {
                self.sender = None;
                Err(TransportError::Network(addr, format!("no answer within {deadline:?}")))
            }
        }
    }

    async fn exchange(
        &mut self,
        method: hyper::Method,
        addr: &str,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), TransportError> {
        let failed = |e: String| TransportError::Network(addr.to_string(), e);
        let authorization = self.token.bearer();
        let sender = self.ready().await?;
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr)
            .header(AUTHORIZATION, authorization)
            .header("content-type", "application/json")
            .body(Full::new(body))
            .map_err(|e| failed(e.to_string()))?;
        let response = sender.send_request(request).await.map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| failed(e.to_string()))?.to_bytes();
        Ok((status, body))
    }

    async fn ready(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, TransportError> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            self.sender = Some(self.connect().await?);
        }
        let sender =
            self.sender.as_mut().ok_or_else(|| TransportError::Network(self.addr.clone(), "no connection".into()))?;
        sender.ready().await.map_err(|e| TransportError::Network(self.addr.clone(), e.to_string()))?;
        Ok(sender)
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, TransportError> {
        let unreachable = |e: String| TransportError::Unreachable(self.addr.clone(), e);
        // A name is resolved here, on every connect, within the same deadline: a member or node
        // that came back at another address (a replaced container) is found, and one whose
        // name does not resolve yet is unreachable for now, not a fault of the config.
        let stream = tokio::time::timeout(CONNECT_MAX, TcpStream::connect(self.addr.as_str()))
            .await
            .map_err(|_| unreachable("connect timed out".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let io: Box<dyn Io> = match &self.tls {
            Some(tls) => tokio::time::timeout(CONNECT_MAX, tls.connect(&self.addr, stream))
                .await
                .map_err(|_| unreachable("TLS handshake timed out".into()))?
                .map_err(|e| unreachable(format!("TLS handshake: {e}")))?,
            None => Box::new(stream),
        };
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}
