//! The fault knobs and the seeded dice that apply them. Every random choice the sandbox makes
//! (decline, drop, duplicate, answer 503) is one draw from one generator seeded at start, so a
//! run that sends the same requests in the same order makes the same choices.

use serde::{Deserialize, Serialize};

/// Longest callback delay a knob may ask for: a minute is already past any order's patience in
/// a test, and a bound keeps a typo from parking deliveries for days.
pub const CALLBACK_DELAY_MS_MAX: u64 = 60_000;
/// Widest reorder window; see [`Faults::reorder_window_ms`].
pub const REORDER_WINDOW_MS_MAX: u64 = 10_000;

/// What the sandbox does wrong on purpose. All off by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Wait this long after a payment succeeds before its first callback.
    pub callback_delay_ms: u64,
    /// Chance that a success is notified twice (two deliveries, each retried on its own).
    pub duplicate_p: f64,
    /// Chance that a success is never notified: only a query finds it.
    pub drop_p: f64,
    /// Hold callbacks and send each batch in reverse order.
    pub reorder: bool,
    /// Under `reorder`, a batch is what arrives within this long of its first callback.
    pub reorder_window_ms: u64,
    /// Chance that a buyer's "succeed" is declined.
    pub decline_p: f64,
    /// Chance that a call of the merchant API (create, query, refund, close) answers 503 and
    /// does nothing.
    pub unavailable_p: f64,
    /// Chance that a merchant call that changes something (create, refund, close) is done but
    /// answered 503, as if the answer were lost on its way back: the caller must ask again
    /// with the same request and get the same result, never a second payment or refund.
    #[serde(default)]
    pub answer_lost_p: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            callback_delay_ms: 0,
            duplicate_p: 0.0,
            drop_p: 0.0,
            reorder: false,
            reorder_window_ms: 250,
            decline_p: 0.0,
            unavailable_p: 0.0,
            answer_lost_p: 0.0,
        }
    }
}

impl Faults {
    /// Checks every knob, naming the first one out of range.
    pub fn validate(&self) -> Result<(), String> {
        for (name, p) in [
            ("duplicate_p", self.duplicate_p),
            ("drop_p", self.drop_p),
            ("decline_p", self.decline_p),
            ("unavailable_p", self.unavailable_p),
            ("answer_lost_p", self.answer_lost_p),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name} is a probability from 0 to 1, not {p}"));
            }
        }
        if self.callback_delay_ms > CALLBACK_DELAY_MS_MAX {
            return Err(format!("callback_delay_ms is at most {CALLBACK_DELAY_MS_MAX}"));
        }
        if !(1..=REORDER_WINDOW_MS_MAX).contains(&self.reorder_window_ms) {
            return Err(format!("reorder_window_ms is from 1 to {REORDER_WINDOW_MS_MAX}"));
        }
        Ok(())
    }

    /// These faults with `patch`'s fields in place of theirs.
    pub fn patched(&self, patch: &FaultsPatch) -> Faults {
        Faults {
            callback_delay_ms: patch.callback_delay_ms.unwrap_or(self.callback_delay_ms),
            duplicate_p: patch.duplicate_p.unwrap_or(self.duplicate_p),
            drop_p: patch.drop_p.unwrap_or(self.drop_p),
            reorder: patch.reorder.unwrap_or(self.reorder),
            reorder_window_ms: patch.reorder_window_ms.unwrap_or(self.reorder_window_ms),
            decline_p: patch.decline_p.unwrap_or(self.decline_p),
            unavailable_p: patch.unavailable_p.unwrap_or(self.unavailable_p),
            answer_lost_p: patch.answer_lost_p.unwrap_or(self.answer_lost_p),
        }
    }
}

/// `PUT /v1/faults`: the knobs to change; the others keep their values. Unknown names are
/// refused, so a misspelt knob is an error rather than a fault silently left off.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultsPatch {
    pub callback_delay_ms: Option<u64>,
    pub duplicate_p: Option<f64>,
    pub drop_p: Option<f64>,
    pub reorder: Option<bool>,
    pub reorder_window_ms: Option<u64>,
    pub decline_p: Option<f64>,
    pub unavailable_p: Option<f64>,
    pub answer_lost_p: Option<f64>,
}

/// The seeded generator behind every fault.
pub(crate) struct Dice(std::sync::Mutex<fastrand::Rng>);

impl Dice {
    pub(crate) fn new(seed: u64) -> Self {
        Self(std::sync::Mutex::new(fastrand::Rng::with_seed(seed)))
    }

    /// True with probability `p`. One draw whatever `p` is, so turning one knob does not shift
    /// the draws of the others.
    pub(crate) fn hit(&self, p: f64) -> bool {
        let draw = match self.0.lock() {
            Ok(mut rng) => rng.f64(),
            // A panic elsewhere while drawing cannot leave the generator half-updated in a way
            // that matters for a sandbox: keep drawing from it.
            Err(poisoned) => poisoned.into_inner().f64(),
        };
        draw < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_out_of_range_are_named() {
        assert_eq!(Faults::default().validate(), Ok(()));
        let bad = Faults { drop_p: 1.5, ..Faults::default() };
        assert!(bad.validate().is_err_and(|e| e.contains("drop_p")));
        let bad = Faults { unavailable_p: f64::NAN, ..Faults::default() };
        assert!(bad.validate().is_err_and(|e| e.contains("unavailable_p")));
        let bad = Faults { reorder_window_ms: 0, ..Faults::default() };
        assert!(bad.validate().is_err_and(|e| e.contains("reorder_window_ms")));
        let patched = Faults::default().patched(&FaultsPatch { reorder: Some(true), ..FaultsPatch::default() });
        assert_eq!(patched, Faults { reorder: true, ..Faults::default() });
    }

    #[test]
    fn the_same_seed_makes_the_same_choices() {
        let (a, b) = (Dice::new(7), Dice::new(7));
        let draws = |dice: &Dice| (0..64).map(|_| dice.hit(0.5)).collect::<Vec<_>>();
        assert_eq!(draws(&a), draws(&b));
        assert!((0..100).all(|_| a.hit(1.0)) && (0..100).all(|_| !a.hit(0.0)));
    }
}
