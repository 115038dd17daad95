//! What [`Sim`](super::Sim) reports when a step breaks a promise: one variant per check.

use crate::base::CpuId;
use crate::clock::Nanos;
use crate::hierarchy::HierarchyError;

/// A promise of the pull model (or the harness's own consistency) that a step broke.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// The model refused the VM's shape.
    #[error("the hierarchy refused the simulated VM: {0}")]
    Build(#[from] HierarchyError),
    /// A timer fired that was never armed or already fired.
    #[error("timer {id} fired twice or was never armed")]
    UnknownFire {
        /// Timer id.
        id: u64,
    },
    /// A cancelled timer fired.
    #[error("cancelled timer {id} fired")]
    FiredAfterCancel {
        /// Timer id.
        id: u64,
    },
    /// A timer fired before its deadline.
    #[error("timer {id} fired early: at {now}, deadline {deadline}")]
    Early {
        /// Timer id.
        id: u64,
        /// Its deadline.
        deadline: Nanos,
        /// When it fired.
        now: Nanos,
    },
    /// A timer fired with another owner, handle or deadline than it was armed with.
    #[error("timer {id} fired as {fired}, armed as {armed}")]
    WrongFire {
        /// Timer id.
        id: u64,
        /// Owner, handle and deadline as armed.
        armed: String,
        /// Owner, handle and deadline as fired.
        fired: String,
    },
    /// A timer was expired remotely although its owner was running, or by its owner.
    #[error("timer {id} of CPU {owner} fired remotely on CPU {runner} while its owner was running or by itself")]
    RemoteOfRunning {
        /// Timer id.
        id: u64,
        /// The CPU that armed it.
        owner: CpuId,
        /// The CPU that expired it.
        runner: CpuId,
    },
    /// Cancelling a pending timer, or re-arming one, failed; or a stale handle worked.
    #[error("{what} of timer {id} returned the wrong result")]
    Handle {
        /// Timer id.
        id: u64,
        /// `cancel`, `rearm`, `stale cancel` or `stale rearm`.
        what: &'static str,
    },
    /// A pending timer's base reports another deadline than it was armed for.
    #[error("timer {id} armed for {armed}, its base says {reported:?}")]
    Deadline {
        /// Timer id.
        id: u64,
        /// The deadline armed.
        armed: Nanos,
        /// What the base reports.
        reported: Option<Nanos>,
    },
    /// The hierarchy's structural invariants are broken.
    #[error("hierarchy invariant broken: {0}")]
    Hierarchy(String),
    /// The hierarchy and the simulation disagree on whether a CPU is idle.
    #[error("CPU {cpu}: idle in the hierarchy {hierarchy}, in the simulation {sim}")]
    IdleState {
        /// The CPU.
        cpu: CpuId,
        /// The hierarchy's view.
        hierarchy: bool,
        /// The simulation's view.
        sim: bool,
    },
    /// A running CPU's host tick is later than something it must expire.
    #[error("CPU {cpu} host tick at {tick} misses its deadline {due}")]
    TickMisses {
        /// The CPU.
        cpu: CpuId,
        /// Its host tick.
        tick: Nanos,
        /// The first local or remote deadline it is responsible for.
        due: Nanos,
    },
    /// A halted CPU's first global timer is not (correctly) queued in its level-0 group.
    #[error("CPU {cpu}'s global timer at {expiry} is not queued under it")]
    NotQueued {
        /// The CPU.
        cpu: CpuId,
        /// Its first global deadline.
        expiry: Nanos,
    },
    /// An idle group's first event is later than a timer below it.
    #[error("group {group} hides CPU {cpu}'s timer at {expiry}")]
    Hidden {
        /// The group.
        group: usize,
        /// The CPU.
        cpu: CpuId,
        /// Its first global deadline.
        expiry: Nanos,
    },
    /// Nobody is running and no halted CPU wakes for the root's first event.
    #[error("CPU {cpu}'s timer at {expiry} is unreachable: nobody wakes for root event {root}")]
    Unreachable {
        /// The CPU.
        cpu: CpuId,
        /// Its first global deadline.
        expiry: Nanos,
        /// The root's first event.
        root: Nanos,
    },
    /// `quick_check` promised a later wake-up than `deactivate` gave.
    #[error("quick_check forecast {forecast} is later than the wakeup {wakeup}")]
    QuickCheckLate {
        /// What `quick_check` said.
        forecast: Nanos,
        /// What the CPU got.
        wakeup: Nanos,
    },
    /// A migrator that just ran still had remote work to do.
    #[error("CPU {cpu} still has remote timers due at {now} after it ran")]
    NoFixedPoint {
        /// The migrator.
        cpu: CpuId,
        /// The time.
        now: Nanos,
    },
    /// The vCPUs kept kicking each other.
    #[error("kick storm: vCPUs keep kicking each other at {now}")]
    KickStorm {
        /// The time.
        now: Nanos,
    },
    /// Time could not advance to the target.
    #[error("no progress advancing to {target}")]
    Stuck {
        /// Where time was going.
        target: Nanos,
    },
    /// Timers still pending after time passed all their deadlines.
    #[error("lost timers (id: deadline): {0:?}")]
    Lost(Vec<(u64, Nanos)>),
    /// Timers that fired after their deadline although time stopped at it.
    #[error("late timers (id, deadline, fired at): {0:?}")]
    Late(Vec<(u64, Nanos, Nanos)>),
}
