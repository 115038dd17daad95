//! Cloud Hypervisor's command line (lull invoked as `cloud-hypervisor`, or `lull ch ...`)
//! onto lull's [`VmConfig`] and the few things lull itself needs (the API socket, the log).
//!
//! The flags, how they take their values, their help and what each does are one table
//! ([`super::flags`]), read with clap. A flag lull does not have is refused by name, a
//! single-valued flag given twice is refused (not the last one kept). lull's own knobs come
//! as `--lull KEY=VALUE[,KEY=VALUE]`, with the names of `lull run`'s flags (`--lull
//! timer-model=push,halt-poll=50us`); a value may hold commas (`--lull
//! idle-inject=percent=25,period=100`): a new pair starts only at one of lull's flag names.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Args, Command, FromArgMatches};

use super::flags::{self, Effect, Flag, Parsed, FLAGS};
use super::options;
use super::ChError;
use crate::config::VmConfig;

pub use super::launch::{ApiSocketArg, ChCommand, ChLaunch, EventMonitorArg};

/// Reads `args` (without the program name, or after `ch`).
pub fn parse(args: &[String]) -> Result<ChCommand, ChError> {
    let matches = match flags::command().try_get_matches_from(args) {
        Ok(matches) => matches,
        Err(e) => return clap_outcome(&e),
    };
    let mut parsed = Parsed::new(matches.get_count("v"));
    // The flags given that describe the VM, by first position: none may come with `--restore`.
    let mut vm_flags: Vec<(usize, String)> = Vec::new();
    let given = |f: &&Flag| matches.value_source(f.id) == Some(ValueSource::CommandLine);
    let refused = FLAGS.iter().filter(given).find_map(|f| match f.effect {
        Effect::Refused(why) => Some((f.name(), why)),
        _ => None,
    });
    if let Some((option, why)) = refused {
        return Err(ChError::Refused { option, why });
    }
    for f in FLAGS.iter().filter(given) {
        let set = match f.effect {
            Effect::Vm(set) => {
                vm_flags.push((matches.index_of(f.id).unwrap_or(0), f.name()));
                set
            }
            Effect::Run(set) => set,
            Effect::Refused(_) | Effect::Clap => continue,
        };
        let values: Vec<String> = matches
            .get_many::<String>(f.id)
            .map(|v| v.cloned().collect())
            .unwrap_or_default();
        set(&mut parsed, &f.name(), values)?;
    }
    let Parsed {
        mut cfg,
        mut launch,
        lull_knobs,
        console_pty,
    } = parsed;
    if console_pty && launch.restore.is_none() {
        options::console_pty(&mut cfg.serial)?;
    }
    if launch.restore.is_some() && !vm_flags.is_empty() {
        vm_flags.sort();
        let names: Vec<String> = vm_flags.into_iter().map(|(_, name)| name).collect();
        return Err(ChError::Refused {
            option: format!("--restore with {}", names.join(", ")),
            why: "the restored VM is the snapshot's, as it was saved: give --restore alone \
                  (with --api-socket, --log-file, -v, --console, --rng)",
        });
    }
    for knobs in &lull_knobs {
        apply_lull_knobs(&mut cfg, knobs)?;
    }
    cfg.validate()?;
    launch.config = cfg;
    launch.lull_knobs = lull_knobs;
    Ok(ChCommand::Launch(Box::new(launch)))
}

/// What clap's refusal (or its `--help`, `--version`) means here.
fn clap_outcome(e: &clap::Error) -> Result<ChCommand, ChError> {
    // clap names a flag with its value's name (`--kernel <P>`, `--frob=1`): the flag alone;
    // a stray value as it is.
    let flag = || match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) if arg.starts_with('-') => {
            arg.split([' ', '=']).next().unwrap_or_default().to_string()
        }
        Some(ContextValue::String(arg)) => arg.clone(),
        _ => String::new(),
    };
    match e.kind() {
        ErrorKind::DisplayHelp => Ok(ChCommand::Help(e.to_string())),
        ErrorKind::DisplayVersion => Ok(ChCommand::Version),
        ErrorKind::UnknownArgument => Err(ChError::Refused {
            option: flag(),
            why: "not a Cloud Hypervisor flag lull knows",
        }),
        ErrorKind::ArgumentConflict => Err(ChError::Repeated(flag())),
        ErrorKind::InvalidValue if e.get(ContextKind::InvalidValue).is_none_or(is_empty) => {
            Err(ChError::NoValue(flag()))
        }
        _ => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            Err(ChError::Usage(
                first.strip_prefix("error: ").unwrap_or(first).to_string(),
            ))
        }
    }
}

fn is_empty(value: &ContextValue) -> bool {
    matches!(value, ContextValue::String(s) if s.is_empty()) || matches!(value, ContextValue::None)
}

/// Applies `--lull KEY=VALUE[,KEY=VALUE]` with the parser of `lull run`'s flags (to the VM of
/// the command line, and to each the API creates from Cloud Hypervisor's `VmConfig`).
pub fn apply_lull_knobs(cfg: &mut VmConfig, text: &str) -> Result<(), ChError> {
    let flags = VmConfig::augment_args_for_update(Command::new("lull").no_binary_name(true));
    let names: Vec<String> = flags
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    let mut argv: Vec<String> = Vec::new();
    for part in text.split(',') {
        let key = part.split_once('=').map_or(part, |(k, _)| k);
        if names.iter().any(|n| n == key) {
            let value = part.split_once('=').map_or("", |(_, v)| v);
            argv.push(format!("--{key}"));
            argv.push(value.to_string());
        } else if let Some(value) = argv.last_mut() {
            value.push(',');
            value.push_str(part);
        } else {
            return Err(ChError::Lull(format!("'{key}' is not one of lull's flags")));
        }
    }
    let matches = flags
        .try_get_matches_from(&argv)
        .map_err(|e| ChError::Lull(e.to_string().lines().next().unwrap_or("").to_string()))?;
    cfg.update_from_arg_matches(&matches)
        .map_err(|e| ChError::Lull(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use timer::ModelKind;

    use crate::config::ch::options::TapSource;
    use crate::config::ch::restore::ChRestore;
    use crate::config::knobs::SeccompMode;
    use crate::config::{IrqchipMode, SerialMode};
    use crate::size::ByteSize;

    fn launch(args: &str) -> Result<ChLaunch, ChError> {
        let args: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        match parse(&args)? {
            ChCommand::Launch(l) => Ok(*l),
            other => panic!("{other:?}"),
        }
    }

    /// The first Nomad driver's command line (see docs/ORCHESTRATION.md).
    #[test]
    fn a_driver_s_command_line_maps_onto_lull_s_config() {
        let l = launch(
            "--api-socket path=/run/ch.sock --kernel /k --initramfs /i --cmdline console=ttyS0 \
             --cpus boot=2 --memory size=268435456 --disk path=/a.img,readonly=on path=/b.img \
             --net tap=tap0,mac=52:54:00:00:00:01 --serial tty --console off -vv \
             --log-file /l --seccomp log --rng src=/dev/urandom",
        )
        .unwrap();
        let cfg = &l.config;
        assert!(l.boots);
        assert_eq!(
            l.api_socket,
            Some(ApiSocketArg::Path("/run/ch.sock".into()))
        );
        assert_eq!((cfg.cpus, cfg.memory), (2, ByteSize::mib(256)));
        assert_eq!(cfg.cmdline.as_deref(), Some("console=ttyS0"));
        assert_eq!(cfg.disks.len(), 2);
        assert!(cfg.disks[0].readonly && !cfg.disks[1].readonly);
        assert_eq!(cfg.nets[0].tap, "tap0");
        assert_eq!(cfg.serial, SerialMode::Stdio);
        assert_eq!(cfg.seccomp, SeccompMode::Log);
        assert_eq!((l.verbose, l.log_file.as_deref()), (2, Some("/l".as_ref())));
        assert_eq!(l.notes.len(), 1, "{:?}", l.notes);
    }

    #[test]
    fn flintlock_s_forms_and_other_spellings() {
        let l = launch(
            "--api-socket=/s --memory size=512M,shared=on --net fd=3,mac=52:54:00:00:00:09 -v",
        )
        .unwrap();
        assert!(!l.boots);
        assert_eq!(l.config.memory, ByteSize::mib(512));
        assert_eq!(l.net_fds.len(), 1);
        assert_eq!(l.net_fds[0].source, TapSource::Fd(3));
        assert_eq!(
            launch("--api-socket fd=5").unwrap().api_socket,
            Some(ApiSocketArg::Fd(5))
        );
        assert_eq!(
            launch("--api-socket /x").unwrap().api_socket,
            Some(ApiSocketArg::Path("/x".into()))
        );
        assert_eq!(
            launch("--serial file=/s.log").unwrap().config.serial,
            SerialMode::File("/s.log".into())
        );
        assert_eq!(
            launch("--seccomp false").unwrap().config.seccomp,
            SeccompMode::Off
        );
        assert_eq!(parse(&["--version".into()]), Ok(ChCommand::Version));
        assert_eq!(parse(&["-V".into()]), Ok(ChCommand::Version));
    }

    /// libvirt's ch driver: `--api-socket fd=N --event-monitor path=FIFO`.
    #[test]
    fn the_event_monitor_takes_a_path_or_an_fd() {
        let l =
            launch("--api-socket fd=3 --event-monitor path=/run/vm-event-monitor-fifo").unwrap();
        assert_eq!(
            l.event_monitor,
            Some(EventMonitorArg::Path("/run/vm-event-monitor-fifo".into()))
        );
        assert_eq!(
            launch("--event-monitor fd=7").unwrap().event_monitor,
            Some(EventMonitorArg::Fd(7))
        );
        for bad in [
            "--event-monitor /x",
            "--event-monitor fd=x",
            "--event-monitor path=",
        ] {
            assert!(launch(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn what_lull_cannot_honour_is_refused_by_name() {
        for (args, named) in [
            ("--kernel /k --fs tag=x,socket=/s", "--fs"),
            ("--pmem file=/p", "--pmem"),
            ("--vsock cid=3,socket=/v", "--vsock"),
            ("--cpus boot=1,max=2", "--cpus max=2"),
            ("--memory size=1G,hugepages=on", "--memory hugepages=on"),
            ("--console tty", "--console tty"),
            ("--disk path=/a,vhost_user=on", "--disk vhost_user=on"),
            ("--frobnicate", "--frobnicate"),
            ("-x", "-x"),
        ] {
            let err = launch(args).unwrap_err();
            assert!(err.to_string().contains(named), "{args}: {err}");
        }
        assert_eq!(launch("--kernel"), Err(ChError::NoValue("--kernel".into())));
    }

    #[test]
    fn restore_comes_without_vm_flags() {
        let l = launch("--api-socket /s --restore source_url=file:///snap,prefault=on -v").unwrap();
        let paused = ChRestore {
            dir: "/snap".into(),
            resume: false,
            memory: crate::config::MemoryRestore {
                prefault: true,
                ..Default::default()
            },
            nets: Vec::new(),
            serial: None,
        };
        assert_eq!(l.restore, Some(paused));
        assert!(!l.boots);
        let l = launch("--restore source_url=file:///snap,resume=true --console off").unwrap();
        assert!(l.restore.is_some_and(|r| r.resume));
        for (args, named) in [
            (
                "--restore source_url=file:///s --kernel /k --cpus boot=2 --lull cpus=2",
                "--restore with --kernel, --cpus, --lull:",
            ),
            (
                "--serial tty --restore source_url=file:///s",
                "with --serial",
            ),
            ("--restore prefault=on", "source_url"),
            (
                "--restore source_url=file:///s,memory_restore_mode=eager",
                "memory_restore_mode=eager",
            ),
        ] {
            let err = launch(args).unwrap_err().to_string();
            assert!(err.contains(named), "{args}: {err}");
        }
    }

    #[test]
    fn lull_s_own_knobs_come_with_dash_dash_lull() {
        let l = launch(
            "--lull timer-model=push,halt-poll=50us --lull idle-inject=percent=25,period=100",
        )
        .unwrap();
        assert_eq!(l.config.timer_model, ModelKind::Push);
        assert_eq!(l.config.idle_inject.map(|c| c.percent), Some(25));
        assert_eq!(l.config.irqchip, IrqchipMode::User);
        let err = launch("--lull bogus=1").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        assert!(launch("--lull cpus=x").is_err());
        // lull's own rules still hold.
        assert!(launch("--lull irqchip=kernel,timer-model=push").is_err());
    }

    #[test]
    fn a_single_valued_flag_given_twice_is_refused() {
        for (args, flag) in [
            ("--api-socket /a --api-socket /b", "--api-socket"),
            ("--kernel /k --cpus boot=1 --kernel=/k", "--kernel"),
            ("--serial tty --serial off", "--serial"),
            (
                "--restore source_url=file:///s --restore source_url=file:///t",
                "--restore",
            ),
        ] {
            let err = launch(args).unwrap_err();
            assert_eq!(err, ChError::Repeated(flag.into()), "{args}");
            assert!(err.to_string().contains("give it once"), "{err}");
        }
        // The repeatable ones repeat, with one or more values each time.
        let l = launch("--disk path=/a path=/b --disk path=/c --lull cpus=2 --lull halt-poll=50us")
            .unwrap();
        assert_eq!(l.config.disks.len(), 3);
        assert_eq!(l.config.cpus, 2);
        assert_eq!(launch("-v -vv").unwrap().verbose, 3);
    }

    #[test]
    fn an_empty_disk_path_is_called_empty() {
        let err = launch("--disk path=").unwrap_err();
        assert_eq!(err, ChError::EmptyPath("--disk path".into()));
        assert!(err.to_string().contains("--disk path is empty"), "{err}");
        assert_eq!(
            launch("--disk readonly=on"),
            Err(ChError::Missing("--disk path"))
        );
    }

    #[test]
    fn values_take_cloud_hypervisor_s_forms() {
        let l = launch("--cmdline -x --kernel=/k --cpus=boot=2").unwrap();
        assert_eq!(l.config.cmdline.as_deref(), Some("-x"));
        assert_eq!(l.config.cpus, 2);
        assert_eq!(launch("--disk"), Err(ChError::NoValue("--disk".into())));
        assert_eq!(
            launch("--kernel --cpus boot=1"),
            Err(ChError::NoValue("--kernel".into()))
        );
        let err = launch("--api-socket /a key=value").unwrap_err();
        assert!(err.to_string().contains("key=value: not a"), "{err}");
    }

    /// The help comes from the same table as the parser: every flag lull takes is in it, and
    /// every refused one with its reason.
    #[test]
    fn the_help_lists_the_flags_lull_takes() {
        let Ok(ChCommand::Help(help)) = parse(&["--help".into()]) else {
            panic!("--help")
        };
        for f in &FLAGS {
            let shown = help.contains(&f.name());
            match f.effect {
                Effect::Refused(why) => assert!(
                    help.contains(&format!("{:<20}{why}", f.name())),
                    "{} and its reason not in the help",
                    f.name()
                ),
                _ if f.help.is_empty() => {}
                _ => assert!(shown, "{} not in the help:\n{help}", f.name()),
            }
        }
        assert_eq!(parse(&["-h".into()]), Ok(ChCommand::Help(help)));
    }
}
