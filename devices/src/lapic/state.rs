//! A LAPIC's state as a plain value, for snapshots: [`Lapic::save`] and [`Lapic::restore`].
//!
//! Every register is kept as the guest reads it (IRR, ISR and TMR as their eight words), with
//! the NMIs on their way to the CPU and the INIT/SIPI state. The timer is kept in guest time,
//! not in the caller's clock, which a restored VM does not share:
//! - one-shot and periodic: the time left to the next expiry (`remaining_ns`), re-armed that
//!   far from the restoring VM's `now`, so it fires no earlier than it would have (a periodic
//!   timer then runs on its period from there);
//! - TSC-deadline: the IA32_TSC_DEADLINE value, converted with the restoring LAPIC's TSC map:
//!   the same guest TSC, so never early; one the guest TSC has passed meanwhile expires at the
//!   restore and its interrupt is pending (late, once).
//!
//! A saved state is untrusted input (a snapshot file): [`Lapic::restore`] checks every field
//! against what the guest could have written and this LAPIC's configuration (ID, BSP,
//! x2APIC support, MAXPHYADDR, timer limits) before it changes anything, and refuses a bad one
//! with a [`LapicStateError`] that names the field.

use serde::{Deserialize, Serialize};

use super::nmi::{CpuNmi, NmiQueue, MAX_PENDING_NMIS};
use super::regs::{self, VectorBitmap};
use super::timer::{Armed, TimerMode};
use super::{
    InitSipiState, Lapic, LapicEvents, LapicTimerChange, APIC_BASE_BSP, APIC_BASE_ENABLE,
    APIC_BASE_X2APIC,
};

/// The ESR bits this LAPIC sets (send and receive illegal vector, illegal register address).
const ESR_BITS: u32 =
    regs::ESR_SEND_ILLEGAL_VECTOR | regs::ESR_RECEIVE_ILLEGAL_VECTOR | regs::ESR_ILLEGAL_REGISTER;

/// A LAPIC timer in guest time (see the module's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LapicTimerState {
    /// The mode the LVT timer register selected.
    pub mode: TimerMode,
    /// The divide configuration register.
    pub divide_config: u32,
    /// The initial count register (0 in TSC-deadline mode).
    pub initial_count: u32,
    /// IA32_TSC_DEADLINE (0 unless armed in TSC-deadline mode).
    pub tsc_deadline: u64,
    /// One-shot or periodic and counting: nanoseconds to the next expiry (0: due already).
    pub remaining_ns: Option<u64>,
}

/// Everything a [`Lapic`] holds that the guest or its devices changed, as a plain value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LapicState {
    /// IA32_APIC_BASE (address, BSP, x2APIC and enable bits).
    pub apic_base: u64,
    /// The xAPIC ID register's ID (x2APIC mode uses the configured ID).
    pub xapic_id: u8,
    /// Task priority.
    pub tpr: u8,
    /// Logical destination register (xAPIC; bits 31:24).
    pub ldr: u32,
    /// Destination format register.
    pub dfr: u32,
    /// Spurious-interrupt vector register.
    pub svr: u32,
    /// In-service register, word 0 holding vectors 0-31.
    pub isr: [u32; 8],
    /// Trigger-mode register.
    pub tmr: [u32; 8],
    /// Interrupt-request register.
    pub irr: [u32; 8],
    /// Error status as the guest last latched it.
    pub esr: u32,
    /// Errors since the last ESR write.
    pub esr_pending: u32,
    /// Interrupt command register (both halves).
    pub icr: u64,
    /// The local vector table: timer, thermal, perfmon, LINT0, LINT1, error.
    pub lvt: [u32; 6],
    /// The timer.
    pub timer: LapicTimerState,
    /// NMIs accepted and not yet handed to the CPU.
    pub nmis_pending: u32,
    /// What the CPU last said it holds of the NMIs it was handed.
    pub nmi_in_cpu: CpuNmi,
    /// Where the vCPU is in the INIT/SIPI sequence.
    pub init_sipi: InitSipiState,
}

/// Why a saved LAPIC state cannot be restored: the snapshot is corrupt or of another VM.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LapicStateError {
    /// IA32_APIC_BASE has bits this LAPIC cannot have set.
    #[error("Saved LAPIC state: IA32_APIC_BASE {value:#x} is not one this vCPU can have (reserved bits, x2APIC without enable or support, or another BSP bit): corrupt snapshot or another VM's")]
    ApicBase {
        /// The saved value.
        value: u64,
    },
    /// A register holds bits the guest cannot set.
    #[error("Saved LAPIC state: register {register} = {value:#x} has bits the guest cannot set: corrupt snapshot")]
    Register {
        /// Which register.
        register: &'static str,
        /// The saved value.
        value: u64,
    },
    /// IRR, ISR or TMR holds a vector below 16, which no interrupt can have.
    #[error("Saved LAPIC state: {register} holds vector {vector} (below 16, which no interrupt has): corrupt snapshot")]
    ReservedVector {
        /// Which register.
        register: &'static str,
        /// The vector.
        vector: u8,
    },
    /// The timer's mode is not the LVT timer register's.
    #[error("Saved LAPIC state: timer mode {mode:?} does not match LVT timer {lvt:#x}: corrupt snapshot")]
    TimerMode {
        /// The saved mode.
        mode: TimerMode,
        /// The saved LVT timer register.
        lvt: u32,
    },
    /// The timer's counts are not ones its mode can hold.
    #[error("Saved LAPIC state: timer counts {what}: corrupt snapshot")]
    TimerCounts {
        /// What is wrong.
        what: &'static str,
    },
    /// The time left on the timer is longer than its count can run.
    #[error("Saved LAPIC state: {remaining_ns} ns left on a timer that runs at most {max_ns} ns: corrupt snapshot")]
    TimerRemaining {
        /// The saved time left.
        remaining_ns: u64,
        /// The longest the saved count runs.
        max_ns: u64,
    },
    /// More NMIs are pending than a LAPIC holds.
    #[error("Saved LAPIC state: {0} NMIs pending, more than the {max} a LAPIC holds: corrupt snapshot", max = MAX_PENDING_NMIS)]
    Nmis(u32),
}

/// The lowest vector of a 256-bit register below 16, if any.
fn low_vector(words: [u32; 8]) -> Option<u8> {
    let low = words[0] & 0xFFFF;
    (low != 0).then(|| u8::try_from(low.trailing_zeros()).unwrap_or(0))
}

impl<E: LapicEvents> Lapic<E> {
    /// This LAPIC's state at `now_ns` (the caller's clock), for a snapshot.
    pub fn save(&self, now_ns: u64) -> LapicState {
        let timer = &self.timer;
        LapicState {
            apic_base: self.apic_base,
            xapic_id: self.xapic_id,
            tpr: self.tpr,
            ldr: self.ldr,
            dfr: self.dfr,
            svr: self.svr,
            isr: self.isr.words(),
            tmr: self.tmr.words(),
            irr: self.irr.words(),
            esr: self.esr,
            esr_pending: self.esr_pending,
            icr: self.icr,
            lvt: self.lvt,
            timer: LapicTimerState {
                mode: timer.mode,
                divide_config: timer.divide_config,
                initial_count: timer.initial_count,
                tsc_deadline: timer.tsc_deadline,
                remaining_ns: match timer.mode {
                    TimerMode::TscDeadline => None,
                    _ => timer
                        .armed
                        .map(|armed| armed.deadline_ns.saturating_sub(now_ns)),
                },
            },
            nmis_pending: self.nmis.accepted,
            nmi_in_cpu: self.nmis.in_cpu,
            init_sipi: self.init_sipi,
        }
    }

    /// Takes `state` (from [`Lapic::save`], maybe of another process) at `now_ns`, after
    /// checking all of it: on an error nothing changed. Returns what to do with the host
    /// timer, like a register write: `Arm` for a timer still running (due already if its time
    /// or TSC deadline has passed: it fires at the next timer pass), else `Cancel`. A TSC
    /// deadline the guest TSC has passed expires here: its interrupt is pending on return.
    /// Refresh this vCPU's routing entry ([`Lapic::destination_info`]) afterwards.
    pub fn restore(
        &mut self,
        state: &LapicState,
        now_ns: u64,
    ) -> Result<LapicTimerChange, LapicStateError> {
        self.check(state)?;
        self.apic_base = state.apic_base;
        self.xapic_id = state.xapic_id;
        self.tpr = state.tpr;
        self.ldr = state.ldr;
        self.dfr = state.dfr;
        self.svr = state.svr;
        self.isr = VectorBitmap::from_words(state.isr);
        self.tmr = VectorBitmap::from_words(state.tmr);
        self.irr = VectorBitmap::from_words(state.irr);
        self.esr = state.esr;
        self.esr_pending = state.esr_pending;
        self.icr = state.icr;
        self.lvt = state.lvt;
        self.nmis = NmiQueue {
            accepted: state.nmis_pending,
            in_cpu: state.nmi_in_cpu,
        };
        self.init_sipi = state.init_sipi;
        let saved = state.timer;
        self.timer.reset();
        self.timer.mode = saved.mode;
        self.timer.divide_config = saved.divide_config;
        self.timer.initial_count = saved.initial_count;
        if saved.mode == TimerMode::TscDeadline {
            if saved.tsc_deadline == 0 {
                return Ok(LapicTimerChange::Cancel);
            }
            let update = self
                .timer
                .write_tsc_deadline(saved.tsc_deadline, now_ns, &self.events);
            if update.expired {
                self.timer_interrupt();
            }
            return Ok(match update.change {
                LapicTimerChange::Unchanged => LapicTimerChange::Cancel,
                change => change,
            });
        }
        let Some(remaining_ns) = saved.remaining_ns else {
            return Ok(LapicTimerChange::Cancel);
        };
        let period_ns = match saved.mode {
            TimerMode::Periodic => self.timer.period_ns(&self.events),
            _ => 0,
        };
        let deadline_ns = now_ns.saturating_add(remaining_ns);
        self.timer.armed = Some(Armed {
            deadline_ns,
            period_ns,
        });
        Ok(LapicTimerChange::Arm { deadline_ns })
    }

    /// Whether `state` is one this LAPIC could be in (see [`Lapic::restore`]).
    fn check(&self, state: &LapicState) -> Result<(), LapicStateError> {
        let known =
            self.apic_base_address_mask | APIC_BASE_BSP | APIC_BASE_ENABLE | APIC_BASE_X2APIC;
        let base = state.apic_base;
        let x2apic = base & APIC_BASE_X2APIC != 0;
        if base & !known != 0
            || (x2apic && (!self.x2apic_supported || base & APIC_BASE_ENABLE == 0))
            || (base & APIC_BASE_BSP != 0) != self.bsp
        {
            return Err(LapicStateError::ApicBase { value: base });
        }
        let register = |register, value: u64, bad: bool| match bad {
            true => Err(LapicStateError::Register { register, value }),
            false => Ok(()),
        };
        register("LDR", state.ldr.into(), state.ldr & 0x00FF_FFFF != 0)?;
        register(
            "DFR",
            state.dfr.into(),
            state.dfr & 0x0FFF_FFFF != 0x0FFF_FFFF,
        )?;
        register(
            "SVR",
            state.svr.into(),
            state.svr & !regs::SVR_WRITABLE != 0,
        )?;
        register("ESR", state.esr.into(), state.esr & !ESR_BITS != 0)?;
        register(
            "ESR (pending)",
            state.esr_pending.into(),
            state.esr_pending & !ESR_BITS != 0,
        )?;
        let icr_low = state.icr & 0xFFFF_FFFF;
        let icr_high_bad = !x2apic && state.icr >> 32 & 0x00FF_FFFF != 0;
        register(
            "ICR",
            state.icr,
            icr_low & !u64::from(regs::ICR_LOW_WRITABLE) != 0 || icr_high_bad,
        )?;
        const LVT_NAMES: [&str; 6] = [
            "LVT timer",
            "LVT thermal",
            "LVT perfmon",
            "LVT LINT0",
            "LVT LINT1",
            "LVT error",
        ];
        for (index, (&lvt, name)) in state.lvt.iter().zip(LVT_NAMES).enumerate() {
            register(name, lvt.into(), lvt & !regs::lvt_writable(index) != 0)?;
        }
        for (register, words) in [("IRR", state.irr), ("ISR", state.isr), ("TMR", state.tmr)] {
            if let Some(vector) = low_vector(words) {
                return Err(LapicStateError::ReservedVector { register, vector });
            }
        }
        self.check_timer(&state.timer, state.lvt[0])?;
        if state.nmis_pending > MAX_PENDING_NMIS {
            return Err(LapicStateError::Nmis(state.nmis_pending));
        }
        Ok(())
    }

    fn check_timer(&self, timer: &LapicTimerState, lvt: u32) -> Result<(), LapicStateError> {
        if TimerMode::from_lvt(lvt) != Some(timer.mode) {
            return Err(LapicStateError::TimerMode {
                mode: timer.mode,
                lvt,
            });
        }
        let counts = |what| Err(LapicStateError::TimerCounts { what });
        if timer.divide_config & !0xB != 0 {
            return counts("have a divide configuration with reserved bits set");
        }
        match timer.mode {
            TimerMode::TscDeadline if timer.initial_count != 0 => {
                return counts("have an initial count in TSC-deadline mode")
            }
            TimerMode::TscDeadline if timer.remaining_ns.is_some() => {
                return counts("have a running count in TSC-deadline mode")
            }
            TimerMode::OneShot | TimerMode::Periodic if timer.tsc_deadline != 0 => {
                return counts("have a TSC deadline outside TSC-deadline mode")
            }
            TimerMode::OneShot | TimerMode::Periodic
                if timer.remaining_ns.is_some() && timer.initial_count == 0 =>
            {
                return counts("run with an initial count of 0")
            }
            _ => {}
        }
        let Some(remaining_ns) = timer.remaining_ns else {
            return Ok(());
        };
        // The longest a count runs: its whole initial count at the saved divisor, or the
        // floors a short one is pushed out to.
        let mut probe = self.timer.clone();
        probe.divide_config = timer.divide_config;
        let limits = probe.limits;
        let max_ns = probe
            .ticks_to_ns(u64::from(timer.initial_count))
            .max(limits.min_period_ns)
            .max(limits.min_delay_ns);
        if remaining_ns > max_ns {
            return Err(LapicStateError::TimerRemaining {
                remaining_ns,
                max_ns,
            });
        }
        Ok(())
    }
}
