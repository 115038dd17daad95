//! [`VmConfig::validate`]: the rules a configuration must keep that do not depend on the host
//! (the files and devices it names are checked by `vm::inputs`).
//!
//! Knobs of the user irqchip given with `--irqchip kernel` are refused rather than ignored:
//! KVM's in-kernel LAPIC expires the guest's timers and decides when a vCPU runs, so halt
//! polling, timer advance, a timer slack, wake placement, idle injection, the CPU quota, the
//! global-timer load, the `push` and `central` timer models and hierarchy device timers would
//! have no effect (`--timer-slack off` is accepted: it asks for nothing). (`--timer-model pull` is the default and is not told apart from no flag; it has no
//! effect with the kernel irqchip either.) A `--cpu-quota` whose quota is at least
//! `cpus x period` can never park a vCPU, so it is refused too.

use timer::ModelKind;

use super::knobs::TimerSlack;
use super::{
    ConfigError, DeviceTimerMode, IrqchipMode, VmConfig, MAX_CPUS, MAX_DISKS, MAX_MEMORY,
    MAX_VIRTIO_DEVICES, MIN_MEMORY,
};

/// Guest memory is mapped in pages of this size.
const PAGE_SIZE: u64 = 4096;

impl VmConfig {
    /// Checks ranges and combinations that do not depend on the host.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cpus == 0 || self.cpus > MAX_CPUS {
            return Err(ConfigError::Cpus(self.cpus));
        }
        if self.memory < MIN_MEMORY || self.memory > MAX_MEMORY {
            return Err(ConfigError::Memory(self.memory));
        }
        if !self.memory.0.is_multiple_of(PAGE_SIZE) {
            return Err(ConfigError::MemoryAlignment(self.memory));
        }
        if self.disks.len() > MAX_DISKS {
            return Err(ConfigError::TooManyDisks(self.disks.len()));
        }
        if self.disks.len() + self.nets.len() > MAX_VIRTIO_DEVICES {
            return Err(ConfigError::TooManyDevices {
                disks: self.disks.len(),
                nets: self.nets.len(),
            });
        }
        for (i, net) in self.nets.iter().enumerate() {
            if self.nets[..i].iter().any(|n| n.tap == net.tap) {
                return Err(ConfigError::DuplicateTap(net.tap.clone()));
            }
        }
        if let Some(q) = self.cpu_quota {
            if q.quota_ns >= q.period_ns.saturating_mul(u64::from(self.cpus)) {
                return Err(ConfigError::QuotaNeverApplies {
                    quota_ms: q.quota_ns / 1_000_000,
                    period_ms: q.period_ns / 1_000_000,
                    cpus: self.cpus,
                });
            }
        }
        if self.irqchip == IrqchipMode::Kernel {
            let knobs = [
                (self.halt_poll.is_some(), "--halt-poll"),
                (self.timer_advance.is_some(), "--timer-advance"),
                (
                    self.timer_slack.is_some_and(TimerSlack::is_on),
                    "--timer-slack",
                ),
                (self.wake_placement.is_some(), "--wake-placement"),
                (self.idle_inject.is_some(), "--idle-inject"),
                (self.cpu_quota.is_some(), "--cpu-quota"),
                (self.global_timers.is_some(), "--global-timers"),
                (self.timer_model == ModelKind::Push, "--timer-model push"),
                (
                    self.timer_model == ModelKind::Central,
                    "--timer-model central",
                ),
                (
                    self.device_timers == Some(DeviceTimerMode::Hierarchy),
                    "--device-timers hierarchy",
                ),
            ];
            if let Some((_, name)) = knobs.iter().find(|(set, _)| *set) {
                return Err(ConfigError::NeedsUserIrqchip(name));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::knobs::WakePlacementMode;
    use crate::size::ByteSize;

    #[test]
    fn validate_ranges() {
        let mut cfg = VmConfig::default();
        assert!(cfg.validate().is_ok());
        cfg.cpus = 0;
        assert!(matches!(cfg.validate(), Err(ConfigError::Cpus(0))));
        cfg.cpus = 1;
        cfg.memory = ByteSize::mib(8);
        assert!(matches!(cfg.validate(), Err(ConfigError::Memory(_))));
        cfg.memory = ByteSize::mib(64);
        cfg.idle_inject = Some("percent=10".parse().unwrap());
        assert!(cfg.validate().is_ok());
        cfg.irqchip = IrqchipMode::Kernel;
        assert!(matches!(
            cfg.validate(),
            Err(ConfigError::NeedsUserIrqchip("--idle-inject"))
        ));
        cfg.irqchip = IrqchipMode::User;
        assert!(cfg.validate().is_ok());
        cfg.idle_inject = None;
        cfg.wake_placement = Some(WakePlacementMode::default());
        cfg.irqchip = IrqchipMode::Kernel;
        assert!(matches!(
            cfg.validate(),
            Err(ConfigError::NeedsUserIrqchip("--wake-placement"))
        ));
    }

    #[test]
    fn memory_is_whole_pages() {
        let mut cfg = VmConfig {
            memory: ByteSize((32 << 20) + 1),
            ..VmConfig::default()
        };
        let err = cfg.validate().unwrap_err();
        assert!(matches!(err, ConfigError::MemoryAlignment(_)));
        assert!(err.to_string().contains("multiple of 4 KiB"), "{err}");
        cfg.memory = ByteSize((32 << 20) + 4096);
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn knobs_the_kernel_irqchip_ignores_are_refused() {
        let kernel = |f: fn(&mut VmConfig)| {
            let mut cfg = VmConfig {
                irqchip: IrqchipMode::Kernel,
                ..VmConfig::default()
            };
            f(&mut cfg);
            let user = VmConfig {
                irqchip: IrqchipMode::User,
                ..cfg.clone()
            };
            assert!(user.validate().is_ok(), "{user:?}");
            cfg.validate()
        };
        assert!(kernel(|_| {}).is_ok());
        assert!(kernel(|c| c.timer_model = ModelKind::Pull).is_ok());
        assert!(matches!(
            kernel(|c| c.timer_model = ModelKind::Central),
            Err(ConfigError::NeedsUserIrqchip("--timer-model central"))
        ));
        assert!(matches!(
            kernel(|c| c.timer_model = ModelKind::Push),
            Err(ConfigError::NeedsUserIrqchip("--timer-model push"))
        ));
        assert!(matches!(
            kernel(|c| c.timer_advance = Some("20us".parse().unwrap())),
            Err(ConfigError::NeedsUserIrqchip("--timer-advance"))
        ));
        assert!(matches!(
            kernel(|c| c.timer_slack = Some("1ms".parse().unwrap())),
            Err(ConfigError::NeedsUserIrqchip("--timer-slack"))
        ));
        assert!(kernel(|c| c.timer_slack = Some(TimerSlack::Off)).is_ok());
    }

    #[test]
    fn a_quota_that_can_never_bind_is_refused() {
        let with = |quota: &str, cpus| VmConfig {
            cpus,
            cpu_quota: Some(quota.parse().unwrap()),
            ..VmConfig::default()
        };
        assert!(matches!(
            with("quota=200,period=100", 1).validate(),
            Err(ConfigError::QuotaNeverApplies { cpus: 1, .. })
        ));
        assert!(with("quota=100,period=100", 1).validate().is_err());
        assert!(with("quota=99,period=100", 1).validate().is_ok());
        assert!(with("quota=150,period=100", 2).validate().is_ok());
        assert!(with("quota=200,period=100", 2).validate().is_err());
    }
}
