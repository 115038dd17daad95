//! The `serial` target: guest port reads and writes of any width on lull's real port bus, as
//! `vmm::vm::devices` builds it (`console` on COM1 with its interrupt on a real user irqchip's
//! IOAPIC, then `pio_bus_with_cmos`: i8042, port 0x92, test exit, boot marker, CMOS with a clock read
//! from the input, ignored PIT/PIC/ELCR ports, fw_cfg, pc-testdev's scratch and IRQ-line
//! ports), reached through the real exit path of vCPU 0 (its irqchip half first, then
//! `vmm::vcpu::exit::handle_exit`), interleaved with host console input, the guest's IOAPIC
//! and LAPIC programming and vCPU 0's entries (which take what the UART and the IRQ lines
//! raised through the IOAPIC).
//!
//! After every step:
//! - every byte the UART counted as sent is in the console sink, and no other byte is;
//! - exactly the ports of the documented layout are claimed; the others read as all ones
//!   and are counted as unknown;
//! - host input never overfills the receive FIFO (what is taken fits in the room there was);
//! - the test-exit port alone stops the VM with a status, always odd; only the i8042's
//!   command port and port 0x92 reset; only the boot marker marks the boot;
//! - at vCPU 0's entries: at most one injection, of a vector >= 16, and none while the guest
//!   cannot take one (`crate::chip::FakePort`).

use std::fs::File;
use std::io::{Seek, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use devices::cmos::{Cmos, CMOS_PORT, CMOS_PORT_COUNT};
use devices::fw_cfg::{FW_CFG_PORT, FW_CFG_PORT_COUNT};
use devices::i8042;
use devices::mmio::MmioBus;
use devices::port92;
use devices::restore_count::{RESTORE_COUNT_PORT, RESTORE_COUNT_PORT_COUNT};
use devices::serial::{COM1_PORT, COM_PORT_COUNT};
use devices::test_exit::{BOOT_MARKER_PORT, TEST_EXIT_PORT, TEST_EXIT_PORT_COUNT};
use devices::testdev::{IRQ_LINE_COUNT, IRQ_LINE_PORT, SCRATCH_PORT, SCRATCH_PORT_COUNT};
use kvm_ioctls::VcpuExit;
use timer::lock;
use timer::ModelKind;
use vmm::config::VmConfig;
use vmm::host::console::ConsoleSink;
use vmm::irqchip::user::vcpu::UserVcpuIrq;
use vmm::irqchip::{ChipExit, Entry, VcpuIrq};
use vmm::metrics::LapicNoise;
use vmm::setup::layout::IOAPIC_ADDR;
use vmm::size::ByteSize;
use vmm::state::{StopReason, VcpuShared};
use vmm::vcpu::exit::{DeviceBuses, VcpuAction};
use vmm::vm::devices::{console, pio_bus_with_cmos, Console};

use crate::chip::{ChipSpec, FakeChip, FakePort, FuzzClock};

/// The ports lull's bus claims: (base, count), from the devices' own constants.
const LAYOUT: [(u16, u16); 15] = [
    (COM1_PORT, COM_PORT_COUNT),
    (0x60, i8042::PORT_COUNT),
    (port92::PORT, 1),
    (TEST_EXIT_PORT, TEST_EXIT_PORT_COUNT),
    (BOOT_MARKER_PORT, 1),
    (RESTORE_COUNT_PORT, RESTORE_COUNT_PORT_COUNT),
    (CMOS_PORT, CMOS_PORT_COUNT),
    (0x40, 4),
    (0x80, 1),
    (0x20, 2),
    (0xa0, 2),
    (0x4d0, 2),
    (FW_CFG_PORT, FW_CFG_PORT_COUNT),
    (SCRATCH_PORT, SCRATCH_PORT_COUNT),
    (IRQ_LINE_PORT, IRQ_LINE_COUNT),
];

/// The xAPIC page of vCPU 0 (its LAPIC stays at the default base: this target never moves it).
const LAPIC_BASE: u64 = 0xfee0_0000;

/// A port: mostly near the devices, sometimes anywhere.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Port {
    Com1(u8),
    Cmos(u8),
    FwCfg(u8),
    TestDev(u8),
    IrqLine(u8),
    Legacy(u8),
    Any(u16),
}

impl Port {
    fn get(self) -> u16 {
        match self {
            Port::Com1(o) => COM1_PORT + u16::from(o % 10),
            Port::Cmos(o) => CMOS_PORT + u16::from(o % 3),
            Port::FwCfg(o) => FW_CFG_PORT + u16::from(o % 3),
            Port::TestDev(o) => SCRATCH_PORT + u16::from(o % 16),
            Port::IrqLine(o) => IRQ_LINE_PORT + u16::from(o % 26),
            Port::Legacy(p) => u16::from(p),
            Port::Any(p) => p,
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    /// IN.
    Read { port: Port, len: u8 },
    /// OUT.
    Write { port: Port, len: u8, value: u32 },
    /// Host console input.
    Input(Vec<u8>),
    /// A 4-byte write to the IOAPIC's IOREGSEL (false) or IOWIN (true).
    Ioapic { window: bool, value: u32 },
    /// A 4-byte write to LAPIC register `n << 4` of vCPU 0.
    Lapic { n: u8, value: u32 },
    /// vCPU 0 enters the guest; `open`: it can take an interrupt.
    Enter { open: bool },
}

/// The console sink: one unlinked file per process, emptied for each input.
fn sink_file() -> &'static Mutex<File> {
    static SINK: OnceLock<Mutex<File>> = OnceLock::new();
    SINK.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("lull-fuzz-serial-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        let _ = std::fs::remove_file(&path);
        Mutex::new(file)
    })
}

struct Fuzz<'a> {
    shared: Arc<VcpuShared>,
    buses: DeviceBuses,
    console: Arc<Mutex<Console>>,
    sink: &'a File,
    irq: UserVcpuIrq<Arc<LapicNoise>, FuzzClock>,
    port: FakePort,
    /// Keeps the chip (and the IOAPIC the console's line reaches) alive.
    _chip: FakeChip,
}

fn is_claimed(port: u16) -> bool {
    LAYOUT
        .iter()
        .any(|&(base, len)| port >= base && u32::from(port) < u32::from(base) + u32::from(len))
}

impl<'a> Fuzz<'a> {
    fn new(clock: u64, memory: u64, sink: &'a File) -> Option<Self> {
        let spec = ChipSpec {
            cpus: 1,
            model: ModelKind::Pull,
            tsc_khz: 1_000_000,
            guest_tsc: 0,
            start: 0,
            pv_eoi: false,
            pv_deadline: false,
        };
        let fake = FakeChip::new(spec)?;
        let cfg = VmConfig {
            cpus: 1,
            memory: ByteSize(memory),
            ..VmConfig::default()
        };
        let out = ConsoleSink::from_file(sink.try_clone().ok()?, "fuzz-serial".into());
        let parts = console(&fake.chip, out, None).ok()?;
        let cmos = Cmos::new(Box::new(move || clock));
        let bus = pio_bus_with_cmos(&cfg, parts.console.clone(), &fake.chip, cmos, 0)
            .unwrap_or_else(|e| panic!("lull's port layout refused: {e}"));
        let mut port = crate::chip::fake_port();
        let mut irq = fake
            .chip
            .user_vcpu(0, &fake.shared)
            .unwrap_or_else(|e| panic!("vCPU 0: {e}"));
        irq.attach(&mut port);
        Some(Fuzz {
            shared: fake.shared.clone(),
            buses: DeviceBuses::new(bus, MmioBus::new()),
            console: parts.console,
            sink,
            irq,
            port,
            _chip: fake,
        })
    }

    /// One exit as `vmm::vcpu::run` handles it: the chip first, then the generic handler.
    fn exit(&mut self, exit: VcpuExit<'_>) -> VcpuAction {
        let action = match self.irq.handle_exit(exit) {
            Ok(ChipExit::Continue) => VcpuAction::Continue,
            Ok(ChipExit::Stop(reason)) => VcpuAction::Stop(reason),
            Err(exit) => {
                let Some(counters) = self.shared.counters(0) else {
                    panic!("no counters for vCPU 0");
                };
                vmm::vcpu::exit::handle_exit(exit, &self.buses.exit_context(0, counters))
            }
        };
        self.irq.exit_done(&mut self.port);
        action
    }

    fn unknown_ports(&self) -> u64 {
        self.buses.noise.unknown_port.count()
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Read { port, len } => self.port_in(port.get(), len),
            Op::Write { port, len, value } => self.port_out(port.get(), len, value),
            Op::Input(bytes) => {
                let mut console = lock(&self.console);
                let room = console.input_room();
                let taken = console.enqueue_input(&bytes);
                assert!(
                    taken <= room && taken <= bytes.len(),
                    "input overfilled the FIFO"
                );
                assert!(console.input_room() <= room);
            }
            Op::Ioapic { window, value } => {
                let addr = IOAPIC_ADDR + if window { 0x10 } else { 0 };
                let action = self.exit(VcpuExit::MmioWrite(addr, &value.to_le_bytes()));
                assert_eq!(action, VcpuAction::Continue);
            }
            Op::Lapic { n, value } => {
                let addr = LAPIC_BASE + (u64::from(n & 0x3f) << 4);
                let action = self.exit(VcpuExit::MmioWrite(addr, &value.to_le_bytes()));
                assert_eq!(action, VcpuAction::Continue);
            }
            Op::Enter { open } => self.enter(open),
        }
    }

    /// An IN of `len % 9` bytes from `port`: claimed exactly by the devices lull has there,
    /// all ones from a port nobody claims.
    fn port_in(&mut self, port: u16, len: u8) {
        let mut data = [0u8; 8];
        let data = &mut data[..usize::from(len % 9)];
        let before = self.unknown_ports();
        let action = self.exit(VcpuExit::IoIn(port, data));
        assert_eq!(action, VcpuAction::Continue, "IN {port:#x} did {action:?}");
        let unclaimed = self.unknown_ports() > before;
        assert_eq!(
            unclaimed,
            !is_claimed(port),
            "port {port:#x} claimed wrongly"
        );
        if unclaimed {
            assert!(data.iter().all(|b| *b == 0xff), "unclaimed port {port:#x}");
        }
    }

    /// An OUT of `len % 9` bytes of `value` to `port`: claimed exactly by the devices lull
    /// has there; only the test-exit, reset and boot-marker ports end or mark the run.
    fn port_out(&mut self, port: u16, len: u8, value: u32) {
        let mut data = [0u8; 8];
        data[..4].copy_from_slice(&value.to_le_bytes());
        let before = self.unknown_ports();
        let action = self.exit(VcpuExit::IoOut(port, &data[..usize::from(len % 9)]));
        let unclaimed = self.unknown_ports() > before;
        assert_eq!(
            unclaimed,
            !is_claimed(port),
            "port {port:#x} claimed wrongly"
        );
        match action {
            VcpuAction::Stop(StopReason::TestExit(status)) => {
                assert_eq!(port, TEST_EXIT_PORT, "test exit from {port:#x}");
                assert_eq!(status & 1, 1, "test-exit status must be odd");
            }
            VcpuAction::Stop(StopReason::Reset) => {
                assert!(
                    port == 0x64 || port == port92::PORT,
                    "only the i8042 command port and port 0x92 reset, not {port:#x}"
                );
            }
            VcpuAction::BootComplete => assert_eq!(port, BOOT_MARKER_PORT),
            VcpuAction::Continue => {}
            other => panic!("OUT {port:#x} did {other:?}"),
        }
    }

    /// An entry with the interrupt window `open`: at most one injection, of a vector from 16.
    fn enter(&mut self, open: bool) {
        self.port.open = open;
        self.port.injected.clear();
        // An IOAPIC entry with INIT delivery can put vCPU 0 in INIT: it takes nothing.
        let entry = self.irq.before_entry(&mut self.port);
        assert_ne!(
            entry,
            Entry::Stop,
            "before_entry stopped a VM nobody stopped"
        );
        assert!(self.port.injected.len() <= 1, "two injections in one entry");
        if let Some(&v) = self.port.injected.first() {
            assert!(v >= 16, "vector {v:#x} injected");
        }
        self.irq.after_run(Some(self.port.cr8));
    }

    fn check(&self) {
        let mut sink = self.sink;
        let sent = sink
            .stream_position()
            .unwrap_or_else(|e| panic!("console sink: {e}"));
        let counters = lock(&self.console).counters();
        let counted = counters.bytes_out.load(Ordering::Relaxed);
        let lost = counters.bytes_lost.load(Ordering::Relaxed);
        assert_eq!(sent, counted, "console sink and byte counter disagree");
        assert_eq!(lost, 0, "a sink that never fails lost bytes");
    }
}

/// Runs one input: the CMOS clock value and the guest's memory size, then steps until the
/// bytes run out.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let (Ok(clock), Ok(memory)) = (u.arbitrary::<u64>(), u.arbitrary::<u64>()) else {
        return;
    };
    let file = sink_file().lock().unwrap_or_else(|p| p.into_inner());
    let mut sink: &File = &file;
    if sink.set_len(0).is_err() || sink.rewind().is_err() || sink.flush().is_err() {
        panic!("cannot empty the console sink");
    }
    let Some(mut fuzz) = Fuzz::new(clock, memory, &file) else {
        return;
    };
    while let Ok(op) = u.arbitrary::<Op>() {
        fuzz.step(op);
        fuzz.check();
        if u.is_empty() {
            break;
        }
    }
}
