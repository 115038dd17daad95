//! Property tests of the pending-NMI rules: random NMIs and fixed IPIs sent to a LAPIC, driven
//! the way lull's vCPU loop drives it, into a CPU that handles NMIs as KVM does.
//!
//! [`Cpu`] is KVM's side (`kvm_inject_nmi` counts in `nmi_queued`, `process_nmi` folds that
//! into `nmi_pending` with a limit of 2, or 1 while an NMI is in service) and the guest's
//! order of handlers: an interrupt the VMM hands over is queued as injected and goes ahead of
//! pending NMIs, as KVM re-injects it first. The checks:
//! - never more than [`MAX_PENDING_NMIS`] outstanding in the LAPIC, nor in the CPU, nor more
//!   than one pending while one is in service;
//! - an NMI sent while fewer than the limit are outstanding is never lost: every such NMI is
//!   handled once the guest has had its entries and IRETs;
//! - a fixed interrupt's handler runs only after every such NMI sent before it.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::super::{DeliveryMode, Ipi, Lapic, LapicConfig};
use super::{CpuNmi, MAX_PENDING_NMIS};

const EOI: u64 = 0xB0;
const SVR: u64 = 0xF0;

#[derive(Debug, Clone, Copy)]
enum Op {
    /// An NMI IPI reaches the LAPIC.
    SendNmi,
    /// A fixed IPI with this vector reaches the LAPIC.
    SendFixed(u8),
    /// The VMM's pass before an entry, then the entry.
    Entry,
    /// The guest's NMI handler returns (IRET ends NMI blocking).
    Iret,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::SendNmi),
        2 => (0x4u8..0xC).prop_map(|class| Op::SendFixed(class << 4)),
        3 => Just(Op::Entry),
        2 => Just(Op::Iret),
    ]
}

/// What the guest ran, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    Nmi,
    Fixed(u8),
}

/// KVM's NMI state for one vCPU and the guest's handlers.
#[derive(Debug, Default)]
struct Cpu {
    /// `nmi_queued`: `KVM_NMI` calls not yet processed.
    queued: u32,
    /// `nmi_pending`.
    pending: u32,
    /// NMI blocking: the guest is in its NMI handler (IF is clear there).
    in_service: bool,
    /// An interrupt the VMM handed over, queued as injected.
    injected: Option<u8>,
    handled: Vec<Handled>,
}

impl Cpu {
    /// `process_nmi`.
    fn process_nmi(&mut self) {
        let limit = if self.in_service { 1 } else { 2 };
        self.pending = (self.pending + std::mem::take(&mut self.queued)).min(limit);
    }

    /// `KVM_GET_VCPU_EVENTS`, as lull reads it.
    fn report(&mut self) -> CpuNmi {
        self.process_nmi();
        match (self.pending, self.in_service) {
            (0, _) => CpuNmi::None,
            (_, true) => CpuNmi::Blocked,
            (_, false) => CpuNmi::Deliverable,
        }
    }

    /// The guest can take an external interrupt (its NMI handler runs with IF clear).
    fn can_inject(&self) -> bool {
        !self.in_service && self.injected.is_none()
    }

    /// One entry: an injected interrupt first (its handler runs and EOIs), else an NMI if
    /// not blocked.
    fn enter(&mut self) -> Option<Handled> {
        self.process_nmi();
        if let Some(v) = self.injected.take() {
            self.handled.push(Handled::Fixed(v));
            return Some(Handled::Fixed(v));
        }
        if self.pending > 0 && !self.in_service {
            self.pending -= 1;
            self.in_service = true;
            self.handled.push(Handled::Nmi);
            return Some(Handled::Nmi);
        }
        None
    }
}

/// The test's own record of what must happen.
#[derive(Debug, Default)]
struct Record {
    sent: u32,
    /// NMIs sent while fewer than the limit were outstanding: none of them may be lost.
    owed: u32,
    /// Per pending fixed vector: `owed` when it was sent (its handler must come after as many
    /// NMIs).
    fixed_after: BTreeMap<u8, u32>,
}

fn nmi_ipi() -> Ipi {
    Ipi {
        delivery_mode: DeliveryMode::Nmi,
        ..Ipi::fixed(0, 0)
    }
}

fn step(lapic: &mut Lapic, cpu: &mut Cpu, rec: &mut Record, op: Op) -> Result<(), TestCaseError> {
    match op {
        Op::SendNmi => {
            let outstanding = lapic.nmis.pending() + cpu.queued + cpu.pending;
            let limit = if cpu.in_service { 1 } else { 2 };
            rec.sent += 1;
            if outstanding < limit {
                rec.owed += 1;
            }
            prop_assert!(lapic.receive(&nmi_ipi()));
        }
        Op::SendFixed(v) => {
            rec.fixed_after.entry(v).or_insert(rec.owed);
            prop_assert!(lapic.receive(&Ipi::fixed(v, 0)));
        }
        Op::Entry => {
            let handed = lapic.take_nmi();
            prop_assert!(handed <= MAX_PENDING_NMIS);
            cpu.queued += handed;
            if lapic.nmi_in_cpu() {
                lapic.cpu_nmi(cpu.report());
            }
            if cpu.can_inject() {
                if let Some(v) = lapic.injectable_interrupt() {
                    lapic.interrupt_injected(v);
                    cpu.injected = Some(v);
                }
            }
            if let Some(Handled::Fixed(v)) = cpu.enter() {
                let nmis = cpu.handled.iter().filter(|h| **h == Handled::Nmi).count();
                let after = rec.fixed_after.remove(&v).unwrap_or(0);
                prop_assert!(
                    u32::try_from(nmis).unwrap_or(u32::MAX) >= after,
                    "fixed {:#x} handled after {} NMIs, sent after {} that must come first: {:?}",
                    v,
                    nmis,
                    after,
                    cpu.handled
                );
                let _ = lapic.write_mmio(EOI, &0u32.to_le_bytes(), 0);
            }
        }
        Op::Iret => cpu.in_service = false,
    }
    prop_assert!(lapic.nmis.pending() <= MAX_PENDING_NMIS);
    let limit = if cpu.in_service { 1 } else { 2 };
    prop_assert!(
        cpu.pending <= limit,
        "{} pending, in service: {}",
        cpu.pending,
        cpu.in_service
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn nmis_are_capped_never_lost_under_the_cap_and_go_before_later_fixed_ipis(
        ops in prop::collection::vec(op(), 1..120)
    ) {
        let mut lapic = Lapic::new(LapicConfig::default()).unwrap();
        let _ = lapic.write_mmio(SVR, &0x1FFu32.to_le_bytes(), 0);
        let mut cpu = Cpu::default();
        let mut rec = Record::default();
        for op in ops {
            step(&mut lapic, &mut cpu, &mut rec, op)?;
        }
        // Let the guest finish: IRETs and entries until nothing is left anywhere.
        for _ in 0..16 {
            step(&mut lapic, &mut cpu, &mut rec, Op::Iret)?;
            step(&mut lapic, &mut cpu, &mut rec, Op::Entry)?;
        }
        prop_assert_eq!(lapic.nmis.pending() + cpu.queued + cpu.pending, 0);
        prop_assert!(lapic.next_interrupt().is_none());
        let nmis = u32::try_from(cpu.handled.iter().filter(|h| **h == Handled::Nmi).count())
            .unwrap_or(u32::MAX);
        prop_assert!(nmis >= rec.owed, "{} NMIs handled, {} owed: {:?}", nmis, rec.owed, cpu.handled);
        prop_assert!(nmis <= rec.sent);
    }
}
