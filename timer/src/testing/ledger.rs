//! The ledger of the simulated VMM: every timer's fate (pending, fired when, or cancelled),
//! and the check of each fire against what was armed.

use std::collections::{HashMap, HashSet};

use super::Violation;
use crate::base::{CpuId, Fired, TimerHandle};
use crate::clock::{Nanos, NEVER};
use crate::hierarchy::RemoteExpiry;

/// One armed timer as the ledger knows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Armed {
    pub(super) cpu: CpuId,
    pub(super) deadline: Nanos,
    pub(super) handle: TimerHandle,
}

/// Every timer's fate: pending, fired (when) or cancelled.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Every timer ever armed, by id (ids are dense from 0); deadlines kept current.
    pub(super) armed: Vec<Armed>,
    /// Armed, not yet fired or cancelled.
    pub(super) pending: HashSet<u64>,
    /// Fired, and when.
    pub(super) fired: HashMap<u64, Nanos>,
    /// Cancelled while pending.
    pub(super) cancelled: HashSet<u64>,
    /// Fired after their deadline: (id, deadline, when).
    pub(super) late: Vec<(u64, Nanos, Nanos)>,
}

impl Ledger {
    /// Checks and records one fire on `runner` at `now`; `idle` is the simulation's view.
    pub(super) fn fire(
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

/// A [`RemoteExpiry`] that only records which CPUs it was asked to expire (and knows of no
/// further timers): for tests of [`Hierarchy::handle_remote`](crate::Hierarchy::handle_remote)
/// on its own, and to check that a migrator that just ran has nothing left to expire.
#[derive(Debug, Default)]
pub struct ExpiryLog(pub Vec<CpuId>);

impl RemoteExpiry for ExpiryLog {
    fn expire_remote(&mut self, cpu: CpuId, _now: Nanos) {
        self.0.push(cpu);
    }
    fn next_global(&mut self, _cpu: CpuId) -> Nanos {
        NEVER
    }
}
