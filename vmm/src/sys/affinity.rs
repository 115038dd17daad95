//! The calling thread's host CPU and CPU affinity: which CPU it runs on (`sched_getcpu`,
//! answered by glibc from the thread's rseq area or the vDSO, no system call), its own CPU
//! set, and binding it to one CPU of that set and back (`sched_setaffinity` on itself, pid 0:
//! the only form the vCPU threads' seccomp filter allows).

use std::io;
use std::mem::MaybeUninit;

/// A thread's CPU set, as `sched_getaffinity` gave it.
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuSet({} CPUs)", self.count())
    }
}

impl CpuSet {
    /// The calling thread's CPU set.
    pub fn of_current_thread() -> io::Result<Self> {
        let mut set = MaybeUninit::<libc::cpu_set_t>::zeroed();
        // SAFETY: `set` is a writable cpu_set_t of the size passed; pid 0 is this thread.
        let r = unsafe {
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set.as_mut_ptr())
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: zero-initialized, then filled by the kernel; every bit pattern is valid.
        Ok(Self(unsafe { set.assume_init() }))
    }

    /// How many CPUs it holds.
    pub fn count(&self) -> usize {
        // SAFETY: CPU_COUNT only reads the set it is given, a valid cpu_set_t.
        let n = unsafe { libc::CPU_COUNT(&self.0) };
        usize::try_from(n).unwrap_or(0)
    }

    /// Makes it the calling thread's CPU set.
    pub fn apply_to_current_thread(&self) -> io::Result<()> {
        set_affinity(&self.0)
    }
}

/// The host CPU the calling thread runs on; `None` if the host cannot tell.
pub fn current_cpu() -> Option<u32> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).ok()
}

/// Binds the calling thread to host CPU `cpu` alone.
pub fn bind_current_thread(cpu: u32) -> io::Result<()> {
    let index = usize::try_from(cpu).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if index >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `index` is below CPU_SETSIZE (checked above), so the bit is inside `set`.
    unsafe { libc::CPU_SET(index, &mut set) };
    set_affinity(&set)
}

fn set_affinity(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed, only read; pid 0 is this thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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
