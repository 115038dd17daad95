//! The `lapic` target: two local APICs driven the way `vmm::vcpu::user` drives them, by
//! arbitrary xAPIC MMIO accesses (any offset and width), x2APIC / APIC_BASE / TSC-deadline MSR
//! accesses, clock advances, host-timer expiries (due and stale), interrupt acceptance and
//! injection, EOIs, IPIs routed between the two, INIT/SIPI, LINT and CR8 writes.
//!
//! After every step, for each LAPIC:
//! - PPR is TPR or the class of the highest in-service vector, whichever is higher, and the
//!   PPR and TPR registers read what `ppr()` / `tpr()` say;
//! - a vector offered for injection is of a class above PPR and becomes the highest ISR bit;
//!   an EOI clears the highest ISR bit;
//! - every deadline the LAPIC asks for is at least `min_delay_ns` after now, and a periodic
//!   re-arm is at least `min_period_ns` after the previous deadline;
//! - **no lost timer**: whenever the model has a deadline, the (simulated) host timer is armed
//!   no later than it, and a fire with the LVT unmasked leaves the vector in IRR;
//! - **the clamp bounds the storm**: timer fires <= guest writes that armed the timer +
//!   elapsed time / `min_period_ns`.

use arbitrary::{Arbitrary, Unstructured};
use devices::lapic::{regs, ApicMode};
use devices::lapic::{
    route, DeliveryMode, DestinationMode, Ipi, Lapic, LapicConfig, LapicEffects, LapicTimerChange,
    Shorthand, TimerLimits, TriggerMode, TscMap, APIC_BASE_ADDRESS, APIC_BASE_BSP,
    APIC_BASE_ENABLE, APIC_BASE_X2APIC,
};

/// Where an MMIO access lands.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Offset {
    /// One of the 64 register slots (offset = n << 4).
    Register(u8),
    /// Anywhere in the 4 KiB page.
    Page(u16),
    /// Anywhere at all (the VMM only sends offsets inside the page, but the model must cope).
    Wild(u64),
}

impl Offset {
    fn get(self) -> u64 {
        match self {
            Offset::Register(n) => u64::from(n & 0x3F) << 4,
            Offset::Page(o) => u64::from(o & 0xFFF),
            Offset::Wild(o) => o,
        }
    }
}

/// A register value, with shapes that reach the interesting states sooner.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Value {
    Raw(u32),
    Small(u16),
    /// An LVT entry: vector, mode bits 18:17, delivery mode, mask.
    Lvt {
        vector: u8,
        mode: u8,
        delivery: u8,
        masked: bool,
    },
    /// SVR with the software-enable bit.
    Svr(u8),
    /// An ICR low word: vector, delivery mode, logical, level, trigger, shorthand.
    Icr {
        vector: u8,
        delivery: u8,
        logical: bool,
        assert: bool,
        level: bool,
        shorthand: u8,
    },
}

impl Value {
    fn get(self) -> u32 {
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
enum Msr {
    ApicBase,
    TscDeadline,
    X2Apic(u8),
    Any(u32),
}

impl Msr {
    fn get(self) -> u32 {
        match self {
            Msr::ApicBase => regs::MSR_APIC_BASE,
            Msr::TscDeadline => regs::MSR_TSC_DEADLINE,
            Msr::X2Apic(n) => regs::X2APIC_MSR_FIRST + u32::from(n),
            Msr::Any(m) => m,
        }
    }
}

/// An MSR value.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum MsrValue {
    Raw(u64),
    Register(Value),
    /// IA32_APIC_BASE: enable, x2APIC, BSP bits over a page address.
    ApicBase {
        enable: bool,
        x2apic: bool,
        page: u32,
        default_page: bool,
    },
    /// A TSC value near "now" (in TSC ticks relative to the TSC at now).
    TscNear(i32),
}

/// A time step.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Delay {
    Tiny(u16),
    Micros(u16),
    Millis(u16),
    Huge(u64),
}

impl Delay {
    fn get(self) -> u64 {
        match self {
            Delay::Tiny(n) => u64::from(n),
            Delay::Micros(n) => u64::from(n) * 1_000,
            Delay::Millis(n) => u64::from(n) * 1_000_000,
            Delay::Huge(n) => n,
        }
    }
}

/// An interrupt message arriving from outside (the IOAPIC or a third CPU).
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Message {
    delivery: u8,
    vector: u8,
    destination: u32,
    logical: bool,
    shorthand: u8,
    assert: bool,
    level: bool,
    x2apic_format: bool,
}

impl Message {
    fn ipi(self) -> Option<Ipi> {
        Some(Ipi {
            delivery_mode: DeliveryMode::from_bits(u64::from(self.delivery))?,
            vector: self.vector,
            destination: self.destination,
            destination_mode: if self.logical {
                DestinationMode::Logical
            } else {
                DestinationMode::Physical
            },
            shorthand: match self.shorthand & 3 {
                0 => Shorthand::None,
                1 => Shorthand::SelfOnly,
                2 => Shorthand::AllIncludingSelf,
                _ => Shorthand::AllExcludingSelf,
            },
            assert: self.assert,
            trigger_mode: if self.level {
                TriggerMode::Level
            } else {
                TriggerMode::Edge
            },
            x2apic_format: self.x2apic_format,
            source_apic_id: None,
        })
    }
}

/// One step; `cpu` picks LAPIC 0 or 1.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    MmioWrite {
        cpu: bool,
        offset: Offset,
        len: u8,
        value: Value,
    },
    MmioRead {
        cpu: bool,
        offset: Offset,
        len: u8,
    },
    MsrWrite {
        cpu: bool,
        msr: Msr,
        value: MsrValue,
    },
    MsrRead {
        cpu: bool,
        msr: Msr,
    },
    Advance(Delay),
    StaleHostTimer {
        cpu: bool,
    },
    Accept {
        cpu: bool,
        vector: u8,
        level: bool,
    },
    Inject {
        cpu: bool,
    },
    Eoi {
        cpu: bool,
    },
    Receive(Message),
    SetCr8 {
        cpu: bool,
        cr8: u8,
    },
    Lint {
        cpu: bool,
        pin: u8,
    },
    TakeSipi {
        cpu: bool,
    },
    TakeNmi {
        cpu: bool,
    },
}

/// One vCPU as the VMM sees it: its LAPIC and its host timer.
struct Cpu {
    lapic: Lapic,
    host: Option<u64>,
    arms: u64,
    fires: u64,
}

/// Two vCPUs, a clock and the limits every LAPIC was built with.
struct Machine {
    cpus: [Cpu; 2],
    now: u64,
    start: u64,
    limits: TimerLimits,
    tsc: TscMap,
}

/// The clock stops here: ~146 years of uptime. Beyond it, deadlines that saturate at
/// `u64::MAX` would look due, which no real run reaches.
const MAX_NOW: u64 = 1 << 62;

fn index(cpu: bool) -> usize {
    usize::from(cpu)
}

/// A register read through the interface of the LAPIC's current mode (None when disabled).
fn read_reg(lapic: &mut Lapic, offset: u32, now: u64) -> Option<u32> {
    match lapic.mode() {
        ApicMode::Disabled => None,
        ApicMode::XApic => {
            let mut data = [0u8; 4];
            lapic.read_mmio(u64::from(offset), &mut data, now);
            Some(u32::from_le_bytes(data))
        }
        ApicMode::X2Apic => {
            let msr = regs::X2APIC_MSR_FIRST + (offset >> 4);
            let value = lapic
                .read_msr(msr, now)
                .unwrap_or_else(|e| panic!("x2APIC read of {offset:#x} faulted: {e}"));
            Some(u32::try_from(value & 0xFFFF_FFFF).unwrap_or(0))
        }
    }
}

/// The 256-bit register starting at `first` (ISR, TMR or IRR), if readable.
fn read_bitmap(lapic: &mut Lapic, first: u32, now: u64) -> Option<[u32; 8]> {
    let mut words = [0u32; 8];
    for (i, word) in (0u32..).zip(words.iter_mut()) {
        *word = read_reg(lapic, first + i * 0x10, now)?;
    }
    Some(words)
}

fn highest(words: &[u32; 8]) -> Option<u8> {
    (0u8..8).rev().find_map(|i| {
        let w = words[usize::from(i)];
        let top = 31u32.checked_sub(w.leading_zeros())?;
        u8::try_from(u32::from(i) * 32 + top).ok()
    })
}

fn contains(words: &[u32; 8], vector: u8) -> bool {
    words[usize::from(vector >> 5)] & (1 << (vector & 31)) != 0
}

impl Machine {
    fn new(u: &mut Unstructured<'_>) -> arbitrary::Result<Self> {
        let tsc = TscMap {
            tsc_khz: u64::from(u.int_in_range(1u32..=10_000_000)?),
            tsc_at_ns0: u.arbitrary()?,
        };
        let bus_hz = match u.int_in_range(0u8..=2)? {
            0 => devices::lapic::DEFAULT_BUS_HZ,
            1 => u.int_in_range(1u64..=10_000_000_000)?,
            _ => 25_000_000,
        };
        let x2apic_supported = u.arbitrary()?;
        let limits = TimerLimits::default();
        let make = |id: u32| -> Cpu {
            let config = LapicConfig {
                apic_id: id,
                bsp: id == 0,
                bus_hz,
                tsc,
                limits,
                x2apic_supported,
                ..LapicConfig::default()
            };
            let lapic = Lapic::new(config).unwrap_or_else(|e| panic!("valid config refused: {e}"));
            Cpu {
                lapic,
                host: None,
                arms: 0,
                fires: 0,
            }
        };
        let start = match u.int_in_range(0u8..=2)? {
            0 => 0,
            1 => u.int_in_range(0u64..=1 << 50)?,
            _ => MAX_NOW - u64::from(u.arbitrary::<u32>()?),
        };
        Ok(Machine {
            cpus: [make(0), make(1)],
            now: start,
            start,
            limits,
            tsc,
        })
    }

    fn msr_value(&self, value: MsrValue) -> u64 {
        match value {
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
            MsrValue::TscNear(delta) => self
                .tsc
                .tsc_at(self.now)
                .saturating_add_signed(i64::from(delta)),
        }
    }

    /// Applies what a LAPIC write asked of the VMM, checking the timer request.
    fn apply(&mut self, cpu: usize, effects: LapicEffects) {
        match effects.timer {
            LapicTimerChange::Arm { deadline_ns } => {
                let floor = self.now.saturating_add(self.limits.min_delay_ns);
                assert!(
                    deadline_ns >= floor,
                    "cpu {cpu}: deadline {deadline_ns} below now {} + min delay",
                    self.now
                );
                self.cpus[cpu].arms += 1;
                self.cpus[cpu].host = Some(deadline_ns);
            }
            LapicTimerChange::Cancel => self.cpus[cpu].host = None,
            LapicTimerChange::Unchanged => {}
        }
        if let Some(ipi) = effects.ipi {
            self.deliver(&ipi, Some(cpu));
        }
    }

    /// Routes a message over both LAPICs and delivers it, as `InterruptRouter` does.
    fn deliver(&mut self, ipi: &Ipi, source: Option<usize>) {
        let mut ipi = *ipi;
        if let Some(s) = source {
            ipi.source_apic_id = Some(self.cpus[s].lapic.apic_id());
        }
        let table = [
            self.cpus[0].lapic.destination_info(),
            self.cpus[1].lapic.destination_info(),
        ];
        let targets: Vec<usize> = route(&ipi, &table).iter().collect();
        for t in targets {
            let Some(target) = self.cpus.get_mut(t) else {
                panic!("route named LAPIC {t} of 2");
            };
            let init = ipi.delivery_mode == DeliveryMode::Init && !ipi.is_init_deassert();
            if target.lapic.receive(&ipi) && init {
                // INIT resets the LAPIC: the VMM cancels its host timer.
                target.host = None;
            }
        }
    }

    /// The host timer of `cpu` passed (or a stale one fired): what the vCPU loop does.
    fn host_timer_fired(&mut self, cpu: usize) {
        let now = self.now;
        let min_period = self.limits.min_period_ns;
        let c = &mut self.cpus[cpu];
        let before = c.lapic.timer_deadline();
        let lvt = read_reg(&mut c.lapic, regs::LVT_TIMER, now);
        let next = c.lapic.timer_fired(now);
        let Some(due) = before.filter(|&d| d <= now) else {
            assert_eq!(
                next, before,
                "cpu {cpu}: early timer_fired moved the deadline"
            );
            if next.is_some() {
                c.host = next;
            }
            return;
        };
        c.fires += 1;
        if let Some(next) = next {
            assert!(
                next - due >= min_period,
                "cpu {cpu}: periodic step {} below the {min_period} ns clamp",
                next - due
            );
            assert!(
                next > now || next == u64::MAX,
                "cpu {cpu}: re-armed in the past"
            );
        }
        c.host = next;
        if let Some(lvt) = lvt {
            let vector = regs::low_byte(lvt);
            if lvt & regs::LVT_MASKED == 0 && vector >= 16 {
                let irr = read_bitmap(&mut c.lapic, regs::IRR0, now);
                assert!(
                    irr.is_some_and(|irr| contains(&irr, vector)),
                    "cpu {cpu}: timer fired unmasked but vector {vector:#x} is not in IRR"
                );
            }
        }
    }

    fn advance(&mut self, delay: u64) {
        self.now = self.now.saturating_add(delay).min(MAX_NOW);
        for cpu in 0..2 {
            // Each pass moves the deadline past now, so two passes always suffice.
            for _ in 0..2 {
                match self.cpus[cpu].host {
                    Some(at) if at <= self.now => self.host_timer_fired(cpu),
                    _ => break,
                }
            }
            if let Some(at) = self.cpus[cpu].host {
                assert!(
                    at > self.now,
                    "cpu {cpu}: host timer still due after firing"
                );
            }
        }
    }

    fn step(&mut self, op: Op) {
        let now = self.now;
        match op {
            Op::MmioWrite {
                cpu,
                offset,
                len,
                value,
            } => {
                let bytes = value.get().to_le_bytes();
                let mut data = [0u8; 8];
                data[..4].copy_from_slice(&bytes);
                let len = usize::from(len % 9);
                let effects =
                    self.cpus[index(cpu)]
                        .lapic
                        .write_mmio(offset.get(), &data[..len], now);
                self.apply(index(cpu), effects);
            }
            Op::MmioRead { cpu, offset, len } => {
                let mut data = [0u8; 8];
                let len = usize::from(len % 9);
                self.cpus[index(cpu)]
                    .lapic
                    .read_mmio(offset.get(), &mut data[..len], now);
            }
            Op::MsrWrite { cpu, msr, value } => {
                let value = self.msr_value(value);
                if let Ok(effects) = self.cpus[index(cpu)].lapic.write_msr(msr.get(), value, now) {
                    self.apply(index(cpu), effects);
                }
            }
            Op::MsrRead { cpu, msr } => {
                let _ = self.cpus[index(cpu)].lapic.read_msr(msr.get(), now);
            }
            Op::Advance(delay) => self.advance(delay.get()),
            Op::StaleHostTimer { cpu } => self.host_timer_fired(index(cpu)),
            Op::Accept { cpu, vector, level } => {
                let _ = self.cpus[index(cpu)].lapic.accept_interrupt(vector, level);
            }
            Op::Inject { cpu } => self.inject(index(cpu)),
            Op::Eoi { cpu } => self.eoi(index(cpu)),
            Op::Receive(message) => {
                if let Some(ipi) = message.ipi() {
                    self.deliver(&ipi, None);
                }
            }
            Op::SetCr8 { cpu, cr8 } => self.cpus[index(cpu)].lapic.set_cr8(u64::from(cr8)),
            Op::Lint { cpu, pin } => {
                let _ = self.cpus[index(cpu)]
                    .lapic
                    .assert_lint(usize::from(pin % 3));
            }
            Op::TakeSipi { cpu } => {
                let _ = self.cpus[index(cpu)].lapic.take_sipi();
            }
            Op::TakeNmi { cpu } => {
                let lapic = &mut self.cpus[index(cpu)].lapic;
                let pending = lapic.nmi_pending();
                assert_eq!(lapic.take_nmi() > 0, pending);
                assert!(!lapic.nmi_pending());
            }
        }
    }

    fn inject(&mut self, cpu: usize) {
        let now = self.now;
        let lapic = &mut self.cpus[cpu].lapic;
        let Some(vector) = lapic.next_interrupt() else {
            return;
        };
        assert!(lapic.has_pending_interrupt());
        assert!(
            vector >> 4 > lapic.ppr() >> 4,
            "cpu {cpu}: vector {vector:#x} offered at PPR {:#x}",
            lapic.ppr()
        );
        lapic.interrupt_injected(vector);
        if let Some(isr) = read_bitmap(lapic, regs::ISR0, now) {
            assert_eq!(
                highest(&isr),
                Some(vector),
                "cpu {cpu}: injected vector not in service"
            );
        }
    }

    fn eoi(&mut self, cpu: usize) {
        let now = self.now;
        let lapic = &mut self.cpus[cpu].lapic;
        let before = read_bitmap(lapic, regs::ISR0, now);
        let effects = match lapic.mode() {
            ApicMode::X2Apic => lapic
                .write_msr(regs::X2APIC_MSR_FIRST + (regs::EOI >> 4), 0, now)
                .unwrap_or_else(|e| panic!("cpu {cpu}: x2APIC EOI faulted: {e}")),
            _ => lapic.write_mmio(u64::from(regs::EOI), &[0; 4], now),
        };
        if let Some(before) = before {
            assert_eq!(
                effects.eoi.map(|e| e.vector),
                highest(&before),
                "cpu {cpu}: EOI did not retire the highest in-service vector"
            );
        }
        self.apply(cpu, effects);
    }

    fn check(&mut self) {
        let now = self.now;
        let elapsed = now - self.start;
        let min_period = self.limits.min_period_ns;
        for (cpu, c) in self.cpus.iter_mut().enumerate() {
            let lapic = &mut c.lapic;
            if let Some(deadline) = lapic.timer_deadline() {
                assert!(
                    c.host.is_some_and(|h| h <= deadline),
                    "cpu {cpu}: lost timer: model deadline {deadline}, host timer {:?}",
                    c.host
                );
            }
            assert!(
                c.fires <= c.arms + elapsed / min_period,
                "cpu {cpu}: {} fires from {} arms in {elapsed} ns exceed the clamp",
                c.fires,
                c.arms
            );
            if lapic.next_interrupt().is_some() {
                assert!(lapic.has_pending_interrupt());
            }
            let (tpr, ppr) = (lapic.tpr(), lapic.ppr());
            assert_eq!(u64::from(tpr >> 4), lapic.cr8());
            let Some(isr) = read_bitmap(lapic, regs::ISR0, now) else {
                continue;
            };
            let isrv = highest(&isr).unwrap_or(0);
            let derived = if tpr >> 4 >= isrv >> 4 {
                tpr
            } else {
                isrv & 0xF0
            };
            assert_eq!(
                ppr, derived,
                "cpu {cpu}: PPR inconsistent with TPR {tpr:#x}, ISR"
            );
            assert_eq!(read_reg(lapic, regs::PPR, now), Some(u32::from(ppr)));
            assert_eq!(read_reg(lapic, regs::TPR, now), Some(u32::from(tpr)));
            assert_eq!(isr[0] & 0xFFFF, 0, "cpu {cpu}: vector below 16 in service");
            let irr = read_bitmap(lapic, regs::IRR0, now);
            assert!(irr.is_some_and(|irr| irr[0] & 0xFFFF == 0));
        }
    }
}

/// Runs one input: a LAPIC configuration, then steps until the bytes run out.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(mut machine) = Machine::new(&mut u) else {
        return;
    };
    while let Ok(op) = u.arbitrary::<Op>() {
        machine.step(op);
        machine.check();
        if u.is_empty() {
            break;
        }
    }
}
