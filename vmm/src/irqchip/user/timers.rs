//! What happens when a vCPU's timer fires, on whichever thread expired it (its own, a
//! migrator vCPU's, or the `central` model's timer thread).
//!
//! Pinned timers flag their owner's mailbox (and the model kicks the owner if they fired on
//! another thread); global ones wake nobody: the synthetic load's are queued for re-arming, a
//! device's is collected into `devices_due` for the caller to run the device's callback
//! (`crate::state::device_timers`) on the same thread once the timer model has returned: the
//! callback may raise an interrupt that wakes a vCPU, which must not then find its timer
//! queues still locked by the expiry.

use timer::{AfterFire, Fired};

use super::mailbox::Mailbox;
use super::router::InterruptRouter;
use crate::idle::global_load::GlobalLoad;
use crate::idle::vcpu_timer::{FiredSummary, VcpuTimer};

/// The expiry callback every thread uses; counts what fired into `summary`.
pub fn on_timer_fired(
    router: &InterruptRouter,
    global: Option<&GlobalLoad>,
    devices_due: &mut Vec<u32>,
    summary: &mut FiredSummary,
    fired: Fired<VcpuTimer>,
) -> AfterFire {
    let notify = |flag: fn(&Mailbox)| {
        if let Some(mailbox) = router.mailbox(fired.cpu) {
            flag(mailbox);
        }
        if fired.remote {
            AfterFire::NotifyOwner
        } else {
            AfterFire::Done
        }
    };
    match fired.payload {
        VcpuTimer::Lapic => {
            summary.own_pinned += 1;
            notify(Mailbox::flag_timer)
        }
        VcpuTimer::IdleInject | VcpuTimer::QuotaCheck => {
            summary.own_pinned += 1;
            notify(Mailbox::flag_recheck)
        }
        // Not counted as a wake-up cause: it exists only to end a KVM_RUN.
        VcpuTimer::TprPoll => notify(Mailbox::flag_recheck),
        VcpuTimer::Global(_) | VcpuTimer::Device(_) => {
            if fired.remote {
                summary.remote_global += 1;
            } else {
                summary.own_global += 1;
            }
            match fired.payload {
                VcpuTimer::Device(id) => {
                    summary.device += 1;
                    devices_due.push(id);
                }
                VcpuTimer::Global(slot) => {
                    if let Some(g) = global {
                        g.fired(slot);
                    }
                }
                _ => {}
            }
            AfterFire::Done
        }
    }
}
