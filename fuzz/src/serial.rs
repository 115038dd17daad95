//! The `serial` target: guest port reads and writes of any width on lull's port bus, laid out
//! as `vmm::vm` lays it out (COM1 16550A, i8042, test exit, boot marker, CMOS with a clock
//! read from the input, ignored PIT/PIC ports), interleaved with host console input.
//!
//! After every step:
//! - every byte the UART counted as sent is in the console sink, and no other byte is;
//! - ports no device claims read as all ones;
//! - host input never overfills the receive FIFO (what is taken fits in the room there was);
//! - a test-exit write yields an odd status; the i8042 only asks for a reset.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use arbitrary::{Arbitrary, Unstructured};
use devices::cmos::{Cmos, CMOS_PORT, CMOS_PORT_COUNT};
use devices::i8042::{self, I8042};
use devices::pio::{IgnoredPorts, MachineRequest, PioBus, PioOutcome};
use devices::serial::{SerialCounters, SerialPort, Trigger, COM1_PORT, COM_PORT_COUNT};
use devices::test_exit::{
    BootMarker, TestExit, BOOT_MARKER_PORT, TEST_EXIT_PORT, TEST_EXIT_PORT_COUNT,
};

/// The serial interrupt: counted, never fails.
#[derive(Clone, Default)]
struct Irq(Arc<Mutex<u64>>);

impl Trigger for Irq {
    type E = std::io::Error;
    fn trigger(&self) -> Result<(), Self::E> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        Ok(())
    }
}

/// The console sink, readable after the fact.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A port: mostly near the devices, sometimes anywhere.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Port {
    Com1(u8),
    Cmos(u8),
    Legacy(u8),
    Any(u16),
}

impl Port {
    fn get(self) -> u16 {
        match self {
            Port::Com1(o) => COM1_PORT + u16::from(o % 10),
            Port::Cmos(o) => CMOS_PORT + u16::from(o % 3),
            Port::Legacy(p) => u16::from(p),
            Port::Any(p) => p,
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    Read { port: Port, len: u8 },
    Write { port: Port, len: u8, value: u32 },
    Input(Vec<u8>),
}

struct Fuzz {
    bus: PioBus,
    console: Arc<Mutex<SerialPort<Irq, Sink>>>,
    counters: Arc<SerialCounters>,
    sink: Sink,
    claimed: Vec<(u16, u16)>,
}

impl Fuzz {
    fn new(clock: u64) -> Self {
        let sink = Sink::default();
        let console = Arc::new(Mutex::new(SerialPort::new(Irq::default(), sink.clone())));
        let counters = console.lock().unwrap_or_else(|p| p.into_inner()).counters();
        let mut bus = PioBus::new();
        let ignored = Arc::new(Mutex::new(IgnoredPorts));
        let devices: Vec<(u16, u16, devices::pio::SharedPioDevice)> = vec![
            (COM1_PORT, COM_PORT_COUNT, console.clone()),
            (0x60, i8042::PORT_COUNT, Arc::new(Mutex::new(I8042))),
            (
                TEST_EXIT_PORT,
                TEST_EXIT_PORT_COUNT,
                Arc::new(Mutex::new(TestExit)),
            ),
            (BOOT_MARKER_PORT, 1, Arc::new(Mutex::new(BootMarker))),
            (
                CMOS_PORT,
                CMOS_PORT_COUNT,
                Arc::new(Mutex::new(Cmos::new(Box::new(move || clock)))),
            ),
            (0x40, 4, ignored.clone()),
            (0x80, 1, ignored.clone()),
            (0x20, 2, ignored.clone()),
            (0xa0, 2, ignored.clone()),
            (0x4d0, 2, ignored),
        ];
        let mut claimed = Vec::new();
        for (base, len, device) in devices {
            bus.insert(base, len, device)
                .unwrap_or_else(|e| panic!("lull's port layout refused: {e}"));
            claimed.push((base, len));
        }
        Fuzz {
            bus,
            console,
            counters,
            sink,
            claimed,
        }
    }

    fn is_claimed(&self, port: u16) -> bool {
        self.claimed
            .iter()
            .any(|&(base, len)| port >= base && u32::from(port) < u32::from(base) + u32::from(len))
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Read { port, len } => {
                let port = port.get();
                let mut data = [0u8; 8];
                let data = &mut data[..usize::from(len % 9)];
                let outcome = self.bus.read(port, data);
                assert_eq!(outcome == PioOutcome::Unclaimed, !self.is_claimed(port));
                if outcome == PioOutcome::Unclaimed {
                    assert!(data.iter().all(|b| *b == 0xff), "unclaimed port {port:#x}");
                }
            }
            Op::Write { port, len, value } => {
                let port = port.get();
                let mut data = [0u8; 8];
                data[..4].copy_from_slice(&value.to_le_bytes());
                let outcome = self.bus.write(port, &data[..usize::from(len % 9)]);
                assert_eq!(outcome == PioOutcome::Unclaimed, !self.is_claimed(port));
                match outcome {
                    PioOutcome::Handled(Some(MachineRequest::Exit(status))) => {
                        assert_eq!(port, TEST_EXIT_PORT);
                        assert_eq!(status & 1, 1, "test-exit status must be odd");
                    }
                    PioOutcome::Handled(Some(MachineRequest::Reset)) => {
                        assert_eq!(port, 0x64, "only the i8042 command port resets");
                    }
                    PioOutcome::Handled(Some(MachineRequest::BootComplete)) => {
                        assert_eq!(port, BOOT_MARKER_PORT);
                    }
                    PioOutcome::Handled(None) | PioOutcome::Unclaimed => {}
                }
            }
            Op::Input(bytes) => {
                let mut console = self.console.lock().unwrap_or_else(|p| p.into_inner());
                let room = console.input_room();
                let taken = console.enqueue_input(&bytes);
                assert!(
                    taken <= room && taken <= bytes.len(),
                    "input overfilled the FIFO"
                );
                assert!(console.input_room() <= room);
            }
        }
    }

    fn check(&self) {
        let sent = self.sink.0.lock().unwrap_or_else(|p| p.into_inner()).len();
        let counted = self.counters.bytes_out.load(Ordering::Relaxed);
        let lost = self.counters.bytes_lost.load(Ordering::Relaxed);
        assert_eq!(
            u64::try_from(sent).unwrap_or(u64::MAX),
            counted,
            "console sink and byte counter disagree"
        );
        assert_eq!(lost, 0, "a sink that never fails lost bytes");
    }
}

/// Runs one input: the CMOS clock value, then steps until the bytes run out.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(clock) = u.arbitrary::<u64>() else {
        return;
    };
    let mut fuzz = Fuzz::new(clock);
    while let Ok(op) = u.arbitrary::<Op>() {
        fuzz.step(op);
        fuzz.check();
        if u.is_empty() {
            break;
        }
    }
}
