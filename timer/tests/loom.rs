//! Model checking of the lock-free group state with loom.
//!
//! Run with `make loom-tests` (bound 5), or:
//! `RUSTFLAGS="--cfg loom" cargo test -p timer --release --test loom` (bound 3 by default;
//! `LOOM_MAX_PREEMPTIONS=6` searches deeper). Without `--cfg loom` this file is empty.
//!
//! The tree: 4 CPUs, groups of 2, so two level-0 groups under one root:
//! ```text
//!           [root]
//!          /      \
//!      [G0]        [G1]
//!      /  \        /  \
//!     0    1      2    3
//! ```
#![cfg(loom)]
#![allow(clippy::unwrap_used)]

use loom::thread;
use std::sync::Arc;
use timer::hierarchy::{Hierarchy, HierarchyConfig};
use timer::NEVER;

fn tree() -> Hierarchy {
    let cfg = HierarchyConfig {
        group_size: 2,
        max_cpus: 4,
        max_nodes: 1,
        cpus_per_node: None,
    };
    Hierarchy::new(cfg, &[0, 0, 0, 0]).unwrap()
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// The last two CPUs of different groups go idle at once: exactly the tree's invariants hold
/// afterwards, and one of them learns the system-wide first expiry.
#[test]
fn loom_concurrent_deactivate() {
    model(|| {
        let h = Arc::new(tree());
        h.activate(0);
        h.activate(2);
        let h2 = Arc::clone(&h);
        let t = thread::spawn(move || h2.deactivate(2, 200).wakeup);
        let a = h.deactivate(0, 100).wakeup;
        let b = t.join().unwrap();
        h.dump().check().unwrap();
        assert_eq!(a.min(b), 100, "nobody will wake for the first timer");
        assert_eq!(a.max(b), NEVER);
    });
}

/// CPU 0 goes idle (its group goes idle, the walk continues to the root) while CPU 1 of the
/// same group comes back: the root must keep G0's bit. This is the interleaving `seq` is for.
fn activate_vs_deactivate(h: Hierarchy) {
    let h = Arc::new(h);
    h.activate(0);
    h.activate(2);
    let h2 = Arc::clone(&h);
    let t = thread::spawn(move || h2.activate(1));
    h.deactivate(0, 100);
    t.join().unwrap();
    let s = h.dump();
    if let Err(e) = s.check() {
        panic!("active CPU lost: {e}");
    }
}

#[test]
fn loom_activate_races_deactivate() {
    model(|| activate_vs_deactivate(tree()));
}

/// The same model with `seq` never bumped: loom finds the stale compare-exchange that clears
/// the bit of a group whose CPU 1 just became active.
#[test]
#[should_panic(expected = "active CPU lost")]
fn loom_without_seq_loses_an_active_cpu() {
    model(|| activate_vs_deactivate(tree().without_seq()));
}

/// Two CPUs flip idle/active in both groups; afterwards the tree is consistent.
#[test]
fn loom_flip_flop() {
    model(|| {
        let h = Arc::new(tree());
        h.activate(0);
        h.activate(3);
        let h2 = Arc::clone(&h);
        let t = thread::spawn(move || {
            h2.deactivate(3, 300);
            h2.activate(3);
        });
        h.deactivate(0, 100);
        h.activate(0);
        t.join().unwrap();
        h.dump().check().unwrap();
    });
}

/// CPU 1's global timers, shared with whoever expires them remotely.
struct Remote(Arc<loom::sync::Mutex<Vec<u64>>>);

impl timer::RemoteExpiry for Remote {
    fn expire_remote(&mut self, _cpu: timer::CpuId, now: u64) {
        self.0.lock().unwrap().retain(|&d| d > now);
    }

    fn next_global(&mut self, _cpu: timer::CpuId) -> u64 {
        self.0
            .lock()
            .unwrap()
            .iter()
            .copied()
            .min()
            .unwrap_or(NEVER)
    }
}

/// The migrator expires idle CPU 1's due timer while CPU 1 arms a new, earlier-than-reported
/// one (the `remote` flag protocol): afterwards the new timer is still reachable.
#[test]
fn loom_remote_expiry_races_new_timer() {
    model(|| {
        let h = Arc::new(tree());
        let q = Arc::new(loom::sync::Mutex::new(vec![100u64, 500]));
        h.activate(0);
        h.activate(1);
        h.deactivate(1, 100);
        let (h2, q2) = (Arc::clone(&h), Arc::clone(&q));
        let t = thread::spawn(move || {
            q2.lock().unwrap().push(150);
            h2.new_timer(1, 150);
        });
        h.handle_remote(0, 100, &mut Remote(Arc::clone(&q)));
        t.join().unwrap();
        let s = h.dump();
        s.check().unwrap();
        let first = q.lock().unwrap().iter().copied().min().unwrap();
        assert_eq!(first, 150);
        // CPU 1's event in its group (whose migrator, CPU 0, is active) covers the timer.
        let g = &s.groups[s.cpus[1].group];
        let e = g.events.iter().find(|e| e.slot == s.cpus[1].slot);
        assert!(
            e.is_some_and(|e| e.expiry <= 150),
            "timer at 150 unreachable: {e:?}"
        );
        assert!(h.remote_deadline(0) <= 150);
    });
}

fn flat_pair() -> Hierarchy {
    let cfg = HierarchyConfig {
        group_size: 2,
        max_cpus: 3,
        max_nodes: 1,
        cpus_per_node: None,
    };
    Hierarchy::new(cfg, &[0, 0]).unwrap()
}

/// Checks the tree and that an all-idle tree's first event has someone waking for it.
fn check_covered(h: &Hierarchy) {
    let s = h.dump();
    s.check().unwrap();
    let root = &s.groups[s.root().unwrap()];
    if root.state.active == 0 && root.next_expiry != NEVER {
        assert!(
            s.cpus
                .iter()
                .any(|c| c.idle && c.wakeup <= root.next_expiry),
            "all idle, nobody wakes for {}",
            root.next_expiry
        );
    }
}

/// A new root is grown above the old one (adding CPU 2) while CPU 0 goes idle, or CPU 1
/// comes up: the adopted root's bit and event end up right in the new root either way.
#[test]
fn loom_root_grows_while_cpus_flip() {
    model(|| {
        let h = Arc::new(flat_pair());
        h.activate(0);
        let (h1, h2) = (Arc::clone(&h), Arc::clone(&h));
        let a = thread::spawn(move || {
            h1.deactivate(0, 100);
        });
        let b = thread::spawn(move || h2.activate(1));
        assert_eq!(h.add_cpu(0).unwrap(), 2);
        a.join().unwrap();
        b.join().unwrap();
        check_covered(&h);
        h.deactivate(1, NEVER);
        check_covered(&h);
    });
}

/// The last running CPU goes idle while an idle CPU arms an earlier global timer: one of the
/// two must end up waking for it.
#[test]
fn loom_last_idle_races_new_timer() {
    model(|| {
        let h = Arc::new(tree());
        h.activate(0);
        h.activate(3);
        h.deactivate(3, 500);
        let h2 = Arc::clone(&h);
        let t = thread::spawn(move || h2.new_timer(3, 50).wakeup);
        let a = h.deactivate(0, 300).wakeup;
        let b = t.join().unwrap();
        check_covered(&h);
        assert_eq!(a.min(b), 50, "nobody wakes for the timer at 50 ({a}, {b})");
    });
}
