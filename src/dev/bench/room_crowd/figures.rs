//! The figures of a point: quantiles of latencies, and how long after the last sale each waiter
//! still in line heard `sold_out`.

use super::*;

/// Sorted milliseconds from microseconds.
pub(super) fn sorted_ms(us: &[u64]) -> Vec<f64> {
    let mut ms: Vec<f64> = us.iter().map(|us| *us as f64 / 1e3).collect();
    ms.sort_by(f64::total_cmp);
    ms
}

/// The `q` quantile of ascending `sorted` (nearest rank); `None` if empty.
pub(super) fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// A waiter as the sold-out measure sees it, in ms from the first intended join.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Line {
    /// Its join put it in line (`waiting` or `pre_queue`).
    pub(super) queued: bool,
    /// When the room admitted it.
    pub(super) admitted_ms: Option<f64>,
    pub(super) sold_out_heard_ms: Option<f64>,
}

/// Each waiter's line, admitted when the room's log says (ledger clock, ms from the start): one
/// admitted just before the last sale may hear it only after, and is no waiter then.
pub(super) fn lines(records: &[WaiterRecord], admitted_at: &HashMap<&str, f64>) -> Vec<Line> {
    records
        .iter()
        .map(|r| Line {
            queued: r.queued,
            admitted_ms: admitted_at.get(r.user.as_str()).copied(),
            sold_out_heard_ms: r.sold_out_heard_ms,
        })
        .collect()
}

/// What the waiters in line at the last sale heard.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Told {
    pub(super) waiting: u64,
    pub(super) untold: u64,
    /// `None` if nobody waited, or someone never heard.
    pub(super) max_ms: Option<f64>,
    /// Untold waiters count as never: `None` if the p99 falls on one (or nobody waited).
    pub(super) p99_ms: Option<f64>,
}

/// For every waiter in line when the last unit sold at `last_sale_ms` (queued by its join, not
/// admitted before then): how long after it the waiter heard `sold_out`.
pub(super) fn sold_out_heard(lines: &[Line], last_sale_ms: f64) -> Told {
    let waiting: Vec<&Line> =
        lines.iter().filter(|l| l.queued && l.admitted_ms.is_none_or(|at| at > last_sale_ms)).collect();
    let mut delays: Vec<f64> =
        waiting.iter().map(|l| l.sold_out_heard_ms.map_or(f64::INFINITY, |heard| heard - last_sale_ms)).collect();
    delays.sort_by(f64::total_cmp);
    let finite = |v: Option<f64>| v.filter(|v| v.is_finite());
    Told {
        waiting: waiting.len() as u64,
        untold: delays.iter().filter(|d| d.is_infinite()).count() as u64,
        max_ms: finite(delays.last().copied()),
        p99_ms: finite(quantile(&delays, 0.99)),
    }
}
