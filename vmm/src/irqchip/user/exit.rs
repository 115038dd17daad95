//! Exits that only reach lull without an in-kernel irqchip: LAPIC and IOAPIC MMIO, LAPIC and
//! other MSRs, interrupt windows, CR8 lowered (`KVM_EXIT_SET_TPR`). A free function over the
//! exit, testable with a real `Lapic` and no KVM; every other exit is given back to the generic
//! handler (`vcpu::exit`).
//!
//! An MSR access that is not the LAPIC's reaches lull because KVM would fault on it; the exit's
//! reason says why, and the log line says it: `UNKNOWN`, KVM does not know the MSR; `INVAL`,
//! KVM knows it but refused this access (a value or reserved bits the host does not accept).

use std::sync::atomic::Ordering;

use devices::lapic::{is_lapic_msr, Lapic, LapicEffects, LapicEvents};
use kvm_ioctls::{MsrExitReason, VcpuExit};

use super::router::InterruptRouter;
use crate::metrics::VcpuCounters;
use crate::ratelimit::LogLimiter;
use crate::setup::layout::IOAPIC_ADDR;

/// Size of the IOAPIC's MMIO window.
pub const IOAPIC_WINDOW: u64 = 0x1000;
/// Size of the xAPIC MMIO page.
pub const LAPIC_WINDOW: u64 = 0x1000;

/// The state a user-irqchip exit handler may touch.
pub struct UserExitContext<'a, E: LapicEvents> {
    /// vCPU index, for log lines.
    pub vcpu: u32,
    /// This vCPU's counters.
    pub counters: &'a VcpuCounters,
    /// This vCPU's LAPIC.
    pub lapic: &'a mut Lapic<E>,
    /// The VM's interrupt fabric.
    pub router: &'a InterruptRouter,
    /// Current VM-clock time.
    pub now: u64,
    /// MSR accesses that #GP because neither KVM nor lull takes them.
    pub unknown_msr: &'a LogLimiter,
}

/// Handles one exit in `--irqchip user` mode: `Ok` with the LAPIC's side effects to apply
/// (timer, IPI, EOI, routing change), or the exit back if it is not the irqchip's.
pub fn handle_user_exit<'a, E: LapicEvents>(
    exit: VcpuExit<'a>,
    ctx: &mut UserExitContext<'_, E>,
) -> Result<Option<LapicEffects>, VcpuExit<'a>> {
    let counters = ctx.counters;
    let lapic_base = ctx.lapic.base_address();
    let in_lapic = |addr: u64| addr >= lapic_base && addr - lapic_base < LAPIC_WINDOW;
    let in_ioapic = |addr: u64| addr >= IOAPIC_ADDR && addr - IOAPIC_ADDR < IOAPIC_WINDOW;
    match exit {
        VcpuExit::MmioRead(addr, data) if in_lapic(addr) => {
            counters.mmio_read.fetch_add(1, Ordering::Relaxed);
            ctx.lapic.read_mmio(addr - lapic_base, data, ctx.now);
            Ok(None)
        }
        VcpuExit::MmioWrite(addr, data) if in_lapic(addr) => {
            counters.mmio_write.fetch_add(1, Ordering::Relaxed);
            Ok(Some(ctx.lapic.write_mmio(addr - lapic_base, data, ctx.now)))
        }
        VcpuExit::MmioRead(addr, data) if in_ioapic(addr) => {
            counters.mmio_read.fetch_add(1, Ordering::Relaxed);
            ctx.router.ioapic_read(addr - IOAPIC_ADDR, data);
            Ok(None)
        }
        VcpuExit::MmioWrite(addr, data) if in_ioapic(addr) => {
            counters.mmio_write.fetch_add(1, Ordering::Relaxed);
            ctx.router.ioapic_write(addr - IOAPIC_ADDR, data);
            Ok(None)
        }
        VcpuExit::X86Rdmsr(msr) => {
            counters.msr.fetch_add(1, Ordering::Relaxed);
            if is_lapic_msr(msr.index) {
                match ctx.lapic.read_msr(msr.index, ctx.now) {
                    Ok(value) => *msr.data = value,
                    Err(_) => *msr.error = 1,
                }
            } else {
                refused_msr(ctx, msr.index, msr.reason, None);
                *msr.error = 1;
            }
            Ok(None)
        }
        VcpuExit::X86Wrmsr(msr) => {
            counters.msr.fetch_add(1, Ordering::Relaxed);
            if is_lapic_msr(msr.index) {
                match ctx.lapic.write_msr(msr.index, msr.data, ctx.now) {
                    Ok(effects) => return Ok(Some(effects)),
                    Err(_) => *msr.error = 1,
                }
            } else {
                refused_msr(ctx, msr.index, msr.reason, Some(msr.data));
                *msr.error = 1;
            }
            Ok(None)
        }
        VcpuExit::IrqWindowOpen => {
            counters.irq_window.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        }
        // The guest lowered CR8: the TPR took it from kvm_run.cr8 as the exit came back
        // (`super::cr8`); the next entry injects what the new priority lets in.
        VcpuExit::SetTpr => {
            counters.other.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        }
        other => Err(other),
    }
}

/// Logs (rate-limited) an MSR access neither KVM nor lull takes; `written` is the value of a
/// WRMSR.
fn refused_msr<E: LapicEvents>(
    ctx: &UserExitContext<'_, E>,
    index: u32,
    reason: MsrExitReason,
    written: Option<u64>,
) {
    if let Some(n) = ctx.unknown_msr.hit() {
        let what = refused_msr_message(index, reason, written);
        tracing::warn!(
            vcpu = ctx.vcpu,
            "{what}; #GP injected ({n} refused MSR accesses so far)"
        );
    }
}

/// What happened to a refused MSR access, worded by KVM's exit `reason`.
fn refused_msr_message(index: u32, reason: MsrExitReason, written: Option<u64>) -> String {
    let access = match written {
        Some(value) => format!("guest write of {value:#x} to MSR {index:#x}"),
        None => format!("guest read of MSR {index:#x}"),
    };
    if reason.contains(MsrExitReason::Inval) {
        format!("{access}: KVM refused it (a value or reserved bits the host does not accept)")
    } else {
        format!("{access}: neither KVM nor lull implements this MSR")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::ioapic::IoApic;
    use devices::lapic::{LapicConfig, LapicTimerChange};
    use kvm_ioctls::{MsrExitReason, ReadMsrExit, WriteMsrExit};

    /// What a user exit context borrows, owned by the test.
    struct Fixture {
        lapic: Lapic,
        router: InterruptRouter,
        counters: VcpuCounters,
        unknown_msr: LogLimiter,
    }

    impl Fixture {
        fn new() -> Self {
            let lapic = Lapic::new(LapicConfig {
                bsp: true,
                ..LapicConfig::default()
            })
            .unwrap();
            let router =
                InterruptRouter::new(vec![lapic.destination_info()], vec![], IoApic::new(1));
            Self {
                lapic,
                router,
                counters: VcpuCounters::default(),
                unknown_msr: LogLimiter::new(),
            }
        }

        fn ctx(&mut self) -> UserExitContext<'_, devices::lapic::NoopLapicEvents> {
            UserExitContext {
                vcpu: 0,
                counters: &self.counters,
                lapic: &mut self.lapic,
                router: &self.router,
                now: 0,
                unknown_msr: &self.unknown_msr,
            }
        }
    }

    #[test]
    fn lapic_mmio_arms_the_timer() {
        let mut fixture = Fixture::new();
        let mut ctx = fixture.ctx();
        let base = 0xfee0_0000;
        assert!(handle_user_exit(
            VcpuExit::MmioWrite(base + 0xf0, &0x1ffu32.to_le_bytes()),
            &mut ctx,
        )
        .is_ok());
        assert!(handle_user_exit(
            VcpuExit::MmioWrite(base + 0x320, &0x40u32.to_le_bytes()),
            &mut ctx,
        )
        .is_ok());
        assert!(handle_user_exit(
            VcpuExit::MmioWrite(base + 0x3e0, &0xbu32.to_le_bytes()),
            &mut ctx,
        )
        .is_ok());
        let count = 1_000_000u32.to_le_bytes();
        let out = handle_user_exit(VcpuExit::MmioWrite(base + 0x380, &count), &mut ctx);
        assert_eq!(
            out.unwrap().unwrap().timer,
            LapicTimerChange::Arm {
                deadline_ns: 1_000_000
            }
        );
        let mut id = [0u8; 4];
        assert!(handle_user_exit(VcpuExit::MmioRead(base + 0x30, &mut id), &mut ctx).is_ok());
        assert_eq!(u32::from_le_bytes(id) & 0xff, 0x14);
        assert_eq!(fixture.counters.mmio_write.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn unknown_msrs_fault_and_lapic_msrs_do_not() {
        let mut fixture = Fixture::new();
        let mut ctx = fixture.ctx();
        let (mut error, mut data) = (0u8, 0u64);
        let exit = VcpuExit::X86Rdmsr(ReadMsrExit {
            error: &mut error,
            reason: MsrExitReason::Unknown,
            index: 0x1234,
            data: &mut data,
        });
        assert!(handle_user_exit(exit, &mut ctx).is_ok());
        assert_eq!(error, 1);
        let (mut error, mut data) = (0u8, 0u64);
        let exit = VcpuExit::X86Rdmsr(ReadMsrExit {
            error: &mut error,
            reason: MsrExitReason::Filter,
            index: 0x1b,
            data: &mut data,
        });
        assert!(handle_user_exit(exit, &mut ctx).is_ok());
        assert_eq!((error, data & 0xffff_f000), (0, 0xfee0_0000));
        let mut error = 0u8;
        let exit = VcpuExit::X86Wrmsr(WriteMsrExit {
            error: &mut error,
            reason: MsrExitReason::Filter,
            index: 0x6e0,
            data: 5,
        });
        let out = handle_user_exit(exit, &mut ctx);
        assert!(matches!(out, Ok(Some(_))));
        assert_eq!(error, 0);
        assert_eq!(fixture.unknown_msr.count(), 1);
    }

    #[test]
    fn a_refused_msr_is_told_apart_from_an_unknown_one() {
        let refused = refused_msr_message(0x10, MsrExitReason::Inval, Some(5));
        assert_eq!(
            refused,
            "guest write of 0x5 to MSR 0x10: KVM refused it (a value or reserved bits the host does not accept)"
        );
        assert!(!refused.contains("implements"));
        let unknown = refused_msr_message(0x1234, MsrExitReason::Unknown, None);
        assert_eq!(
            unknown,
            "guest read of MSR 0x1234: neither KVM nor lull implements this MSR"
        );
    }

    #[test]
    fn set_tpr_is_the_irqchips() {
        let mut fixture = Fixture::new();
        let mut ctx = fixture.ctx();
        assert!(matches!(
            handle_user_exit(VcpuExit::SetTpr, &mut ctx),
            Ok(None)
        ));
    }

    #[test]
    fn other_exits_are_given_back() {
        let mut fixture = Fixture::new();
        let mut ctx = fixture.ctx();
        let given_back = handle_user_exit(VcpuExit::IoOut(0xf4, &[1]), &mut ctx);
        assert!(matches!(given_back, Err(VcpuExit::IoOut(0xf4, _))));
        let mut m = [0u8; 4];
        let unclaimed = handle_user_exit(VcpuExit::MmioRead(0xd000_0000, &mut m), &mut ctx);
        assert!(matches!(unclaimed, Err(VcpuExit::MmioRead(0xd000_0000, _))));
    }
}
