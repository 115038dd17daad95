//! The `timer` target: the pull model on 1 to 40 vCPUs (groups of 2, 4 or 8, one to three NUMA
//! nodes) driven by arbitrary arm / cancel / re-arm / activate (wake) / deactivate (idle) /
//! handle-remote / clock-advance sequences through `timer::testing::Sim`, the simulated VMM
//! the timer crate's property tests use: it honours every kick, host tick and idle timeout as
//! the vCPU loop does.
//!
//! After every step: the hierarchy's structural invariants (`HierarchyDump::check`); every running
//! CPU's host tick covers its own first timer and the remote events it is migrator for; every
//! idle CPU's first global timer is queued under it and reachable up to an active migrator or
//! a CPU that wakes for the root's first event; pending timers keep their deadlines and stale
//! handles do nothing. Every fire: not early, not twice, not after a cancel, for the right
//! CPU with the right handle and deadline, remote only for an idle CPU. At the end time runs
//! until nothing is pending: **every timer armed has fired or was cancelled (no lost timer)**,
//! none late. The fuzzer widens what the property tests reach: any group size of 2 to 8,
//! round-robin NUMA placement, up to 400 steps, deltas up to 65 535 ns.

use arbitrary::{Result, Unstructured};
use timer::hierarchy::HierarchyConfig;
use timer::testing::{Op, Sim};

/// One operation from the input; CPU numbers and picks are taken modulo what exists.
fn op(u: &mut Unstructured<'_>) -> Result<Op> {
    let cpu = usize::from(u.arbitrary::<u8>()?);
    let pick = usize::from(u.arbitrary::<u16>()?);
    let delta = u64::from(u.arbitrary::<u16>()?);
    Ok(match u.choose_index(7)? {
        0 => Op::Arm {
            cpu,
            pinned: u.arbitrary()?,
            delta,
        },
        1 => Op::Cancel { pick },
        2 => Op::Rearm { pick, delta },
        3 => Op::Activate { cpu },
        4 => Op::Deactivate { cpu },
        5 => Op::HandleRemote { cpu },
        _ => Op::Advance { delta },
    })
}

/// The VM's shape: CPUs, group size and NUMA nodes.
fn shape(u: &mut Unstructured<'_>) -> Result<(usize, usize, usize)> {
    let n = usize::from(u.int_in_range(1u8..=40)?);
    let group_size = 1usize << u.int_in_range(1u8..=3)?;
    let nodes = usize::from(u.int_in_range(1u8..=3)?);
    Ok((n, group_size, nodes))
}

/// Runs one input: the shape, then at most 400 steps, then a drain. A broken promise panics
/// with the step that broke it.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((n, group_size, nodes)) = shape(&mut u) else {
        return;
    };
    let config = HierarchyConfig {
        group_size,
        max_cpus: 64,
        ..HierarchyConfig::default()
    };
    let node_of: Vec<usize> = (0..n).map(|i| i % nodes).collect();
    let mut sim = Sim::new(config, &node_of)
        .unwrap_or_else(|v| panic!("a VM of {n} CPUs in groups of {group_size}: {v}"));
    for _ in 0..400 {
        let Ok(op) = op(&mut u) else {
            break;
        };
        if let Err(v) = sim.step(op) {
            panic!("{op:?} at {}: {v}", sim.now());
        }
        if u.is_empty() {
            break;
        }
    }
    if let Err(v) = sim.drain() {
        panic!("drain: {v}");
    }
}
