//! The nemesis: randomized fault schedules against a real seckill fleet, a recorded history of
//! every purchase request, and a checker for every promise the README makes.
//!
//! **Method** (Jepsen's, TigerBeetle's VOPR's): for each schedule, start a fresh fleet of
//! processes (Redis with AOF and `appendfsync always`, a three-member coordinator, N nodes,
//! every node behind proxies of its own toward Redis and each member), let retrying buyers in,
//! apply faults drawn from a seed, heal everything, let demand continue until the ledger sells
//! out, then judge the history, the monitor's samples and the ledger. A violation is printed
//! with its seed, the fault timeline and the history lines that show it; `--seed` replays the
//! schedule.
//!
//! **Layout.** `run` drives the others; the checker reads only the history and the samples:
//! - [`schedule`]: faults drawn from a seed, and setups: a run-time SKU, a short idempotency
//!   TTL, skewed clocks.
//! - [`sales`]: the SKUs a schedule sells, one of them created at run time in some.
//! - [`stripes`]: a striped SKU's ledgers, read and judged as one SKU and per stripe.
//! - [`room`]: a SKU behind a waiting room: its waiters (join, event stream, buy with the
//!   ticket) and the room's rules, judged on what they heard and the ledger's admission log.
//! - [`faults`]: applying and undoing them on the fleet (`testkit::fleet`, `testkit::proxy`).
//! - [`workload`]: the retrying buyers.
//! - [`payer`]: the buyers paying (or not) through the order service and the sandbox provider.
//! - [`history`]: what they sent and heard, and the fault timeline.
//! - [`monitor`]: samples of the leader's view, the nodes' stock and the ledger during a run.
//! - [`books`]: the ledger's, the order store's and the money's books read after a schedule,
//!   whatever fleet ran it.
//! - [`checker`]: the checks, one violation kind per promise; [`money`]: the money's.
//! - [`report`]: per schedule and per run, as a table and as JSON.
//! - [`docker`]: the same on the Compose fleet of `deploy/`: container and network faults,
//!   hand-written schedules for the Docker tests.
//! - [`mod@run`]: one schedule from start to verdict, and a run of many.
//!
//! ```text
//! run → schedule, sales, stripes, room, faults, workload, payer, monitor, books, checker, money, report
//! books → checker, history, money, monitor, stripes
//! docker → books, checker, faults, history, monitor, payer, report, sales, schedule, workload
//! room → checker, history, sales, payer
//! report → checker, faults, history, monitor, payer      money → checker
//! checker → faults, history, monitor, stripes           workload → history, payer
//! faults → history, schedule     monitor → history, stripes     payer → sales → stripes
//! ```
//!
//! **Non-goals.** It fixes nothing: it finds. It never touches a server it did not start, and
//! sends traffic only over loopback. It does not link the `seckill` library; it runs the binary
//! the caller names.

pub mod books;
pub mod checker;
pub mod docker;
pub mod faults;
pub mod history;
pub mod money;
pub mod monitor;
pub mod payer;
pub mod report;
pub mod room;
pub mod run;
pub mod sales;
pub mod schedule;
pub mod stripes;
pub mod workload;

pub use crate::checker::{Violation, ViolationKind};
pub use crate::report::{RunReport, ScheduleReport};
pub use crate::run::{run, run_schedule, Options, BOUNDS, SELL_OUT_AFTER_HEAL};
pub use testkit::fleet::RedisLayout;
