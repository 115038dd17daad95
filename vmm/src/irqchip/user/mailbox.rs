//! A vCPU's mailbox: how other threads hand it interrupts and timer expiries, and wake it.
//!
//! Senders never touch the target's LAPIC or registers. They post an [`Ipi`] (or flag a timer
//! expiry) and kick: a signal if the target may be inside KVM_RUN, a write of its kick eventfd
//! if it may be blocked in HLT (where it waits on that eventfd and its wake-up timerfd). The owner drains the mailbox before every entry and after every wake-up.
//! Ordering: the sender publishes the mail, then reads the target's state; the target
//! publishes its state, then checks the mail, with a SeqCst fence between the store and the
//! load on both sides (Dekker), so at least one of them sees the other: a wake-up is never
//! lost.
//! `vmm/tests/loom_mailbox.rs` checks this with loom, every interleaving of a sender and a
//! vCPU that enters KVM_RUN or blocks in HLT (there the kick signal is a flag the model's
//! KVM_RUN reads, as the real signal handler sets `kvm_run.immediate_exit`).

use devices::lapic::Ipi;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::sync::{
    current_thread, fence, AtomicBool, AtomicI32, AtomicU8, Mutex, Ordering, ThreadSlot,
};
use crate::idle::core::WakeCause;
use crate::sys::kick;

/// The vCPU is executing (in KVM_RUN or handling an exit).
const RUNNING: u8 = 0;
/// The vCPU is blocked in HLT (or waiting for SIPI).
const BLOCKED: u8 = 1;

/// One vCPU's mailbox.
#[derive(Debug)]
pub struct Mailbox {
    inbox: Mutex<Vec<Ipi>>,
    has_mail: AtomicBool,
    timer_due: AtomicBool,
    recheck: AtomicBool,
    control: AtomicBool,
    state: AtomicU8,
    tid: AtomicI32,
    thread: ThreadSlot,
    /// Written to wake the owner while it is blocked.
    kick_fd: EventFd,
    /// Under loom: the kick signal's effect (`immediate_exit`), for the model's KVM_RUN.
    #[cfg(loom)]
    signalled: AtomicBool,
}

impl Mailbox {
    /// An empty mailbox with its kick eventfd.
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            inbox: Mutex::default(),
            has_mail: AtomicBool::default(),
            timer_due: AtomicBool::default(),
            recheck: AtomicBool::default(),
            control: AtomicBool::default(),
            state: AtomicU8::default(),
            tid: AtomicI32::default(),
            thread: ThreadSlot::default(),
            kick_fd: EventFd::new(EFD_NONBLOCK)?,
            #[cfg(loom)]
            signalled: AtomicBool::default(),
        })
    }

    /// The eventfd a blocked owner waits on (with its wake-up timer).
    pub fn kick_fd(&self) -> &EventFd {
        &self.kick_fd
    }

    /// Consumes the kicks a blocked owner was woken by.
    pub fn drain_kicks(&self) {
        let _ = self.kick_fd.read();
    }

    /// Called by the owning thread when it starts.
    pub fn bind_current_thread(&self) {
        self.tid.store(kick::current_tid(), Ordering::SeqCst);
        self.thread.set(current_thread());
    }

    /// Posts an interrupt message and wakes the owner.
    pub fn post(&self, ipi: Ipi) {
        self.inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ipi);
        self.has_mail.store(true, Ordering::SeqCst);
        self.kick();
    }

    /// Flags that the owner's LAPIC timer fired on another thread; the caller kicks.
    pub fn flag_timer(&self) {
        self.timer_due.store(true, Ordering::SeqCst);
    }

    /// Flags that one of the owner's idle-manager timers fired elsewhere; the caller kicks.
    pub fn flag_recheck(&self) {
        self.recheck.store(true, Ordering::SeqCst);
    }

    /// Takes the recheck flag (owner only).
    pub fn take_recheck(&self) -> bool {
        self.recheck.swap(false, Ordering::SeqCst)
    }

    /// True once VM control asked the owner to stop what it is doing.
    pub fn control_pending(&self) -> bool {
        self.control.load(Ordering::SeqCst)
    }

    /// Flags VM control (stop) and wakes the owner.
    pub fn flag_control(&self) {
        self.control.store(true, Ordering::SeqCst);
        self.kick();
    }

    /// Wakes the owner wherever it is.
    pub fn kick(&self) {
        // The caller published its mail or flag: order that before reading the state.
        fence(Ordering::SeqCst);
        if self.state.load(Ordering::SeqCst) == RUNNING {
            self.signal();
        } else {
            self.wake_blocked();
        }
    }

    /// Wakes the owner blocked in its wait.
    #[cfg(not(loom))]
    fn wake_blocked(&self) {
        let _ = self.kick_fd.write(1);
    }

    /// Under loom the owner's wait is `park`.
    #[cfg(loom)]
    fn wake_blocked(&self) {
        self.thread.unpark();
    }

    /// Interrupts the owner's KVM_RUN (or makes its next one return at once).
    #[cfg(not(loom))]
    fn signal(&self) {
        let tid = self.tid.load(Ordering::SeqCst);
        if tid > 0 && tid != kick::current_tid() {
            kick::kick_thread(tid);
        }
    }

    #[cfg(loom)]
    fn signal(&self) {
        self.signalled.store(true, Ordering::SeqCst);
    }

    /// Under loom: takes the kick signal's effect, as KVM_RUN consumes `immediate_exit`.
    #[cfg(loom)]
    pub fn take_signal(&self) -> bool {
        self.signalled.swap(false, Ordering::SeqCst)
    }

    /// Whether the owner has bound its thread.
    pub fn is_bound(&self) -> bool {
        self.thread.is_set()
    }

    /// Takes the posted messages (owner only).
    pub fn take_mail(&self) -> Vec<Ipi> {
        if !self.has_mail.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Takes the "timer fired elsewhere" flag (owner only).
    pub fn take_timer_due(&self) -> bool {
        self.timer_due.swap(false, Ordering::SeqCst)
    }

    /// True if anything is waiting for the owner (checked after publishing BLOCKED).
    pub fn has_work(&self) -> bool {
        self.has_mail.load(Ordering::SeqCst)
            || self.timer_due.load(Ordering::SeqCst)
            || self.recheck.load(Ordering::SeqCst)
            || self.control.load(Ordering::SeqCst)
    }

    /// The owner is about to block.
    pub fn set_blocked(&self) {
        self.state.store(BLOCKED, Ordering::SeqCst);
        // Order the state before the caller's look at the mail.
        fence(Ordering::SeqCst);
    }

    /// The owner is running again.
    pub fn set_running(&self) {
        self.state.store(RUNNING, Ordering::SeqCst);
    }

    /// What woke the owner, looking at the mailbox (before it is drained).
    pub fn wake_cause(&self) -> Option<WakeCause> {
        if self.control.load(Ordering::SeqCst) {
            Some(WakeCause::Control)
        } else if self.has_mail.load(Ordering::SeqCst) {
            Some(WakeCause::Interrupt)
        } else if self.timer_due.load(Ordering::SeqCst) {
            Some(WakeCause::Timer)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::lapic::{DeliveryMode, DestinationMode, Shorthand, TriggerMode};

    fn fixed(vector: u8) -> Ipi {
        Ipi {
            vector,
            delivery_mode: DeliveryMode::Fixed,
            destination_mode: DestinationMode::Physical,
            shorthand: Shorthand::None,
            trigger_mode: TriggerMode::Edge,
            assert: true,
            destination: 0,
            x2apic_format: false,
            source_apic_id: None,
        }
    }

    #[test]
    fn mail_is_taken_once() {
        let m = Mailbox::new().unwrap();
        m.bind_current_thread();
        assert!(!m.has_work());
        m.post(fixed(0x40));
        m.post(fixed(0x41));
        assert_eq!(m.wake_cause(), Some(WakeCause::Interrupt));
        assert_eq!(m.take_mail().len(), 2);
        assert!(m.take_mail().is_empty());
        m.flag_timer();
        assert!(m.has_work());
        assert!(m.take_timer_due());
        assert!(!m.has_work());
    }

    #[test]
    fn a_post_wakes_a_blocked_owner() {
        let m = std::sync::Arc::new(Mailbox::new().unwrap());
        let owner = {
            let m = m.clone();
            std::thread::spawn(move || {
                m.bind_current_thread();
                m.set_blocked();
                while !m.has_work() {
                    let woken = crate::sys::poll::wait(m.kick_fd(), None, None).unwrap();
                    if woken.kick {
                        m.drain_kicks();
                    }
                }
                m.set_running();
                m.take_mail().len()
            })
        };
        // The owner may or may not be blocked yet: it re-checks its mail after publishing
        // BLOCKED, and the eventfd keeps a kick that comes before its wait.
        while !m.is_bound() {
            std::thread::yield_now();
        }
        m.post(fixed(0x30));
        assert_eq!(owner.join().unwrap(), 1);
    }
}
