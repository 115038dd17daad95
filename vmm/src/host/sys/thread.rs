//! Per-thread scheduling knobs.

/// Sets the calling thread's timer slack (`PR_SET_TIMERSLACK`) to `ns` nanoseconds.
///
/// Linux lets a sleeping thread's timeouts (futex, poll, nanosleep) expire up to its timer
/// slack late (50 us by default) so that wake-ups can be batched; a vCPU thread blocked until
/// its guest's timer deadline must wake as close to the deadline as the host allows.
pub fn set_timer_slack(ns: u64) -> std::io::Result<()> {
    let arg = libc::c_ulong::try_from(ns.max(1)).unwrap_or(libc::c_ulong::MAX);
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, arg, 0, 0, 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slack_is_set_for_this_thread() {
        std::thread::spawn(|| {
            set_timer_slack(1).unwrap();
            // SAFETY: PR_GET_TIMERSLACK takes no pointer and touches no memory of ours.
            let got = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
            assert_eq!(got, 1);
        })
        .join()
        .unwrap();
    }
}
