//! The calling thread's host CPU and CPU affinity: which CPU it runs on (`sched_getcpu`,
//! answered by glibc from the thread's rseq area or the vDSO, no system call), its own CPU
//! set, and binding it to one CPU of that set and back (`sched_setaffinity` on itself, pid 0:
//! the only form the vCPU threads' seccomp filter allows).
//!
//! The calls go through nix's `sched` wrappers: the same system calls (pid 0, the full
//! `cpu_set_t`), nothing allocated, so `current_cpu` on the wake path costs what it did.

use std::io;

use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity};
use nix::unistd::Pid;

/// A thread's CPU set, as `sched_getaffinity` gave it.
#[derive(Clone, Copy)]
pub struct CpuSet(nix::sched::CpuSet);

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuSet({} CPUs)", self.count())
    }
}

/// The calling thread, as the affinity calls name it (the only form the vCPU threads' seccomp
/// filter allows).
fn this_thread() -> Pid {
    Pid::from_raw(0)
}

impl CpuSet {
    /// The calling thread's CPU set.
    pub fn of_current_thread() -> io::Result<Self> {
        Ok(Self(sched_getaffinity(this_thread())?))
    }

    /// How many CPUs it holds.
    pub fn count(&self) -> usize {
        (0..nix::sched::CpuSet::count())
            .filter(|&cpu| self.0.is_set(cpu).unwrap_or(false))
            .count()
    }

    /// Makes it the calling thread's CPU set.
    pub fn apply_to_current_thread(&self) -> io::Result<()> {
        Ok(sched_setaffinity(this_thread(), &self.0)?)
    }
}

/// The host CPU the calling thread runs on; `None` if the host cannot tell.
pub fn current_cpu() -> Option<u32> {
    sched_getcpu().ok().and_then(|cpu| u32::try_from(cpu).ok())
}

/// Binds the calling thread to host CPU `cpu` alone.
pub fn bind_current_thread(cpu: u32) -> io::Result<()> {
    let index = usize::try_from(cpu).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut set = nix::sched::CpuSet::new();
    // Refuses (EINVAL) a CPU at or past CPU_SETSIZE.
    set.set(index)?;
    Ok(sched_setaffinity(this_thread(), &set)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_binds_to_its_cpu_and_gets_its_set_back() {
        std::thread::spawn(|| {
            let own = CpuSet::of_current_thread().unwrap();
            assert!(own.count() >= 1);
            let cpu = current_cpu().expect("sched_getcpu works on Linux");
            bind_current_thread(cpu).unwrap();
            assert_eq!(CpuSet::of_current_thread().unwrap().count(), 1);
            assert_eq!(current_cpu(), Some(cpu), "bound to it, so running on it");
            own.apply_to_current_thread().unwrap();
            assert_eq!(CpuSet::of_current_thread().unwrap().count(), own.count());
            assert!(bind_current_thread(u32::MAX).is_err());
        })
        .join()
        .unwrap();
    }
}
