//! Bodies in and out: reading a bounded JSON request body, writing JSON answers and refusals.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use protocol::Refusal;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Longest time to read a body: a 32 MiB snapshot chunk takes well under a second on any link
/// a raft group can live with. Admin bodies are read within the same bound.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) type Body = Full<Bytes>;

/// Reads a JSON body of at most `bytes_max` within [`BODY_TIMEOUT`]: 413 past the limit (a
/// declared length over it is refused before reading), 408 when it takes too long.
pub(super) async fn read<T: DeserializeOwned>(
    request: Request<Incoming>,
    bytes_max: usize,
) -> Result<T, Response<Body>> {
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > bytes_max as u64) {
        return Err(closing(refusal(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", None)));
    }
    let collected = tokio::time::timeout(BODY_TIMEOUT, Limited::new(request.into_body(), bytes_max).collect()).await;
    let body = match collected {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) if e.is::<LengthLimitError>() => {
            return Err(closing(refusal(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", None)))
        }
        Ok(Err(_)) => return Err(closing(refusal(StatusCode::BAD_REQUEST, "bad_body", None))),
        Err(_) => return Err(closing(refusal(StatusCode::REQUEST_TIMEOUT, "body_timeout", None))),
    };
    serde_json::from_slice(&body).map_err(|_| refusal(StatusCode::BAD_REQUEST, "bad_request", None))
}

pub(super) fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| br#"{"error":"internal"}"#.to_vec());
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A `protocol::Refusal` with `status`, naming the leader when it is known.
pub(super) fn refusal(status: StatusCode, error: &str, leader: Option<String>) -> Response<Body> {
    json(status, &Refusal { leader, ..Refusal::new(error) })
}

/// Asks hyper to close the connection after this answer: its body was not (fully) read.
pub(super) fn closing(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

pub(super) fn not_found() -> Response<Body> {
    refusal(StatusCode::NOT_FOUND, "not_found", None)
}

/// 405 for a route that exists under another method. A route that takes a body answers it
/// [`closing`]: its body is not read.
pub(super) fn method_not_allowed() -> Response<Body> {
    refusal(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", None)
}

pub(super) fn unsupported_version(theirs: u32) -> Response<Body> {
    json(StatusCode::BAD_REQUEST, &Refusal::unsupported_version(theirs))
}
