//! The flags of `lull run` that describe the VM: [`VmConfig`]'s fields, each one a flag, and
//! `--config FILE`.
//!
//! Precedence: built-in defaults, then the config file, then the flags given on the command
//! line, each one over the same field of the file (`--disk` and `--net` replace the file's
//! lists). clap's own update does exactly that: [`FromArgMatches::update_from_arg_matches`]
//! sets a field only if its flag was given, which holds because no field has a clap default.
//! So the flags are kept as clap matched them and applied once the file has been read.

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, FromArgMatches};

use super::{ConfigError, VmConfig};

/// [`VmConfig`]'s fields as flags, none required, kept as given until [`VmArgs::to_config`]
/// applies them over the config file.
#[derive(Debug, Clone)]
struct VmFlags(ArgMatches);

impl VmFlags {
    /// Sets the fields of `cfg` whose flags were given.
    fn apply(&self, cfg: &mut VmConfig) -> Result<(), clap::Error> {
        cfg.update_from_arg_matches(&self.0)
    }

    /// True if any of the flags was given.
    fn any_given(&self) -> bool {
        !self.given().is_empty()
    }

    /// The flags given on the command line (`--cpus`...), in [`VmConfig`]'s order.
    fn given(&self) -> Vec<String> {
        let flags = VmConfig::augment_args(Command::new("lull run"));
        flags
            .get_arguments()
            .filter(|flag| {
                self.0.value_source(flag.get_id().as_str()) == Some(ValueSource::CommandLine)
            })
            .map(|flag| format!("--{}", flag.get_long().unwrap_or(flag.get_id().as_str())))
            .collect()
    }
}

impl FromArgMatches for VmFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let flags = Self(matches.clone());
        // Applied once here so that a value clap cannot hand over is a usage error now.
        flags.apply(&mut VmConfig::default())?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for VmFlags {
    fn augment_args(cmd: Command) -> Command {
        // The "for update" form: every field optional, none required.
        VmConfig::augment_args_for_update(cmd)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        VmConfig::augment_args_for_update(cmd)
    }
}

/// The flags of `lull run` that describe the VM. Each one overrides the same field of
/// `--config`.
#[derive(Debug, Clone, Args)]
pub struct VmArgs {
    /// [`VmConfig`]'s fields.
    #[command(flatten)]
    flags: VmFlags,

    /// Read the VM configuration from a JSON file with the same fields as these flags
    /// (kernel, initramfs, cmdline, cpus, memory, irqchip, timer_model, halt_poll, timer_advance,
    /// timer_slack, wake_placement, idle_inject, cpu_quota, global_timers, serial, metrics,
    /// seccomp, pv_eoi, pv_deadline, x2apic, disks: a list of `--disk` values, nets: a list of
    /// `--net` values, and device_timers); flags win (`--disk` and `--net` replace the file's lists). The file
    /// must be a regular file of at most 1 MiB holding a JSON object (not an array; a device
    /// such as /dev/zero is refused before it is read).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// What the VM flags given with `--restore` say ([`VmArgs::for_restore`]): the outputs of
/// the restored run (a snapshot's own are its saving run's, never reused:
/// `crate::snapshot::read` drops them) and the host taps of its nets.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreFlags {
    /// `--metrics`: where this run writes its report.
    pub metrics: Option<PathBuf>,
    /// `--serial`: where the restored VM's console goes (`None`: the default, stdio).
    pub serial: Option<crate::config::SerialMode>,
    /// `--net`s: a host tap for each of the snapshot's nets, in order (none: the snapshot's).
    pub nets: Vec<super::NetConfig>,
}

impl VmArgs {
    /// True if any flag that describes the VM (or `--config`) was given.
    pub fn describes_vm(&self) -> bool {
        self.config.is_some() || self.flags.any_given()
    }

    /// With `--restore` the VM is the snapshot's: of these flags only the run's outputs,
    /// `--metrics` (where this run writes its report) and `--serial` (where its console goes),
    /// and `--net` (the host taps of the snapshot's nets, see [`super::restore_nets`]) may be
    /// given. What they say; the flags that may not be given, or `--config`, are refused by
    /// name.
    pub fn for_restore(&self) -> Result<RestoreFlags, ConfigError> {
        let mut refused: Vec<String> = self
            .flags
            .given()
            .into_iter()
            .filter(|flag| flag != "--metrics" && flag != "--serial" && flag != "--net")
            .collect();
        if self.config.is_some() {
            refused.push("--config".to_string());
        }
        if !refused.is_empty() {
            return Err(ConfigError::FlagsWithRestore(refused.join(", ")));
        }
        let mut cfg = VmConfig::default();
        self.flags.apply(&mut cfg).map_err(ConfigError::Flags)?;
        let serial = self
            .flags
            .given()
            .iter()
            .any(|f| f == "--serial")
            .then_some(cfg.serial);
        Ok(RestoreFlags {
            metrics: cfg.metrics,
            serial,
            nets: cfg.nets,
        })
    }

    /// The configuration these flags describe: defaults, then `--config`, then flags.
    pub fn to_config(&self) -> Result<VmConfig, ConfigError> {
        let mut cfg = match &self.config {
            Some(path) => VmConfig::from_file(path)?,
            None => VmConfig::default(),
        };
        self.flags.apply(&mut cfg).map_err(ConfigError::Flags)?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    use timer::ModelKind;

    use crate::config::{IrqchipMode, SerialMode, Switch};
    use crate::size::ByteSize;

    /// `lull run` with the VM's flags only (the `lull` binary adds the rest).
    #[derive(Debug, Parser)]
    #[command(name = "lull")]
    enum Cli {
        /// `lull run`.
        Run(VmArgs),
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_override_config_file() {
        let dir = std::env::temp_dir().join(format!("lull-cli-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("vm.json");
        std::fs::write(&file, r#"{"cpus": 4, "memory": "512M", "cmdline": "a=b"}"#).unwrap();
        let cli = Cli::try_parse_from([
            "lull",
            "run",
            "--config",
            file.to_str().unwrap(),
            "--cpus",
            "2",
        ])
        .unwrap();
        let Cli::Run(args) = cli;
        let cfg = args.to_config().unwrap();
        assert_eq!(cfg.cpus, 2);
        assert_eq!(cfg.memory, ByteSize::mib(512));
        assert_eq!(cfg.cmdline.as_deref(), Some("a=b"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The configuration of `lull run --config FILE EXTRA...` where FILE holds `json`.
    fn config_with(name: &str, json: &str, extra: &[&str]) -> VmConfig {
        let dir = std::env::temp_dir().join(format!("lull-cli-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("vm.json");
        std::fs::write(&file, json).unwrap();
        let mut argv = vec!["lull", "run", "--config", file.to_str().unwrap()];
        argv.extend_from_slice(extra);
        let Cli::Run(args) = Cli::try_parse_from(argv).unwrap();
        let cfg = args.to_config().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        cfg
    }

    #[test]
    fn x2apic_switch_comes_from_the_config_file_or_the_flag() {
        let parse = |extra: &[&str]| config_with("x2apic", r#"{"x2apic": "off"}"#, extra).x2apic;
        assert_eq!(parse(&[]), Switch::Off);
        assert_eq!(parse(&["--x2apic", "on"]), Switch::On);
        assert_eq!(VmConfig::default().x2apic, Switch::On);
    }

    #[test]
    fn absent_flags_leave_every_field_of_the_file_and_given_ones_win() {
        let json = r#"{"kernel": "/k", "initramfs": "/i", "cmdline": "c", "cpus": 3,
            "memory": "64M", "irqchip": "user", "timer_model": "push", "halt_poll": "50us",
            "timer_advance": "off", "timer_slack": "1ms", "wake_placement": "cache-hot",
            "idle_inject": "percent=10,period=100", "cpu_quota": "quota=50,period=100",
            "global_timers": "2", "serial": "off", "metrics": "/m", "seccomp": "log",
            "pv_eoi": "off", "pv_deadline": "off", "x2apic": "off", "disks": ["path=/d"],
            "nets": ["tap=t0"], "device_timers": "timerfd"}"#;
        let file: VmConfig = serde_json::from_str(json).unwrap();
        // The file sets every field away from its default, so a flag's default would show;
        // but `irqchip`, which the idle knobs need at its default (`user`): it has its own file.
        let fields = serde_json::to_value(&file).unwrap();
        let defaults = serde_json::to_value(VmConfig::default()).unwrap();
        for (name, value) in fields.as_object().unwrap() {
            if name != "irqchip" {
                assert_ne!(
                    Some(value),
                    defaults.get(name),
                    "{name} is the default in the file"
                );
            }
        }
        let kernel = r#"{"irqchip": "kernel"}"#;
        assert_eq!(
            config_with("irqchip", kernel, &[]).irqchip,
            IrqchipMode::Kernel
        );
        let user = config_with("irqchip", kernel, &["--irqchip", "user"]);
        assert_eq!(user.irqchip, IrqchipMode::User);
        assert_eq!(config_with("every-field", json, &[]), file);
        let flagged = config_with(
            "every-field",
            json,
            &["--cpus", "2", "--serial", "stdio", "--timer-model", "pull"],
        );
        let expected = VmConfig {
            cpus: 2,
            serial: SerialMode::Stdio,
            timer_model: ModelKind::Pull,
            ..file
        };
        assert_eq!(flagged, expected);
    }

    #[test]
    fn disks_repeat_and_replace_the_config_files() {
        let json = r#"{"disks": ["path=/from/file"]}"#;
        assert_eq!(config_with("disks", json, &[]).disks.len(), 1);
        let flags = config_with(
            "disks",
            json,
            &["--disk", "path=/a", "--disk", "path=/b,readonly=on"],
        )
        .disks;
        assert_eq!(
            flags.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["path=/a", "path=/b,readonly=on"]
        );
        assert!(Cli::try_parse_from(["lull", "run", "--disk", "/a"]).is_err());
    }

    #[test]
    fn nets_repeat_and_replace_the_config_files() {
        let json = r#"{"nets": ["tap=fromfile"]}"#;
        assert_eq!(config_with("nets", json, &[]).nets[0].tap, "fromfile");
        let flags = config_with(
            "nets",
            json,
            &["--net", "tap=a", "--net", "tap=b,mac=52:54:00:00:00:0b"],
        )
        .nets;
        assert_eq!(
            flags.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["tap=a", "tap=b,mac=52:54:00:00:00:0b"]
        );
        assert!(Cli::try_parse_from(["lull", "run", "--net", "lulltap0"]).is_err());
        let cli = Cli::try_parse_from(["lull", "run", "--net", "tap=a", "--net", "tap=a"]).unwrap();
        let Cli::Run(args) = cli;
        assert!(args.describes_vm());
        assert!(matches!(
            args.to_config(),
            Err(ConfigError::DuplicateTap(_))
        ));
    }

    /// `lull run ARGS`'s VM flags.
    fn parsed(args: &[&str]) -> VmArgs {
        let Cli::Run(vm) = Cli::try_parse_from(["lull", "run"].iter().chain(args)).unwrap();
        vm
    }

    #[test]
    fn restore_takes_metrics_serial_and_nets_and_names_every_other_flag() {
        assert_eq!(parsed(&[]).for_restore().unwrap(), RestoreFlags::default());
        assert_eq!(
            parsed(&["--serial", "file=/c"])
                .for_restore()
                .unwrap()
                .serial,
            Some(SerialMode::File("/c".into()))
        );
        assert_eq!(
            parsed(&["--metrics", "/m.json", "--net", "tap=t0", "--net", "tap=t1"])
                .for_restore()
                .unwrap(),
            RestoreFlags {
                metrics: Some(PathBuf::from("/m.json")),
                serial: None,
                nets: vec!["tap=t0".parse().unwrap(), "tap=t1".parse().unwrap()],
            }
        );
        let all = parsed(&["--metrics", "/m", "--serial", "off", "--net", "tap=t0"])
            .for_restore()
            .unwrap();
        assert_eq!(
            (all.metrics.is_some(), all.serial, all.nets.len()),
            (true, Some(SerialMode::Off), 1)
        );
        let refused = |args: &[&str]| match parsed(args).for_restore() {
            Err(ConfigError::FlagsWithRestore(flags)) => flags,
            other => panic!("{args:?}: {other:?}"),
        };
        assert_eq!(refused(&["--cpus", "4"]), "--cpus");
        assert_eq!(
            refused(&[
                "--metrics",
                "/m",
                "--timer-model",
                "pull",
                "--net",
                "tap=t0",
                "--disk",
                "path=/d"
            ]),
            "--timer-model, --disk"
        );
        assert_eq!(refused(&["--config", "/vm.json"]), "--config");
    }

    #[test]
    fn bad_values_are_usage_errors() {
        assert!(Cli::try_parse_from(["lull", "run", "--memory", "lots"]).is_err());
        assert!(Cli::try_parse_from(["lull", "run", "--serial", "tty"]).is_err());
        let cli = Cli::try_parse_from(["lull", "run", "--cpus", "0"]).unwrap();
        let Cli::Run(args) = cli;
        assert!(matches!(args.to_config(), Err(ConfigError::Cpus(0))));
    }
}
