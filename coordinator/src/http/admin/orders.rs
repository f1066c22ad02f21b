//! Orders by state for the operator's view, read from the order service's own metrics (the
//! `seckill_orders{sku,state}` gauge it publishes from its store): the coordinator keeps no
//! order state, and the page must not need a second origin.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::HOST;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The operator's page asks every 2 s: a slow order service shows as an error, not a stall.
const READ_MAX: Duration = Duration::from_millis(800);
/// Metrics of a service with many SKUs are a few hundred kB.
const METRICS_BYTES_MAX: usize = 8 << 20;
const GAUGE: &str = "seckill_orders";

/// Orders per SKU and state, as the order service at `addr` last counted them.
pub type OrdersByState = BTreeMap<String, BTreeMap<String, u64>>;

pub async fn orders_by_state(addr: &str) -> Result<OrdersByState, String> {
    let text = tokio::time::timeout(READ_MAX, fetch_metrics(addr))
        .await
        .map_err(|_| format!("the order service at {addr} did not answer within {READ_MAX:?}"))??;
    Ok(parse(&text))
}

async fn fetch_metrics(addr: &str) -> Result<String, String> {
    let unreachable = |e: &dyn std::fmt::Display| format!("cannot read the order service at {addr}: {e}");
    let stream = TcpStream::connect(addr).await.map_err(|e| unreachable(&e))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| unreachable(&e))?;
    tokio::spawn(connection);
    let request =
        Request::get("/metrics").header(HOST, addr).body(Empty::<Bytes>::new()).map_err(|e| unreachable(&e))?;
    let response = sender.send_request(request).await.map_err(|e| unreachable(&e))?;
    if !response.status().is_success() {
        return Err(format!("the order service at {addr} answered {} on /metrics", response.status()));
    }
    let body = Limited::new(response.into_body(), METRICS_BYTES_MAX).collect().await.map_err(|e| unreachable(&e))?;
    Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
}

/// The `seckill_orders` samples of a Prometheus text exposition; other lines are skipped.
fn parse(text: &str) -> OrdersByState {
    let mut orders = OrdersByState::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(GAUGE).and_then(|rest| rest.strip_prefix('{')) else { continue };
        let Some((labels, value)) = rest.rsplit_once('}') else { continue };
        let Ok(count) = value.trim().parse::<f64>() else { continue };
        let labels = labels_of(labels);
        if let (Some(sku), Some(state)) = (labels.get("sku"), labels.get("state")) {
            // A gauge of a count: whole and non-negative.
            let count = if count.is_finite() && count > 0.0 { count.round() as u64 } else { 0 };
            orders.entry(sku.clone()).or_default().insert(state.clone(), count);
        }
    }
    orders
}

/// `name="value",…` with the exposition's escapes (`\\`, `\"`, `\n`) undone.
fn labels_of(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars();
    loop {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect::<String>();
        let name = name.trim_start_matches(',').trim().to_string();
        if name.is_empty() || chars.next() != Some('"') {
            return labels;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => return labels,
                },
                c => value.push(c),
            }
        }
        labels.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_orders_gauge_is_read_by_sku_and_state_and_nothing_else() {
        let text = "# TYPE seckill_orders gauge\n\
                    seckill_orders{sku=\"phone\",state=\"paid\"} 3\n\
                    seckill_orders{state=\"pending\",sku=\"phone\"} 2\n\
                    seckill_orders{sku=\"odd \\\"one\\\"\",state=\"expired\"} 1\n\
                    seckill_orders_lag_seconds{sku=\"phone\"} 9\n\
                    seckill_orders{sku=\"phone\"} 7\n\
                    seckill_orders{sku=\"phone\",state=\"broken\"} nan-ish\n";
        let orders = parse(text);
        assert_eq!(orders["phone"], BTreeMap::from([("paid".to_string(), 3), ("pending".to_string(), 2)]));
        assert_eq!(orders["odd \"one\""]["expired"], 1);
        assert_eq!(orders.len(), 2);
    }
}
