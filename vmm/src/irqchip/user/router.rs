//! Delivering interrupt messages between vCPUs and from the IOAPIC in `--irqchip user`.
//!
//! The routing table holds every vCPU's addressing state (APIC ID, LDR, mode, priority); each
//! vCPU refreshes its own entry when its LAPIC says it changed. A message is routed with
//! `devices::lapic::route` and posted to each target's [`Mailbox`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use devices::ioapic::{IoApic, IoApicState, IoApicStateError, IoapicInterrupt};
use devices::lapic::{route, ApicDestinationInfo, Ipi};
use devices::serial::Trigger;

use super::mailbox::Mailbox;

/// Counters of the router.
#[derive(Debug, Default)]
pub struct RouterCounters {
    /// Messages sent by vCPUs (IPIs).
    pub ipis: AtomicU64,
    /// Messages from the IOAPIC.
    pub device_interrupts: AtomicU64,
    /// Messages nobody accepted.
    pub undeliverable: AtomicU64,
}

/// The VM's interrupt fabric in user-space irqchip mode.
pub struct InterruptRouter {
    destinations: RwLock<Vec<ApicDestinationInfo>>,
    mailboxes: Vec<Arc<Mailbox>>,
    ioapic: Mutex<IoApic>,
    /// Counters.
    pub counters: RouterCounters,
}

impl InterruptRouter {
    /// A router for vCPUs with these initial addressing states and mailboxes.
    pub fn new(
        destinations: Vec<ApicDestinationInfo>,
        mailboxes: Vec<Arc<Mailbox>>,
        ioapic: IoApic,
    ) -> Self {
        Self {
            destinations: RwLock::new(destinations),
            mailboxes,
            ioapic: Mutex::new(ioapic),
            counters: RouterCounters::default(),
        }
    }

    /// The mailbox of vCPU `cpu`.
    pub fn mailbox(&self, cpu: usize) -> Option<&Arc<Mailbox>> {
        self.mailboxes.get(cpu)
    }

    /// Every mailbox.
    pub fn mailboxes(&self) -> &[Arc<Mailbox>] {
        &self.mailboxes
    }

    /// Refreshes vCPU `cpu`'s routing entry.
    pub fn update_destination(&self, cpu: usize, info: ApicDestinationInfo) {
        let mut table = self.destinations.write().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = table.get_mut(cpu) {
            *slot = info;
        }
    }

    fn deliver(&self, ipi: &Ipi) -> usize {
        let targets = {
            let table = self.destinations.read().unwrap_or_else(|p| p.into_inner());
            route(ipi, &table)
        };
        for cpu in targets.iter() {
            if let Some(mailbox) = self.mailboxes.get(cpu) {
                mailbox.post(*ipi);
            }
        }
        if targets.is_empty() {
            self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
        }
        targets.len()
    }

    /// Sends an IPI from a vCPU.
    pub fn send_ipi(&self, ipi: &Ipi) -> usize {
        self.counters.ipis.fetch_add(1, Ordering::Relaxed);
        self.deliver(ipi)
    }

    fn deliver_ioapic(&self, interrupts: impl IntoIterator<Item = IoapicInterrupt>) {
        for int in interrupts {
            self.counters
                .device_interrupts
                .fetch_add(1, Ordering::Relaxed);
            self.deliver(&int.ipi);
        }
    }

    /// The IOAPIC's state, for a snapshot.
    pub fn save_ioapic(&self) -> IoApicState {
        self.ioapic().save()
    }

    /// Takes a snapshot's IOAPIC state (checked: nothing changes if it is bad).
    pub fn restore_ioapic(&self, state: &IoApicState) -> Result<(), IoApicStateError> {
        self.ioapic().restore(state)
    }

    fn ioapic(&self) -> std::sync::MutexGuard<'_, IoApic> {
        timer::lock(&self.ioapic)
    }

    /// Guest read of the IOAPIC window.
    pub fn ioapic_read(&self, offset: u64, data: &mut [u8]) {
        self.ioapic().read_mmio(offset, data);
    }

    /// Guest write of the IOAPIC window.
    pub fn ioapic_write(&self, offset: u64, data: &[u8]) {
        let delivered = self.ioapic().write_mmio(offset, data);
        self.deliver_ioapic(delivered);
    }

    /// A device drives IOAPIC input `pin`.
    pub fn set_irq_line(&self, pin: usize, asserted: bool) {
        let delivered = self.ioapic().set_irq_line(pin, asserted);
        self.deliver_ioapic(delivered);
    }

    /// A LAPIC EOI'd a level-triggered `vector`.
    pub fn end_of_interrupt(&self, vector: u8) {
        let delivered = self.ioapic().end_of_interrupt(vector);
        self.deliver_ioapic(delivered);
    }
}

/// An edge on an IOAPIC pin, as a `vm-superio` interrupt trigger (the serial port's IRQ).
pub struct IoapicEdgeTrigger {
    /// The router.
    pub router: Arc<InterruptRouter>,
    /// The pin.
    pub pin: usize,
}

impl Trigger for IoapicEdgeTrigger {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        self.router.set_irq_line(self.pin, true);
        self.router.set_irq_line(self.pin, false);
        Ok(())
    }
}

/// Level-driven device lines into lull's IOAPIC (pc-testdev's IRQ ports).
pub struct UserIrqLines(pub Arc<InterruptRouter>);

impl devices::testdev::IrqLines for UserIrqLines {
    fn set_level(&self, line: u32, asserted: bool) {
        if let Ok(pin) = usize::try_from(line) {
            self.0.set_irq_line(pin, asserted);
        }
    }
}
