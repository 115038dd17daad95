//! Loom models of the mailbox's wake-up protocol (`irqchip::user::mailbox`): a sender posts an
//! interrupt and kicks while the owning vCPU drains its mailbox, enters KVM_RUN or blocks in
//! HLT. In every interleaving the interrupt reaches the owner; a lost wake-up shows up as a
//! thread parked for ever, which loom reports as a deadlock.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p vmm --release --test loom_mailbox`.
#![cfg(loom)]

use devices::lapic::Ipi;
use loom::sync::Arc;
use loom::thread;
use vmm::irqchip::user::mailbox::Mailbox;

/// The owner's view of KVM_RUN in these models.
#[derive(Clone, Copy)]
enum Guest {
    /// The guest halts at once (KVM_RUN returns a HLT exit unless a kick is pending).
    Halts,
    /// The guest never halts: KVM_RUN returns only when kicked.
    Spins,
}

/// One vCPU iteration after another until the posted interrupt is taken.
fn owner(m: &Mailbox, guest: Guest) -> usize {
    m.bind_current_thread();
    loop {
        m.set_running();
        let mail = m.take_mail().len();
        if mail > 0 {
            return mail;
        }
        // KVM_RUN: a kick that landed since the drain makes it return at once.
        if m.take_signal() {
            continue;
        }
        match guest {
            Guest::Spins => {
                // The guest runs until the kick signal interrupts it.
                while !m.take_signal() {
                    thread::park();
                }
            }
            Guest::Halts => {
                // HLT reached user space: block until there is work.
                m.set_blocked();
                while !m.has_work() {
                    thread::park();
                }
            }
        }
    }
}

fn model(guest: Guest) {
    loom::model(move || {
        let m = Arc::new(Mailbox::new().unwrap());
        let target = {
            let m = m.clone();
            thread::spawn(move || owner(&m, guest))
        };
        // The sender may run before the owner binds its thread: then it has nobody to unpark
        // or signal, and the owner sees the mail on its first drain.
        m.post(Ipi::fixed(0x40, 0));
        assert_eq!(target.join().unwrap_or(0), 1);
    });
}

#[test]
fn a_post_reaches_an_owner_that_halts() {
    model(Guest::Halts);
}

#[test]
fn a_post_reaches_an_owner_in_kvm_run() {
    model(Guest::Spins);
}

/// The checker finds a lost wake-up when there is one: an owner whose KVM_RUN does not look
/// at the kick signal (as if the handler did not set `immediate_exit`) sleeps for ever in
/// some interleaving, and loom reports it.
#[test]
#[should_panic]
fn an_owner_that_ignores_the_signal_loses_the_wake_up() {
    loom::model(|| {
        let m = Arc::new(Mailbox::new().unwrap());
        let target = {
            let m = m.clone();
            thread::spawn(move || {
                m.bind_current_thread();
                m.set_running();
                if m.take_mail().is_empty() {
                    loop {
                        thread::park();
                    }
                }
            })
        };
        m.post(Ipi::fixed(0x40, 0));
        let _ = target.join();
    });
}
