//! The guest's two views of the LAPIC registers: the xAPIC MMIO page and the x2APIC MSRs, plus
//! IA32_APIC_BASE (0x1B) and IA32_TSC_DEADLINE (0x6E0).

use super::events::{InvalidAccess, LapicEvents};
use super::icr::{decode_icr, IcrDecode};
use super::regs::{self, low_byte};
use super::timer::TimerMode;
use super::{
    ApicBaseChange, ApicMode, Lapic, LapicEffects, LapicError, LapicTimerChange, APIC_BASE_BSP,
    APIC_BASE_ENABLE, APIC_BASE_X2APIC,
};

/// Whether `msr` is handled by [`Lapic::read_msr`] / [`Lapic::write_msr`].
///
/// ```
/// assert!(devices::lapic::is_lapic_msr(0x1B));
/// assert!(devices::lapic::is_lapic_msr(0x830));
/// assert!(!devices::lapic::is_lapic_msr(0x10));
/// ```
pub fn is_lapic_msr(msr: u32) -> bool {
    msr == regs::MSR_APIC_BASE
        || msr == regs::MSR_TSC_DEADLINE
        || regs::msr_to_offset(msr).is_some()
}

/// A register read outcome shared by both views.
enum Read {
    Value(u32),
    /// Reserved in this mode (xAPIC: ESR illegal register; x2APIC: #GP).
    Reserved,
}

/// A register write outcome shared by both views.
enum Write {
    Done(LapicEffects),
    ReadOnly,
    Reserved,
}

impl<E: LapicEvents> Lapic<E> {
    /// Reads `data.len()` bytes at `offset` from the MMIO base. Only aligned 1, 2 or 4 byte
    /// reads inside one register return data; anything else reads zeros. While the xAPIC
    /// interface is off (x2APIC mode or globally disabled) the page is not the APIC: reads
    /// return all ones, as unbacked MMIO does (KVM's LAPIC MMIO hole quirk does the same).
    pub fn read_mmio(&mut self, offset: u64, data: &mut [u8], now_ns: u64) {
        if self.mode() != ApicMode::XApic {
            data.fill(0xFF);
            self.events
                .invalid_access(InvalidAccess::MmioWhileDisabled { offset });
            return;
        }
        data.fill(0);
        let within = usize::try_from(offset & 0xF).unwrap_or(usize::MAX);
        if !matches!(data.len(), 1 | 2 | 4) || within + data.len() > 4 {
            self.events.invalid_access(InvalidAccess::BadWidth {
                offset,
                len: data.len(),
            });
            return;
        }
        let value = match u32::try_from(offset & !0xF) {
            Ok(register) => self.read_register(register, false, now_ns),
            Err(_) => Read::Reserved,
        };
        match value {
            Read::Value(value) => {
                let bytes = value.to_le_bytes();
                data.copy_from_slice(&bytes[within..within + data.len()]);
            }
            Read::Reserved => self.illegal_register(offset),
        }
    }

    /// Writes `data` at `offset` from the MMIO base. Only aligned 4-byte writes take effect,
    /// and none while the xAPIC interface is off.
    pub fn write_mmio(&mut self, offset: u64, data: &[u8], now_ns: u64) -> LapicEffects {
        if self.mode() != ApicMode::XApic {
            self.events
                .invalid_access(InvalidAccess::MmioWhileDisabled { offset });
            return LapicEffects::default();
        }
        let (Ok(bytes), 0) = (<[u8; 4]>::try_from(data), offset & 0xF) else {
            self.events.invalid_access(InvalidAccess::BadWidth {
                offset,
                len: data.len(),
            });
            return LapicEffects::default();
        };
        let value = u32::from_le_bytes(bytes);
        let Ok(register) = u32::try_from(offset) else {
            self.illegal_register(offset);
            return LapicEffects::default();
        };
        match self.write_register(register, u64::from(value), false, now_ns) {
            Write::Done(effects) => effects,
            Write::ReadOnly => {
                self.events
                    .invalid_access(InvalidAccess::ReadOnlyRegister { offset });
                LapicEffects::default()
            }
            Write::Reserved => {
                self.illegal_register(offset);
                LapicEffects::default()
            }
        }
    }

    fn illegal_register(&mut self, offset: u64) {
        self.events
            .invalid_access(InvalidAccess::ReservedRegister { offset });
        self.set_error(regs::ESR_ILLEGAL_REGISTER);
    }

    fn fault(&self, msr: u32) -> LapicError {
        self.events.invalid_access(InvalidAccess::MsrFault { msr });
        LapicError::GeneralProtection { msr }
    }

    /// Reads a LAPIC MSR (see [`is_lapic_msr`]). `Err(GeneralProtection)`: inject #GP.
    pub fn read_msr(&mut self, msr: u32, now_ns: u64) -> Result<u64, LapicError> {
        match msr {
            regs::MSR_APIC_BASE => return Ok(self.apic_base),
            regs::MSR_TSC_DEADLINE => return Ok(self.timer.tsc_deadline()),
            _ => {}
        }
        let offset = regs::msr_to_offset(msr).ok_or(LapicError::NotLapicMsr(msr))?;
        if self.mode() != ApicMode::X2Apic {
            return Err(self.fault(msr));
        }
        if offset == regs::ICR_LOW {
            return Ok(self.icr);
        }
        match self.read_register(offset, true, now_ns) {
            Read::Value(value) => Ok(u64::from(value)),
            Read::Reserved => Err(self.fault(msr)),
        }
    }

    /// Writes a LAPIC MSR (see [`is_lapic_msr`]). `Err(GeneralProtection)`: inject #GP.
    pub fn write_msr(
        &mut self,
        msr: u32,
        value: u64,
        now_ns: u64,
    ) -> Result<LapicEffects, LapicError> {
        match msr {
            regs::MSR_APIC_BASE => return self.write_apic_base(value),
            regs::MSR_TSC_DEADLINE => {
                let (timer, timer_expired) = if self.mode() == ApicMode::Disabled {
                    (LapicTimerChange::Unchanged, false)
                } else {
                    let update = self.timer.write_tsc_deadline(value, now_ns, &self.events);
                    (self.timer_update(update), update.expired)
                };
                return Ok(LapicEffects {
                    timer,
                    timer_expired,
                    ..LapicEffects::default()
                });
            }
            _ => {}
        }
        let offset = regs::msr_to_offset(msr).ok_or(LapicError::NotLapicMsr(msr))?;
        if self.mode() != ApicMode::X2Apic || (offset != regs::ICR_LOW && value >> 32 != 0) {
            return Err(self.fault(msr));
        }
        match self.write_register(offset, value, true, now_ns) {
            Write::Done(effects) => Ok(effects),
            Write::ReadOnly | Write::Reserved => Err(self.fault(msr)),
        }
    }

    fn read_register(&mut self, offset: u32, x2apic: bool, now_ns: u64) -> Read {
        let value = match offset {
            regs::ID if x2apic => self.apic_id(),
            regs::ID => u32::from(self.xapic_id) << 24,
            regs::VERSION => regs::VERSION_VALUE,
            regs::TPR => u32::from(self.tpr),
            regs::APR if !x2apic => u32::from(self.arbitration_priority()),
            regs::PPR => u32::from(self.ppr()),
            regs::EOI if !x2apic => 0,
            regs::RRD if !x2apic => 0,
            regs::LDR => self.ldr(),
            regs::DFR if !x2apic => self.dfr,
            regs::SVR => self.svr,
            regs::ISR0..=0x170 => self.isr.word(word_index(offset, regs::ISR0)),
            regs::TMR0..=0x1F0 => self.tmr.word(word_index(offset, regs::TMR0)),
            regs::IRR0..=0x270 => self.irr.word(word_index(offset, regs::IRR0)),
            regs::ESR => self.esr,
            regs::ICR_LOW => u32::try_from(self.icr & 0xFFFF_FFFF).unwrap_or(0),
            regs::ICR_HIGH if !x2apic => u32::try_from(self.icr >> 32).unwrap_or(0),
            regs::LVT_TIMER..=regs::LVT_ERROR => match regs::lvt_index(offset) {
                Some(index) => self.lvt[index],
                None => return Read::Reserved,
            },
            regs::TIMER_INITIAL => self.timer.initial_count(),
            regs::TIMER_CURRENT => self.timer.current_count(now_ns),
            regs::TIMER_DIVIDE => self.timer.divide_config(),
            _ => return Read::Reserved,
        };
        Read::Value(value)
    }

    fn write_register(&mut self, offset: u32, value: u64, x2apic: bool, now_ns: u64) -> Write {
        let low = u32::try_from(value & 0xFFFF_FFFF).unwrap_or(0);
        let mut effects = LapicEffects::default();
        match offset {
            regs::ID if x2apic => return Write::ReadOnly,
            regs::ID => {
                self.xapic_id = low_byte(low >> 24);
                effects.destination_changed = true;
            }
            regs::TPR => self.tpr = low_byte(low),
            regs::EOI if x2apic && value != 0 => return Write::Reserved,
            regs::EOI => effects.eoi = self.end_of_interrupt(),
            regs::LDR if x2apic => return Write::ReadOnly,
            regs::LDR => {
                self.ldr = low & 0xFF00_0000;
                effects.destination_changed = true;
            }
            regs::DFR if !x2apic => {
                self.dfr = low | 0x0FFF_FFFF;
                effects.destination_changed = true;
            }
            regs::SVR => {
                self.write_svr(low);
                effects.destination_changed = true;
            }
            regs::ESR if x2apic && value != 0 => return Write::Reserved,
            regs::ESR => self.esr = std::mem::take(&mut self.esr_pending),
            regs::ICR_LOW if x2apic && value & regs::X2APIC_ICR_RESERVED != 0 => {
                return Write::Reserved
            }
            regs::ICR_LOW if x2apic => {
                self.icr = value & (0xFFFF_FFFF_0000_0000 | u64::from(regs::ICR_LOW_WRITABLE));
                effects.ipi = self.send_ipi(true);
            }
            regs::ICR_LOW => {
                self.icr =
                    (self.icr & 0xFFFF_FFFF_0000_0000) | u64::from(low & regs::ICR_LOW_WRITABLE);
                effects.ipi = self.send_ipi(false);
            }
            regs::ICR_HIGH if !x2apic => {
                self.icr = (self.icr & 0xFFFF_FFFF) | (u64::from(low & 0xFF00_0000) << 32);
            }
            regs::LVT_TIMER..=regs::LVT_ERROR => match regs::lvt_index(offset) {
                Some(index) => {
                    (effects.timer, effects.timer_expired) =
                        self.write_lvt(index, low, offset, now_ns);
                }
                None => return Write::Reserved,
            },
            regs::TIMER_INITIAL => {
                let update = self.timer.write_initial_count(low, now_ns, &self.events);
                effects.timer_expired = update.expired;
                effects.timer = self.timer_update(update);
            }
            regs::TIMER_DIVIDE => {
                let update = self.timer.write_divide(low, now_ns, &self.events);
                effects.timer_expired = update.expired;
                effects.timer = self.timer_update(update);
            }
            regs::SELF_IPI if x2apic && value > 0xFF => return Write::Reserved,
            regs::SELF_IPI if x2apic => self.self_ipi(low_byte(low)),
            regs::VERSION | regs::PPR | regs::TIMER_CURRENT => return Write::ReadOnly,
            regs::APR | regs::RRD | regs::ISR0..=0x270 if !x2apic => return Write::ReadOnly,
            regs::ISR0..=0x270 if offset.is_multiple_of(0x10) => return Write::ReadOnly,
            _ => return Write::Reserved,
        }
        Write::Done(effects)
    }

    fn write_svr(&mut self, value: u32) {
        self.svr = value & regs::SVR_WRITABLE;
        if !self.software_enabled() {
            for lvt in &mut self.lvt {
                *lvt |= regs::LVT_MASKED;
            }
        }
    }

    fn write_lvt(
        &mut self,
        index: usize,
        value: u32,
        offset: u32,
        now_ns: u64,
    ) -> (LapicTimerChange, bool) {
        let writable = regs::lvt_writable(index);
        let mut lvt = value & writable;
        if value & !writable & !(1 << 12) != 0 {
            self.events.invalid_access(InvalidAccess::ReservedBits {
                offset,
                value: u64::from(value),
            });
        }
        if !self.software_enabled() {
            lvt |= regs::LVT_MASKED;
        }
        let mut change = LapicTimerChange::Unchanged;
        let mut expired = false;
        if index == 0 {
            // An expiry due before this write happened under the old LVT (vector, mask, mode),
            // even if the host timer has not told us yet.
            let settled = self.timer.settle(now_ns);
            expired = settled.expired;
            change = self.timer_update(settled);
            let mode = TimerMode::from_lvt(lvt).unwrap_or_else(|| {
                self.events.invalid_access(InvalidAccess::ReservedBits {
                    offset,
                    value: u64::from(value),
                });
                lvt &= !(3 << 17);
                TimerMode::OneShot
            });
            change = change.then(self.timer.set_mode(mode, &self.events));
        }
        self.lvt[index] = lvt;
        (change, expired)
    }

    fn send_ipi(&mut self, x2apic: bool) -> Option<super::Ipi> {
        match decode_icr(self.icr, x2apic, self.apic_id()) {
            IcrDecode::Send(ipi) => Some(ipi),
            IcrDecode::IllegalVector(vector) => {
                self.events.illegal_vector(vector);
                self.set_error(regs::ESR_SEND_ILLEGAL_VECTOR);
                None
            }
            IcrDecode::Unsupported(mode) => {
                self.events.unsupported_delivery_mode(mode);
                None
            }
        }
    }

    /// The x2APIC SELF_IPI register: a fixed, edge-triggered interrupt to this LAPIC.
    fn self_ipi(&mut self, vector: u8) {
        if vector < 16 {
            self.events.illegal_vector(vector);
            self.set_error(regs::ESR_SEND_ILLEGAL_VECTOR);
        } else {
            let _ = self.accept_interrupt(vector, false);
        }
    }

    fn write_apic_base(&mut self, value: u64) -> Result<LapicEffects, LapicError> {
        let msr = regs::MSR_APIC_BASE;
        let known =
            self.apic_base_address_mask | APIC_BASE_BSP | APIC_BASE_ENABLE | APIC_BASE_X2APIC;
        if value & !known != 0 || (value & APIC_BASE_X2APIC != 0 && !self.x2apic_supported) {
            return Err(self.fault(msr));
        }
        let old_mode = self.mode();
        let new_mode = match (value & APIC_BASE_ENABLE != 0, value & APIC_BASE_X2APIC != 0) {
            (false, false) => ApicMode::Disabled,
            (true, false) => ApicMode::XApic,
            (true, true) => ApicMode::X2Apic,
            (false, true) => return Err(self.fault(msr)),
        };
        match (old_mode, new_mode) {
            (ApicMode::X2Apic, ApicMode::XApic) | (ApicMode::Disabled, ApicMode::X2Apic) => {
                return Err(self.fault(msr))
            }
            _ => {}
        }
        let old_base = self.base_address();
        self.apic_base = (value & !APIC_BASE_BSP) | (self.apic_base & APIC_BASE_BSP);
        let mut effects = LapicEffects::default();
        if new_mode == ApicMode::Disabled && old_mode != ApicMode::Disabled {
            let armed = self.timer.deadline().is_some();
            self.reset_registers();
            self.xapic_id = low_byte(self.initial_id);
            if armed {
                effects.timer = LapicTimerChange::Cancel;
            }
        }
        effects.destination_changed = new_mode != old_mode;
        if new_mode != old_mode || self.base_address() != old_base {
            effects.base_change = Some(ApicBaseChange {
                base_address: self.base_address(),
                mode: new_mode,
            });
        }
        Ok(effects)
    }
}

fn word_index(offset: u32, first: u32) -> usize {
    usize::try_from((offset - first) >> 4).unwrap_or(usize::MAX)
}
