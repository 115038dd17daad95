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
//!   ([`HierarchyDump::check`](crate::hierarchy::HierarchyDump::check)); the hierarchy and the
//!   simulation agree on who is idle; a running vCPU's host tick covers its own first timer
//!   and the remote events it is migrator for; a halted vCPU's first global timer is queued
//!   under it and reachable up to an active migrator or a vCPU that wakes for the root's
//!   first event; every pending timer's base reports the deadline it was armed for. Stale
//!   handles (fired or cancelled timers) cancel and re-arm nothing.
//! * At the end ([`Sim::drain`]): time runs until nothing is pending, and **every timer armed
//!   fired exactly once or was cancelled (no lost timer)**, none late.
//!
//! After a [`Violation`] the simulation is in an unknown state: stop using it.

mod ledger;
mod violation;

use std::sync::{Arc, Mutex, PoisonError};

pub use self::ledger::ExpiryLog;
use self::ledger::{Armed, Ledger};
pub use self::violation::Violation;
use crate::base::{AfterFire, CpuId, Fired, TimerKind};
use crate::clock::{Nanos, NEVER};
use crate::hierarchy::{HierarchyConfig, NodeId};
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
        let mut left = ExpiryLog::default();
        let again = h.handle_remote(c, self.now, &mut left);
        if again.cpus_expired != 0 || !left.0.is_empty() {
            return Err(no_fixed_point);
        }
        Ok(())
    }

    /// Every invariant that must hold between steps (see the module docs).
    pub fn check(&self) -> Result<(), Violation> {
        let h = self.model.hierarchy();
        let snap = h.dump();
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
