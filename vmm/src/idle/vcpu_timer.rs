//! What a vCPU's timers carry, and what one pass over them fired: the vocabulary the idle core,
//! the irqchip and the timer models share.

/// Which of a vCPU's timers fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuTimer {
    /// Its LAPIC timer (pinned).
    Lapic,
    /// The start of the next idle-injection window (pinned).
    IdleInject,
    /// A CPU-quota check (pinned): the budget may be used up by now.
    QuotaCheck,
    /// A look at CR8 while an interrupt is held by TPR alone (pinned): it only makes the vCPU
    /// exit (`irqchip::user::cr8`).
    TprPoll,
    /// A synthetic device/housekeeping deadline (global), by load slot.
    Global(u32),
    /// A device's timer (global): a rate-limited disk's refill, by device index.
    Device(u32),
}

/// What one pass over the timers fired, for the thread that ran it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FiredSummary {
    /// Pinned timers of this vCPU (LAPIC, injection, quota).
    pub own_pinned: u32,
    /// Global timers of this vCPU's own base.
    pub own_global: u32,
    /// Global timers of other vCPUs (this one is a migrator).
    pub remote_global: u32,
    /// Of the global timers, device timers (their callbacks ran on this thread).
    pub device: u32,
}

impl FiredSummary {
    /// Global timers fired, own and remote.
    pub fn global(&self) -> u32 {
        self.own_global + self.remote_global
    }

    /// Every timer fired, pinned and global.
    pub fn total(&self) -> u32 {
        self.own_pinned + self.global()
    }
}
