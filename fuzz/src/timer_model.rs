//! The `timer` target: the pull model on 1 to 40 vCPUs (groups of 2, 4 or 8, one to three NUMA
//! nodes) driven by arbitrary arm / cancel / re-arm / activate (wake) / deactivate (idle) /
//! handle-remote / clock-advance sequences, with a miniature VMM that honours every kick,
//! host tick and idle timeout as the vCPU loop does.
//!
//! After every step: the hierarchy's structural invariants (`Snapshot::check`); every running
//! CPU's host tick covers its own first timer and the remote events it is migrator for; every
//! idle CPU's first global timer is queued under it and reachable up to an active migrator or
//! a CPU that wakes for the root's first event. Every fire: not early, not twice, not after a
//! cancel, on the right CPU with the right deadline. At the end time runs until nothing is
//! pending: **every timer armed has fired or was cancelled (no lost timer)**, none late.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arbitrary::{Arbitrary, Unstructured};
use timer::hierarchy::HierarchyConfig;
use timer::model::{PullCpu, PullModel};
use timer::{
    AfterFire, CpuId, CpuTimers, FakeHostTimer, Fired, HostTimer, Nanos, RemoteExpiry, TimerHandle,
    TimerKind, Waker, NEVER,
};

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    Arm { cpu: u8, pinned: bool, delta: u16 },
    Cancel { pick: u16 },
    Rearm { pick: u16, delta: u16 },
    Activate { cpu: u8 },
    Deactivate { cpu: u8 },
    HandleRemote { cpu: u8 },
    Advance { delta: u16 },
}

#[derive(Debug, Clone, Copy)]
struct Timer {
    cpu: usize,
    deadline: Nanos,
    handle: TimerHandle,
}

/// A VMM in miniature: vCPUs run, go idle, wake at their timeouts and when kicked.
struct Sim {
    model: Arc<PullModel<u64>>,
    cpus: Vec<PullCpu<u64>>,
    idle: Vec<bool>,
    now: Nanos,
    pending: HashMap<u64, Timer>,
    fired: HashMap<u64, Nanos>,
    cancelled: Vec<u64>,
    ids: Vec<u64>,
    next_id: u64,
    kicks: Arc<Mutex<Vec<CpuId>>>,
    late: Vec<(u64, Nanos, Nanos)>,
}

/// A remote expiry that must never be needed.
struct Nothing;

impl RemoteExpiry for Nothing {
    fn expire_remote(&mut self, cpu: CpuId, now: Nanos) {
        panic!("CPU {cpu} still had due remote timers at {now} after its migrator ran");
    }
    fn next_global(&mut self, _cpu: CpuId) -> Nanos {
        NEVER
    }
}

impl Sim {
    fn new(n: usize, group_size: usize, nodes: usize) -> Self {
        let kicks = Arc::new(Mutex::new(Vec::new()));
        let k = Arc::clone(&kicks);
        let waker: Arc<dyn Waker> = Arc::new(move |c: CpuId| {
            k.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        });
        let config = HierarchyConfig {
            group_size,
            max_cpus: 64,
            ..HierarchyConfig::default()
        };
        let node_of: Vec<usize> = (0..n).map(|i| i % nodes).collect();
        let (model, cpus) = PullModel::with_config(
            config,
            &node_of,
            &mut |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>,
            waker,
        )
        .unwrap_or_else(|e| panic!("hierarchy of {n} CPUs refused: {e}"));
        let mut s = Self {
            model,
            cpus,
            idle: vec![false; n],
            now: 1000,
            pending: HashMap::new(),
            fired: HashMap::new(),
            cancelled: Vec::new(),
            ids: Vec::new(),
            next_id: 0,
            kicks,
            late: Vec::new(),
        };
        for c in 0..n {
            s.run(c);
        }
        s
    }

    /// The vCPU's exit path: expire, handle remote, re-arm the tick.
    fn run(&mut self, c: usize) {
        let now = self.now;
        let (pending, fired, cancelled, late) = (
            &mut self.pending,
            &mut self.fired,
            &self.cancelled,
            &mut self.late,
        );
        self.cpus[c].run(now, &mut |f: Fired<u64>| {
            let id = f.payload;
            let t = pending
                .remove(&id)
                .unwrap_or_else(|| panic!("timer {id} fired twice or unknown"));
            assert!(!cancelled.contains(&id), "cancelled timer {id} fired");
            assert_eq!(
                t.deadline, f.deadline,
                "timer {id} fired with a stale deadline"
            );
            assert_eq!(t.cpu, f.cpu, "timer {id} fired for the wrong CPU");
            assert!(
                now >= f.deadline,
                "timer {id} fired early: {now} < {}",
                f.deadline
            );
            if now > f.deadline {
                late.push((id, f.deadline, now));
            }
            assert!(fired.insert(id, now).is_none());
            if f.remote && id.is_multiple_of(3) {
                AfterFire::NotifyOwner
            } else {
                AfterFire::Done
            }
        });
    }

    /// Wakes an idle vCPU, runs it, and sends it back to idle (a timeout or a kick).
    fn bounce(&mut self, c: usize) {
        self.cpus[c].wake(self.now);
        self.run(c);
        self.cpus[c].idle(self.now);
    }

    fn take_kicks(&self) -> Vec<CpuId> {
        std::mem::take(&mut *self.kicks.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn service_kicks(&mut self) {
        for _ in 0..10_000 {
            let k = self.take_kicks();
            if k.is_empty() {
                return;
            }
            for c in k {
                if self.idle[c] {
                    self.bounce(c);
                } else {
                    self.run(c);
                }
            }
        }
        panic!("kick storm: vCPUs keep kicking each other at {}", self.now);
    }

    /// When the next thing happens: an active vCPU's host tick or an idle one's timeout.
    fn next_event(&self) -> Option<(Nanos, usize)> {
        (0..self.cpus.len())
            .map(|c| {
                let t = if self.idle[c] {
                    self.cpus[c].idle_timeout()
                } else {
                    self.cpus[c].next_deadline()
                };
                (t, c)
            })
            .filter(|&(t, _)| t != NEVER)
            .min()
    }

    fn advance_to(&mut self, target: Nanos) {
        for _ in 0..100_000 {
            self.service_kicks();
            match self.next_event() {
                Some((t, c)) if t <= target => {
                    self.now = self.now.max(t);
                    if self.idle[c] {
                        self.bounce(c);
                    } else {
                        self.run(c);
                    }
                }
                _ => {
                    self.now = self.now.max(target);
                    return;
                }
            }
        }
        panic!("no progress advancing to {target}");
    }

    fn pick(&self, pick: u16) -> Option<u64> {
        (!self.ids.is_empty()).then(|| self.ids[usize::from(pick) % self.ids.len()])
    }

    fn step(&mut self, op: Op) {
        let n = self.cpus.len();
        let model = Arc::clone(&self.model);
        let h = model.hierarchy();
        match op {
            Op::Arm { cpu, pinned, delta } => {
                let c = usize::from(cpu) % n;
                let kind = if pinned {
                    TimerKind::Pinned
                } else {
                    TimerKind::Global
                };
                let id = self.next_id;
                self.next_id += 1;
                let deadline = self.now + u64::from(delta);
                let handle = self.cpus[c].arm(kind, deadline, id);
                self.pending.insert(
                    id,
                    Timer {
                        cpu: c,
                        deadline,
                        handle,
                    },
                );
                self.ids.push(id);
                if !self.idle[c] {
                    self.run(c);
                }
            }
            Op::Cancel { pick } => {
                if let Some(id) = self.pick(pick) {
                    if let Some(t) = self.pending.get(&id).copied() {
                        assert_eq!(self.cpus[t.cpu].cancel(t.handle), Some(id));
                        self.pending.remove(&id);
                        self.cancelled.push(id);
                    }
                }
            }
            Op::Rearm { pick, delta } => {
                if let Some(id) = self.pick(pick) {
                    if let Some(t) = self.pending.get_mut(&id) {
                        t.deadline = self.now + u64::from(delta);
                        let (c, handle, d) = (t.cpu, t.handle, t.deadline);
                        assert!(
                            self.cpus[c].rearm(handle, d),
                            "re-arm of pending timer {id}"
                        );
                        if !self.idle[c] {
                            self.run(c);
                        }
                    }
                }
            }
            Op::Activate { cpu } => {
                let c = usize::from(cpu) % n;
                if self.idle[c] {
                    self.idle[c] = false;
                    self.cpus[c].wake(self.now);
                    self.run(c);
                }
            }
            Op::Deactivate { cpu } => {
                let c = usize::from(cpu) % n;
                if !self.idle[c] {
                    self.run(c);
                    let b = self.cpus[c].base();
                    let reported = if b.next_global() < b.next_pinned() {
                        b.next_global()
                    } else {
                        NEVER
                    };
                    let forecast = h.quick_check(c, reported);
                    self.idle[c] = true;
                    self.cpus[c].idle(self.now);
                    let truth = h.wakeup(c);
                    assert!(
                        forecast <= truth,
                        "quick_check {forecast} later than wakeup {truth}"
                    );
                }
            }
            Op::HandleRemote { cpu } => {
                let c = usize::from(cpu) % n;
                if !self.idle[c] {
                    self.run(c);
                    assert!(!h.requires_handle_remote(c, self.now), "no fixed point");
                    let again = h.handle_remote(c, self.now, &mut Nothing);
                    assert_eq!(again.cpus_expired, 0);
                }
            }
            Op::Advance { delta } => self.advance_to(self.now + u64::from(delta)),
        }
        self.service_kicks();
        self.check();
    }

    /// Every pending global timer of an idle CPU is reachable; every running CPU's tick covers
    /// what it must expire; the tree is consistent.
    fn check(&self) {
        let h = self.model.hierarchy();
        let snap = h.snapshot();
        if let Err(e) = snap.check() {
            panic!("hierarchy invariant broken: {e}");
        }
        for c in 0..self.cpus.len() {
            assert_eq!(snap.cpus[c].idle, self.idle[c], "CPU {c} idle state");
            let b = self.cpus[c].base();
            if !self.idle[c] {
                let must = b.next_expiry().min(h.remote_deadline(c));
                assert!(
                    self.cpus[c].next_deadline() <= must,
                    "CPU {c} tick {} misses {must}",
                    self.cpus[c].next_deadline()
                );
                continue;
            }
            let g = b.next_global();
            if g == NEVER || self.cpus[c].idle_timeout() <= g {
                continue;
            }
            let cs = snap.cpus[c];
            let g0 = &snap.groups[cs.group];
            let e = g0.events.iter().find(|e| e.slot == cs.slot);
            assert!(
                e.is_some_and(|e| e.cpu == c && e.expiry <= g),
                "CPU {c} timer {g} not queued: {e:?}"
            );
            let mut grp = g0;
            loop {
                if grp.state.active != 0 {
                    break;
                }
                assert!(
                    grp.next_expiry <= g,
                    "group {} hides CPU {c}'s timer",
                    grp.id
                );
                match grp.parent {
                    Some((p, _)) => grp = &snap.groups[p],
                    None => {
                        let covered = (0..self.cpus.len()).any(|i| {
                            self.idle[i] && self.cpus[i].idle_timeout() <= grp.next_expiry
                        });
                        assert!(
                            covered,
                            "CPU {c} timer {g} unreachable: nobody wakes for root {}",
                            grp.next_expiry
                        );
                        break;
                    }
                }
            }
        }
    }

    /// Runs time forward until nothing is pending; every timer must have fired exactly once.
    fn drain(&mut self) {
        let last = self
            .pending
            .values()
            .map(|t| t.deadline)
            .max()
            .unwrap_or(self.now);
        self.advance_to(last + 1);
        assert!(self.pending.is_empty(), "lost timers: {:?}", self.pending);
        let accounted = self.fired.len() + self.cancelled.len();
        assert_eq!(u64::try_from(accounted).unwrap_or(u64::MAX), self.next_id);
        assert!(
            self.late.is_empty(),
            "late timers (id, deadline, fired at): {:?}",
            self.late
        );
    }
}

/// Runs one input: the shape (CPUs, group size, nodes), then at most 400 steps, then a drain.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let shape = (|| -> arbitrary::Result<(usize, usize, usize)> {
        let n = usize::from(u.int_in_range(1u8..=40)?);
        let group_size = 1usize << u.int_in_range(1u8..=3)?;
        let nodes = usize::from(u.int_in_range(1u8..=3)?);
        Ok((n, group_size, nodes))
    })();
    let Ok((n, group_size, nodes)) = shape else {
        return;
    };
    let mut sim = Sim::new(n, group_size, nodes);
    for _ in 0..400 {
        let Ok(op) = u.arbitrary::<Op>() else {
            break;
        };
        sim.step(op);
        if u.is_empty() {
            break;
        }
    }
    sim.drain();
}
