//! How a background reader paces its reads of figures that may not move: every period while
//! they change, ever less often while they do not. A sold-out or idle SKU then costs Redis
//! close to nothing, and the first change after a quiet spell is seen at most `max` periods
//! late.

/// When to read one thing again, from what the last reads found.
#[derive(Debug)]
pub struct Pace<T> {
    seen: Option<T>,
    /// Pause before the next read, in periods (1 ..= `max`).
    periods: u32,
    /// Periods still to wait.
    waiting: u32,
    max: u32,
}

impl<T: PartialEq> Pace<T> {
    /// A pace whose quiet pause doubles up to `max` periods (at least 1); the first read is due
    /// at once.
    pub fn new(max: u32) -> Self {
        Self { seen: None, periods: 1, waiting: 0, max: max.max(1) }
    }

    /// Whether to read this period; counts one period off the pause otherwise.
    pub fn due(&mut self) -> bool {
        if self.waiting == 0 {
            return true;
        }
        self.waiting -= 1;
        false
    }

    /// After a read that found `seen` (`None`: nothing, e.g. a failed read, which is retried
    /// every period): the same as last time doubles the pause, anything else resets it.
    pub fn read(&mut self, seen: Option<T>) {
        let quiet = seen.is_some() && seen == self.seen;
        self.periods = if quiet { self.periods.saturating_mul(2).min(self.max) } else { 1 };
        debug_assert!((1..=self.max).contains(&self.periods), "a pause is 1 to {} periods", self.max);
        self.waiting = self.periods - 1;
        self.seen = seen;
    }

    /// What the last read found.
    pub fn seen(&self) -> Option<&T> {
        self.seen.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Periods skipped until the next read is due.
    fn skipped(pace: &mut Pace<(u64, u64)>) -> u32 {
        let mut skipped = 0;
        while !pace.due() {
            skipped += 1;
        }
        skipped
    }

    /// Goal: figures that do not move are read ever less often, down to one read in `max`
    /// periods, and any change (a figure, a failed read) brings the next read back to the next
    /// period.
    #[test]
    fn quiet_figures_are_read_less_often_and_a_change_restores_the_pace() {
        let mut pace = Pace::new(8);
        assert!(pace.due(), "the first read is at once");
        pace.read(Some((3, 5)));
        assert_eq!(skipped(&mut pace), 0, "a first sight counts as a change");
        let mut gaps = Vec::new();
        for _ in 0..6 {
            pace.read(Some((3, 5)));
            gaps.push(skipped(&mut pace));
        }
        assert_eq!(gaps, [1, 3, 7, 7, 7, 7]);
        pace.read(Some((4, 5)));
        assert_eq!(skipped(&mut pace), 0, "a change");
        pace.read(Some((4, 5)));
        assert_eq!(skipped(&mut pace), 1);
        pace.read(None);
        assert_eq!(skipped(&mut pace), 0, "a failed read is retried every period");
        pace.read(None);
        assert_eq!(skipped(&mut pace), 0, "nothing found is never quiet");
        assert_eq!(pace.seen(), None);
    }

    /// Goal: the bound holds at its edges: `max` 1 reads every period, `max` 0 is taken as 1.
    #[test]
    fn a_max_of_one_or_zero_reads_every_period() {
        for max in [0, 1] {
            let mut pace = Pace::new(max);
            for _ in 0..4 {
                pace.read(Some((1, 1)));
                assert_eq!(skipped(&mut pace), 0);
            }
        }
    }
}
