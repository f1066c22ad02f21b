//! The judgement: every SKU's checks, the money's and the room's on what the schedule recorded
//! and read, the schedule's report, and with `--out` everything it was judged on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use ledger::{RedisLedger, SkuId};

use super::{sells, Ended, Healed, Options, Sale, Selling, BOUNDS, UNITS};
use crate::checker::{self, Evidence, FinalLedger, OrderBooks, Violation};
use crate::history::{Event, Request};
use crate::money;
use crate::report::{self, SaleReport, ScheduleReport};
use crate::room;
use crate::schedule::Schedule;
use crate::stripes;

/// What the room's checks found, and its admission log as read.
type RoomRead = (Vec<Violation>, Result<Vec<ledger::Admission>, String>);

/// Every violation found, in check order, and each SKU's line of the report.
struct Verdict {
    violations: Vec<Violation>,
    sales: Vec<SaleReport>,
    /// Sales in the ledger whose buyer never heard of them.
    untold_sales: u64,
}

/// Judges the schedule and reports it; with `--out`, writes out what it was judged on (and,
/// when it violated a promise, the fleet's logs).
pub(super) async fn judge(
    options: &Options,
    sale: &Sale,
    healed: Healed,
    ended: Ended,
    wall: Instant,
) -> anyhow::Result<ScheduleReport> {
    let events = sale.history.events();
    let nodes = sale.fleet.node_names();
    let mut verdict = Verdict { violations: Vec::new(), sales: Vec::new(), untold_sales: 0 };
    for ((selling, final_ledger), order_books) in sale.sellings.iter().zip(&ended.finals).zip(&ended.books) {
        let (found, sale_report, untold) =
            judge_sale(sale, &healed, &ended, &nodes, selling, final_ledger, order_books);
        verdict.violations.extend(found);
        verdict.sales.push(sale_report);
        verdict.untold_sales += untold;
    }
    verdict.violations.extend(money::check(&ended.money));
    verdict.violations.extend(money::check_paying(&ended.paying));
    let room_read = match &ended.room {
        Some((logs, end)) => {
            Some(judge_room(logs, *end, &ended.watch, &sale.sellings, &ended.finals, healed.heal_ms).await?)
        }
        None => None,
    };
    if let Some((found, _)) = &room_read {
        verdict.violations.extend(found.iter().cloned());
    }
    let report = schedule_report(sale, healed, &ended, verdict, &events, wall);
    if let Some(out) = &options.out {
        save(&out.join(format!("seed-{}", sale.seed)), sale, &ended, &report, &events, room_read.as_ref())?;
    }
    Ok(report)
}

/// One SKU's checks: the violations found, its line of the report, and its sales nobody was told
/// of.
fn judge_sale(
    sale: &Sale,
    healed: &Healed,
    ended: &Ended,
    nodes: &[String],
    selling: &Selling,
    final_ledger: &FinalLedger,
    order_books: &OrderBooks,
) -> (Vec<Violation>, SaleReport, u64) {
    let main = selling.sku == sale.sku;
    let sold: Vec<Request> = ended.requests.iter().filter(|r| sells(r, &selling.sku)).cloned().collect();
    let sold_out_ms = match main {
        true => ended.samples.iter().find(|s| s.ledger.is_some_and(|l| l.unsold() == 0)).map(|s| s.at_ms),
        false => selling.sold_out_ms,
    };
    let sold_out_ms = sold_out_ms.or_else(|| {
        let unsold = |s: &&ledger::SkuStatus| stripes::unsold(s.remaining, s.transferred_out, s.transferred_in);
        final_ledger.status.as_ref().ok().filter(|s| unsold(s) == 0).map(|_| final_ledger.at_ms)
    });
    let evidence = Evidence {
        total: selling.terms.total,
        per_user_limit: selling.terms.per_user_limit,
        nodes,
        requests: &sold,
        // The monitor samples the main SKU: the rules on samples judge it alone.
        samples: if main { &ended.samples } else { &[] },
        windows: &healed.windows,
        ledger: final_ledger,
        heal_ms: healed.heal_ms,
        sold_out_ms,
        demand_ended_ms: ended.demand_ended_ms,
        // Once per schedule, with the main SKU.
        truncated: main && sale.history.truncated(),
        coordinator: if main { ended.coordinator.clone() } else { Ok(()) },
        bounds: BOUNDS,
        order_books: Some(order_books),
        idempotency_ttl_ms: sale.ttl.unwrap_or(ledger::IDEMPOTENCY_TTL_DEFAULT).as_millis() as u64,
        clock_origin_unix_ms: sale.clock.origin_unix_ms(),
    };
    let mut found = Vec::new();
    for mut violation in checker::check(&evidence) {
        if !main {
            violation.detail = format!("{}: {}", selling.sku, violation.detail);
        }
        found.push(violation);
    }
    let told: BTreeSet<&str> = sold.iter().filter(|r| r.is_purchase()).filter_map(|r| r.order_id.as_deref()).collect();
    let untold = final_ledger
        .orders
        .as_ref()
        .map(|orders| orders.iter().filter(|o| !told.contains(o.order_id.0.as_str())).count() as u64)
        .unwrap_or(0);
    let sale_report = SaleReport {
        sku: selling.sku.to_string(),
        total: selling.terms.total,
        sold: final_ledger.status.as_ref().ok().map(|s| s.sold),
        created_ms: selling.created_ms,
        sold_out_ms,
    };
    (found, sale_report, untold)
}

/// The schedule's report: the verdict, with the heal's timings and what the buyers did.
fn schedule_report(
    sale: &Sale,
    healed: Healed,
    ended: &Ended,
    verdict: Verdict,
    events: &[Event],
    wall: Instant,
) -> ScheduleReport {
    let main_sold_out_ms = verdict.sales.first().and_then(|s| s.sold_out_ms);
    let heal_times = report::heal_times(&ended.requests, &healed.windows, healed.heal_ms, main_sold_out_ms);
    let mut outcomes = BTreeMap::new();
    for request in &ended.requests {
        *outcomes.entry(request.outcome.clone()).or_insert(0) += 1;
    }
    let details = report::details(sale.seed, &verdict.violations, events, &ended.requests, &ended.samples);
    ScheduleReport {
        seed: sale.seed,
        faults: healed.windows,
        setup: sale.schedule.setup.labels(),
        heal_ms: healed.heal_ms,
        time_to_heal_ms: heal_times.heal,
        fault_recovery_ms: heal_times.faults,
        node_recovery_ms: heal_times.nodes,
        sold_out_ms: main_sold_out_ms,
        total: UNITS,
        sold: verdict.sales.first().and_then(|s| s.sold),
        sales: verdict.sales,
        requests: ended.requests.len() as u64,
        keys: ended.keys,
        reused_keys: ended.finished.reused_keys,
        payments: ended.money.as_ref().map_or(0, |m| m.taken().count() as u64),
        paying: ended.paying,
        outcomes,
        untold_sales: verdict.untold_sales,
        unresolved_keys: ended.finished.unresolved_keys,
        violations: verdict.violations,
        details,
        wall_ms: wall.elapsed().as_millis() as u64,
    }
}

/// Writes into `dir` what the schedule was judged on and its report; the room's waiters and
/// admissions when it ran one; and the fleet's logs when a promise was broken.
fn save(
    dir: &Path,
    sale: &Sale,
    ended: &Ended,
    report: &ScheduleReport,
    events: &[Event],
    room_read: Option<&RoomRead>,
) -> anyhow::Result<()> {
    let ledgers: Vec<(&SkuId, &FinalLedger)> = sale.sellings.iter().map(|s| &s.sku).zip(&ended.finals).collect();
    write_out(dir, &sale.schedule, report, events, &ended.requests, &ended.samples, &ledgers)?;
    if let (Some((logs, _)), Some((_, admissions))) = (&ended.room, room_read) {
        let room = serde_json::json!({ "waiters": logs, "admissions": admissions.as_ref().ok().map(|log| {
            log.iter().map(|a| (a.seq, a.position, a.user.clone(), a.at_ms, a.remaining, a.live)).collect::<Vec<_>>()
        }) });
        std::fs::write(dir.join("room.json"), serde_json::to_vec_pretty(&room)?)?;
    }
    if !report.violations.is_empty() {
        sale.fleet.copy_logs(&dir.join("logs"))?;
    }
    Ok(())
}

/// The room SKU's rules ([`room::check`]) on what its waiters heard, the ledger's admission
/// log and its sales; with the log as read, for `--out`.
async fn judge_room(
    logs: &[room::WaiterLog],
    end: room::RoomEnd,
    watch: &RedisLedger,
    sellings: &[Selling],
    finals: &[FinalLedger],
    heal_ms: u64,
) -> anyhow::Result<(Vec<checker::Violation>, Result<Vec<ledger::Admission>, String>)> {
    let sku = SkuId::new(room::ROOM.id)?;
    let at = sellings.iter().position(|selling| selling.sku == sku).context("the room SKU was not sold")?;
    let mut admissions = Vec::new();
    let admissions = loop {
        match ledger::SalesLedger::room_admissions(watch, &sku, admissions.len() as u64, 1000).await {
            Ok(page) if page.is_empty() => break Ok(admissions),
            Ok(page) => admissions.extend(page),
            Err(e) => break Err(e.to_string()),
        }
    };
    let bought_by_user = finals[at].orders.clone().map(|orders| {
        let mut bought = BTreeMap::new();
        for order in orders {
            *bought.entry(order.user.as_str().to_string()).or_insert(0) += u64::from(order.qty);
        }
        bought
    });
    let evidence =
        room::RoomEvidence { waiters: logs, admissions: &admissions, bought_by_user: &bought_by_user, end, heal_ms };
    let found = room::check(&evidence).into_iter().map(|mut v| {
        v.detail = format!("{}: {}", room::ROOM.id, v.detail);
        v
    });
    Ok((found.collect(), admissions))
}

fn write_out(
    dir: &Path,
    schedule: &Schedule,
    report: &ScheduleReport,
    events: &[crate::history::Event],
    requests: &[crate::history::Request],
    samples: &[crate::monitor::Sample],
    ledgers: &[(&SkuId, &FinalLedger)],
) -> anyhow::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let json_lines = |name: &str, lines: Vec<String>| -> anyhow::Result<()> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(dir.join(name))?);
        for line in lines {
            writeln!(file, "{line}")?;
        }
        Ok(file.flush()?)
    };
    std::fs::write(dir.join("schedule.json"), serde_json::to_string_pretty(schedule)?)?;
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(report)?)?;
    json_lines("timeline.jsonl", events.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect())?;
    json_lines("history.jsonl", requests.iter().map(|r| serde_json::to_string(r).unwrap_or_default()).collect())?;
    json_lines("samples.jsonl", samples.iter().map(|s| serde_json::to_string(s).unwrap_or_default()).collect())?;
    for (at, (sku, ledger)) in ledgers.iter().enumerate() {
        let mut ledger_json = serde_json::json!({
            "sku": sku,
            "status": ledger.status.as_ref().map_err(|e| e.clone()),
            "orders": ledger.orders.as_ref().map_err(|e| e.clone()),
            "releases": ledger.releases.as_ref().map_err(|e| e.clone()),
            "sellers": ledger.sellers,
            "at_ms": ledger.at_ms,
        });
        if !ledger.stripes.is_empty() {
            ledger_json["stripes"] = serde_json::to_value(&ledger.stripes)?;
        }
        // The main SKU's keeps the name it always had.
        let name = if at == 0 { "ledger.json".to_string() } else { format!("ledger-{sku}.json") };
        std::fs::write(dir.join(name), serde_json::to_string_pretty(&ledger_json)?)?;
    }
    if !report.details.is_empty() {
        std::fs::write(dir.join("violations.txt"), report.details.join("\n"))?;
    }
    Ok(())
}
