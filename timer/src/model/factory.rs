//! A model chosen at run time ([`ModelKind`]): its shared part and its per-CPU parts behind
//! the common interface.

use std::sync::Arc;

use super::{
    CentralModel, CpuTimers, ModelError, ModelKind, PullModel, PushModel, TimerModel, Waker,
};
use crate::base::CpuId;
use crate::hierarchy::{HierarchyConfig, NodeId};
use crate::host::HostTimer;

/// A built model: the shared part and one [`CpuTimers`] per CPU, to move to vCPU threads.
pub struct Model<T> {
    /// Shared part.
    pub shared: Arc<dyn TimerModel<T>>,
    /// Per-CPU parts, index = CPU id.
    pub cpus: Vec<Box<dyn CpuTimers<T>>>,
}

/// The hierarchy of a `pull` model whose CPUs are all given at build time: its tables (CPUs,
/// groups, per-CPU global queues and sleepers) sized for those CPUs. The default's 4,096
/// slots, written at start-up, cost a VMM ~650 KiB of resident memory per VM.
pub fn fixed_cpus_config(cpus: usize) -> HierarchyConfig {
    HierarchyConfig {
        max_cpus: cpus.max(1),
        ..HierarchyConfig::default()
    }
}

/// Builds `kind` for CPUs on NUMA nodes `nodes` (CPU `i` on `nodes[i]`), which are all the
/// CPUs it will ever have (see [`fixed_cpus_config`]). `host(Some(cpu))` makes a CPU's host
/// tick, `host(None)` the central thread's timer.
pub fn build<T: Send + 'static>(
    kind: ModelKind,
    nodes: &[NodeId],
    host: &mut dyn FnMut(Option<CpuId>) -> Box<dyn HostTimer>,
    waker: Arc<dyn Waker>,
) -> Result<Model<T>, ModelError> {
    fn boxed<T, C: CpuTimers<T> + 'static>(v: Vec<C>) -> Vec<Box<dyn CpuTimers<T>>> {
        v.into_iter()
            .map(|c| Box::new(c) as Box<dyn CpuTimers<T>>)
            .collect()
    }
    Ok(match kind {
        ModelKind::Pull => {
            let (m, c) =
                PullModel::with_config(fixed_cpus_config(nodes.len()), nodes, host, waker)?;
            Model {
                shared: m,
                cpus: boxed(c),
            }
        }
        ModelKind::Push => {
            let (m, c) = PushModel::new(nodes.len(), host, waker);
            Model {
                shared: m,
                cpus: boxed(c),
            }
        }
        ModelKind::Central => {
            let (m, c) = CentralModel::new(nodes.len(), host, waker);
            Model {
                shared: m,
                cpus: boxed(c),
            }
        }
    })
}

#[cfg(test)]
#[cfg(not(loom))]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::fixed_cpus_config;
    use crate::host::{FakeHostTimer, HostTimer};
    use crate::model::{build, CpuTimers, ModelKind, PullModel};
    use crate::{AfterFire, TimerKind, NEVER};

    #[test]
    fn a_fixed_pull_model_holds_its_cpus_and_no_more() {
        for n in [1, 2, 8, 9, 64] {
            let nodes: Vec<usize> = (0..n).map(|i| i % 2).collect();
            let mut host = |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>;
            let (m, mut cpus) = PullModel::<usize>::with_config(
                fixed_cpus_config(n),
                &nodes,
                &mut host,
                Arc::new(|_cpu: usize| {}),
            )
            .unwrap();
            assert_eq!(m.hierarchy().max_cpus(), n);
            assert_eq!(m.hierarchy().num_cpus(), n);
            m.hierarchy().dump().check().unwrap();
            // Every CPU's global timer is found by the last one to go idle.
            for (i, c) in cpus.iter_mut().enumerate() {
                let at = 1_000 + u64::try_from(i).unwrap();
                c.arm(TimerKind::Global, at, i);
            }
            let last = cpus.len() - 1;
            for c in &mut cpus[..last] {
                assert_eq!(c.idle(0), NEVER);
            }
            assert_eq!(cpus[last].idle(0), 1_000, "{n} CPUs");
            let tick = Box::new(FakeHostTimer::new());
            assert!(m.add_cpu(0, tick).is_err(), "no room for CPU {n}");
        }
    }

    #[test]
    fn the_timer_thread_re_arms_a_global_timer_for_its_owner() {
        let thread_timer = FakeHostTimer::new();
        let mut host = |cpu: Option<usize>| match cpu {
            None => Box::new(thread_timer.clone()) as Box<dyn HostTimer>,
            Some(_) => Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>,
        };
        let kicked = Arc::new(Mutex::new(Vec::new()));
        let k = kicked.clone();
        let waker = Arc::new(move |cpu: usize| k.lock().unwrap().push(cpu));
        let m = build::<&str>(ModelKind::Central, &[0, 0], &mut host, waker).unwrap();
        assert!(m.shared.arm_global(1, 5_000, "device"));
        assert_eq!(
            thread_timer.deadline(),
            5_000,
            "the timer thread wakes for it"
        );
        let mut fired = Vec::new();
        let next = m.shared.service(5_000, &mut |f| {
            fired.push((f.cpu, f.payload));
            AfterFire::Done
        });
        assert_eq!(fired, vec![(1, "device")]);
        assert_eq!(next, NEVER);
        assert!(
            kicked.lock().unwrap().is_empty(),
            "a global timer wakes nobody"
        );
        for kind in [ModelKind::Pull, ModelKind::Push] {
            let mut host = |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>;
            let m = build::<&str>(kind, &[0], &mut host, Arc::new(|_cpu: usize| {})).unwrap();
            assert!(!m.shared.arm_global(0, 5_000, "device"), "{kind:?}");
        }
    }
}
