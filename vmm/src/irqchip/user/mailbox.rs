//! A vCPU's mailbox: how other threads hand it interrupts and timer expiries, and wake it.
//!
//! Senders never touch the target's LAPIC or registers. They post an [`Ipi`] (or flag a timer
//! expiry) and kick: a signal if the target may be inside KVM_RUN, a write of its kick eventfd
//! if it may be blocked in HLT (where it waits on that eventfd and its wake-up timerfd). The owner drains the mailbox before every entry and after every wake-up.
//! Ordering: the sender publishes the mail, then marks the state word (`fetch_or` of a
//! "kicked" bit) and reads in the same step whether the owner is blocked; the owner marks the
//! word "blocked" (`fetch_or`) before it checks the mail. Both are read-modify-writes of one
//! word, so one comes first: if the owner's, the sender sees "blocked" and wakes it; if the
//! sender's, the owner's read-modify-write acquires the sender's mail. A wake-up is never lost.
//! A halted owner that polls before it blocks marks the word "polling" the same way: a sender
//! that sees it neither signals nor writes the eventfd (the poll watches the mail flags), and
//! the owner clears it with a read-modify-write before it drains the mailbox, so mail whose
//! kick was skipped is never left behind. This spares the polling vCPU a signal on its way
//! back into the guest (which would also make its next KVM_RUN return at once).

use devices::lapic::Ipi;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};
use std::sync::Mutex;

use crate::host::sys::kick;
use crate::idle::core::WakeCause;

/// Bit of the state word: a sender kicked since the owner last ran (orders the handshake).
const KICKED: u8 = 2;
/// Bit of the state word: the vCPU is blocked in HLT (or waiting for SIPI); clear while it
/// executes (in KVM_RUN or handling an exit).
const BLOCKED: u8 = 1;
/// Bit of the state word: the halted vCPU polls its mail flags before it blocks (it is in
/// neither KVM_RUN nor its wait).
const POLLING: u8 = 4;

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
    /// Written to wake the owner while it is blocked.
    kick_fd: EventFd,
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
            kick_fd: EventFd::new(EFD_NONBLOCK)?,
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
    }

    /// Posts an interrupt message and wakes the owner.
    pub fn post(&self, ipi: Ipi) {
        timer::lock(&self.inbox).push(ipi);
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
        // The caller published its mail or flag; this read-modify-write orders it against the
        // owner's own one in `set_blocked`.
        let state = self.state.fetch_or(KICKED, Ordering::SeqCst);
        if state & BLOCKED != 0 {
            self.wake_blocked();
        } else if state & POLLING == 0 {
            self.signal();
        }
    }

    /// Wakes the owner blocked in its wait.
    fn wake_blocked(&self) {
        let _ = self.kick_fd.write(1);
    }

    /// Interrupts the owner's KVM_RUN (or makes its next one return at once).
    fn signal(&self) {
        let tid = self.tid.load(Ordering::SeqCst);
        if tid > 0 && tid != kick::current_tid() {
            kick::kick_thread(tid);
        }
    }

    /// Whether the owner has bound its thread.
    pub fn is_bound(&self) -> bool {
        self.tid.load(Ordering::SeqCst) > 0
    }

    /// Takes the posted messages (owner only).
    pub fn take_mail(&self) -> Vec<Ipi> {
        if !self.has_mail.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        std::mem::take(&mut *timer::lock(&self.inbox))
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
        // A read-modify-write, so that the caller's look at the mail comes after every kick
        // that saw the owner running (see the module comment).
        self.state.fetch_or(BLOCKED, Ordering::SeqCst);
    }

    /// The owner starts polling its mail flags (see the module comment).
    pub fn set_polling(&self) {
        self.state.fetch_or(POLLING, Ordering::SeqCst);
    }

    /// The owner stopped polling; it drains the mailbox next (see the module comment).
    pub fn clear_polling(&self) {
        self.state.fetch_and(!POLLING, Ordering::SeqCst);
    }

    /// The owner is running again.
    pub fn set_running(&self) {
        // Clears only the blocked bit: the kicked bit stays, so that every later
        // `set_blocked` reads from the senders' read-modify-writes (their release sequence).
        self.state.fetch_and(!BLOCKED, Ordering::SeqCst);
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

    /// A sender neither signals a polling owner nor writes its eventfd, and the owner finds the
    /// mail; once it stops polling, the same post signals it (the kick is held pending on the
    /// owner thread, so it is seen at once).
    #[test]
    fn a_polling_owner_is_not_kicked_and_finds_its_mail() {
        use std::sync::mpsc::channel;
        let m = std::sync::Arc::new(Mailbox::new().unwrap());
        let (to_owner, posted) = channel::<()>();
        let (to_sender, ready) = channel::<()>();
        let owner = {
            let m = m.clone();
            std::thread::spawn(move || {
                kick::block_kicks();
                m.bind_current_thread();
                m.set_polling();
                to_sender.send(()).unwrap();
                posted.recv().unwrap();
                let polling = (kick::take_pending_kick(), m.kick_fd().read().is_ok());
                let found = m.has_work();
                m.clear_polling();
                to_sender.send(()).unwrap();
                posted.recv().unwrap();
                let running = kick::take_pending_kick();
                (polling, found, running, m.take_mail().len())
            })
        };
        ready.recv().unwrap();
        m.post(fixed(0x40));
        to_owner.send(()).unwrap();
        ready.recv().unwrap();
        m.post(fixed(0x41));
        to_owner.send(()).unwrap();
        assert_eq!(owner.join().unwrap(), ((false, false), true, true, 2));
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
                    let woken = crate::host::sys::poll::wait(m.kick_fd(), None, None).unwrap();
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

    /// The handshake under real threads: an owner that, like a vCPU, drains its mailbox,
    /// "runs" (sometimes) and blocks when it finds no work, against a sender posting with
    /// and without pauses. Every message arrives; a lost wake-up leaves the owner blocked and
    /// the bounded wait below fails the test instead of hanging it.
    #[test]
    fn no_post_is_lost_between_a_sender_and_a_blocking_owner() {
        const POSTS: usize = 20_000;
        // A running owner is kicked with the signal: without its handler it would kill the
        // test process (whichever test happens to install it first).
        crate::host::sys::kick::install_handler().unwrap();
        let m = std::sync::Arc::new(Mailbox::new().unwrap());
        let owner = {
            let m = m.clone();
            std::thread::spawn(move || {
                m.bind_current_thread();
                let mut got = 0;
                let mut round = 0u32;
                while got < POSTS {
                    m.set_running();
                    got += m.take_mail().len();
                    if got == POSTS {
                        break;
                    }
                    round = round.wrapping_add(1);
                    if round.is_multiple_of(3) {
                        std::hint::spin_loop(); // "in the guest"
                        continue;
                    }
                    if round % 3 == 1 {
                        // A halt poll: kicks that see it are skipped; then drain, or block
                        // as after a poll that saw nothing.
                        m.set_polling();
                        let mut spins = 0;
                        while !m.has_work() && spins < 100 {
                            std::hint::spin_loop();
                            spins += 1;
                        }
                        m.clear_polling();
                        if m.has_work() {
                            continue;
                        }
                    }
                    m.set_blocked();
                    if !m.has_work() {
                        let limit = Some(std::time::Duration::from_secs(5));
                        let w = crate::host::sys::poll::wait(m.kick_fd(), None, limit).unwrap();
                        if w.kick {
                            m.drain_kicks();
                        } else if !w.interrupted {
                            // The sender never pauses for 5 s: the kick was lost.
                            return Err(format!("blocked for 5 s with {got} of {POSTS}"));
                        }
                    }
                }
                Ok(got)
            })
        };
        while !m.is_bound() {
            std::thread::yield_now();
        }
        for i in 0..POSTS {
            m.post(fixed(0x30));
            if i % 64 == 0 {
                std::thread::yield_now();
            }
        }
        assert_eq!(owner.join().unwrap(), Ok(POSTS));
    }
}
