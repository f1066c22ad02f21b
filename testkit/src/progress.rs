//! Progress bars for the commands that run longer than a second (`demo`, `load`, `bench`), drawn
//! on stderr only when a person watches: [`enable`] is called once by `main` when stdout and
//! stderr are terminals and the output is not `--json`. Everywhere else (tests, scripts, CI) every
//! bar is hidden and costs nothing.
//!
//! Bars never sit on a hot path: a caller updates its bar from a counter it already keeps, at
//! most ten times a second ([`follow`]), so a benchmark measures the same with or without them.
//! Log lines go through [`suspend`], so a warning printed while a bar is drawn does not tear it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often [`follow`] copies a counter into its bar; more often draws nothing a person sees.
const REFRESH: Duration = Duration::from_millis(100);

/// How often a bar redraws by itself, so its clock moves while its count does not.
const TICK: Duration = Duration::from_millis(250);

/// Set once by [`enable`]; read on every bar made and every log line.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Every visible bar, so nested ones (a benchmark's rounds, the current round's purchases) stack
/// instead of overwriting each other.
fn bars() -> &'static MultiProgress {
    static BARS: OnceLock<MultiProgress> = OnceLock::new();
    BARS.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

/// Draws bars from now on. `main` calls it when a person is watching; libraries never do.
pub fn enable() {
    // Relaxed: a flag read by the same thread that set it, or by later ones that only decide
    // whether to draw; a bar missed at the start is cosmetic.
    ENABLED.store(true, Ordering::Relaxed);
}

fn enabled() -> bool {
    // Relaxed: see `enable`.
    ENABLED.load(Ordering::Relaxed)
}

/// A bar counting `len` like items (purchases), titled `what`, with the time it has left;
/// hidden unless [`enable`] was called.
pub fn counter(len: u64, what: &str) -> ProgressBar {
    make(len, what, "{msg:>24} [{bar:32}] {human_pos}/{human_len} {elapsed_precise} eta {eta}")
}

/// A bar over `len` unlike steps (a benchmark's phases), titled `what`: no time left, as steps
/// differ too much to extrapolate; hidden unless [`enable`] was called.
pub fn steps(len: u64, what: &str) -> ProgressBar {
    make(len, what, "{msg:>24} [{bar:32}] {pos}/{len} {elapsed_precise}")
}

fn make(len: u64, what: &str, template: &str) -> ProgressBar {
    if !enabled() {
        return ProgressBar::hidden();
    }
    let style =
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> ");
    let bar = bars().add(ProgressBar::new(len).with_style(style).with_message(what.to_string()));
    // The clock keeps moving through a long step (a benchmark's engine phase) with no count.
    bar.enable_steady_tick(TICK);
    bar
}

/// Runs `write` with the bars cleared, then draws them again: for anything else that writes to
/// the terminal while bars may be shown (the log writer).
pub fn suspend<R>(write: impl FnOnce() -> R) -> R {
    if enabled() {
        bars().suspend(write)
    } else {
        write()
    }
}

/// Copies `counter` (capped at the bar's length) into `bar` every 100 ms until the returned
/// guard is dropped; nothing is spawned for a hidden bar. The counter is one the caller keeps
/// anyway, so the work being shown pays nothing for the bar.
pub fn follow(bar: &ProgressBar, counter: Arc<AtomicU64>) -> Following {
    if bar.is_hidden() {
        return Following(None);
    }
    let bar = bar.clone();
    let len = bar.length().unwrap_or(u64::MAX);
    Following(Some(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(REFRESH);
        loop {
            ticks.tick().await;
            // Relaxed: a display of a count that only grows; a stale read shows an older figure.
            bar.set_position(counter.load(Ordering::Relaxed).min(len));
        }
    })))
}

/// Stops [`follow`]'s updates when dropped.
pub struct Following(Option<tokio::task::JoinHandle<()>>);

impl Drop for Following {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}
