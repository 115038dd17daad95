//! The three timer models behind one interface, so lull can pick one per VM.
//!
//! | model     | who expires global timers of an idle vCPU         | host timers            |
//! |-----------|---------------------------------------------------|------------------------|
//! | `pull`    | a running vCPU that is a migrator (`Hierarchy`)   | one lazy tick per vCPU |
//! | `push`    | the owner, which wakes for every timer            | per vCPU, tracks head  |
//! | `central` | one timer thread for everything, kicking owners   | one for the thread     |
//!
//! A vCPU thread owns one [`CpuTimers`] and calls, in its run loop:
//! [`CpuTimers::run`] at every exit and host tick, [`CpuTimers::idle`] before blocking (it
//! returns the timeout), [`CpuTimers::wake`] after blocking. The VMM keeps the shared
//! [`TimerModel`] for metrics and, for `central`, to drive [`TimerModel::service`] from its
//! timer thread.
//!
//! # Blocking on the host wake-up
//!
//! In `pull` the timeout of a blocked vCPU can move while it sleeps: when it went idle last
//! it holds the wake-up duty of the all-idle VM, and a vCPU that becomes active takes that
//! duty over (see `hierarchy/duty.rs`). A VMM that blocks with the timeout `idle` returned
//! would wake for nothing. So a VMM gives each vCPU a *wake timer* with
//! [`CpuTimers::set_wake_timer`] (a `HostTimer` any thread may arm, e.g. an absolute
//! timerfd) and then blocks until that timer fires or it is kicked, ignoring the timeout:
//!
//! ```text
//!   idle(now)          arms the wake timer for the timeout (it also returns it)
//!   wait               until the wake timer fires or a kick; other threads may re-arm the
//!                      wake timer meanwhile (later, earlier, or off) without waking it
//!   wake(now)          before running guest code (counts the wake-up, empty or not)
//! ```
//! All three models honour the contract (in `push` and `central` nobody else moves it).
//! Between `wake` and the next `idle` the wake timer may still fire: `idle` re-programs it
//! unless its deadline is the same and still ahead (then it has not fired), and re-programming
//! a timerfd clears a stale expiry. A wake timer must accept an absolute deadline in the
//! model's clock, may be armed from any thread while its owner waits on it, and must fire at
//! once for a deadline already past.

mod central;
#[cfg(test)]
#[cfg(not(loom))]
mod coalesce_tests;
mod factory;
mod pull;
mod push;
#[cfg(test)]
#[cfg(not(loom))]
mod slack_tests;
mod sleep;
#[cfg(test)]
#[cfg(not(loom))]
mod sleep_tests;

pub use central::{CentralCpu, CentralModel};
pub use factory::{build, fixed_cpus_config, Model};
pub use pull::{PullCpu, PullModel};
pub use push::{PushCpu, PushModel};
pub use sleep::Sleeper;

use crate::base::{AfterFire, CpuId, Fired, TimerHandle, TimerKind};
use crate::clock::{Nanos, NEVER};
use crate::hierarchy::HierarchyError;
use crate::host::HostTimer;
use crate::metrics::{Metrics, TimerMetrics};

/// The expiry callback: told which CPU's timer fired, returns whether to notify the owner.
pub type OnFire<'a, T> = &'a mut dyn FnMut(Fired<T>) -> AfterFire;

/// The notification hook: kick `cpu` out of KVM_RUN or its blocking wait.
pub trait Waker: Send + Sync {
    /// Kicks `cpu` (a vCPU whose timer fired elsewhere, or a migrator with new work).
    fn wake(&self, cpu: CpuId);
}

impl<F: Fn(CpuId) + Send + Sync> Waker for F {
    fn wake(&self, cpu: CpuId) {
        self(cpu)
    }
}

/// Which model: the one place its name (`--timer-model`, the report's `timer_model`, the
/// bench's modes) is spelt, by [`ModelKind::as_str`]; parsing ([`FromStr`](std::str::FromStr)),
/// serde and (feature `clap`) clap's value enum all go through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ModelKind {
    /// Hierarchical pull of idle CPUs' global timers (the default).
    #[default]
    Pull,
    /// Every CPU programs a host timer for its own head, global timers included.
    Push,
    /// One timer thread expires everything and kicks the owners.
    Central,
}

impl ModelKind {
    /// Every model, in the order the CLI lists them.
    pub const ALL: [Self; 3] = [Self::Pull, Self::Push, Self::Central];
    /// Their names, in that order.
    pub const NAMES: [&'static str; 3] = [
        Self::ALL[0].as_str(),
        Self::ALL[1].as_str(),
        Self::ALL[2].as_str(),
    ];

    /// The model's name (`pull`, `push`, `central`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pull => "pull",
            Self::Push => "push",
            Self::Central => "central",
        }
    }

    /// What the model does, in a line (the help of its CLI value).
    pub const fn summary(self) -> &'static str {
        match self {
            Self::Pull => {
                "Timers queue on the arming vCPU; a halted vCPU's global timers are pulled by \
                 running vCPUs through a hierarchy (Linux's timer-migration model). One host \
                 timer per vCPU"
            }
            Self::Push => {
                "Every vCPU arms a host timer for every timer on its base, global ones included"
            }
            Self::Central => {
                "One VMM timer thread expires all timers and kicks the vCPUs (QEMU-style)"
            }
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ModelKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ModelKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse()
            .map_err(|_| serde::de::Error::unknown_variant(&name, &Self::NAMES))
    }
}

#[cfg(feature = "clap")]
impl clap::ValueEnum for ModelKind {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.as_str()).help(self.summary()))
    }
}

/// Errors from building a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The hierarchy could not be built.
    #[error("cannot build the timer hierarchy")]
    Hierarchy(#[from] HierarchyError),
    /// Unknown model name.
    #[error("unknown timer model {0:?}; use pull, push or central")]
    UnknownModel(String),
}

impl std::str::FromStr for ModelKind {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| ModelError::UnknownModel(s.to_owned()))
    }
}

/// One vCPU's timers, owned by its thread.
pub trait CpuTimers<T>: Send {
    /// The CPU.
    fn cpu(&self) -> CpuId;
    /// Arms a timer on this CPU's base.
    fn arm(&mut self, kind: TimerKind, deadline: Nanos, payload: T) -> TimerHandle;
    /// Cancels a pending timer; `Some` means it will never fire.
    fn cancel(&mut self, h: TimerHandle) -> Option<T>;
    /// Moves a pending timer; false if it already fired or was cancelled.
    fn rearm(&mut self, h: TimerHandle, deadline: Nanos) -> bool;
    /// At an exit or host tick: expires what is due (own timers, and remote ones if this CPU
    /// is a migrator), re-arms the host tick if needed, returns the deadline it must fire by.
    fn run(&mut self, now: Nanos, f: OnFire<'_, T>) -> Nanos;
    /// [`CpuTimers::run`] for a CPU that runs no guest code until its next `run` (a halted
    /// vCPU that polls or blocks next): the same expiries, but a host tick that only
    /// interrupts guest code may be left unprogrammed (`pull`: the next `run` programs it, or
    /// `idle` hands over to the wake-up), which spares "arm the tick, halt, disarm it" at
    /// every timer event. Models whose tick must follow every change keep `run`'s behaviour.
    fn run_halted(&mut self, now: Nanos, f: OnFire<'_, T>) -> Nanos {
        self.run(now, f)
    }
    /// [`CpuTimers::run`], with the host tick set to exactly the next deadline even where it
    /// moved later (`run` leaves a tick armed earlier in place, to fire once for nothing):
    /// for a caller that knows the armed tick is stale and that firing would interrupt guest
    /// code for nothing (a timer handled at an exit before its tick). Models whose tick
    /// follows every change already keep `run`'s behaviour.
    fn run_exact(&mut self, now: Nanos, f: OnFire<'_, T>) -> Nanos {
        self.run(now, f)
    }
    /// Going idle: returns the absolute timeout to block with (`NEVER`: until kicked).
    fn idle(&mut self, now: Nanos) -> Nanos;
    /// The timeout to block with while idle, re-read after arming timers while idle.
    fn idle_timeout(&self) -> Nanos;
    /// Back from idle, before running guest code.
    fn wake(&mut self, now: Nanos);
    /// Gives this CPU a host wake-up timer that [`CpuTimers::idle`] arms and that other
    /// threads may re-arm while the CPU sleeps; the VMM then blocks until it fires or a kick
    /// (see the module docs). Without one, the VMM blocks with the returned timeout.
    fn set_wake_timer(&mut self, timer: Box<dyn HostTimer>);
    /// The deadline the host tick is armed for (`NEVER` if none).
    fn next_deadline(&self) -> Nanos;
}

/// The state shared by all CPUs of a model.
pub trait TimerModel<T>: Send + Sync {
    /// Which model this is.
    fn kind(&self) -> ModelKind;
    /// Counters.
    fn metrics(&self) -> TimerMetrics;
    /// Work for a dedicated timer thread (`central` only): expires what is due, returns the
    /// next deadline. Other models return `NEVER` at once.
    fn service(&self, now: Nanos, f: OnFire<'_, T>) -> Nanos;
    /// Arms a global timer owned by `cpu` from a thread that has no base of its own (the
    /// `central` model's timer thread re-arming what it just fired). Only `central` has such
    /// a thread: the other models refuse (`false`) and their timers are re-armed on a base.
    fn arm_global(&self, cpu: CpuId, deadline: Nanos, payload: T) -> bool;
    /// Lets global timers expire anywhere in `[deadline, deadline + slack]` (see
    /// [`crate::slack`]); set before the CPUs run. `pull` defers a running CPU's host tick
    /// for them to the range's end; the other models keep their timers exact.
    fn set_global_slack(&self, _slack: Nanos) {}
}

/// A host timer armed lazily: only when the deadline moves earlier or the armed one passed.
struct HostTick {
    host: Box<dyn HostTimer>,
    armed: Nanos,
}

impl HostTick {
    fn new(host: Box<dyn HostTimer>) -> Self {
        Self { host, armed: NEVER }
    }

    /// Lazy: re-arm only if `deadline` is earlier than what is armed or the armed one passed.
    fn ensure(&mut self, deadline: Nanos, now: Nanos, m: &Metrics) {
        if deadline < self.armed || (self.armed <= now && deadline != self.armed) {
            self.program(deadline, Some(now), m);
        }
    }

    /// Exact: make the host timer track `deadline` (`now`, if known, may spare a syscall).
    fn track(&mut self, deadline: Nanos, now: Option<Nanos>, m: &Metrics) {
        if deadline != self.armed {
            self.program(deadline, now, m);
        }
    }

    /// Going idle with a host wake-up that takes over: a tick left armed would fire a second
    /// time for a deadline the wake-up already covers (or, in `pull`, for a global timer the
    /// CPU just handed to the hierarchy), interrupting the blocked thread for nothing.
    ///
    /// Call it *after* arming the wake-up. Both are host timers in the host's timer queue,
    /// usually for the same deadline (the CPU's next own timer). Armed first, the wake-up
    /// queues behind the tick, and removing the tick then leaves the host's next expiry where
    /// it was, so Linux programs its clock-event device for neither. In the other order it
    /// programs the device twice: when the removed tick was first in line, and when the
    /// wake-up becomes first. A C loop of the two calls on our hosts (where programming the
    /// device is itself an exit) took 9.3-11.6 us in that order against 1.2-1.5 us in this.
    fn release(&mut self, now: Nanos, m: &Metrics) {
        self.track(NEVER, Some(now), m);
    }

    /// Programs `deadline`; disarming a one-shot tick that has already fired (its deadline
    /// is at or before `now`) needs no syscall: the host disarmed it when it fired.
    fn program(&mut self, deadline: Nanos, now: Option<Nanos>, m: &Metrics) {
        if deadline == NEVER && now.is_some_and(|n| self.armed <= n) {
            self.armed = NEVER;
            return;
        }
        self.set(deadline, m);
    }

    fn set(&mut self, deadline: Nanos, m: &Metrics) {
        self.armed = deadline;
        let ok = if deadline == NEVER {
            self.host.disarm().is_ok()
        } else {
            let ok = self.host.arm(deadline).is_ok();
            m.host_arm(ok);
            ok
        };
        if !ok {
            tracing::warn!(deadline, "host timer programming failed");
        }
    }
}

#[cfg(test)]
#[cfg(not(loom))]
mod tests;
