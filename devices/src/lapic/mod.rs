//! The local APIC of one vCPU, emulated in user space: xAPIC (MMIO) and x2APIC (MSR) views over
//! one register state, the LAPIC timer, IPIs and INIT/SIPI.
//!
//! ```text
//!   guest MMIO/MSR ──> read_mmio / write_mmio / read_msr / write_msr ──> LapicEffects
//!                                                                         │ timer: Arm/Cancel
//!                                                                         │ ipi:   route() + receive()
//!                                                                         │ eoi:   IoApic::end_of_interrupt
//!                                                                         │ base_change: move MMIO page
//!   host timer passed ──> timer_fired(now) ──> next deadline (periodic)
//!   IoApic / other vCPUs ──> receive(&Ipi) / accept_interrupt ──> IRR
//!   before KVM_RUN ──> next_interrupt() ──> inject (KVM) ──> interrupt_injected(v): IRR -> ISR
//! ```
//!
//! The LAPIC owns no clock and no thread: every method that needs time takes `now_ns`
//! (monotonic nanoseconds) and it tells its caller what to do through return values. How the
//! VMM drives it:
//! - **MMIO exit** in `[base, base + 4 KiB)`: [`Lapic::read_mmio`] / [`Lapic::write_mmio`] with
//!   the offset from [`Lapic::base_address`]; apply the returned [`LapicEffects`]. In x2APIC
//!   mode or globally disabled the page is unbacked: reads return all ones, writes do nothing.
//! - **MSR exit** for which [`is_lapic_msr`] holds (0x1B, 0x6E0, 0x800-0x8FF):
//!   [`Lapic::read_msr`] / [`Lapic::write_msr`]; an `Err` means inject #GP (`error = 1`).
//! - **Timer**: arm/cancel the vCPU's pinned host timer per [`LapicEffects::timer`]; when it
//!   passes call [`Lapic::timer_fired`] and re-arm at the deadline it returns, if any. A stale
//!   host timer is harmless: `timer_fired` on a disarmed timer does nothing, and before the
//!   deadline it just returns the deadline again. A write whose TSC deadline or one-shot count
//!   has already run out arms nothing: the interrupt is pending when the write returns.
//! - **IPI**: [`route`] over every vCPU's [`Lapic::destination_info`] (refresh a vCPU's entry
//!   when [`LapicEffects::destination_changed`], after INIT, and as often as lowest-priority
//!   arbitration needs fresh priorities), then [`Lapic::receive`] on each target and kick it.
//! - **Injection**: after every exit and every `receive`, when the guest can take an
//!   interrupt, take [`Lapic::next_interrupt`], hand it to KVM (`KVM_INTERRUPT`, or the
//!   vCPU events KVM_RUN synchronizes: lull's `vcpu::kvm_port`) and call
//!   [`Lapic::interrupt_injected`]. Keep CR8 and TPR one register: [`Lapic::sync_cr8`] with
//!   `kvm_run.cr8` after every exit, `kvm_run.cr8 =` [`Lapic::cr8`] before every entry. NMIs:
//!   [`Lapic::take_nmi`] says how many to inject (`KVM_NMI` each); inject fixed interrupts from
//!   [`Lapic::injectable_interrupt`], which holds them behind NMIs the CPU has yet to deliver
//!   (ask it while [`Lapic::nmi_in_cpu`], tell [`Lapic::cpu_nmi`]). A halted vCPU wakes when
//!   [`Lapic::has_pending_interrupt`].
//! - **EOI**: when [`LapicEffects::eoi`] is level-triggered, call
//!   [`IoApic::end_of_interrupt`](crate::ioapic::IoApic::end_of_interrupt) and route what it
//!   re-delivers (EOIs are always broadcast: no EOI-broadcast suppression is advertised).
//! - **INIT/SIPI**: after an INIT the vCPU must stop and have its CPU state reset; a vCPU
//!   whose [`Lapic::init_sipi_state`] is not `Running` must not run; [`Lapic::take_sipi`]
//!   gives the start vector (CS = vector << 8, RIP = 0, real mode).
//!
//! ```
//! use devices::lapic::{Lapic, LapicConfig, LapicTimerChange};
//! let mut lapic = Lapic::new(LapicConfig::default()).unwrap();
//! let write = |lapic: &mut Lapic, offset: u64, value: u32, now| {
//!     lapic.write_mmio(offset, &value.to_le_bytes(), now)
//! };
//! let _ = write(&mut lapic, 0xF0, 0x1FF, 0); // SVR: software enable
//! let _ = write(&mut lapic, 0x320, 0x40, 0); // LVT timer: one-shot, vector 0x40
//! let _ = write(&mut lapic, 0x3E0, 0xB, 0); // divide by 1
//! let effects = write(&mut lapic, 0x380, 1_000_000, 0); // 1 ms at 1 GHz
//! assert_eq!(effects.timer, LapicTimerChange::Arm { deadline_ns: 1_000_000 });
//! assert_eq!(lapic.timer_fired(1_000_000), None);
//! assert_eq!(lapic.next_interrupt(), Some(0x40));
//! ```

mod access;
mod events;
mod icr;
mod nmi;
mod pv_eoi;
pub mod regs;
mod route;
mod state;
mod timer;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod timer_tests;

pub use access::is_lapic_msr;
pub use events::{InvalidAccess, LapicEvents, NoopLapicEvents};
pub use icr::{DeliveryMode, DestinationMode, Ipi, Shorthand, TriggerMode};
pub use nmi::{CpuNmi, NmiQueue, MAX_PENDING_NMIS};
pub use route::{route, ApicDestinationInfo, DestinationSet, LogicalModel};
pub use state::{LapicState, LapicStateError, LapicTimerState};
pub use timer::{LapicTimerChange, TimerLimits, TimerMode, TscMap, DEFAULT_BUS_HZ};

use regs::{class, low_byte, VectorBitmap};
use timer::{LapicTimer, TimerUpdate};

/// Default physical address of the xAPIC MMIO page.
pub const DEFAULT_APIC_BASE: u64 = 0xFEE0_0000;
/// IA32_APIC_BASE bit 8: this is the bootstrap processor.
pub const APIC_BASE_BSP: u64 = 1 << 8;
/// IA32_APIC_BASE bit 10: x2APIC mode.
pub const APIC_BASE_X2APIC: u64 = 1 << 10;
/// IA32_APIC_BASE bit 11: global enable.
pub const APIC_BASE_ENABLE: u64 = 1 << 11;
/// IA32_APIC_BASE bits that hold the page address (a 52-bit physical address space); bits at
/// and above the guest's MAXPHYADDR are reserved ([`LapicConfig::max_phys_addr_bits`]).
pub const APIC_BASE_ADDRESS: u64 = 0x000F_FFFF_FFFF_F000;
/// The architectural maximum of MAXPHYADDR (CPUID 0x80000008 EAX[7:0]), the default of
/// [`LapicConfig::max_phys_addr_bits`].
pub const MAX_PHYS_ADDR_BITS: u8 = 52;

/// Errors of the LAPIC model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LapicError {
    /// The MSR access faults: inject #GP into the guest.
    #[error("MSR {msr:#x} access faults; inject #GP into the guest")]
    GeneralProtection {
        /// The MSR.
        msr: u32,
    },
    /// The MSR is not a local APIC MSR; route it elsewhere.
    #[error("MSR {0:#x} is not a local APIC MSR; route it elsewhere")]
    NotLapicMsr(u32),
    /// The configuration has a zero frequency; give a bus and TSC frequency above zero.
    #[error("LAPIC bus and TSC frequencies must be above zero")]
    ZeroFrequency,
    /// The configured MAXPHYADDR is outside 32..=52; give the guest's CPUID 0x80000008
    /// EAX[7:0].
    #[error("MAXPHYADDR {0} is outside 32..=52; give the guest's CPUID 0x80000008 EAX[7:0]")]
    MaxPhysAddrOutOfRange(u8),
}

/// Construction parameters of a [`Lapic`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LapicConfig {
    /// Initial APIC ID (the x2APIC ID; its low 8 bits are the xAPIC ID).
    pub apic_id: u32,
    /// Whether this is the bootstrap processor (starts running; others wait for SIPI).
    pub bsp: bool,
    /// Timer input frequency in Hz (default 1 GHz); advertise the same in CPUID.
    pub bus_hz: u64,
    /// Guest TSC to monotonic-time conversion for TSC-deadline mode.
    pub tsc: TscMap,
    /// Floors on timer deadlines.
    pub limits: TimerLimits,
    /// Whether the guest may switch to x2APIC mode (advertise it in CPUID then). Without it
    /// setting IA32_APIC_BASE.EXTD and every x2APIC MSR fault (#GP).
    pub x2apic_supported: bool,
    /// The guest's physical-address width (CPUID 0x80000008 EAX[7:0], 32..=52): an
    /// IA32_APIC_BASE write with an address bit at or above it faults (#GP).
    pub max_phys_addr_bits: u8,
}

impl Default for LapicConfig {
    fn default() -> Self {
        LapicConfig {
            apic_id: 0,
            bsp: true,
            bus_hz: DEFAULT_BUS_HZ,
            tsc: TscMap::default(),
            limits: TimerLimits::default(),
            x2apic_supported: true,
            max_phys_addr_bits: MAX_PHYS_ADDR_BITS,
        }
    }
}

/// The LAPIC's mode, from IA32_APIC_BASE bits 11:10.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApicMode {
    /// Globally disabled: no MMIO, no x2APIC MSRs, no interrupts.
    Disabled,
    /// xAPIC: registers in the MMIO page.
    XApic,
    /// x2APIC: registers in MSRs 0x800-0x8FF.
    X2Apic,
}

/// A change of IA32_APIC_BASE the VMM must act on (move or unmap the MMIO page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApicBaseChange {
    /// Physical address of the register page.
    pub base_address: u64,
    /// The new mode; MMIO is live only in [`ApicMode::XApic`].
    pub mode: ApicMode,
}

/// An end of interrupt the guest signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eoi {
    /// The vector whose ISR bit was cleared.
    pub vector: u8,
    /// Whether it was level-triggered (TMR set): forward it to the IOAPIC.
    pub level_triggered: bool,
}

/// What the VMM must do after a register write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct LapicEffects {
    /// What to do with this vCPU's host timer.
    pub timer: LapicTimerChange,
    /// The timer expired at this write (a count already run out, a TSC deadline at or before
    /// now, or an expiry the write settled): its interrupt is pending already, and no host
    /// timer will report this expiry, so the VMM counts it here.
    pub timer_expired: bool,
    /// An IPI to route and deliver.
    pub ipi: Option<Ipi>,
    /// An EOI to forward to the IOAPIC if level-triggered.
    pub eoi: Option<Eoi>,
    /// A change of base address or mode.
    pub base_change: Option<ApicBaseChange>,
    /// The ID, LDR, DFR, SVR enable or mode changed: refresh this vCPU's entry in the routing
    /// table ([`Lapic::destination_info`]).
    pub destination_changed: bool,
}

/// Where a vCPU is in the INIT / start-up sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum InitSipiState {
    /// Executing guest code.
    Running,
    /// INIT received (or an AP after reset): waiting for a start-up IPI.
    WaitForSipi,
    /// A start-up IPI arrived; the VMM starts the vCPU at `vector << 12`.
    SipiReceived(u8),
}

/// The local APIC of one vCPU. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Lapic<E: LapicEvents = NoopLapicEvents> {
    initial_id: u32,
    bsp: bool,
    x2apic_supported: bool,
    /// The IA32_APIC_BASE address bits below MAXPHYADDR.
    apic_base_address_mask: u64,
    apic_base: u64,
    xapic_id: u8,
    tpr: u8,
    ldr: u32,
    dfr: u32,
    svr: u32,
    isr: VectorBitmap,
    tmr: VectorBitmap,
    irr: VectorBitmap,
    esr: u32,
    esr_pending: u32,
    icr: u64,
    lvt: [u32; 6],
    timer: LapicTimer,
    /// NMIs accepted, and what the CPU holds of those handed to it.
    nmis: NmiQueue,
    init_sipi: InitSipiState,
    events: E,
}

impl Lapic<NoopLapicEvents> {
    /// A LAPIC in its power-up state that reports no events.
    pub fn new(config: LapicConfig) -> Result<Self, LapicError> {
        Lapic::with_events(config, NoopLapicEvents)
    }
}

impl<E: LapicEvents> Lapic<E> {
    /// A LAPIC in its power-up state that reports guest misbehaviour to `events`.
    pub fn with_events(config: LapicConfig, events: E) -> Result<Self, LapicError> {
        if config.bus_hz == 0 || config.tsc.tsc_khz == 0 {
            return Err(LapicError::ZeroFrequency);
        }
        if !(32..=MAX_PHYS_ADDR_BITS).contains(&config.max_phys_addr_bits) {
            return Err(LapicError::MaxPhysAddrOutOfRange(config.max_phys_addr_bits));
        }
        let below_max_phys = (1u64 << config.max_phys_addr_bits) - 1;
        let mut lapic = Lapic {
            initial_id: config.apic_id,
            bsp: config.bsp,
            x2apic_supported: config.x2apic_supported,
            apic_base_address_mask: APIC_BASE_ADDRESS & below_max_phys,
            apic_base: 0,
            xapic_id: 0,
            tpr: 0,
            ldr: 0,
            dfr: 0,
            svr: 0,
            isr: VectorBitmap::default(),
            tmr: VectorBitmap::default(),
            irr: VectorBitmap::default(),
            esr: 0,
            esr_pending: 0,
            icr: 0,
            lvt: [0; 6],
            timer: LapicTimer::new(config.bus_hz, config.tsc, config.limits),
            nmis: NmiQueue::default(),
            init_sipi: InitSipiState::Running,
            events,
        };
        lapic.reset();
        Ok(lapic)
    }

    /// Power-up (RESET) state: xAPIC mode at the default base, registers cleared, timer
    /// disarmed (cancel the host timer), an AP waiting for SIPI.
    pub fn reset(&mut self) {
        self.apic_base =
            DEFAULT_APIC_BASE | APIC_BASE_ENABLE | if self.bsp { APIC_BASE_BSP } else { 0 };
        self.xapic_id = low_byte(self.initial_id);
        self.reset_registers();
        self.nmis.clear();
        self.init_sipi = if self.bsp {
            InitSipiState::Running
        } else {
            InitSipiState::WaitForSipi
        };
    }

    /// The register reset shared by RESET, INIT and global disable (SDM 11.4.7.1): everything
    /// but the APIC ID and IA32_APIC_BASE.
    fn reset_registers(&mut self) {
        self.tpr = 0;
        self.ldr = 0;
        self.dfr = 0xFFFF_FFFF;
        self.svr = 0xFF;
        self.isr = VectorBitmap::default();
        self.tmr = VectorBitmap::default();
        self.irr = VectorBitmap::default();
        self.esr = 0;
        self.esr_pending = 0;
        self.icr = 0;
        self.lvt = [regs::LVT_MASKED; 6];
        self.timer.reset();
    }

    /// The current mode.
    pub fn mode(&self) -> ApicMode {
        match (
            self.apic_base & APIC_BASE_ENABLE != 0,
            self.apic_base & APIC_BASE_X2APIC != 0,
        ) {
            (false, _) => ApicMode::Disabled,
            (true, false) => ApicMode::XApic,
            (true, true) => ApicMode::X2Apic,
        }
    }

    /// Physical address of the xAPIC MMIO page.
    pub fn base_address(&self) -> u64 {
        self.apic_base & APIC_BASE_ADDRESS
    }

    /// The current APIC ID: the x2APIC ID in x2APIC mode, else the 8-bit xAPIC ID.
    pub fn apic_id(&self) -> u32 {
        match self.mode() {
            ApicMode::X2Apic => self.initial_id,
            _ => u32::from(self.xapic_id),
        }
    }

    /// The logical destination register as the guest reads it (derived from the ID in x2APIC
    /// mode).
    pub fn ldr(&self) -> u32 {
        match self.mode() {
            ApicMode::X2Apic => ((self.initial_id >> 4) << 16) | (1 << (self.initial_id & 0xF)),
            _ => self.ldr,
        }
    }

    fn software_enabled(&self) -> bool {
        self.svr & regs::SVR_ENABLED != 0
    }

    /// The processor priority: TPR, or the class of the highest in-service vector if higher.
    pub fn ppr(&self) -> u8 {
        let isrv = self.isr.highest().unwrap_or(0);
        if class(self.tpr) >= class(isrv) {
            self.tpr
        } else {
            isrv & 0xF0
        }
    }

    /// The arbitration priority (SDM 11.6.2.4), used for lowest-priority delivery.
    pub fn arbitration_priority(&self) -> u8 {
        let isrv = self.isr.highest().unwrap_or(0);
        let irrv = self.irr.highest().unwrap_or(0);
        if class(self.tpr) >= class(isrv) && class(self.tpr) >= class(irrv) {
            self.tpr
        } else {
            self.tpr.max(isrv).max(irrv) & 0xF0
        }
    }

    /// The task priority register.
    pub fn tpr(&self) -> u8 {
        self.tpr
    }

    /// CR8 as the guest sees it (TPR bits 7:4).
    pub fn cr8(&self) -> u64 {
        u64::from(self.tpr >> 4)
    }

    /// Sets TPR from a guest CR8 value (`kvm_run.cr8` after an exit): TPR[7:4] = CR8[3:0] and
    /// TPR[3:0] = 0 (SDM 11.8.6.1). The PPR follows at once, so a pending interrupt whose
    /// class is at or below the new priority is held.
    pub fn set_cr8(&mut self, cr8: u64) {
        self.tpr = low_byte(u32::try_from(cr8 & 0xF).unwrap_or(0)) << 4;
    }

    /// Takes `kvm_run.cr8` after an exit: sets TPR from it only if the guest changed CR8, and
    /// returns whether it did (re-evaluate injection then). `kvm_run.cr8` is a value, not a
    /// write: taking it as one after every exit would clear TPR[3:0] that the guest set
    /// through the TPR register. Before the next entry, give KVM [`Lapic::cr8`].
    pub fn sync_cr8(&mut self, cr8: u64) -> bool {
        if cr8 & 0xF == self.cr8() {
            return false;
        }
        self.set_cr8(cr8);
        true
    }

    /// This LAPIC's addressing state for [`route`].
    pub fn destination_info(&self) -> ApicDestinationInfo {
        ApicDestinationInfo {
            apic_id: self.apic_id(),
            ldr: self.ldr(),
            logical_model: if self.dfr >> 28 == 0 {
                LogicalModel::Cluster
            } else {
                LogicalModel::Flat
            },
            x2apic: self.mode() == ApicMode::X2Apic,
            hardware_enabled: self.mode() != ApicMode::Disabled,
            software_enabled: self.software_enabled(),
            priority: self.arbitration_priority(),
        }
    }

    /// Records errors in the ESR and raises the LVT error interrupt for new ones.
    fn set_error(&mut self, bits: u32) {
        let new = bits & !self.esr_pending;
        self.esr_pending |= bits;
        let lvt = self.lvt[5];
        if new == 0 || lvt & regs::LVT_MASKED != 0 {
            return;
        }
        let vector = low_byte(lvt);
        if vector < 16 {
            self.esr_pending |= regs::ESR_RECEIVE_ILLEGAL_VECTOR;
        } else {
            self.irr.set(vector);
            self.tmr.clear(vector);
        }
    }

    /// Accepts a fixed or lowest-priority interrupt: sets IRR (and TMR if level-triggered).
    ///
    /// Returns whether it is now pending. A vector below 16 sets ESR "received illegal vector";
    /// a disabled LAPIC drops the interrupt.
    pub fn accept_interrupt(&mut self, vector: u8, level_triggered: bool) -> bool {
        if self.mode() == ApicMode::Disabled {
            return false;
        }
        if vector < 16 {
            self.events.illegal_vector(vector);
            self.set_error(regs::ESR_RECEIVE_ILLEGAL_VECTOR);
            return false;
        }
        if !self.software_enabled() {
            return false;
        }
        self.irr.set(vector);
        if level_triggered {
            self.tmr.set(vector);
        } else {
            self.tmr.clear(vector);
        }
        true
    }

    /// Delivers a routed message to this LAPIC according to its delivery mode. Returns whether
    /// the vCPU has something new to do (kick it if so).
    pub fn receive(&mut self, ipi: &Ipi) -> bool {
        if self.mode() == ApicMode::Disabled {
            return false;
        }
        match ipi.delivery_mode {
            DeliveryMode::Fixed | DeliveryMode::LowestPriority => {
                self.accept_interrupt(ipi.vector, ipi.trigger_mode == TriggerMode::Level)
            }
            DeliveryMode::Nmi => {
                self.accept_nmi();
                true
            }
            DeliveryMode::Init if ipi.is_init_deassert() => false,
            DeliveryMode::Init => {
                self.accept_init();
                true
            }
            DeliveryMode::StartUp => self.accept_sipi(ipi.vector),
            DeliveryMode::Smi => {
                self.events.unsupported_delivery_mode(2);
                false
            }
            DeliveryMode::ExtInt => {
                self.events.unsupported_delivery_mode(7);
                false
            }
        }
    }

    /// A rising edge on LINT0 (`pin` 0) or LINT1 (`pin` 1): delivers per that LVT entry
    /// unless masked (fixed or NMI; ExtINT, SMI and INIT are reported and dropped). Returns
    /// whether something became pending.
    pub fn assert_lint(&mut self, pin: usize) -> bool {
        let lvt = match pin {
            0 => self.lvt[3],
            1 => self.lvt[4],
            _ => return false,
        };
        if lvt & regs::LVT_MASKED != 0 || self.mode() == ApicMode::Disabled {
            return false;
        }
        let bits = (lvt >> 8) & 7;
        match DeliveryMode::from_bits(u64::from(bits)) {
            Some(DeliveryMode::Fixed) => self.accept_interrupt(low_byte(lvt), lvt & (1 << 15) != 0),
            Some(DeliveryMode::Nmi) => {
                self.accept_nmi();
                true
            }
            _ => {
                self.events.unsupported_delivery_mode(low_byte(bits));
                false
            }
        }
    }

    /// Accepts an NMI. Up to [`MAX_PENDING_NMIS`] wait for [`Lapic::take_nmi`]; more are
    /// merged, as a CPU latches only one NMI behind the one it is taking.
    pub fn accept_nmi(&mut self) {
        self.nmis.accept();
    }

    /// Whether an NMI is pending.
    pub fn nmi_pending(&self) -> bool {
        self.nmis.pending() > 0
    }

    /// Takes the pending NMIs: how many to inject, 0 to [`MAX_PENDING_NMIS`]. Inject each with
    /// its own `KVM_NMI`; KVM queues them and keeps one latched while the guest handles the
    /// other (its NMI blocking ends at the handler's IRET), so two sent before the guest took
    /// the first are both taken. Until [`Lapic::cpu_nmi`] says otherwise they hold fixed
    /// interrupts back ([`Lapic::injectable_interrupt`]).
    pub fn take_nmi(&mut self) -> u32 {
        self.nmis.take()
    }

    /// Whether the CPU may still hold NMIs it was handed: ask it (`KVM_GET_VCPU_EVENTS`) and
    /// tell [`Lapic::cpu_nmi`] before injecting a fixed interrupt, and at a halt.
    pub fn nmi_in_cpu(&self) -> bool {
        self.nmis.in_cpu()
    }

    /// What the CPU says it holds of the NMIs it was handed.
    pub fn cpu_nmi(&mut self, held: CpuNmi) {
        self.nmis.cpu_reports(held);
    }

    /// Whether the CPU will deliver an NMI at its next entry whatever IF is (a halted vCPU
    /// must run for it), as it last reported.
    pub fn nmi_wakes_cpu(&self) -> bool {
        self.nmis.wakes_cpu()
    }

    /// The interrupt to hand the CPU now: [`Lapic::next_interrupt`], unless an NMI accepted
    /// or handed over is still to be delivered (NMIs go first: see [`NmiQueue`]).
    pub fn injectable_interrupt(&self) -> Option<u8> {
        if self.nmis.holds_interrupts() {
            return None;
        }
        self.next_interrupt()
    }

    /// INIT: resets the registers (ID and IA32_APIC_BASE are kept) and waits for a SIPI. The
    /// VMM must stop the vCPU and reset its CPU state; cancel the host timer too.
    pub fn accept_init(&mut self) {
        self.reset_registers();
        self.nmis.clear();
        self.init_sipi = InitSipiState::WaitForSipi;
    }

    /// A start-up IPI: recorded only while waiting for one. Returns whether it was taken.
    pub fn accept_sipi(&mut self, vector: u8) -> bool {
        if self.init_sipi != InitSipiState::WaitForSipi {
            return false;
        }
        self.init_sipi = InitSipiState::SipiReceived(vector);
        true
    }

    /// Where the vCPU is in the INIT/SIPI sequence.
    pub fn init_sipi_state(&self) -> InitSipiState {
        self.init_sipi
    }

    /// Takes a received start-up vector and marks the vCPU running; start it in real mode
    /// with CS = vector << 8, RIP = 0.
    pub fn take_sipi(&mut self) -> Option<u8> {
        match self.init_sipi {
            InitSipiState::SipiReceived(vector) => {
                self.init_sipi = InitSipiState::Running;
                Some(vector)
            }
            _ => None,
        }
    }

    /// The highest pending vector whose priority class is above the PPR's: the interrupt to
    /// inject next when the guest can take one.
    pub fn next_interrupt(&self) -> Option<u8> {
        if self.mode() == ApicMode::Disabled {
            return None;
        }
        self.irr.highest().filter(|&v| class(v) > class(self.ppr()))
    }

    /// Whether the highest pending interrupt is held by the task priority alone: no in-service
    /// vector blocks it, but TPR's class is at or above its own. Lowering TPR (or CR8) lets it
    /// in, so a VMM that does not see every CR8 write must look again while this holds.
    pub fn held_by_tpr(&self) -> bool {
        if self.mode() == ApicMode::Disabled {
            return false;
        }
        let isr_class = class(self.isr.highest().unwrap_or(0));
        self.irr
            .highest()
            .is_some_and(|v| class(v) > isr_class && class(v) <= class(self.tpr))
    }

    /// Whether an interrupt or NMI is waiting for injection (a halted vCPU wakes for it).
    pub fn has_pending_interrupt(&self) -> bool {
        self.nmi_pending() || self.next_interrupt().is_some()
    }

    /// The VMM injected `vector`: moves it from IRR to ISR. Ignored if it was not pending.
    pub fn interrupt_injected(&mut self, vector: u8) {
        if self.irr.contains(vector) {
            self.irr.clear(vector);
            self.isr.set(vector);
        }
    }

    /// The EOI register was written: clears the highest in-service vector.
    fn end_of_interrupt(&mut self) -> Option<Eoi> {
        let vector = self.isr.highest()?;
        self.isr.clear(vector);
        Some(Eoi {
            vector,
            level_triggered: self.tmr.contains(vector),
        })
    }

    /// The host timer for this LAPIC passed. Sets the timer vector pending unless masked and
    /// returns the next deadline to arm (periodic mode, or a call before the deadline).
    pub fn timer_fired(&mut self, now_ns: u64) -> Option<u64> {
        let (fired, next) = self.timer.fire(now_ns);
        if fired {
            self.timer_interrupt();
        }
        next
    }

    /// The timer reached zero or its deadline: the LVT timer vector becomes pending unless
    /// masked.
    fn timer_interrupt(&mut self) {
        let lvt = self.lvt[0];
        if lvt & regs::LVT_MASKED == 0 {
            let _ = self.accept_interrupt(low_byte(lvt), false);
        }
    }

    /// Applies a timer write: an expiry on the spot raises the interrupt before the write
    /// completes; the host-timer change goes to the VMM.
    fn timer_update(&mut self, update: TimerUpdate) -> LapicTimerChange {
        if update.expired {
            self.timer_interrupt();
        }
        update.change
    }

    /// The timer mode selected by the LVT timer register.
    pub fn timer_mode(&self) -> TimerMode {
        self.timer.mode()
    }

    /// The armed timer deadline, if any.
    pub fn timer_deadline(&self) -> Option<u64> {
        self.timer.deadline()
    }

    /// Converts the TSC values written from now on (TSC deadlines) with `tsc`: the VMM
    /// re-anchors the map now and then, so that the guest TSC's drift against its clock does
    /// not accumulate over the VM's life. A deadline already armed keeps its conversion.
    pub fn set_tsc_map(&mut self, tsc: TscMap) {
        self.timer.set_tsc_map(tsc);
    }

    /// The events sink.
    pub fn events(&self) -> &E {
        &self.events
    }
}
