//! One-shot HTTP/1 calls for harnesses that poll servers they started (readiness, a
//! coordinator's state): a fresh connection per call, every step under one deadline, so a
//! process that is down, frozen or partitioned costs the caller at most that deadline.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HOST;
use hyper::Request;

/// `GET path` on `addr`: the status and body, or an error if no full answer came within
/// `within` (connect included).
pub async fn get(addr: SocketAddr, path: &str, within: Duration) -> anyhow::Result<(u16, Bytes)> {
    get_with(addr, path, None, within).await
}

/// `GET path` on `addr` with `Authorization: Bearer <token>` if given.
pub async fn get_with(
    addr: SocketAddr,
    path: &str,
    bearer: Option<&str>,
    within: Duration,
) -> anyhow::Result<(u16, Bytes)> {
    let call = async {
        let mut sender = crate::load::connect(addr).await?;
        let mut request = Request::get(path).header(HOST, addr.to_string());
        if let Some(token) = bearer {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request.body(Full::new(Bytes::new()))?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(within, call)
        .await
        .map_err(|_| anyhow::anyhow!("GET {addr}{path}: no answer within {within:?}"))?
}

/// `GET path` parsed as JSON, when it answers 200.
pub async fn get_json(addr: SocketAddr, path: &str, within: Duration) -> anyhow::Result<serde_json::Value> {
    get_json_with(addr, path, None, within).await
}

/// `GET path` with a bearer token, parsed as JSON, when it answers 200.
pub async fn get_json_with(
    addr: SocketAddr,
    path: &str,
    bearer: Option<&str>,
    within: Duration,
) -> anyhow::Result<serde_json::Value> {
    let (status, body) = get_with(addr, path, bearer, within).await?;
    anyhow::ensure!(status == 200, "GET {addr}{path} answered {status}");
    Ok(serde_json::from_slice(&body)?)
}

/// `POST path` with a JSON body: the status and the body parsed as JSON (null if it is not).
pub async fn post_json(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
    within: Duration,
) -> anyhow::Result<(u16, serde_json::Value)> {
    send_json(hyper::Method::POST, addr, path, body, None, within).await
}

/// A call with a JSON body and, if given, `Authorization: Bearer <token>`: the status and the
/// body parsed as JSON (null if it is not).
pub async fn send_json(
    method: hyper::Method,
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
    bearer: Option<&str>,
    within: Duration,
) -> anyhow::Result<(u16, serde_json::Value)> {
    let call = async {
        let mut sender = crate::load::connect(addr).await?;
        let mut request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(HOST, addr.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(token) = bearer {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request.body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, serde_json::from_slice(&body).unwrap_or_default()))
    };
    tokio::time::timeout(within, call)
        .await
        .map_err(|_| anyhow::anyhow!("{method} {addr}{path}: no answer within {within:?}"))?
}

/// `POST path` with raw `body` bytes and extra headers (a signed webhook): the status and the
/// body parsed as JSON (null if it is not).
pub async fn post_raw(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, String)],
    body: Bytes,
    within: Duration,
) -> anyhow::Result<(u16, serde_json::Value)> {
    let call = async {
        let mut sender = crate::load::connect(addr).await?;
        let mut request = Request::builder()
            .method(hyper::Method::POST)
            .uri(path)
            .header(HOST, addr.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            request = request.header(*name, value.as_str());
        }
        let response = sender.send_request(request.body(Full::new(body))?).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, serde_json::from_slice(&body).unwrap_or_default()))
    };
    tokio::time::timeout(within, call)
        .await
        .map_err(|_| anyhow::anyhow!("POST {addr}{path}: no answer within {within:?}"))?
}
