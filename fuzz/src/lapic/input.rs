//! What the `lapic` target reads from its input: the steps, and value shapes that reach the
//! interesting LAPIC states sooner than raw integers would (LVT entries, an enabled SVR, ICR
//! words, IA32_APIC_BASE values, TSC values near the guest's now, PV EOI flag addresses).

use arbitrary::Arbitrary;
use devices::lapic::{regs, APIC_BASE_ADDRESS, APIC_BASE_BSP, APIC_BASE_ENABLE, APIC_BASE_X2APIC};
use vmm::irqchip::user::pv_deadline::MSR_LULL_PV_DEADLINE;
use vmm::irqchip::user::pv_eoi::MSR_KVM_PV_EOI_EN;

/// Where an MMIO access lands, relative to the LAPIC page.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Offset {
    /// One of the 64 register slots (offset = n << 4).
    Register(u8),
    /// Anywhere in the 4 KiB page.
    Page(u16),
    /// Anywhere: inside or outside the page (then the exit is not the irqchip's).
    Wild(u32),
}

impl Offset {
    /// The offset from the LAPIC base.
    pub fn get(self) -> u64 {
        match self {
            Offset::Register(n) => u64::from(n & 0x3F) << 4,
            Offset::Page(o) => u64::from(o & 0xFFF),
            Offset::Wild(o) => u64::from(o),
        }
    }
}

/// A register value.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Value {
    /// Any.
    Raw(u32),
    /// Small (vectors, selectors, counts).
    Small(u16),
    /// An LVT entry: vector, timer mode bits 18:17, delivery mode, mask.
    Lvt {
        /// Vector.
        vector: u8,
        /// Timer mode.
        mode: u8,
        /// Delivery mode.
        delivery: u8,
        /// Masked.
        masked: bool,
    },
    /// SVR with the software-enable bit.
    Svr(u8),
    /// An ICR low word: vector, delivery mode, logical, level, trigger, shorthand.
    Icr {
        /// Vector.
        vector: u8,
        /// Delivery mode.
        delivery: u8,
        /// Logical destination.
        logical: bool,
        /// Level assert.
        assert: bool,
        /// Level-triggered.
        level: bool,
        /// Shorthand.
        shorthand: u8,
    },
}

impl Value {
    /// The 32-bit value.
    pub fn get(self) -> u32 {
        match self {
            Value::Raw(v) => v,
            Value::Small(v) => u32::from(v),
            Value::Lvt {
                vector,
                mode,
                delivery,
                masked,
            } => {
                u32::from(vector)
                    | (u32::from(delivery & 7) << 8)
                    | (u32::from(masked) << 16)
                    | (u32::from(mode & 3) << 17)
            }
            Value::Svr(v) => u32::from(v) | regs::SVR_ENABLED,
            Value::Icr {
                vector,
                delivery,
                logical,
                assert,
                level,
                shorthand,
            } => {
                u32::from(vector)
                    | (u32::from(delivery & 7) << 8)
                    | (u32::from(logical) << 11)
                    | (u32::from(assert) << 14)
                    | (u32::from(level) << 15)
                    | (u32::from(shorthand & 3) << 18)
            }
        }
    }
}

/// Which MSR.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Msr {
    /// IA32_APIC_BASE.
    ApicBase,
    /// IA32_TSC_DEADLINE.
    TscDeadline,
    /// One of the x2APIC range.
    X2Apic(u8),
    /// MSR_KVM_PV_EOI_EN.
    PvEoi,
    /// Any.
    Any(u32),
    /// MSR_LULL_PV_DEADLINE.
    PvDeadline,
}

impl Msr {
    /// The MSR index.
    pub fn get(self) -> u32 {
        match self {
            Msr::ApicBase => regs::MSR_APIC_BASE,
            Msr::TscDeadline => regs::MSR_TSC_DEADLINE,
            Msr::X2Apic(n) => regs::X2APIC_MSR_FIRST + u32::from(n),
            Msr::PvEoi => MSR_KVM_PV_EOI_EN,
            Msr::Any(m) => m,
            Msr::PvDeadline => MSR_LULL_PV_DEADLINE,
        }
    }
}

/// An MSR value.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum MsrValue {
    /// Any.
    Raw(u64),
    /// A register value.
    Register(Value),
    /// IA32_APIC_BASE: enable, x2APIC, BSP bits over a page address.
    ApicBase {
        /// Global enable.
        enable: bool,
        /// x2APIC mode.
        x2apic: bool,
        /// The page (if not the default).
        page: u32,
        /// The default page.
        default_page: bool,
    },
    /// A TSC value near the guest's now (in TSC ticks).
    TscNear(i32),
    /// A PV EOI flag address (bit 0: enable); mostly inside guest RAM.
    PvEoi {
        /// Byte offset in guest RAM (or past it).
        offset: u16,
        /// The enable bit.
        enable: bool,
    },
    /// A PV deadline slot address (bit 0: enable); mostly inside guest RAM, mostly aligned.
    PvSlot {
        /// Byte offset in guest RAM (or past it).
        offset: u16,
        /// Keep the low bits (misaligned) instead of clearing them.
        misaligned: bool,
        /// The enable bit.
        enable: bool,
    },
}

impl MsrValue {
    /// The value; `tsc_now` is the guest's TSC now.
    pub fn get(self, tsc_now: u64) -> u64 {
        match self {
            MsrValue::Raw(v) => v,
            MsrValue::Register(v) => u64::from(v.get()),
            MsrValue::ApicBase {
                enable,
                x2apic,
                page,
                default_page,
            } => {
                let page = if default_page {
                    devices::lapic::DEFAULT_APIC_BASE
                } else {
                    (u64::from(page) << 12) & APIC_BASE_ADDRESS
                };
                page | if enable { APIC_BASE_ENABLE } else { 0 }
                    | if x2apic { APIC_BASE_X2APIC } else { 0 }
                    | APIC_BASE_BSP
            }
            MsrValue::TscNear(delta) => tsc_now.saturating_add_signed(i64::from(delta)),
            MsrValue::PvEoi { offset, enable } => u64::from(offset & !3) | u64::from(enable),
            MsrValue::PvSlot {
                offset,
                misaligned,
                enable,
            } => {
                let addr = if misaligned { offset & !1 } else { offset & !7 };
                u64::from(addr) | u64::from(enable)
            }
        }
    }
}

/// A time step.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Delay {
    /// Nanoseconds.
    Tiny(u16),
    /// Microseconds.
    Micros(u16),
    /// Milliseconds.
    Millis(u16),
    /// Anything.
    Huge(u64),
}

impl Delay {
    /// In nanoseconds.
    pub fn get(self) -> u64 {
        match self {
            Delay::Tiny(n) => u64::from(n),
            Delay::Micros(n) => u64::from(n) * 1_000,
            Delay::Millis(n) => u64::from(n) * 1_000_000,
            Delay::Huge(n) => n,
        }
    }
}

/// An IPI the target sends and follows.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct IpiSpec {
    /// Vector.
    pub vector: u8,
    /// Destination (8 bits in xAPIC mode).
    pub destination: u32,
    /// Logical destination mode.
    pub logical: bool,
    /// Shorthand (0-3).
    pub shorthand: u8,
    /// An NMI instead of a fixed interrupt.
    pub nmi: bool,
}

/// What the guest does between an entry and the next exit (one exit's worth).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum GuestAction {
    /// A write to the LAPIC page at its current base (or anywhere, with `Offset::Wild`).
    MmioWrite {
        /// Where.
        offset: Offset,
        /// Width 0-8.
        len: u8,
        /// What.
        value: Value,
    },
    /// A read of the LAPIC page.
    MmioRead {
        /// Where.
        offset: Offset,
        /// Width 0-8.
        len: u8,
    },
    /// A write to the IOAPIC window.
    IoapicWrite {
        /// Offset in the window (IOREGSEL 0x00, IOWIN 0x10, or anything).
        offset: u16,
        /// Width 0-8.
        len: u8,
        /// What.
        value: Value,
    },
    /// A read of the IOAPIC window.
    IoapicRead {
        /// Offset.
        offset: u16,
        /// Width 0-8.
        len: u8,
    },
    /// WRMSR.
    MsrWrite {
        /// Which.
        msr: Msr,
        /// What.
        value: MsrValue,
    },
    /// RDMSR.
    MsrRead {
        /// Which.
        msr: Msr,
    },
    /// A fixed (or NMI), edge-triggered IPI through the ICR of the LAPIC's current mode,
    /// whose delivery the target checks.
    Ipi(IpiSpec),
    /// The guest ends its interrupt: through the PV EOI flag if lull set it, else the EOI
    /// register of the LAPIC's mode.
    Eoi,
    /// An interrupt-window exit.
    Window,
    /// KVM_RUN returned EINTR (a kick or a host tick).
    Interrupted,
    /// The guest stores a TSC deadline in its PV deadline slot (no exit of its own); the
    /// next exit (here an EINTR) takes it.
    StoreDeadline(MsrValue),
}

/// One step.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Op {
    /// vCPU `cpu` enters the guest (if it is not in it); `open`: it can take an interrupt.
    Enter {
        /// Which vCPU (modulo the count).
        cpu: u8,
        /// RFLAGS.IF and no shadow.
        open: bool,
    },
    /// vCPU `cpu` exits with what its guest did (entering first if it was out).
    Exit {
        /// Which vCPU.
        cpu: u8,
        /// The exit.
        action: GuestAction,
    },
    /// Time passes; due host timers fire (the `central` thread runs).
    Advance(Delay),
    /// The `central` model's timer thread wakes for no reason.
    TimerThread,
    /// An edge on an IOAPIC pin (the serial port's way).
    Edge(u8),
    /// A device drives an IOAPIC line (pc-testdev's way).
    Line {
        /// Pin.
        pin: u8,
        /// Level.
        asserted: bool,
    },
}
