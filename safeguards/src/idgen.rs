//! Order ids: 64-bit ids in the Snowflake layout, unique across the fleet without a round trip.
//!
//! ```text
//!  63   62 ............................ 22  21 ........ 12  11 ......... 0
//! | 0 |  ms since EPOCH_UNIX_MS (41 bits) | worker (10 bits) | seq (12 bits) |
//! ```
//!
//! - **Epoch** [`EPOCH_UNIX_MS`] = 2026-01-01T00:00:00Z: recent, so the 41 bits last until 2095.
//! - **Worker id** 0..[`WORKER_IDS_MAX`]: leased from the coordinator, which hands out the same
//!   range (its `WORKER_IDS_MAX` is this constant) and never to two live nodes at once.
//! - **Sequence** 0..=[`SEQUENCE_MAX`]: 4,096 ids per ms per worker, 4 M/s.
//! - The top bit stays 0, so an id fits a signed `BIGINT` and sorts the same signed or not.
//!   JavaScript loses integers above 2^53: send ids to browsers as strings.
//!
//! **Guarantees** (per generator, i.e. per worker id held by one process):
//! - every id is strictly greater than every id this generator handed out before, in any thread,
//!   and in any earlier run that used the same high-water file;
//! - with distinct worker ids, ids are unique across generators.
//!
//! **How.** One `AtomicU64` holds `(ms << 12) | seq` of the last id and a compare-and-swap loop
//! advances it, so threads never take a lock on the hot path. When the sequence of a ms is used
//! up, the thread sleeps to the next ms (no spinning: on a 2-core box a spinner starves the
//! threads it waits for). When the clock goes back by at most `rollback_tolerance`, the thread
//! sleeps until it catches up; further back, ids are refused with [`IdError::ClockRollback`]
//! until it does. Reusing the last ms would be unique too, but would hide a broken clock.
//!
//! **Restarts.** Before any id reaches ms `t`, a reservation covering `t` is durable in the
//! high-water file (write to a temp file, fsync, rename, fsync the directory). A reservation
//! runs `reserve_window` ahead, so the file is written about once per window, not per id. On
//! start the generator issues nothing below the reserved mark: a restart after the clock went
//! back cannot repeat an id. A quick restart may wait up to one window for the clock to pass
//! the mark; a mark further ahead than window + tolerance means the clock went back across the
//! restart, and [`IdGenerator::open`] refuses.
//!
//! **Who writes the file.** [`IdGenerator::next_id`] extends the reservation itself when an id
//! nears its end, so about once per window one caller waits for an fsync. A caller that must
//! never wait for a disk (a request on an async runtime's worker) takes ids with
//! [`IdGenerator::next_id_reserved`], which never writes and refuses an id past the mark, and
//! runs [`IdGenerator::reserve_ahead`] on a thread of its own at least every quarter window.
//!
//! **Invariants** (asserted): an id's ms is below the durable reservation when it is handed
//! out; the state only grows.
//!
//! **Non-goals.** Ids never go back, so a clock that jumped forward and was then corrected
//! refuses ids until real time catches up with the last id (the refusals are counted). Two
//! processes sharing one worker id or one high-water file are a wiring bug this module cannot
//! see. Worker-id reuse across nodes relies on the coordinator's lease
//! expiry (seconds) exceeding the clock skew between those nodes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use metrics::Counter;

/// 2026-01-01T00:00:00Z in Unix ms: the zero of the id's timestamp. Never change it: ids made
/// before and after would collide.
pub const EPOCH_UNIX_MS: u64 = 1_767_225_600_000;
/// Bits of ms since [`EPOCH_UNIX_MS`]: about 69.7 years.
pub const TIMESTAMP_BITS: u32 = 41;
/// Bits of worker id: 1,024 generators at once, far above any fleet this runs.
pub const WORKER_ID_BITS: u32 = 10;
/// Bits of per-ms sequence: 4,096 ids per ms per worker, above what one node can sell.
pub const SEQUENCE_BITS: u32 = 12;
/// Worker ids are `0..WORKER_IDS_MAX`; the coordinator leases from the same range.
pub const WORKER_IDS_MAX: u16 = 1 << WORKER_ID_BITS;
/// Largest sequence number within one ms.
pub const SEQUENCE_MAX: u64 = (1 << SEQUENCE_BITS) - 1;
/// Largest timestamp the layout holds, in ms since the epoch.
pub const TIMESTAMP_MAX_MS: u64 = (1 << TIMESTAMP_BITS) - 1;

/// A clock step back this small is waited out. NTP corrections on a healthy host are a few ms;
/// waiting costs the ids of those ms a few ms of latency, while anything bigger is a clock
/// fault an operator should see, and refusing (503, the client retries) is cheaper than
/// stalling every purchase for as long as the step.
pub const ROLLBACK_TOLERANCE_DEFAULT: Duration = Duration::from_millis(5);
/// How far ahead each durable reservation reaches. One fsync per second is noise; a restart
/// within a second of the last reservation waits at most this long before its first id.
pub const RESERVE_WINDOW_DEFAULT: Duration = Duration::from_secs(1);
/// Upper bound on `rollback_tolerance`: a thread may sleep this long inside `next_id`.
pub const ROLLBACK_TOLERANCE_MAX: Duration = Duration::from_secs(1);
/// Bounds on `reserve_window`: shorter means an fsync every few ms; longer means a long wait
/// after a quick restart.
pub const RESERVE_WINDOW_MIN: Duration = Duration::from_millis(10);
pub const RESERVE_WINDOW_MAX: Duration = Duration::from_secs(60);

const _: () = assert!(1 + TIMESTAMP_BITS + WORKER_ID_BITS + SEQUENCE_BITS == 64);
const _: () = assert!(ROLLBACK_TOLERANCE_DEFAULT.as_millis() <= ROLLBACK_TOLERANCE_MAX.as_millis());
const _: () = assert!(RESERVE_WINDOW_MIN.as_millis() <= RESERVE_WINDOW_DEFAULT.as_millis());
const _: () = assert!(RESERVE_WINDOW_DEFAULT.as_millis() <= RESERVE_WINDOW_MAX.as_millis());

const SEQUENCE_MASK: u64 = SEQUENCE_MAX;

/// A generated order id. `Display` is the decimal form stored in the ledger's order events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SnowflakeId(pub u64);

impl std::fmt::Display for SnowflakeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The fields of an id, for operators and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdParts {
    /// When the id was made, Unix ms (the generator's clock, or a later ms it waited for).
    pub unix_ms: u64,
    pub worker_id: u16,
    pub sequence: u16,
}

/// Splits an id into its fields.
pub fn decode(id: SnowflakeId) -> IdParts {
    IdParts {
        unix_ms: (id.0 >> (WORKER_ID_BITS + SEQUENCE_BITS)) + EPOCH_UNIX_MS,
        worker_id: ((id.0 >> SEQUENCE_BITS) & u64::from(WORKER_IDS_MAX - 1)) as u16,
        sequence: (id.0 & SEQUENCE_MASK) as u16,
    }
}

/// Wall-clock time as the generator sees it: the one wall clock every process shares. Its
/// `now_unix_ms` may go backwards, which is what the generator guards against; tests inject one
/// that steps back or stands still.
pub use protocol::clock::{Clock, SystemClock};

/// Why no id was handed out. What the caller does is in each variant's doc.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    /// Bad wiring or config: fix and restart.
    #[error("worker id {0} is outside 0..{WORKER_IDS_MAX}")]
    WorkerIdOutOfRange(u16),
    /// Bad config: fix and restart.
    #[error("bad id generator setting {setting}: {reason}")]
    Config { setting: &'static str, reason: &'static str },
    /// The clock is behind the last id (or the persisted reservation) by more than the
    /// tolerance. Refuse the request (503); ids resume once the clock catches up.
    #[error("the clock is {behind_ms} ms behind the last id, more than the {tolerance_ms} ms tolerance")]
    ClockRollback { behind_ms: u64, tolerance_ms: u64 },
    /// The clock reads a time the layout cannot hold (before 2026 or after 2095): a broken clock.
    #[error("the clock reads {unix_ms} ms, outside the id layout's range")]
    ClockOutOfRange { unix_ms: u64 },
    /// The high-water file could not be read or made durable: refuse the request (503) and
    /// page an operator (disk full, read-only, permissions).
    #[error("high-water file {path}: {source}")]
    HighWater { path: String, source: std::io::Error },
    /// The high-water file holds something other than a Unix ms: an operator must look at it.
    #[error("high-water file {path} holds {content:?}, not a Unix ms")]
    HighWaterCorrupt { path: String, content: String },
    /// [`IdGenerator::next_id_reserved`] reached the end of the durable reservation: whoever
    /// calls [`IdGenerator::reserve_ahead`] is late (a slow disk). Refuse the request (503); ids
    /// resume as soon as the reservation is extended.
    #[error("the durable id reservation ends at ms {reserved_until_ms}; the next id needs ms {next_ms}")]
    ReservationBehind { next_ms: u64, reserved_until_ms: u64 },
}

/// How a generator is set up. Every field is documented in the README under "Order ids and locks".
#[derive(Debug, Clone)]
pub struct IdGeneratorConfig {
    /// The worker id leased from the coordinator; `0..WORKER_IDS_MAX`.
    pub worker_id: u16,
    /// Where the reservation mark is kept across restarts; one file per generator, on a disk
    /// that survives the process (the node's data directory).
    pub high_water_path: PathBuf,
    /// A clock step back up to this is waited out; beyond it ids are refused.
    pub rollback_tolerance: Duration,
    /// How far ahead each durable reservation reaches.
    pub reserve_window: Duration,
}

impl IdGeneratorConfig {
    pub fn new(worker_id: u16, high_water_path: impl Into<PathBuf>) -> Self {
        Self {
            worker_id,
            high_water_path: high_water_path.into(),
            rollback_tolerance: ROLLBACK_TOLERANCE_DEFAULT,
            reserve_window: RESERVE_WINDOW_DEFAULT,
        }
    }

    fn validate(&self) -> Result<(), IdError> {
        if self.worker_id >= WORKER_IDS_MAX {
            return Err(IdError::WorkerIdOutOfRange(self.worker_id));
        }
        if self.rollback_tolerance > ROLLBACK_TOLERANCE_MAX {
            return Err(IdError::Config { setting: "rollback_tolerance", reason: "must be at most 1 s" });
        }
        if self.reserve_window < RESERVE_WINDOW_MIN || self.reserve_window > RESERVE_WINDOW_MAX {
            return Err(IdError::Config { setting: "reserve_window", reason: "must be between 10 ms and 60 s" });
        }
        Ok(())
    }
}

/// Counter handles, registered once so an id pays an atomic add, not a registry lookup.
struct IdMetrics {
    ids: Counter,
    /// Every `next_id` that returned an error, by reason.
    refused_rollback: Counter,
    refused_out_of_range: Counter,
    refused_high_water: Counter,
    rollback_waited: Counter,
    rollback_refused: Counter,
    sequence_exhausted: Counter,
    reservations: Counter,
    reservation_failed: Counter,
}

impl IdMetrics {
    fn register(worker_id: u16) -> Self {
        let worker = worker_id.to_string();
        let rollback = |outcome: &'static str| metrics::counter!("seckill_idgen_clock_rollback_total", "worker" => worker.clone(), "outcome" => outcome);
        let refused = |reason: &'static str| metrics::counter!("seckill_idgen_refused_total", "worker" => worker.clone(), "reason" => reason);
        Self {
            ids: metrics::counter!("seckill_idgen_ids_total", "worker" => worker.clone()),
            refused_rollback: refused("clock_rollback"),
            refused_out_of_range: refused("clock_out_of_range"),
            refused_high_water: refused("high_water"),
            rollback_waited: rollback("waited"),
            rollback_refused: rollback("refused"),
            sequence_exhausted: metrics::counter!("seckill_idgen_sequence_exhausted_total", "worker" => worker.clone()),
            reservations: metrics::counter!("seckill_idgen_reservations_total", "worker" => worker.clone(), "outcome" => "written"),
            reservation_failed: metrics::counter!("seckill_idgen_reservations_total", "worker" => worker, "outcome" => "failed"),
        }
    }
}

/// The high-water file: the first Unix ms no id of this generator has reached, durable.
struct HighWater {
    path: PathBuf,
}

impl HighWater {
    fn error(&self, source: std::io::Error) -> IdError {
        IdError::HighWater { path: self.path.display().to_string(), source }
    }

    /// The stored mark, or 0 if the file does not exist yet (a brand-new generator).
    fn read(&self) -> Result<u64, IdError> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => text.trim().parse().map_err(|_| IdError::HighWaterCorrupt {
                path: self.path.display().to_string(),
                content: text.chars().take(64).collect(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(self.error(e)),
        }
    }

    /// Replaces the mark atomically and durably: a crash leaves the old file or the new one.
    fn write(&self, unix_ms: u64) -> Result<(), IdError> {
        let dir = self.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let mut temp = self.path.clone().into_os_string();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&temp)?;
            writeln!(file, "{unix_ms}")?;
            file.sync_all()?;
            std::fs::rename(&temp, &self.path)?;
            // The rename is durable only once the directory entry is.
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| self.error(e))
    }
}

/// Hands out [`SnowflakeId`]s for one worker id. `Sync`: share one per process.
pub struct IdGenerator {
    /// `(ms since EPOCH << SEQUENCE_BITS) | seq` of the last id handed out. Only grows.
    state: AtomicU64,
    /// ms since EPOCH that the durable reservation reaches: ids stay below it.
    reserved_until: AtomicU64,
    /// Held while writing the file. A std `Mutex`: never held across `.await`, and the writer
    /// is the only one that needs it (others read `reserved_until`).
    high_water: Mutex<HighWater>,
    /// The worker id, already shifted into place.
    worker_bits: u64,
    worker_id: u16,
    tolerance_ms: u64,
    window_ms: u64,
    clock: Arc<dyn Clock>,
    metrics: IdMetrics,
}

impl IdGenerator {
    /// Opens the generator: reads the high-water mark, waits (at most one window plus the
    /// tolerance) until the clock has passed it, and makes the first reservation durable.
    pub fn open(config: IdGeneratorConfig, clock: Arc<dyn Clock>) -> Result<IdGenerator, IdError> {
        config.validate()?;
        let metrics = IdMetrics::register(config.worker_id);
        let tolerance_ms = config.rollback_tolerance.as_millis() as u64;
        let window_ms = config.reserve_window.as_millis() as u64;
        let high_water = HighWater { path: config.high_water_path };
        let floor_unix_ms = high_water.read()?;
        let mut now_unix_ms = clock.now_unix_ms();
        if floor_unix_ms > now_unix_ms {
            let behind_ms = floor_unix_ms - now_unix_ms;
            if behind_ms > window_ms + tolerance_ms {
                metrics.rollback_refused.increment(1);
                return Err(IdError::ClockRollback { behind_ms, tolerance_ms: window_ms + tolerance_ms });
            }
            // A quick restart: ids of the last run may reach up to the mark. Bounded: the clock
            // moves forward, and each wait is at most ROLLBACK_TOLERANCE_MAX.
            while now_unix_ms < floor_unix_ms {
                metrics.rollback_waited.increment(1);
                clock.wait_past(floor_unix_ms - 1);
                now_unix_ms = clock.now_unix_ms();
            }
        }
        let now_ms = since_epoch(now_unix_ms)?;
        let floor_ms = floor_unix_ms.saturating_sub(EPOCH_UNIX_MS);
        // The last id "was" (floor − 1 ms, last sequence): the first one lands at the floor or later.
        let state = (floor_ms << SEQUENCE_BITS).saturating_sub(1);
        let reserved_until = now_ms.max(floor_ms) + window_ms;
        high_water.write(reserved_until + EPOCH_UNIX_MS)?;
        metrics.reservations.increment(1);
        Ok(IdGenerator {
            state: AtomicU64::new(state),
            reserved_until: AtomicU64::new(reserved_until),
            high_water: Mutex::new(high_water),
            worker_bits: u64::from(config.worker_id) << SEQUENCE_BITS,
            worker_id: config.worker_id,
            tolerance_ms,
            window_ms,
            clock,
            metrics,
        })
    }

    pub fn worker_id(&self) -> u16 {
        self.worker_id
    }

    /// How far ahead each durable reservation reaches.
    pub fn reserve_window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The next id. Blocks the thread for at most the rollback tolerance, the rest of a ms when
    /// 4,096 ids were taken in it, or one fsync when a reservation runs out; in async code that
    /// is short enough to call inline.
    pub fn next_id(&self) -> Result<SnowflakeId, IdError> {
        self.counted(self.take_next(Reserve::Inline))
    }

    /// The next id from the reservation already durable: never touches the file, so a caller on
    /// an async runtime's worker never waits for a disk. Someone else keeps the reservation
    /// ahead by calling [`reserve_ahead`](Self::reserve_ahead) at least every quarter of
    /// [`reserve_window`](Self::reserve_window) from a thread that may block; if it falls behind,
    /// the id is refused with [`IdError::ReservationBehind`] rather than waited for. Like
    /// `next_id`, it may still sleep for a clock step back within the rollback tolerance, or for
    /// the rest of a ms whose 4,096 ids are taken.
    pub fn next_id_reserved(&self) -> Result<SnowflakeId, IdError> {
        self.counted(self.take_next(Reserve::Elsewhere))
    }

    /// Keeps the durable reservation more than half a window ahead of both the clock and the
    /// last id, writing the high-water file (one fsync) when it is not. Blocks on the disk: the
    /// companion of [`next_id_reserved`](Self::next_id_reserved), for a thread that may block.
    /// Returns whether it wrote.
    pub fn reserve_ahead(&self) -> Result<bool, IdError> {
        // Relaxed: only the value matters, and a stale one reserves from a slightly older ms;
        // the check under the file's lock below sees every completed reservation.
        let last_ms = self.state.load(Ordering::Relaxed) >> SEQUENCE_BITS;
        let from_ms = since_epoch(self.clock.now_unix_ms())?.max(last_ms);
        let covered = || from_ms + self.window_ms / 2 < self.reserved_until.load(Ordering::Acquire);
        if covered() {
            return Ok(false);
        }
        // A panic while writing leaves the file either old or new: both are valid marks.
        let file = self.high_water.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if covered() {
            return Ok(false); // a `next_id` caller extended it while we waited
        }
        self.write_reservation(&file, from_ms + self.window_ms).map(|()| true)
    }

    /// Counts a refusal under its reason.
    fn counted(&self, result: Result<SnowflakeId, IdError>) -> Result<SnowflakeId, IdError> {
        if let Err(e) = &result {
            match e {
                IdError::ClockRollback { .. } => &self.metrics.refused_rollback,
                IdError::ClockOutOfRange { .. } => &self.metrics.refused_out_of_range,
                _ => &self.metrics.refused_high_water,
            }
            .increment(1);
        }
        result
    }

    fn take_next(&self, reserve: Reserve) -> Result<SnowflakeId, IdError> {
        loop {
            // Relaxed: an id depends only on this atomic's own value, and every change to it is
            // a compare-and-swap in its single modification order, so no two callers can win
            // with the same value.
            let last = self.state.load(Ordering::Relaxed);
            let last_ms = last >> SEQUENCE_BITS;
            let now_ms = since_epoch(self.clock.now_unix_ms())?;
            if now_ms < last_ms {
                let behind_ms = last_ms - now_ms;
                if behind_ms > self.tolerance_ms {
                    self.metrics.rollback_refused.increment(1);
                    return Err(IdError::ClockRollback { behind_ms, tolerance_ms: self.tolerance_ms });
                }
                self.metrics.rollback_waited.increment(1);
                self.clock.wait_past(last_ms - 1 + EPOCH_UNIX_MS);
                continue;
            }
            let next = if now_ms > last_ms {
                now_ms << SEQUENCE_BITS
            } else if last & SEQUENCE_MASK < SEQUENCE_MAX {
                last + 1
            } else {
                self.metrics.sequence_exhausted.increment(1);
                self.clock.wait_past(last_ms + EPOCH_UNIX_MS);
                continue;
            };
            let next_ms = next >> SEQUENCE_BITS;
            // Acquire: pairs with the Release in `reserve`, which stores the mark only after the
            // file is durable.
            let reserved_until = self.reserved_until.load(Ordering::Acquire);
            if next_ms + self.window_ms / 2 >= reserved_until {
                match reserve {
                    Reserve::Inline => {
                        self.reserve(next_ms)?;
                        if next_ms >= self.reserved_until.load(Ordering::Acquire) {
                            continue;
                        }
                    }
                    Reserve::Elsewhere if next_ms >= reserved_until => {
                        return Err(IdError::ReservationBehind { next_ms, reserved_until_ms: reserved_until });
                    }
                    // Still covered; the reserving thread extends it before it runs out.
                    Reserve::Elsewhere => {}
                }
            }
            if self.state.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                assert!(next_ms < self.reserved_until.load(Ordering::Acquire), "id past the durable reservation");
                self.metrics.ids.increment(1);
                return Ok(SnowflakeId(
                    (next_ms << (WORKER_ID_BITS + SEQUENCE_BITS)) | self.worker_bits | (next & SEQUENCE_MASK),
                ));
            }
        }
    }

    /// Extends the reservation. Ids past the mark must wait for it (they block on the file);
    /// ids in the last half window only refresh it early if nobody else is already writing, so
    /// the hot path almost never waits for an fsync.
    fn reserve(&self, next_ms: u64) -> Result<(), IdError> {
        let must = next_ms >= self.reserved_until.load(Ordering::Acquire);
        let file: MutexGuard<'_, HighWater> = match self.high_water.try_lock() {
            Ok(file) => file,
            // A panic while writing leaves the file either old or new: both are valid marks.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) if !must => return Ok(()),
            Err(TryLockError::WouldBlock) => self.high_water.lock().unwrap_or_else(|p| p.into_inner()),
        };
        if next_ms + self.window_ms / 2 < self.reserved_until.load(Ordering::Acquire) {
            return Ok(()); // another thread extended it while we waited
        }
        match self.write_reservation(&file, next_ms + self.window_ms) {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!("id reservation not persisted: {e}");
                if must {
                    Err(e)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Makes `until` (ms since EPOCH) the durable mark. The caller holds the file's lock.
    fn write_reservation(&self, file: &HighWater, until: u64) -> Result<(), IdError> {
        match file.write(until + EPOCH_UNIX_MS) {
            Ok(()) => {
                self.metrics.reservations.increment(1);
                // Release: the mark becomes visible only after the file holding it is durable.
                self.reserved_until.fetch_max(until, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                self.metrics.reservation_failed.increment(1);
                Err(e)
            }
        }
    }
}

/// Who extends the durable reservation when an id nears its end.
#[derive(Clone, Copy)]
enum Reserve {
    /// The caller taking the id (`next_id`): it may block on the file.
    Inline,
    /// Another thread (`reserve_ahead`); the caller never touches the file (`next_id_reserved`).
    Elsewhere,
}

/// Unix ms to ms since the id epoch, refusing times the layout cannot hold.
fn since_epoch(unix_ms: u64) -> Result<u64, IdError> {
    match unix_ms.checked_sub(EPOCH_UNIX_MS) {
        Some(ms) if ms <= TIMESTAMP_MAX_MS => Ok(ms),
        _ => Err(IdError::ClockOutOfRange { unix_ms }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::testing::TestRecorder;

    /// A clock the test moves by hand. `wait_past` jumps it forward, as real time would.
    struct ManualClock {
        now: AtomicU64,
        waits: AtomicU64,
    }

    impl ManualClock {
        fn at(unix_ms: u64) -> Arc<ManualClock> {
            Arc::new(ManualClock { now: AtomicU64::new(unix_ms), waits: AtomicU64::new(0) })
        }

        fn set(&self, unix_ms: u64) {
            self.now.store(unix_ms, Ordering::SeqCst);
        }
    }

    impl Clock for ManualClock {
        fn now_unix_ms(&self) -> u64 {
            self.now.load(Ordering::SeqCst)
        }

        fn wait_past(&self, unix_ms: u64) {
            self.waits.fetch_add(1, Ordering::SeqCst);
            self.now.fetch_max(unix_ms + 1, Ordering::SeqCst);
        }
    }

    /// 2026-06-01, an ordinary day inside the layout.
    const JUNE: u64 = EPOCH_UNIX_MS + 151 * 24 * 3600 * 1000;

    fn config(dir: &tempfile::TempDir, worker_id: u16) -> IdGeneratorConfig {
        IdGeneratorConfig::new(worker_id, dir.path().join(format!("worker-{worker_id}.high-water")))
    }

    #[test]
    fn decode_inverts_the_layout() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at(JUNE);
        let generator = IdGenerator::open(config(&dir, 1023), clock.clone()).unwrap();
        let first = generator.next_id().unwrap();
        let second = generator.next_id().unwrap();
        assert_eq!(decode(first), IdParts { unix_ms: JUNE, worker_id: 1023, sequence: 0 });
        assert_eq!(decode(second), IdParts { unix_ms: JUNE, worker_id: 1023, sequence: 1 });
        assert!(first.0 < i64::MAX as u64, "the top bit stays clear");
    }

    #[test]
    fn worker_ids_outside_ten_bits_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let refused = IdGenerator::open(config(&dir, WORKER_IDS_MAX), ManualClock::at(JUNE));
        assert!(matches!(refused, Err(IdError::WorkerIdOutOfRange(1024))), "{:?}", refused.err());
    }

    #[test]
    fn sequence_exhaustion_waits_for_the_next_ms() {
        // Goal: the 4,097th id of one ms lands in the next ms. Method: a clock that stands still
        // until the generator waits, which moves it one ms on.
        let dir = tempfile::tempdir().unwrap();
        let recorder = TestRecorder::default();
        let clock = ManualClock::at(JUNE);
        let generator =
            metrics::with_local_recorder(&recorder, || IdGenerator::open(config(&dir, 7), clock.clone())).unwrap();
        let ids: Vec<_> = (0..=SEQUENCE_MAX + 1).map(|_| generator.next_id().unwrap()).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "strictly increasing");
        let last = decode(ids[ids.len() - 1]);
        assert_eq!((last.unix_ms, last.sequence), (JUNE + 1, 0), "the 4,097th id moves to the next ms");
        assert_eq!(decode(ids[ids.len() - 2]).sequence as u64, SEQUENCE_MAX);
        assert_eq!(clock.waits.load(Ordering::SeqCst), 1, "one wait, no spinning");
        assert_eq!(recorder.counter("seckill_idgen_sequence_exhausted_total", &[]), 1);
        assert_eq!(recorder.counter("seckill_idgen_ids_total", &[]), SEQUENCE_MAX + 2);
    }

    #[test]
    fn a_small_rollback_is_waited_out_and_ids_stay_unique() {
        // Goal: a step back within tolerance never repeats an id. Method: take ids, set the clock
        // 3 ms back (tolerance 5 ms), take more: the generator waits until the clock is back.
        let dir = tempfile::tempdir().unwrap();
        let recorder = TestRecorder::default();
        let clock = ManualClock::at(JUNE + 10);
        let generator =
            metrics::with_local_recorder(&recorder, || IdGenerator::open(config(&dir, 3), clock.clone())).unwrap();
        let before = generator.next_id().unwrap();
        clock.set(JUNE + 7);
        let after = generator.next_id().unwrap();
        assert!(after > before, "{after} must follow {before}");
        assert!(decode(after).unix_ms >= JUNE + 10, "no id from the repeated ms range below the last one");
        assert_eq!(recorder.counter("seckill_idgen_clock_rollback_total", &[("outcome", "waited")]), 1);
    }

    #[test]
    fn a_large_rollback_is_refused_until_the_clock_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        let recorder = TestRecorder::default();
        let clock = ManualClock::at(JUNE + 1_000);
        let generator =
            metrics::with_local_recorder(&recorder, || IdGenerator::open(config(&dir, 3), clock.clone())).unwrap();
        let before = generator.next_id().unwrap();
        clock.set(JUNE);
        match generator.next_id() {
            Err(IdError::ClockRollback { behind_ms: 1_000, tolerance_ms: 5 }) => {}
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(recorder.counter("seckill_idgen_clock_rollback_total", &[("outcome", "refused")]), 1);
        assert_eq!(recorder.counter("seckill_idgen_refused_total", &[("reason", "clock_rollback")]), 1);
        clock.set(EPOCH_UNIX_MS - 1);
        assert!(matches!(generator.next_id(), Err(IdError::ClockOutOfRange { .. })));
        assert_eq!(recorder.counter("seckill_idgen_refused_total", &[("reason", "clock_out_of_range")]), 1);
        clock.set(JUNE + 1_001);
        assert!(generator.next_id().unwrap() > before, "ids resume above the old ones once the clock is back");
    }

    #[test]
    fn a_restart_after_a_rollback_starts_above_every_earlier_id() {
        // Goal: the high-water file makes a restart safe even when the clock went back across it.
        // Method: take ids over 343 ms, drop the generator, set the clock back to where the last
        // reservation was made (below the last id), reopen on the same file: the first new id is
        // above every old one. Then 10 s back: open refuses.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-9.high-water");
        let clock = ManualClock::at(JUNE + 20_000);
        let generator = IdGenerator::open(config(&dir, 9), clock.clone()).unwrap();
        let mut old_max = SnowflakeId(0);
        for step in 0..50 {
            clock.set(JUNE + 20_000 + step * 7);
            old_max = old_max.max(generator.next_id().unwrap());
        }
        drop(generator);
        let mark: u64 = std::fs::read_to_string(&path).unwrap().trim().parse().unwrap();
        let back_to = mark - RESERVE_WINDOW_DEFAULT.as_millis() as u64;
        assert!(back_to + 300 < decode(old_max).unix_ms, "the restart sees a real step back");
        clock.set(back_to);
        let restarted = IdGenerator::open(config(&dir, 9), clock.clone()).unwrap();
        let first = restarted.next_id().unwrap();
        assert!(first > old_max, "{first} after restart must exceed {old_max}");
        assert!(decode(first).unix_ms >= mark, "nothing below the persisted mark");
        drop(restarted);
        clock.set(JUNE + 10_000);
        let refused = IdGenerator::open(config(&dir, 9), clock.clone());
        assert!(matches!(refused, Err(IdError::ClockRollback { .. })), "{:?}", refused.err());
    }

    #[test]
    fn the_high_water_mark_runs_ahead_of_every_id() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at(JUNE);
        let generator = IdGenerator::open(config(&dir, 2), clock.clone()).unwrap();
        for step in 0..5_000u64 {
            clock.set(JUNE + step);
            let id = generator.next_id().unwrap();
            let mark: u64 =
                std::fs::read_to_string(dir.path().join("worker-2.high-water")).unwrap().trim().parse().unwrap();
            assert!(decode(id).unix_ms < mark, "id at {} not below the durable mark {mark}", decode(id).unix_ms);
        }
    }

    #[test]
    fn reserved_ids_never_write_the_file_and_stop_at_the_mark() {
        // Goal: `next_id_reserved` takes ids only below the durable mark and never writes it;
        // `reserve_ahead` is what moves the mark. Method: take ids across the first window on a
        // manual clock, watching the file; at the mark, one refusal; then reserve and resume.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-5.high-water");
        let recorder = TestRecorder::default();
        let clock = ManualClock::at(JUNE);
        let generator =
            metrics::with_local_recorder(&recorder, || IdGenerator::open(config(&dir, 5), clock.clone())).unwrap();
        let mark = || -> u64 { std::fs::read_to_string(&path).unwrap().trim().parse().unwrap() };
        let first_mark = mark();
        assert_eq!(first_mark, JUNE + RESERVE_WINDOW_DEFAULT.as_millis() as u64);
        for at in (JUNE..first_mark).step_by(7) {
            clock.set(at);
            let id = generator.next_id_reserved().unwrap();
            assert!(decode(id).unix_ms < first_mark);
        }
        assert_eq!(mark(), first_mark, "taking reserved ids wrote nothing");
        clock.set(first_mark);
        match generator.next_id_reserved() {
            Err(IdError::ReservationBehind { .. }) => {}
            other => panic!("expected a refusal at the mark, got {other:?}"),
        }
        assert_eq!(recorder.counter("seckill_idgen_refused_total", &[("reason", "high_water")]), 1);
        assert!(generator.reserve_ahead().unwrap(), "the mark was due");
        assert!(mark() > first_mark);
        assert!(!generator.reserve_ahead().unwrap(), "a fresh mark needs no write");
        assert!(decode(generator.next_id_reserved().unwrap()).unix_ms >= first_mark);
    }

    #[test]
    fn reserving_every_quarter_window_keeps_reserved_ids_flowing() {
        // Goal: a thread calling `reserve_ahead` every quarter window is enough for ids every ms
        // never to be refused, and every id stays below the durable mark. Method: 5 windows of
        // one id per ms on a manual clock, reserving every 250 ms.
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at(JUNE);
        let generator = IdGenerator::open(config(&dir, 6), clock.clone()).unwrap();
        let quarter = generator.reserve_window().as_millis() as u64 / 4;
        for step in 0..5_000u64 {
            clock.set(JUNE + step);
            if step % quarter == 0 {
                generator.reserve_ahead().unwrap();
            }
            let id = generator.next_id_reserved().unwrap();
            let mark: u64 =
                std::fs::read_to_string(dir.path().join("worker-6.high-water")).unwrap().trim().parse().unwrap();
            assert!(decode(id).unix_ms < mark, "id at {} not below the durable mark {mark}", decode(id).unix_ms);
        }
    }

    #[test]
    fn a_corrupt_high_water_file_stops_the_generator() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("worker-4.high-water"), "yesterday").unwrap();
        let refused = IdGenerator::open(config(&dir, 4), ManualClock::at(JUNE));
        assert!(matches!(refused, Err(IdError::HighWaterCorrupt { .. })), "{:?}", refused.err());
    }

    #[test]
    fn millions_of_ids_from_many_threads_and_workers_are_unique() {
        // Goal: no duplicate across 8 threads on 4 generators (2 threads each) on the real clock,
        // and every thread sees its generator's ids strictly increase. Method: 2,048,000 ids,
        // then one set of all of them.
        const WORKERS: u16 = 4;
        const THREADS: usize = 8;
        const PER_THREAD: usize = 256_000;
        let dir = tempfile::tempdir().unwrap();
        let generators: Vec<Arc<IdGenerator>> = (0..WORKERS)
            .map(|worker| Arc::new(IdGenerator::open(config(&dir, worker * 100), Arc::new(SystemClock)).unwrap()))
            .collect();
        let started = std::time::Instant::now();
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let generator = generators[thread % generators.len()].clone();
                std::thread::spawn(move || {
                    let mut ids = Vec::with_capacity(PER_THREAD);
                    for _ in 0..PER_THREAD {
                        ids.push(generator.next_id().unwrap());
                    }
                    ids
                })
            })
            .collect();
        let per_thread: Vec<Vec<SnowflakeId>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let elapsed = started.elapsed();
        let mut all = HashSet::with_capacity(THREADS * PER_THREAD);
        for ids in &per_thread {
            assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "a thread saw its generator go back");
            for id in ids {
                assert!(all.insert(*id), "duplicate id {id} ({:?})", decode(*id));
            }
        }
        assert_eq!(all.len(), THREADS * PER_THREAD);
        eprintln!(
            "{} ids from {THREADS} threads on {WORKERS} workers in {elapsed:?}: {:.0} ids/s",
            all.len(),
            all.len() as f64 / elapsed.as_secs_f64()
        );
    }
}
