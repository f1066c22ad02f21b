//! What probes, scrapers and browsers read without a token: `/health`, `/metrics` and the
//! operator's page `/ops` with its files (they tell nothing a token protects: the page asks the
//! operator for the admin token and reads `/admin/*` with it).

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Response, StatusCode};

use super::body::{json, method_not_allowed, refusal, Body};
use crate::context::Context;

/// `GET /health`: the member's HTTP server answers.
pub(super) fn health(method: &Method) -> Response<Body> {
    if method != Method::GET {
        return method_not_allowed();
    }
    json(StatusCode::OK, &serde_json::json!({ "status": "ok" }))
}

/// `GET /metrics`: Prometheus text, with the raft and fleet gauges set at this scrape.
pub(super) fn metrics(member: &Context, method: &Method) -> Response<Body> {
    if method != Method::GET {
        return method_not_allowed();
    }
    match member.render_metrics() {
        Some(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            response
        }
        None => refusal(StatusCode::SERVICE_UNAVAILABLE, "metrics_unavailable", None),
    }
}

/// `GET /ops` and the files it loads under `/web/`: the operator's live view of the sale.
pub(super) fn ops_page(path: &str, method: &Method) -> Response<Body> {
    if method != Method::GET {
        return method_not_allowed();
    }
    let asset = match path {
        "/ops" => Some(web::ops_page()),
        _ => path.strip_prefix(web::ASSET_PREFIX).and_then(web::asset),
    };
    let Some(asset) = asset else { return super::body::not_found() };
    let mut response = Response::new(Full::new(Bytes::from_static(asset.body)));
    for (name, value) in asset.headers() {
        response.headers_mut().insert(name, HeaderValue::from_static(value));
    }
    response
}
