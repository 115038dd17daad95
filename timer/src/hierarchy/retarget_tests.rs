//! The wake-up duty at the hierarchy level (see `duty.rs`): who holds it, who takes it over,
//! and whom the hierarchy names for a retarget of the host wake-up.

use proptest::prelude::*;

use super::*;
use crate::clock::NEVER;

fn pair_of_groups() -> Hierarchy {
    let cfg = HierarchyConfig {
        group_size: 2,
        max_cpus: 8,
        ..HierarchyConfig::default()
    };
    Hierarchy::new(cfg, &[0, 0, 0, 0]).unwrap()
}

#[test]
fn first_one_back_takes_the_duty_of_the_last_one_out() {
    let h = pair_of_groups();
    h.activate(0);
    h.activate(3);
    assert_eq!(h.deactivate(0, 100).wakeup, NEVER);
    let out = h.deactivate(3, NEVER);
    assert_eq!((out.wakeup, out.retarget), (100, None));
    assert_eq!(h.wakeup(3), 100);
    // CPU 1 (the other group) becomes active: CPU 3 keeps sleeping, its duty is gone.
    assert_eq!(h.activate(1), Some(3));
    assert_eq!(h.wakeup(3), NEVER);
    assert_eq!(
        h.remote_deadline(1),
        100,
        "the new migrator covers the event"
    );
    h.dump().check().unwrap();
    // CPU 1 leaves again: it is the holder now, nobody to retarget.
    let out = h.deactivate(1, NEVER);
    assert_eq!((out.wakeup, out.retarget), (100, None));
    // The holder itself coming back names nobody.
    assert_eq!(h.activate(1), None);
    h.dump().check().unwrap();
}

#[test]
fn an_idle_cpu_reporting_an_earlier_event_takes_the_duty() {
    let h = pair_of_groups();
    h.activate(2);
    h.deactivate(0, 300);
    assert_eq!(h.deactivate(2, NEVER).wakeup, 300);
    // Idle CPU 1 arms a timer at 50: it wakes for it itself, CPU 2 is re-armed.
    let out = h.new_timer(1, 50);
    assert_eq!((out.wakeup, out.retarget), (50, Some(2)));
    assert_eq!(h.wakeup(2), NEVER);
    h.dump().check().unwrap();
    // A later event than the holder's changes nothing; re-reporting the same, neither.
    assert_eq!(h.new_timer(0, 400).retarget, None);
    assert_eq!(h.deactivate(1, 50).retarget, None);
    assert_eq!(h.wakeup(1), 50);
}

#[test]
fn a_cancelled_event_moves_the_duty_later() {
    let h = pair_of_groups();
    h.activate(2);
    h.deactivate(0, 100);
    h.deactivate(1, 200);
    assert_eq!(h.deactivate(2, NEVER).wakeup, 100);
    // CPU 0's timer at 100 is cancelled: it re-reports exactly, nobody wakes at 100.
    let out = h.deactivate(0, NEVER);
    assert_eq!((out.wakeup, out.retarget), (200, Some(2)));
    assert_eq!(h.wakeup(2), NEVER);
    h.dump().check().unwrap();
    // The last event goes: nobody wakes at all.
    let out = h.deactivate(1, NEVER);
    assert_eq!((out.wakeup, out.retarget), (NEVER, Some(0)));
    let s = h.dump();
    s.check().unwrap();
    assert!(s.cpus.iter().all(|c| c.wakeup == NEVER));
}

#[derive(Debug, Clone)]
enum DOp {
    Activate(usize),
    Deactivate(usize, u64),
    Report(usize, u64),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random activations, deactivations and exact re-reports (later or earlier): after
    /// every step the duty invariant holds (checked by `HierarchyDump::check`), and the CPU a
    /// step names for a retarget is exactly the one whose wake-up that step changed.
    #[test]
    fn the_duty_moves_and_names_whom_it_moved(
        n in 1usize..12,
        ops in proptest::collection::vec(prop_oneof![
            2 => any::<usize>().prop_map(DOp::Activate),
            2 => (any::<usize>(), 1u64..1000).prop_map(|(c, e)| DOp::Deactivate(c, e)),
            1 => (any::<usize>(), prop_oneof![1u64..1000, Just(NEVER)])
                .prop_map(|(c, e)| DOp::Report(c, e)),
        ], 1..120),
    ) {
        let cfg = HierarchyConfig { group_size: 2, max_cpus: 16, ..HierarchyConfig::default() };
        let h = Hierarchy::new(cfg, &vec![0; n]).unwrap();
        let mut idle = vec![true; n];
        for op in ops {
            let before: Vec<Nanos> = (0..n).map(|c| h.wakeup(c)).collect();
            let (actor, named) = match op {
                DOp::Activate(c) => {
                    let c = c % n;
                    idle[c] = false;
                    (c, h.activate(c))
                }
                DOp::Deactivate(c, e) | DOp::Report(c, e) => {
                    let c = c % n;
                    if !idle[c] && matches!(op, DOp::Report(..)) {
                        continue;
                    }
                    idle[c] = true;
                    (c, h.deactivate(c, e).retarget)
                }
            };
            let s = h.dump();
            s.check().map_err(TestCaseError::fail)?;
            for c in (0..n).filter(|&c| c != actor) {
                let moved = h.wakeup(c) != before[c];
                prop_assert_eq!(moved, named == Some(c), "CPU {} moved {}, named {:?}",
                    c, moved, named);
            }
        }
    }
}
