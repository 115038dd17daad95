//! lull's side of the host: every system call without a safe wrapper ([`sys`], the only place
//! the compiler lets hold `unsafe`), the seccomp filters of lull's threads ([`seccomp`]), what
//! the host saw of a run ([`stats`]), and the guest's console on the host terminal
//! ([`console`]).

pub mod console;
pub mod seccomp;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
