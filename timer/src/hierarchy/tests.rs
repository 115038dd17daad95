//! Hierarchy tests: shapes, NUMA placement, the basic walks, run-time growth (sequential
//! property test and a concurrent run while the root grows).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::clock::NEVER;

fn one_node(n: usize) -> Hierarchy {
    Hierarchy::with_cpus(n).unwrap()
}

#[test]
fn levels_grow_with_cpus() {
    for (n, levels) in [
        (1, 1),
        (8, 1),
        (9, 2),
        (64, 2),
        (65, 3),
        (512, 3),
        (513, 4),
        (4096, 4),
    ] {
        let h = one_node(n);
        assert_eq!(h.num_levels(), levels, "{n} CPUs");
        let s = h.dump();
        s.check().unwrap();
        assert!(s.groups.iter().all(|g| g.members.len() <= 8));
    }
    assert_eq!(
        Hierarchy::with_cpus(4097).err(),
        Some(HierarchyError::TooManyCpus(4096))
    );
    let bad = HierarchyConfig {
        group_size: 6,
        ..HierarchyConfig::default()
    };
    assert_eq!(
        Hierarchy::new(bad, &[0]).err(),
        Some(HierarchyError::BadGroupSize(6))
    );
}

#[test]
fn numa_nodes_stay_apart_below_the_crossnode_level() {
    // 3 nodes of 20 CPUs, interleaved: 20 per node needs 2 levels of 8.
    let nodes: Vec<usize> = (0..60).map(|i| i % 3).collect();
    let h = Hierarchy::new(HierarchyConfig::default(), &nodes).unwrap();
    assert_eq!(h.crossnode_level(), 2);
    let s = h.dump();
    s.check().unwrap();
    for g in s.groups.iter().filter(|g| g.level < 2) {
        for m in &g.members {
            if let MemberDump::Cpu(c) = m {
                assert_eq!(nodes[*c], g.node);
            }
        }
    }
    let root = &s.groups[s.root().unwrap()];
    assert_eq!(root.level, 2);
    assert_eq!(root.members.len(), 3);
}

#[test]
fn last_cpu_going_idle_gets_the_first_global_expiry() {
    let h = one_node(16);
    for c in 0..16 {
        h.activate(c);
    }
    for c in 0..15 {
        let d = h.deactivate(c, 1000 + c as u64);
        assert_eq!(d.wakeup, NEVER);
        h.dump().check().unwrap();
    }
    assert_eq!(h.quick_check(15, 5000), 1000);
    let d = h.deactivate(15, 5000);
    assert_eq!(d.wakeup, 1000);
    assert_eq!(h.wakeup(15), 1000);
    h.dump().check().unwrap();
    // CPU 15 wakes, becomes migrator of everything and pulls CPU 0's timer.
    h.activate(15);
    assert_eq!(h.remote_deadline(15), 1000);
    assert!(h.requires_handle_remote(15, 1000));
    struct Exp(Vec<CpuId>);
    impl RemoteExpiry for Exp {
        fn expire_remote(&mut self, cpu: CpuId, _now: Nanos) {
            self.0.push(cpu);
        }
        fn next_global(&mut self, _cpu: CpuId) -> Nanos {
            NEVER
        }
    }
    let mut e = Exp(Vec::new());
    let out = h.handle_remote(15, 1001, &mut e);
    assert_eq!(e.0, vec![0, 1]);
    assert_eq!(out.cpus_expired, 2);
    assert_eq!(h.remote_deadline(15), 1002);
    assert!(!h.requires_handle_remote(15, 1001));
    h.dump().check().unwrap();
}

#[test]
fn new_timer_on_an_idle_cpu_reaches_the_migrator() {
    let h = one_node(16);
    h.activate(0);
    h.activate(9);
    h.deactivate(9, NEVER);
    // CPU 9 (idle, in another group) arms a global timer: CPU 0 must be told.
    let upd = h.new_timer(9, 500);
    assert_eq!(upd.wakeup, NEVER);
    assert_eq!(upd.kick, Some(0));
    assert_eq!(h.remote_deadline(0), 500);
    // Later timers change nothing.
    assert_eq!(h.new_timer(9, 600).kick, None);
    h.dump().check().unwrap();
}

#[test]
fn migrator_handoff_kicks_the_new_migrator() {
    let h = one_node(4);
    for c in 0..3 {
        h.activate(c);
    }
    h.deactivate(2, 300);
    // CPU 0 is the migrator; when it leaves, CPU 1 inherits CPU 2's event.
    let d = h.deactivate(0, NEVER);
    assert_eq!(d.kick, Some(1));
    assert_eq!(h.remote_deadline(1), 300);
}

#[derive(Debug, Clone)]
enum HOp {
    Add(usize),
    Activate(usize),
    Deactivate(usize, u64),
    NewTimer(usize, u64),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// CPUs are added at run time (new groups, new roots) between activations and
    /// deactivations; the tree stays consistent and an all-idle tree is always covered.
    #[test]
    fn growth_keeps_the_tree_consistent(
        start in 1usize..10,
        ops in proptest::collection::vec(prop_oneof![
            1 => (0usize..3).prop_map(HOp::Add),
            3 => any::<usize>().prop_map(HOp::Activate),
            3 => (any::<usize>(), 1u64..1000).prop_map(|(c, e)| HOp::Deactivate(c, e)),
            1 => (any::<usize>(), 1u64..1000).prop_map(|(c, e)| HOp::NewTimer(c, e)),
        ], 1..150),
    ) {
        let cfg = HierarchyConfig { group_size: 2, max_cpus: 70, ..HierarchyConfig::default() };
        let nodes: Vec<usize> = (0..start).map(|i| i % 2).collect();
        let h = Hierarchy::new(cfg, &nodes).unwrap();
        let mut idle = vec![true; start];
        for op in ops {
            match op {
                HOp::Add(node) => if idle.len() < 70 {
                    prop_assert_eq!(h.add_cpu(node).unwrap(), idle.len());
                    idle.push(true);
                },
                HOp::Activate(c) => { let c = c % idle.len(); h.activate(c); idle[c] = false; }
                HOp::Deactivate(c, e) => {
                    let c = c % idle.len();
                    if !idle[c] {
                        let q = h.quick_check(c, e);
                        let d = h.deactivate(c, e);
                        prop_assert!(q <= d.wakeup);
                        idle[c] = true;
                    }
                }
                HOp::NewTimer(c, e) => { let c = c % idle.len(); h.new_timer(c, e); }
            }
            let s = h.dump();
            s.check().map_err(TestCaseError::fail)?;
            prop_assert!(s.groups.iter().all(|g| g.members.len() <= 2));
            let root = &s.groups[s.root().unwrap()];
            if root.state.active == 0 && root.next_expiry != NEVER {
                prop_assert!(s.cpus.iter().any(|c| c.idle && c.wakeup <= root.next_expiry),
                    "all idle and nobody wakes for {}", root.next_expiry);
            }
        }
    }
}

/// Threads flip their CPUs between active and idle while the main thread adds CPUs (growing
/// new roots). Afterwards, with every CPU idle, the tree is consistent and covered.
#[test]
fn concurrent_flips_while_the_root_grows() {
    let cfg = HierarchyConfig {
        group_size: 2,
        max_cpus: 64,
        ..HierarchyConfig::default()
    };
    let h = Arc::new(Hierarchy::new(cfg, &[0, 0, 0, 0]).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4)
        .map(|c| {
            let (h, stop) = (Arc::clone(&h), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) || i < 2000 {
                    h.activate(c);
                    h.deactivate(c, 10_000 + (i * 7 + c as u64) % 1000);
                    i += 1;
                }
            })
        })
        .collect();
    for k in 0..60 {
        h.add_cpu(k % 2).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let s = h.dump();
    s.check().unwrap();
    assert_eq!(s.cpus.len(), 64);
    let root = &s.groups[s.root().unwrap()];
    assert_eq!(root.state.active, 0);
    assert!(root.next_expiry >= 10_000 && root.next_expiry < 11_000);
    assert!(s.cpus.iter().any(|c| c.wakeup <= root.next_expiry));
}
