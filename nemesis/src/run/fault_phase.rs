//! The fault phase: the schedule's faults started and ended on time against the fleet, then
//! everything healed when the phase is over.

use super::{Healed, Sale, SKU};
use crate::faults::Injector;
use crate::history::Clock;

/// Applies every fault of the schedule at its time, then heals at the phase's end.
pub(super) async fn apply_and_heal(sale: &mut Sale) -> anyhow::Result<Healed> {
    let sku_key = format!("{}:{{{SKU}}}", sale.targets.key_prefix);
    let mut injector = Injector::new(&mut sale.fleet, sale.history.clone(), sku_key);
    let faults = &sale.schedule.faults;
    let mut steps: Vec<(u64, bool, usize)> = Vec::new();
    for fault in faults {
        steps.push((fault.start_ms, true, fault.id));
        steps.push((fault.end_ms, false, fault.id));
    }
    // Ends before starts at the same moment: a target is free again before it is reused.
    steps.sort_by_key(|(at, start, id)| (*at, *start, *id));
    for (at, start, id) in steps {
        tokio::time::sleep_until(sale.clock.instant_at(at).into()).await;
        if start {
            injector.start(&faults[id]).await?;
        } else {
            injector.end(id).await?;
        }
    }
    heal(injector, sale.clock, sale.schedule.fault_phase_ms).await
}

/// At `phase_ms`, undoes whatever is still broken.
async fn heal(mut injector: Injector<'_>, clock: Clock, phase_ms: u64) -> anyhow::Result<Healed> {
    tokio::time::sleep_until(clock.instant_at(phase_ms).into()).await;
    injector.heal().await?;
    Ok(Healed { windows: injector.windows().to_vec(), heal_ms: clock.now_ms() })
}
