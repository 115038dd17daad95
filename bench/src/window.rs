//! The measured window of a fleet of guests that boot for a long, uneven time and then run a
//! workload of fixed length: it must lie inside every VM's workload, so that no boot counts.
//!
//! ```text
//! vm0  |--- boot ---|start0=================== workload (S s) ===========|report
//! vm1  |------- boot -------|start1=================== workload =================|report
//!                           |settle|######## window ########|margin|
//!                                  ^ last start + settle    ^ min(start + length,
//!                                                              first start + S - margin)
//! ```
//!
//! The workload's length S is fixed on the guest's command line before boot, so it must
//! cover the window, the settle time, the margin and how far apart the VMs reach their start
//! (the boot spread, which the bench cannot know in advance: [`guest_seconds`] adds an
//! allowance for it). If the spread exceeds the allowance the window is shorter than asked;
//! if the VMs' workloads do not overlap by more than settle + margin there is none.

use std::time::Duration;

/// How the window is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRule {
    /// Wait this long after the last VM has started before the window opens.
    pub settle: Duration,
    /// The window's length as asked.
    pub length: Duration,
    /// Each VM's workload length (S).
    pub workload: Duration,
    /// End the window this long before the first VM's workload ends.
    pub margin: Duration,
}

/// Where the window lies, as offsets from the fleet's launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowPlan {
    /// When it opens.
    pub start: Duration,
    /// When it closes.
    pub end: Duration,
    /// Last start - first start.
    pub spread: Duration,
}

impl WindowPlan {
    /// Whether the window is as long as asked.
    pub fn is_full(&self, rule: &WindowRule) -> bool {
        self.end - self.start >= rule.length
    }
}

/// There is no window.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// No VM has started.
    #[error("no VM started its workload")]
    NoStarts,
    /// The VMs' workloads overlap too little.
    #[error("the VMs started their workloads {0:?} apart: no common window; raise --boot-spread")]
    NoOverlap(Duration),
}

/// The window for VMs whose workloads started at `starts` (offsets from launch).
pub fn plan(starts: &[Duration], rule: &WindowRule) -> Result<WindowPlan, WindowError> {
    let first = *starts.iter().min().ok_or(WindowError::NoStarts)?;
    let last = *starts.iter().max().ok_or(WindowError::NoStarts)?;
    let spread = last - first;
    let start = last + rule.settle;
    let latest_end = (first + rule.workload).saturating_sub(rule.margin);
    let end = (start + rule.length).min(latest_end);
    if end <= start {
        return Err(WindowError::NoOverlap(spread));
    }
    Ok(WindowPlan { start, end, spread })
}

/// The workload length (whole seconds) that holds a window of `length` for VMs that start
/// up to `spread` apart.
pub fn guest_seconds(
    length: Duration,
    spread: Duration,
    settle: Duration,
    margin: Duration,
) -> u64 {
    let total = length + spread + settle + margin;
    total.as_secs() + u64::from(total.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn rule(workload: u64) -> WindowRule {
        WindowRule {
            settle: s(2),
            length: s(60),
            workload: s(workload),
            margin: s(3),
        }
    }

    #[test]
    fn the_window_opens_after_the_last_start_and_closes_before_the_first_end() {
        // Four VMs started 40..52 s after launch; S = 60 + 20 + 2 + 3 = 85 s.
        let starts = [s(41), s(40), s(52), s(47)];
        let r = rule(guest_seconds(s(60), s(20), s(2), s(3)));
        assert_eq!(r.workload, s(85));
        let p = plan(&starts, &r).unwrap();
        assert_eq!((p.start, p.end, p.spread), (s(54), s(114), s(12)));
        assert!(p.is_full(&r));
        // Inside every workload: after every start, before every end minus the margin.
        for st in starts {
            assert!(p.start > st && p.end + r.margin <= st + r.workload);
        }
    }

    #[test]
    fn a_spread_beyond_the_allowance_shortens_the_window() {
        // 30 s apart with 20 s allowed: the first VM's end cuts the window to 50 s.
        let r = rule(85);
        let p = plan(&[s(40), s(70)], &r).unwrap();
        assert_eq!((p.start, p.end), (s(72), s(122)));
        assert!(!p.is_full(&r));
        // 80 s apart: the workloads overlap by 5 s, less than settle + margin.
        assert_eq!(
            plan(&[s(40), s(120)], &r),
            Err(WindowError::NoOverlap(s(80)))
        );
        assert_eq!(plan(&[], &r), Err(WindowError::NoStarts));
    }

    #[test]
    fn workload_seconds_round_up() {
        assert_eq!(guest_seconds(s(10), s(0), s(2), s(3)), 15);
        assert_eq!(
            guest_seconds(Duration::from_millis(10_500), s(0), s(2), s(3)),
            16
        );
    }
}
