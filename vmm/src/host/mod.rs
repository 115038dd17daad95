//! lull's side of the host: every system call without a safe wrapper ([`sys`], the only place
//! the compiler lets hold `unsafe`), the seccomp filters of lull's threads ([`seccomp`]), what
//! the host saw of a run ([`stats`]), the guest's console on the host terminal
//! ([`console`]), and how lull opens the files it writes and the snapshot files it reads
//! ([`files`]).

pub mod console;
pub mod files;
pub mod pty;
pub mod seccomp;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
