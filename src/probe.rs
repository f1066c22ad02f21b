//! One HTTP GET under a deadline, for asking a process whether it is up: `fleet up` waits on
//! its nodes' `/ready` with it, and `seckill healthcheck` (the container image's health check,
//! which has no curl) is one call of it.

use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;

/// `GET http://{authority}{path}` within `timeout`, connect included; the answer's status. The
/// authority may be a DNS name (resolved on every call, so a container that got a new address
/// is found).
pub async fn get(authority: &str, path: &str, timeout: Duration) -> anyhow::Result<hyper::StatusCode> {
    tokio::time::timeout(timeout, async {
        let stream =
            tokio::net::TcpStream::connect(authority).await.with_context(|| format!("connecting to {authority}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let request = hyper::Request::get(path).header(hyper::header::HOST, authority).body(Full::new(Bytes::new()))?;
        Ok(sender.send_request(request).await?.status())
    })
    .await
    .with_context(|| format!("no answer from {authority} within {timeout:?}"))?
}

/// Splits `http://host:port/path` into its authority and path (`/` when absent); only plain
/// HTTP, as every probe route of the fleet is.
pub fn split_url(url: &str) -> anyhow::Result<(&str, &str)> {
    let rest = url.strip_prefix("http://").with_context(|| format!("{url:?} is not an http:// URL"))?;
    let (authority, path) = rest.find('/').map_or((rest, "/"), |at| rest.split_at(at));
    anyhow::ensure!(authority.contains(':') && !authority.ends_with(':'), "{url:?} names no port");
    Ok((authority, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_authority_and_path() {
        assert_eq!(split_url("http://node-1:8080/ready").unwrap(), ("node-1:8080", "/ready"));
        assert_eq!(split_url("http://127.0.0.1:9").unwrap(), ("127.0.0.1:9", "/"));
        assert_eq!(split_url("http://[::1]:9/health").unwrap(), ("[::1]:9", "/health"));
        for bad in ["https://a:1/", "a:1/ready", "http://node/ready", "http://node:/ready"] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
    }
}
