//! Every `unsafe` of lull, behind small safe functions. Nothing above this module calls libc
//! or a raw ioctl directly, so an audit of lull's unsafety reads these files and nothing else.
//!
//! - [`clock`]: reading CLOCK_MONOTONIC.
//! - [`kick`]: the real-time signal that kicks a vCPU thread out of KVM_RUN
//!   (`kvm_run.immediate_exit` set from the handler), thread ids, `tgkill`.
//! - [`posix_timer`]: a per-thread POSIX timer that signals its own thread (a vCPU's host tick).
//! - [`timerfd`]: an absolute CLOCK_MONOTONIC timerfd (the `central` model's timer thread).
//! - [`kvm`]: the KVM calls kvm-ioctls does not wrap (KVM_INTERRUPT, KVM_GET_STATS_FD), the
//!   memory-slot registration and the exit union's internal-error member.
//! - [`poll`]: a blocked vCPU's wait on its kick eventfd and wake-up timerfd.
//! - [`peek`]: what waits in an API connection's receive queue, left there.
//! - [`stop_signals`]: SIGINT/SIGTERM/SIGHUP handlers that wake the VMM thread.
//! - [`terminal`]: raw mode for a terminal on stdin.
//! - [`thread`]: per-thread knobs (timer slack).
//! - [`affinity`]: the host CPU a thread runs on, and binding it to one (wake placement).
//! - [`huge_text`]: lull's own machine code moved onto 2 MiB pages at start-up.
//! - [`tap`]: attaching to a host tap device (`TUNSETIFF`) for virtio-net, or taking one
//!   from an fd (`TUNGETIFF`).
//! - [`fds`]: descriptors known only by number (inherited, or named by a `NetConfig`).
//! - [`scm`]: reading the API socket with the descriptors sent along (`SCM_RIGHTS`).
//! - [`listener`]: the inherited API socket, checked to be a listening Unix stream socket.

pub mod affinity;
pub mod clock;
pub mod fds;
pub mod huge_text;
pub mod kick;
pub mod kvm;
pub mod listener;
pub mod peek;
pub mod poll;
pub mod posix_timer;
pub mod scm;
pub mod stop_signals;
pub mod tap;
pub mod terminal;
pub mod thread;
pub mod timerfd;

#[cfg(test)]
mod seccomp_tests;
#[cfg(test)]
mod wait_timerfd_tests;
