//! A VMM in miniature for testing the pull model without KVM (feature `testing`; the crate's
//! own tests always have it): the property tests in `model/tests.rs` and the `timer` fuzz
//! target (`fuzz/src/timer_model.rs`) drive the same harness, so both check the same promises.
//!
//! # Model
//!
//! ```text
//!   Op ──► Sim::step ──► PullCpu::{arm, cancel, rearm, wake, idle, run}
//!                          │
//!       Waker kicks ───────┤  service_kicks: a kicked idle vCPU wakes, runs its timers and
//!                          │  halts again ("bounce"); a kicked running one runs its timers
//!       host ticks and ────┤  advance_to: the simulated clock jumps to the earliest host tick
//!       idle timeouts      │  of a running vCPU or idle timeout of a halted one, which runs
//!                          ▼
//!                Sim::check after every step, Sim::drain at the end
//! ```
//!
//! Time is a plain counter (`now`, nanoseconds) that only moves forward, like
//! [`FakeClock`](crate::FakeClock). Each vCPU is running or halted (`idle`), exactly as the
//! vCPU loop of the VMM drives a [`CpuTimers`]: a running vCPU runs its timers at every step
//! that concerns it and at its host tick; a halted one only at its idle timeout or when
//! kicked. Timers carry their id (`u64`) as payload; a ledger follows every timer's fate.
//!
//! # What is checked
//!
//! * Every fire: the timer is pending (not fired twice, not cancelled), not early, on behalf
//!   of the CPU that armed it, with the handle and deadline it was (re-)armed with; a remote
//!   fire is of a halted vCPU's timer, run by another vCPU.
//! * After every step ([`Sim::check`]): the hierarchy's structural invariants
//!   ([`Snapshot::check`](crate::hierarchy::Snapshot::check)); the hierarchy and the
//!   simulation agree on who is idle; a running vCPU's host tick covers its own first timer
//!   and the remote events it is migrator for; a halted vCPU's first global timer is queued
//!   under it and reachable up to an active migrator or a vCPU that wakes for the root's
//!   first event; every pending timer's base reports the deadline it was armed for. Stale
//!   handles (fired or cancelled timers) cancel and re-arm nothing.
//! * At the end ([`Sim::drain`]): time runs until nothing is pending, and **every timer armed
//!   fired exactly once or was cancelled (no lost timer)**, none late.
//!
//! After a [`Violation`] the simulation is in an unknown state: stop using it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use crate::base::{AfterFire, CpuId, Fired, TimerHandle, TimerKind};
use crate::clock::{Nanos, NEVER};
use crate::hierarchy::{HierarchyConfig, HierarchyError, NodeId, RemoteExpiry};
use crate::host::{FakeHostTimer, HostTimer};
use crate::model::{CpuTimers, PullCpu, PullModel, Waker};

/// Kick rounds [`Sim`] serves before it calls the vCPUs' kicking of each other a storm.
const MAX_KICK_ROUNDS: usize = 10_000;
/// Events [`Sim::advance_to`] runs before it calls time stuck.
const MAX_EVENTS_PER_ADVANCE: usize = 100_000;

/// One thing that happens to the simulated VM. CPU numbers are taken modulo the VM's CPUs and
/// `pick` modulo the timers armed so far, so any value is meaningful.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `cpu` arms a pinned or global timer `delta` ns from now.
    Arm {
        /// Arming vCPU.
        cpu: usize,
        /// Pinned (LAPIC-like) rather than global (device-like).
        pinned: bool,
        /// Distance of the deadline from now.
        delta: Nanos,
    },
    /// The owner cancels a timer; if it already fired or was cancelled, its stale handle
    /// must do nothing.
    Cancel {
        /// Which timer, by arming order.
        pick: usize,
    },
    /// The owner moves a timer to `delta` ns from now (a stale handle must do nothing).
    Rearm {
        /// Which timer, by arming order.
        pick: usize,
        /// Distance of the new deadline from now.
        delta: Nanos,
    },
    /// A halted vCPU wakes (an interrupt came) and runs its timers.
    Activate {
        /// The vCPU.
        cpu: usize,
    },
    /// A running vCPU runs its timers and halts.
    Deactivate {
        /// The vCPU.
        cpu: usize,
    },
    /// A running vCPU runs its timers; afterwards it must have nothing remote left to do.
    HandleRemote {
        /// The vCPU.
        cpu: usize,
    },
    /// The clock moves `delta` ns forward, honouring every host tick and idle timeout.
    Advance {
        /// How far.
        delta: Nanos,
    },
}

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

/// One armed timer as the ledger knows it.
#[derive(Debug, Clone, Copy)]
struct Armed {
    cpu: CpuId,
    deadline: Nanos,
    handle: TimerHandle,
}

/// Every timer's fate: pending, fired (when) or cancelled.
#[derive(Debug, Default)]
struct Ledger {
    /// Every timer ever armed, by id (ids are dense from 0); deadlines kept current.
    armed: Vec<Armed>,
    pending: HashSet<u64>,
    fired: HashMap<u64, Nanos>,
    cancelled: HashSet<u64>,
    late: Vec<(u64, Nanos, Nanos)>,
}

impl Ledger {
    /// Checks and records one fire on `runner` at `now`; `idle` is the simulation's view.
    fn fire(
        &mut self,
        f: &Fired<u64>,
        runner: CpuId,
        now: Nanos,
        idle: &[bool],
    ) -> Result<(), Violation> {
        let id = f.payload;
        if self.cancelled.contains(&id) {
            return Err(Violation::FiredAfterCancel { id });
        }
        if !self.pending.remove(&id) {
            return Err(Violation::UnknownFire { id });
        }
        let t = usize::try_from(id)
            .ok()
            .and_then(|i| self.armed.get(i))
            .copied()
            .ok_or(Violation::UnknownFire { id })?;
        if (t.cpu, t.handle, t.deadline) != (f.cpu, f.handle, f.deadline) {
            return Err(Violation::WrongFire {
                id,
                armed: format!("{:?}", (t.cpu, t.handle, t.deadline)),
                fired: format!("{:?}", (f.cpu, f.handle, f.deadline)),
            });
        }
        if now < f.deadline {
            return Err(Violation::Early {
                id,
                deadline: f.deadline,
                now,
            });
        }
        if f.remote && (f.cpu == runner || !idle.get(f.cpu).copied().unwrap_or(false)) {
            return Err(Violation::RemoteOfRunning {
                id,
                owner: f.cpu,
                runner,
            });
        }
        if now > f.deadline {
            self.late.push((id, f.deadline, now));
        }
        self.fired.insert(id, now);
        Ok(())
    }
}

/// A remote expiry that must never be needed: records whom it was asked to expire.
#[derive(Default)]
struct NothingLeft(Vec<CpuId>);

impl RemoteExpiry for NothingLeft {
    fn expire_remote(&mut self, cpu: CpuId, _now: Nanos) {
        self.0.push(cpu);
    }
    fn next_global(&mut self, _cpu: CpuId) -> Nanos {
        NEVER
    }
}

/// The simulated VM: the pull model, its vCPUs, who is halted, the clock and the ledger.
pub struct Sim {
    model: Arc<PullModel<u64>>,
    cpus: Vec<PullCpu<u64>>,
    idle: Vec<bool>,
    now: Nanos,
    kicks: Arc<Mutex<Vec<CpuId>>>,
    ledger: Ledger,
}

impl Sim {
    /// A VM with one vCPU per entry of `nodes` (its NUMA node), all running, at time 1000.
    pub fn new(config: HierarchyConfig, nodes: &[NodeId]) -> Result<Self, Violation> {
        let kicks = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&kicks);
        let waker: Arc<dyn Waker> = Arc::new(move |c: CpuId| {
            log.lock().unwrap_or_else(PoisonError::into_inner).push(c);
        });
        let (model, cpus) = PullModel::with_config(
            config,
            nodes,
            &mut |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>,
            waker,
        )?;
        let mut sim = Self {
            model,
            cpus,
            idle: vec![false; nodes.len()],
            now: 1000,
            kicks,
            ledger: Ledger::default(),
        };
        for c in 0..nodes.len() {
            sim.run(c)?;
        }
        Ok(sim)
    }

    /// The model, for its metrics and hierarchy.
    pub fn model(&self) -> &Arc<PullModel<u64>> {
        &self.model
    }

    /// The simulated time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// When timer `id` (the `id`-th armed, from 0) fired, if it did.
    pub fn fired_at(&self, id: u64) -> Option<Nanos> {
        self.ledger.fired.get(&id).copied()
    }

    /// Timers fired so far.
    pub fn fired(&self) -> usize {
        self.ledger.fired.len()
    }

    /// Timers armed so far.
    pub fn armed(&self) -> usize {
        self.ledger.armed.len()
    }

    /// Whether vCPU `cpu` is halted.
    pub fn is_idle(&self, cpu: CpuId) -> bool {
        self.idle[cpu]
    }

    /// The vCPU's exit path: expire its timers (and, as migrator, remote ones), re-arm its
    /// host tick. A remote fire of id divisible by 3 asks for the owner to be notified.
    fn run(&mut self, c: CpuId) -> Result<(), Violation> {
        let (now, ledger, idle) = (self.now, &mut self.ledger, &self.idle);
        let mut broken = None;
        self.cpus[c].run(now, &mut |f: Fired<u64>| {
            if let Err(v) = ledger.fire(&f, c, now, idle) {
                broken.get_or_insert(v);
            }
            if f.remote && f.payload.is_multiple_of(3) {
                AfterFire::NotifyOwner
            } else {
                AfterFire::Done
            }
        });
        broken.map_or(Ok(()), Err)
    }

    /// A halted vCPU wakes (its timeout or a kick), runs its timers and halts again.
    fn bounce(&mut self, c: CpuId) -> Result<(), Violation> {
        self.cpus[c].wake(self.now);
        self.run(c)?;
        self.cpus[c].idle(self.now);
        Ok(())
    }

    /// Runs (or bounces) vCPU `c`, whichever its state calls for.
    fn serve(&mut self, c: CpuId) -> Result<(), Violation> {
        if self.idle[c] {
            self.bounce(c)
        } else {
            self.run(c)
        }
    }

    fn take_kicks(&self) -> Vec<CpuId> {
        std::mem::take(&mut *self.kicks.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Honours kicks until none is left.
    fn service_kicks(&mut self) -> Result<(), Violation> {
        for _ in 0..MAX_KICK_ROUNDS {
            let kicked = self.take_kicks();
            if kicked.is_empty() {
                return Ok(());
            }
            for c in kicked {
                self.serve(c)?;
            }
        }
        Err(Violation::KickStorm { now: self.now })
    }

    /// When the next thing happens: a running vCPU's host tick or a halted one's timeout.
    fn next_event(&self) -> Option<(Nanos, CpuId)> {
        self.cpus
            .iter()
            .enumerate()
            .map(|(c, cpu)| {
                let t = if self.idle[c] {
                    cpu.idle_timeout()
                } else {
                    cpu.next_deadline()
                };
                (t, c)
            })
            .filter(|&(t, _)| t != NEVER)
            .min()
    }

    /// Moves the clock to `target`, running every host tick and idle timeout on the way.
    pub fn advance_to(&mut self, target: Nanos) -> Result<(), Violation> {
        for _ in 0..MAX_EVENTS_PER_ADVANCE {
            self.service_kicks()?;
            match self.next_event() {
                Some((t, c)) if t <= target => {
                    self.now = self.now.max(t);
                    self.serve(c)?;
                }
                _ => {
                    self.now = self.now.max(target);
                    return Ok(());
                }
            }
        }
        Err(Violation::Stuck { target })
    }

    /// The id of the `pick`-th timer (modulo the timers armed), if any was armed.
    fn pick(&self, pick: usize) -> Option<u64> {
        let n = self.ledger.armed.len();
        (n > 0).then(|| u64::try_from(pick % n).unwrap_or(u64::MAX))
    }

    /// Applies one operation, serves the kicks it caused and checks everything.
    pub fn step(&mut self, op: Op) -> Result<(), Violation> {
        let n = self.cpus.len();
        match op {
            Op::Arm { cpu, pinned, delta } => {
                let c = cpu % n;
                let kind = if pinned {
                    TimerKind::Pinned
                } else {
                    TimerKind::Global
                };
                let id = u64::try_from(self.ledger.armed.len()).unwrap_or(u64::MAX);
                let deadline = self.now.saturating_add(delta);
                let handle = self.cpus[c].arm(kind, deadline, id);
                self.ledger.armed.push(Armed {
                    cpu: c,
                    deadline,
                    handle,
                });
                self.ledger.pending.insert(id);
                if !self.idle[c] {
                    self.run(c)?;
                }
            }
            Op::Cancel { pick } => {
                if let Some(id) = self.pick(pick) {
                    self.cancel(id)?;
                }
            }
            Op::Rearm { pick, delta } => {
                if let Some(id) = self.pick(pick) {
                    self.rearm(id, self.now.saturating_add(delta))?;
                }
            }
            Op::Activate { cpu } => {
                let c = cpu % n;
                if self.idle[c] {
                    self.idle[c] = false;
                    self.cpus[c].wake(self.now);
                    self.run(c)?;
                }
            }
            Op::Deactivate { cpu } => {
                let c = cpu % n;
                if !self.idle[c] {
                    self.halt(c)?;
                }
            }
            Op::HandleRemote { cpu } => {
                let c = cpu % n;
                if !self.idle[c] {
                    self.run(c)?;
                    self.nothing_remote_left(c)?;
                }
            }
            Op::Advance { delta } => self.advance_to(self.now.saturating_add(delta))?,
        }
        self.service_kicks()?;
        self.check()
    }

    /// Cancels timer `id` through its owner; a fired or cancelled one's stale handle must
    /// cancel nothing.
    fn cancel(&mut self, id: u64) -> Result<(), Violation> {
        let t = self.armed_timer(id)?;
        let pending = self.ledger.pending.contains(&id);
        let got = self.cpus[t.cpu].cancel(t.handle);
        match (pending, got) {
            (true, Some(p)) if p == id => {
                self.ledger.pending.remove(&id);
                self.ledger.cancelled.insert(id);
                Ok(())
            }
            (false, None) => Ok(()),
            (true, _) => Err(Violation::Handle { id, what: "cancel" }),
            (false, Some(_)) => Err(Violation::Handle {
                id,
                what: "stale cancel",
            }),
        }
    }

    /// Moves timer `id` to `deadline` through its owner; a stale handle must move nothing.
    fn rearm(&mut self, id: u64, deadline: Nanos) -> Result<(), Violation> {
        let t = self.armed_timer(id)?;
        let pending = self.ledger.pending.contains(&id);
        let moved = self.cpus[t.cpu].rearm(t.handle, deadline);
        match (pending, moved) {
            (true, true) => {
                if let Some(a) = usize::try_from(id)
                    .ok()
                    .and_then(|i| self.ledger.armed.get_mut(i))
                {
                    a.deadline = deadline;
                }
                if !self.idle[t.cpu] {
                    self.run(t.cpu)?;
                }
                Ok(())
            }
            (false, false) => Ok(()),
            (true, false) => Err(Violation::Handle { id, what: "rearm" }),
            (false, true) => Err(Violation::Handle {
                id,
                what: "stale rearm",
            }),
        }
    }

    fn armed_timer(&self, id: u64) -> Result<Armed, Violation> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.ledger.armed.get(i))
            .copied()
            .ok_or(Violation::UnknownFire { id })
    }

    /// A running vCPU runs its timers and halts; the hierarchy's `quick_check` forecast
    /// beforehand must not be later than the wakeup it then gets.
    fn halt(&mut self, c: CpuId) -> Result<(), Violation> {
        self.run(c)?;
        let b = self.cpus[c].base();
        let reported = if b.next_global() < b.next_pinned() {
            b.next_global()
        } else {
            NEVER
        };
        let forecast = self.model.hierarchy().quick_check(c, reported);
        self.idle[c] = true;
        self.cpus[c].idle(self.now);
        let wakeup = self.model.hierarchy().wakeup(c);
        if forecast > wakeup {
            return Err(Violation::QuickCheckLate { forecast, wakeup });
        }
        Ok(())
    }

    /// After running, a migrator has reached the fixed point: nothing remote is due.
    fn nothing_remote_left(&self, c: CpuId) -> Result<(), Violation> {
        let h = self.model.hierarchy();
        let no_fixed_point = Violation::NoFixedPoint {
            cpu: c,
            now: self.now,
        };
        if h.requires_handle_remote(c, self.now) {
            return Err(no_fixed_point);
        }
        let mut left = NothingLeft::default();
        let again = h.handle_remote(c, self.now, &mut left);
        if again.cpus_expired != 0 || !left.0.is_empty() {
            return Err(no_fixed_point);
        }
        Ok(())
    }

    /// Every invariant that must hold between steps (see the module docs).
    pub fn check(&self) -> Result<(), Violation> {
        let h = self.model.hierarchy();
        let snap = h.snapshot();
        snap.check().map_err(Violation::Hierarchy)?;
        for &id in &self.ledger.pending {
            let t = self.armed_timer(id)?;
            let reported = self.cpus[t.cpu].base().deadline(t.handle);
            if reported != Some(t.deadline) {
                return Err(Violation::Deadline {
                    id,
                    armed: t.deadline,
                    reported,
                });
            }
        }
        for (c, cpu) in self.cpus.iter().enumerate() {
            if snap.cpus[c].idle != self.idle[c] {
                return Err(Violation::IdleState {
                    cpu: c,
                    hierarchy: snap.cpus[c].idle,
                    sim: self.idle[c],
                });
            }
            let b = cpu.base();
            if !self.idle[c] {
                let due = b.next_expiry().min(h.remote_deadline(c));
                let tick = cpu.next_deadline();
                if tick > due {
                    return Err(Violation::TickMisses { cpu: c, tick, due });
                }
                continue;
            }
            let expiry = b.next_global();
            if expiry == NEVER || cpu.idle_timeout() <= expiry {
                continue;
            }
            // Queued at level 0 under its true owner, no later than the timer ...
            let cs = snap.cpus[c];
            let g0 = &snap.groups[cs.group];
            let queued = g0.events.iter().find(|e| e.slot == cs.slot);
            if !queued.is_some_and(|e| e.cpu == c && e.expiry <= expiry) {
                return Err(Violation::NotQueued { cpu: c, expiry });
            }
            // ... and up to a group with an active migrator, or the root's wakeup.
            let mut grp = g0;
            while grp.state.active == 0 {
                if grp.next_expiry > expiry {
                    return Err(Violation::Hidden {
                        group: grp.id,
                        cpu: c,
                        expiry,
                    });
                }
                match grp.parent {
                    Some((p, _)) => grp = &snap.groups[p],
                    None => {
                        let root = grp.next_expiry;
                        let covered = self
                            .cpus
                            .iter()
                            .enumerate()
                            .any(|(i, o)| self.idle[i] && o.idle_timeout() <= root);
                        if !covered {
                            return Err(Violation::Unreachable {
                                cpu: c,
                                expiry,
                                root,
                            });
                        }
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs time past the last pending deadline: every timer must have fired exactly once or
    /// been cancelled, and none late.
    pub fn drain(&mut self) -> Result<(), Violation> {
        let last = self
            .ledger
            .pending
            .iter()
            .filter_map(|&id| self.armed_timer(id).ok())
            .map(|t| t.deadline)
            .max()
            .unwrap_or(self.now);
        self.advance_to(last.saturating_add(1))?;
        if !self.ledger.pending.is_empty() {
            let mut lost: Vec<(u64, Nanos)> = self
                .ledger
                .pending
                .iter()
                .filter_map(|&id| self.armed_timer(id).ok().map(|t| (id, t.deadline)))
                .collect();
            lost.sort_unstable();
            return Err(Violation::Lost(lost));
        }
        if !self.ledger.late.is_empty() {
            return Err(Violation::Late(self.ledger.late.clone()));
        }
        Ok(())
    }
}
