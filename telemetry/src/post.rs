//! The exporter's HTTP client. The SDK exports from a thread of its own, outside any tokio
//! runtime, so each post is spawned onto the process's runtime and awaited from there.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError};

/// A collector's answer is a few bytes; anything longer is not one.
const RESPONSE_BYTES_MAX: usize = 64 * 1024;

#[derive(Debug)]
pub(crate) struct Poster {
    runtime: tokio::runtime::Handle,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl Poster {
    pub(crate) fn new(runtime: tokio::runtime::Handle, timeout: Duration) -> Self {
        Self { runtime, client: Client::builder(TokioExecutor::new()).build_http(), timeout }
    }
}

#[async_trait::async_trait]
impl HttpClient for Poster {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(body));
        let posted = self.runtime.spawn(async move {
            let answer = async {
                let response = client.request(request).await?;
                let (parts, body) = response.into_parts();
                let body = Limited::new(body, RESPONSE_BYTES_MAX).collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            };
            tokio::time::timeout(timeout, answer)
                .await
                .map_err(|_| HttpError::from("the collector did not answer in time"))?
        });
        posted.await?
    }
}
