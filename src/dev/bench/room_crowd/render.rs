//! The table `seckill bench crowd --waiting-room` prints.

use super::*;

impl RoomCrowd {
    /// The table: one line per rate, then the targets.
    #[expect(clippy::too_many_lines, reason = "the report's table, line by line in the order it prints; lab code")]
    pub fn render(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let mut out = format!(
            "scenario {} ({} nodes), SKU behind a waiting room; redis-only saturation {:.0} req/s (closed loop)\n\
             room: admit_per_s {}, admit_factor {}, tickets {} s; {} units; crowd arriving over {:.0} ms at each rate; \
             {} joins in flight at most\n\
             scaled down: {}\n\
             latency counts from each request's intended time: a join's from its arrival, a purchase's from when \
             its waiter heard `admitted`; p99 ×1× is the ratio to the 1× point's\n\n\
             {:<14} {:>7} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>7} {:>11} {:>9} {:>8} {:>9} {:>9} {:>9} {:>8}\n",
            self.scenario,
            self.nodes,
            self.redis_only_saturation_rps,
            self.admit_per_s,
            self.admit_factor,
            self.ticket_ttl_s,
            self.units,
            self.arrival_s * 1e3,
            self.concurrency,
            self.scaled_down,
            "offered",
            "waiters",
            "joins/s",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "×1×",
            "join p99",
            "buy p99",
            "buy ×1×",
            "sold/total",
            "last sale",
            "waiting",
            "heard max",
            "heard p99",
            "admits/s",
            "tickets"
        );
        for p in &self.points {
            out.push_str(&format!(
                "{:<14} {:>7} {:>8.0} {:>8.1} {:>8.1} {:>8.1} {:>7.2} {:>9.1} {:>9} {:>7} {:>11} {:>9} {:>8} {:>9} {:>9} {:>9} {:>8}\n",
                format!("{}× {}/s", p.multiplier, p.offered_rps),
                p.waiters,
                p.achieved_join_rps,
                p.p50_ms,
                p.p99_ms,
                p.p999_ms,
                p.p99_ratio_to_1x,
                p.join_p99_ms,
                ms(p.purchase_p99_ms),
                p.purchase_p99_ratio_to_1x.map_or("-".to_string(), |r| format!("{r:.2}")),
                format!("{}/{}", p.sold, p.total),
                p.last_sale_ms.map_or("-".to_string(), |v| format!("{:.2} s", v / 1e3)),
                p.waiting_at_last_sale,
                if p.waiters_untold > 0 { format!("{} untold", p.waiters_untold) } else { ms(p.sold_out_heard_max_ms) },
                ms(p.sold_out_heard_p99_ms),
                p.admissions_per_s.map_or("-".to_string(), |v| format!("{v:.0}")),
                p.tickets_used
            ));
        }
        out.push_str(
            "\nheard: ms from the last sale (ledger clock) until each waiter still in line heard `sold_out` on its \
             stream; waiting: how many were in line then\n",
        );
        for p in &self.points {
            let outcomes = |map: &BTreeMap<String, u64>| {
                map.iter().map(|(outcome, n)| format!("{outcome}={n}")).collect::<Vec<_>>().join(" ")
            };
            out.push_str(&format!(
                "{}×: joins {} · purchases {} · oversell {} · keys sold twice {} · late joins {} · stream reconnects {} \
                 · rejoins {} · cut off {} · stream open p99 {} ms · {} admissions in {} room calls, heard after p50 {} / \
                 p99 {} ms · Redis CPU {} s\n",
                p.multiplier,
                outcomes(&p.join_outcomes),
                outcomes(&p.purchase_outcomes),
                p.oversell,
                p.duplicates,
                p.late_joins,
                p.stream_reconnects,
                p.rejoins,
                p.cut_off,
                ms(p.stream_open_p99_ms),
                p.admissions,
                p.admitting_calls,
                ms(p.admission_heard_p50_ms),
                ms(p.admission_heard_p99_ms),
                p.redis_cpu_s.map_or("-".to_string(), |s| format!("{s:.2}")),
            ));
        }
        let worst_ratio = self.points.iter().map(|p| p.p99_ratio_to_1x).fold(0.0, f64::max);
        let all_sold = self.points.iter().all(|p| p.sold == p.total && p.oversell == 0 && p.duplicates == 0);
        let heard_in_time = self
            .points
            .iter()
            .all(|p| p.waiters_untold == 0 && p.sold_out_heard_max_ms.is_none_or(|max| max <= HEARD_WITHIN_MS));
        let verdict = |met: bool| if met { "met" } else { "NOT met" };
        out.push_str(&format!(
            "\ntargets: p99 within {P99_RATIO_MAX}× of 1× at every rate: {} (worst {worst_ratio:.2}×); every unit sold, \
             none twice: {}; every waiter heard sold out within {HEARD_WITHIN_MS:.0} ms of the last sale: {}\n",
            verdict(worst_ratio <= P99_RATIO_MAX),
            verdict(all_sold),
            verdict(heard_in_time)
        ));
        out
    }

    /// p99 by kind, sold-out heard, and admissions per rate.
    pub fn svg(&self) -> String {
        let groups: Vec<String> =
            self.points.iter().map(|p| format!("{}× ({}/s)", p.multiplier, p.offered_rps)).collect();
        let values = |f: &dyn Fn(&RoomPoint) -> f64| self.points.iter().map(f).collect::<Vec<f64>>();
        testkit::chart::render(
            &format!(
                "Open-loop flash crowd through a waiting room, {} units: offered rate as multiples of redis-only's \
                 saturation ({:.0}/s)",
                self.units, self.redis_only_saturation_rps
            ),
            &[
                testkit::chart::Panel {
                    title: "p99 from intended send, ms",
                    groups: groups.clone(),
                    series: vec![
                        ("joins + purchases", "#2b7bb9", values(&|p| p.p99_ms)),
                        ("purchases", "#d9822b", values(&|p| p.purchase_p99_ms.unwrap_or(0.0))),
                    ],
                },
                testkit::chart::Panel {
                    title: "sold out heard after the last sale, ms",
                    groups: groups.clone(),
                    series: vec![
                        ("max", "#2b7bb9", values(&|p| p.sold_out_heard_max_ms.unwrap_or(0.0))),
                        ("p99", "#d9822b", values(&|p| p.sold_out_heard_p99_ms.unwrap_or(0.0))),
                    ],
                },
                testkit::chart::Panel {
                    title: "admissions/s",
                    groups,
                    series: vec![("admitted", "#2b7bb9", values(&|p| p.admissions_per_s.unwrap_or(0.0)))],
                },
            ],
        )
    }
}
