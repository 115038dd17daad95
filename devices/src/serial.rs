//! The 16550A UART (COM1) on the port bus, built on vm-superio's `Serial`.
//!
//! vm-superio emulates the registers; this file puts it on lull's [`PioBus`](crate::pio::PioBus)
//! and counts what a guest does with it through [`SerialEvents`].

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
pub use vm_superio::serial::SerialEvents;
use vm_superio::serial::SerialState;
use vm_superio::Serial;
pub use vm_superio::Trigger;

use crate::pio::{MachineRequest, PioDevice};

/// Base port of COM1.
pub const COM1_PORT: u16 = 0x3f8;
/// Ports spanned by a 16550A.
pub const COM_PORT_COUNT: u16 = 8;
/// ISA IRQ of COM1.
pub const COM1_IRQ: u32 = 4;

/// A callback run when the guest has read every queued input byte.
pub type InputDrainedHook = Box<dyn Fn() + Send + Sync>;

/// Counters a serial port keeps; readable from any thread.
#[derive(Default)]
pub struct SerialCounters {
    /// Bytes the guest wrote to the console.
    pub bytes_out: AtomicU64,
    /// Bytes lost because the console sink failed.
    pub bytes_lost: AtomicU64,
    /// Reads of the receive buffer by the guest.
    pub input_reads: AtomicU64,
    /// Interrupts that could not be raised.
    pub trigger_errors: AtomicU64,
    input_drained: std::sync::OnceLock<InputDrainedHook>,
}

impl std::fmt::Debug for SerialCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SerialCounters")
            .field("bytes_out", &self.bytes_out)
            .field("bytes_lost", &self.bytes_lost)
            .field("input_reads", &self.input_reads)
            .field("trigger_errors", &self.trigger_errors)
            .finish()
    }
}

impl SerialEvents for SerialCounters {
    fn buffer_read(&self) {
        self.input_reads.fetch_add(1, Ordering::Relaxed);
    }
    fn out_byte(&self) {
        self.bytes_out.fetch_add(1, Ordering::Relaxed);
    }
    fn tx_lost_byte(&self) {
        self.bytes_lost.fetch_add(1, Ordering::Relaxed);
    }
    fn in_buffer_empty(&self) {
        if let Some(hook) = self.input_drained.get() {
            hook();
        }
    }
}

/// The UART's registers as a snapshot holds them (vm-superio's `SerialState`): the pending
/// interrupt is the IIR, and input the guest has not read yet is `in_buffer`. The output is
/// not state: it went to the sink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialSnapshot {
    /// DLL.
    pub baud_divisor_low: u8,
    /// DLM.
    pub baud_divisor_high: u8,
    /// IER.
    pub interrupt_enable: u8,
    /// IIR.
    pub interrupt_identification: u8,
    /// LCR.
    pub line_control: u8,
    /// LSR.
    pub line_status: u8,
    /// MCR.
    pub modem_control: u8,
    /// MSR.
    pub modem_status: u8,
    /// The scratch register.
    pub scratch: u8,
    /// Received bytes the guest has not read, first first.
    pub in_buffer: Vec<u8>,
}

/// Why a saved serial port cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum SerialStateError {
    /// More input than the receive FIFO holds.
    #[error(
        "The saved serial port holds {0} input bytes, more than its FIFO's 64: corrupt snapshot"
    )]
    FullFifo(usize),
    /// The restored port's pending interrupt could not be raised.
    #[error("Cannot raise the restored serial port's pending interrupt")]
    Trigger,
}

/// A serial port whose interrupt is `T` and whose output goes to `W`.
pub struct SerialPort<T: Trigger, W: Write> {
    uart: Serial<T, std::sync::Arc<SerialCounters>, W>,
    counters: std::sync::Arc<SerialCounters>,
}

impl<T: Trigger, W: Write> SerialPort<T, W> {
    /// A UART raising `interrupt` and writing the guest's output to `out`.
    pub fn new(interrupt: T, out: W) -> Self {
        let counters = std::sync::Arc::new(SerialCounters::default());
        Self {
            uart: Serial::with_events(interrupt, counters.clone(), out),
            counters,
        }
    }

    /// A UART restored from `saved`, raising `interrupt` (at once if `saved` has an enabled
    /// interrupt pending) and writing to `out`.
    pub fn from_saved(
        interrupt: T,
        out: W,
        saved: &SerialSnapshot,
    ) -> Result<Self, SerialStateError> {
        let counters = std::sync::Arc::new(SerialCounters::default());
        let state = SerialState {
            baud_divisor_low: saved.baud_divisor_low,
            baud_divisor_high: saved.baud_divisor_high,
            interrupt_enable: saved.interrupt_enable,
            interrupt_identification: saved.interrupt_identification,
            line_control: saved.line_control,
            line_status: saved.line_status,
            modem_control: saved.modem_control,
            modem_status: saved.modem_status,
            scratch: saved.scratch,
            in_buffer: saved.in_buffer.clone(),
        };
        let uart =
            Serial::from_state(&state, interrupt, counters.clone(), out).map_err(|e| match e {
                vm_superio::serial::Error::FullFifo => {
                    SerialStateError::FullFifo(saved.in_buffer.len())
                }
                _ => SerialStateError::Trigger,
            })?;
        Ok(Self { uart, counters })
    }

    /// The registers and unread input, for a snapshot.
    pub fn save(&self) -> SerialSnapshot {
        let s = self.uart.state();
        SerialSnapshot {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// The counters of this port.
    pub fn counters(&self) -> std::sync::Arc<SerialCounters> {
        self.counters.clone()
    }

    /// Runs `hook` whenever the guest has drained the receive FIFO (set once).
    pub fn set_input_drained_hook(&self, hook: InputDrainedHook) {
        let _ = self.counters.input_drained.set(hook);
    }

    /// Queues host input for the guest; returns how many bytes fit in the receive FIFO.
    pub fn enqueue_input(&mut self, input: &[u8]) -> usize {
        let room = self.uart.fifo_capacity().min(input.len());
        if room == 0 {
            return 0;
        }
        match self.uart.enqueue_raw_bytes(&input[..room]) {
            Ok(n) => n,
            Err(_) => {
                self.counters.trigger_errors.fetch_add(1, Ordering::Relaxed);
                room
            }
        }
    }

    /// Free room in the receive FIFO.
    pub fn input_room(&self) -> usize {
        self.uart.fifo_capacity()
    }

    /// Flushes the output sink.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.uart.writer_mut().flush()
    }
}

impl<T: Trigger + Send, W: Write + Send> PioDevice for SerialPort<T, W> {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        // A wider access reads the register at `offset` in the low byte and zeros above it.
        data.fill(0);
        if let (Some(first), Ok(reg)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.uart.read(reg);
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<MachineRequest> {
        if let (Some(value), Ok(reg)) = (data.first(), u8::try_from(offset)) {
            if self.uart.write(reg, *value).is_err() {
                self.counters.trigger_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct CountingTrigger(Arc<AtomicUsize>);
    impl Trigger for CountingTrigger {
        type E = ();
        fn trigger(&self) -> Result<(), ()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn output_reaches_sink_and_is_counted() {
        let mut port = SerialPort::new(CountingTrigger::default(), Vec::new());
        for b in b"hi\n" {
            port.write(0, &[*b]);
        }
        assert_eq!(port.uart.writer(), b"hi\n");
        assert_eq!(port.counters().bytes_out.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn input_raises_interrupt_when_enabled() {
        let trigger = CountingTrigger::default();
        let mut port = SerialPort::new(trigger.clone(), Vec::new());
        port.write(1, &[0x01]); // IER: received-data interrupt
        assert_eq!(port.enqueue_input(b"ab"), 2);
        assert!(trigger.0.load(Ordering::SeqCst) >= 1);
        let mut b = [0u8; 1];
        port.read(0, &mut b);
        assert_eq!(b, [b'a']);
    }

    #[test]
    fn a_restored_port_reads_and_interrupts_as_the_saved_one() {
        let mut port = SerialPort::new(CountingTrigger::default(), Vec::new());
        port.write(3, &[0x80]); // LCR: DLAB
        port.write(0, &[0x0c]); // DLL
        port.write(1, &[0x01]); // DLM
        port.write(3, &[0x03]); // LCR: 8N1
        port.write(4, &[0x0b]); // MCR
        port.write(7, &[0x5a]); // scratch
        port.write(1, &[0x01]); // IER: received data
        port.enqueue_input(b"xyz");
        let text = serde_json::to_string(&port.save()).unwrap();
        let trigger = CountingTrigger::default();
        let saved: SerialSnapshot = serde_json::from_str(&text).unwrap();
        let mut restored = SerialPort::from_saved(trigger.clone(), Vec::new(), &saved).unwrap();
        assert_eq!(
            trigger.0.load(Ordering::SeqCst),
            1,
            "pending input raises the line"
        );
        for reg in 0..8u16 {
            let (mut a, mut b) = ([0u8], [0u8]);
            port.read(reg, &mut a);
            restored.read(reg, &mut b);
            assert_eq!(a, b, "register {reg}");
        }
        let mut tail = [0u8];
        restored.read(0, &mut tail);
        assert_eq!(tail, [b'y']);
    }

    #[test]
    fn a_saved_port_with_too_much_input_is_refused() {
        let mut saved = SerialPort::new(CountingTrigger::default(), Vec::new()).save();
        saved.in_buffer = vec![0; 65];
        assert!(matches!(
            SerialPort::from_saved(CountingTrigger::default(), Vec::new(), &saved),
            Err(SerialStateError::FullFifo(65))
        ));
    }
}
