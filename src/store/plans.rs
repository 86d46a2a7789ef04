//! When a PostgreSQL session's plans are remade.
//!
//! PostgreSQL plans a prepared statement (and the statements inside
//! `hold_asset`, and the foreign-key checks) for the tables' sizes when it
//! plans them, and after a few executions keeps one generic plan until the
//! tables' statistics change. They change when the tables are analysed; with
//! autovacuum off that is never, and with it on, it is late in a sale's first
//! minutes. A plan made while the reservations were few reads the whole table
//! (cheapest then), and kept as the table grows it makes every hold read
//! every reservation.
//!
//! The tables grow by what the service writes, so the service counts its
//! commits, and each time the count doubles (from [`FIRST_REPLAN`]) every
//! session drops its plans before its next use (`DISCARD PLANS`; the
//! statements stay prepared). Plans are then never made for tables less than
//! half their size, at the cost of one round trip per connection per
//! doubling: about twenty over a billion writes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool::managed::Metrics;

/// The commit count at which sessions first remake their plans: tables a
/// few hundred rows larger than when they were analysed, where an index
/// already beats reading a table whole.
const FIRST_REPLAN: u64 = 512;

/// The commits of one pool, and when their count last doubled.
#[derive(Debug)]
pub(crate) struct Replans {
    commits: AtomicU64,
    /// Microseconds from `epoch` to the last doubling; 0 before the first.
    doubled_at: AtomicU64,
    epoch: Instant,
}

impl Default for Replans {
    fn default() -> Self {
        Self {
            commits: AtomicU64::new(0),
            doubled_at: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Replans {
    /// One more commit (or write sent on its own) succeeded.
    pub(crate) fn committed(&self) {
        let commits = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if commits >= FIRST_REPLAN && commits.is_power_of_two() {
            let at = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.doubled_at.store(at.max(1), Ordering::Relaxed);
        }
    }

    /// Whether a pooled connection being handed out was last handed out
    /// (or opened) before the commit count last doubled: its plans may have
    /// been made for tables half their size or less.
    pub(crate) fn stale(&self, metrics: &Metrics) -> bool {
        match self.doubled_at.load(Ordering::Relaxed) {
            0 => false,
            at => {
                metrics.recycled.unwrap_or(metrics.created) < self.epoch + Duration::from_micros(at)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used_at(at: Instant) -> Metrics {
        Metrics {
            created: at,
            ..Metrics::default()
        }
    }

    #[test]
    fn sessions_used_before_each_doubling_are_stale_once() {
        let replans = Replans::default();
        let before = used_at(Instant::now());
        for _ in 0..FIRST_REPLAN - 1 {
            replans.committed();
        }
        assert!(!replans.stale(&before), "no doubling yet");
        replans.committed();
        assert!(replans.stale(&before), "used before the doubling");
        let after = used_at(Instant::now());
        assert!(!replans.stale(&after), "used after it");
        for _ in 0..FIRST_REPLAN - 1 {
            replans.committed();
        }
        assert!(!replans.stale(&after), "one short of the next doubling");
        replans.committed();
        assert!(replans.stale(&after), "used before the next doubling");
    }
}
