//! A trace collector for tests: an OTLP/HTTP receiver on loopback that decodes every
//! `POST /v1/traces` (protobuf, as the exporter sends it) and keeps the spans, so a test can
//! read what a process exported: names, trace and parent ids, each span's service and
//! attributes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use tokio::net::TcpListener;

/// One exported span, as the collector saw it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub name: String,
    /// Hex, as in a `traceparent`.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// `service.name` of the process that exported it.
    pub service: String,
    /// `service.instance.id` of that process.
    pub instance: String,
    /// The span's own attributes, every value as text.
    pub attributes: Vec<(String, String)>,
    /// Trace ids of the spans it links to (a batch's other purchases).
    pub links: Vec<String>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// A running receiver; stops with its runtime.
pub struct Collector {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

impl Collector {
    /// Listens on a free loopback port.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| receive(kept.clone(), request));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, spans })
    }

    /// The base URL to give as `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Waits until `done` holds for the spans received, or fails after `within` naming what
    /// arrived.
    pub async fn wait_for(
        &self,
        within: Duration,
        what: &str,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> anyhow::Result<Vec<ReceivedSpan>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return Ok(spans);
            }
            if tokio::time::Instant::now() >= deadline {
                let names: Vec<String> = spans.iter().map(|s| format!("{} ({})", s.name, s.service)).collect();
                anyhow::bail!("no {what} within {within:?}; received: {names:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn receive(
    kept: Arc<Mutex<Vec<ReceivedSpan>>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let answer = |status: StatusCode| {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = status;
        Ok(response)
    };
    if request.uri().path() != "/v1/traces" {
        return answer(StatusCode::NOT_FOUND);
    }
    let Ok(body) = request.into_body().collect().await.map(http_body_util::Collected::to_bytes) else {
        return answer(StatusCode::BAD_REQUEST);
    };
    let Ok(export) = ExportTraceServiceRequest::decode(body) else { return answer(StatusCode::BAD_REQUEST) };
    let mut spans = Vec::new();
    for resource_spans in export.resource_spans {
        let resource = resource_spans.resource.map(|r| r.attributes).unwrap_or_default();
        let service = text_of(&resource, "service.name").unwrap_or_default();
        let instance = text_of(&resource, "service.instance.id").unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    service: service.clone(),
                    instance: instance.clone(),
                    attributes: span.attributes.iter().map(|kv| (kv.key.clone(), text(kv))).collect(),
                    links: span.links.iter().map(|link| hex(&link.trace_id)).collect(),
                });
            }
        }
    }
    kept.lock().unwrap_or_else(PoisonError::into_inner).extend(spans);
    answer(StatusCode::OK)
}

fn text_of(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).map(text)
}

fn text(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|value| value.value.as_ref()) {
        Some(Value::StringValue(text)) => text.clone(),
        Some(Value::IntValue(number)) => number.to_string(),
        Some(Value::BoolValue(flag)) => flag.to_string(),
        Some(Value::DoubleValue(number)) => number.to_string(),
        _ => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A `traceparent` for a new sampled trace, and its trace id.
pub fn new_traceparent() -> (String, String) {
    let trace_id = format!("{:016x}{:016x}", fastrand::u64(1..), fastrand::u64(1..));
    let parent = format!("{:016x}", fastrand::u64(1..));
    (format!("00-{trace_id}-{parent}-01"), trace_id)
}

/// How long a test waits for exported spans: the processes it starts export every 100 ms
/// (`OTEL_BSP_SCHEDULE_DELAY`).
pub const EXPORT_WAIT: Duration = Duration::from_secs(20);
