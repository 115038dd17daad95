//! A model chosen at run time ([`ModelKind`]): its shared part and its per-CPU parts behind
//! the common interface.

use std::sync::Arc;

use super::{
    CentralModel, CpuTimers, ModelError, ModelKind, PullModel, PushModel, TimerModel, Waker,
};
use crate::base::CpuId;
use crate::hierarchy::NodeId;
use crate::host::HostTimer;

/// A built model: the shared part and one [`CpuTimers`] per CPU, to move to vCPU threads.
pub struct Model<T> {
    /// Shared part.
    pub shared: Arc<dyn TimerModel<T>>,
    /// Per-CPU parts, index = CPU id.
    pub cpus: Vec<Box<dyn CpuTimers<T>>>,
}

/// Builds `kind` for CPUs on NUMA nodes `nodes` (CPU `i` on `nodes[i]`). `host(Some(cpu))`
/// makes a CPU's host tick, `host(None)` the central thread's timer.
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
            let (m, c) = PullModel::new(nodes, host, waker)?;
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

    use crate::host::{FakeHostTimer, HostTimer};
    use crate::model::{build, ModelKind};
    use crate::{AfterFire, NEVER};

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
