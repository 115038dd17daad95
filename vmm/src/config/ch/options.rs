//! Cloud Hypervisor's device options, one rule per option, shared by its command line
//! (`--disk path=a,readonly=on`) and its `VmConfig` JSON (`{"path": "a", "readonly": true}`):
//! both front ends turn what they read into a list of [`Opt`]s (the JSON's `null`s dropped,
//! its few other key names renamed), and the functions here map a list onto lull's
//! configuration. Each option is honoured, accepted with a note (it changes nothing a guest of
//! lull's can see, or only what lull cannot do anyway), accepted at its default value only, or
//! refused with the reason.

use std::path::PathBuf;

use super::ChError;
use crate::config::{DiskConfig, MacAddr, NetConfig, SerialMode, TAP_NAME_MAX};
use crate::size::ByteSize;

/// One option: its key as the command line spells it, the name an error gives it
/// (`--disk vhost_user`, `disks[0].vhost_user`) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opt {
    /// The key (`path`, `readonly`, `boot`, ...).
    pub key: String,
    /// How a message names it.
    pub name: String,
    /// The value: text, or the JSON text of an array or object.
    pub value: String,
}

impl Opt {
    pub(super) fn bad(&self, expected: &'static str) -> ChError {
        ChError::BadValue {
            option: self.name.clone(),
            value: self.value.clone(),
            expected,
        }
    }

    pub(super) fn refuse(&self, why: &'static str) -> ChError {
        ChError::Refused {
            option: format!("{}={}", self.name, self.value),
            why,
        }
    }

    /// `on`/`true` or `off`/`false` (Cloud Hypervisor's `Toggle`; empty is on).
    pub(super) fn toggle(&self) -> Result<bool, ChError> {
        match self.value.as_str() {
            "on" | "true" | "" => Ok(true),
            "off" | "false" => Ok(false),
            _ => Err(self.bad("on or off")),
        }
    }

    fn number(&self) -> Result<u64, ChError> {
        self.value.parse().map_err(|_| self.bad("a number"))
    }

    /// Accepted if off, refused with `why` if on.
    fn only_off(&self, why: &'static str) -> Result<(), ChError> {
        if self.toggle()? {
            return Err(self.refuse(why));
        }
        Ok(())
    }

    /// Accepted if its value is one of `defaults`, refused with `why` otherwise.
    pub(super) fn only(&self, defaults: &[&str], why: &'static str) -> Result<(), ChError> {
        if defaults.contains(&self.value.as_str()) {
            return Ok(());
        }
        Err(self.refuse(why))
    }

    /// Accepted; `why` is said with `-v`.
    pub(super) fn note(&self, notes: &mut Vec<String>, why: &str) {
        notes.push(format!("{}={}: {why}", self.name, self.value));
    }
}

/// Splits `key=value,key=value` (a command-line value) into options named `flag key`.
/// A value in brackets may hold commas (`fd=[3,4]`).
pub fn split(flag: &str, text: &str) -> Vec<Opt> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = text.as_bytes();
    for i in 0..=bytes.len() {
        match bytes.get(i) {
            Some(b'[') => depth += 1,
            Some(b']') => depth -= 1,
            Some(b',') if depth > 0 => {}
            Some(b',') | None => {
                let part = &text[start..i];
                start = i + 1;
                if part.is_empty() {
                    continue;
                }
                let (key, value) = part.split_once('=').unwrap_or((part, ""));
                out.push(Opt {
                    key: key.to_string(),
                    name: format!("{flag} {key}"),
                    value: value.to_string(),
                });
            }
            Some(_) => {}
        }
    }
    out
}

/// `--cpus boot=N[,max=N]`: the vCPU count. CPU hotplug (`max` above `boot`), topology,
/// affinity and features are refused.
pub fn cpus(opts: &[Opt], notes: &mut Vec<String>) -> Result<u32, ChError> {
    let mut boot = 1u64;
    let mut max = None;
    for o in opts {
        match o.key.as_str() {
            "boot" => boot = o.number()?,
            "max" => max = Some((o, o.number()?)),
            "kvm_hyperv" => o.only_off("lull offers no Hyper-V enlightenments")?,
            "max_phys_bits" => o.note(notes, "lull sets the guest's physical address width"),
            "nested" => o.note(notes, "nested virtualization is the host's KVM's"),
            // Cloud Hypervisor's JSON sends `features: {"amx": false}` by default.
            "features" if !o.value.contains("true") => {}
            "topology" | "affinity" | "features" | "core_scheduling" => {
                return Err(o.refuse("lull has no CPU topology, affinity or feature knobs"))
            }
            _ => return Err(o.refuse("not a --cpus option lull knows")),
        }
    }
    if let Some((o, max)) = max {
        if max != boot {
            return Err(o.refuse("lull has no CPU hotplug: give max equal to boot"));
        }
    }
    u32::try_from(boot).map_err(|_| ChError::BadValue {
        option: "--cpus boot".into(),
        value: boot.to_string(),
        expected: "a vCPU count",
    })
}

/// `--memory size=N[K|M|G][,shared=on|off]`: the guest RAM. `shared` is accepted (only a
/// vhost-user or virtio-fs back end, which lull refuses, could see the difference);
/// hugepages, hotplug, zones and KSM are refused.
pub fn memory(opts: &[Opt], notes: &mut Vec<String>) -> Result<ByteSize, ChError> {
    let mut size = ByteSize::mib(512);
    for o in opts {
        match o.key.as_str() {
            "size" => size = o.value.parse().map_err(|_| o.bad("a size such as 512M"))?,
            "shared" => {
                o.toggle()?;
                o.note(
                    notes,
                    "lull's guest memory is private: nothing of lull's shares it",
                );
            }
            "thp" => o.note(
                notes,
                "lull leaves transparent huge pages to the host's setting",
            ),
            "prefault" => o.note(notes, "lull maps guest memory on demand"),
            "hugepages" => o.only_off("lull maps guest memory on small pages")?,
            "mergeable" => o.only_off("lull does not mark guest memory for KSM")?,
            "hotplug_size" | "hotplugged_size" => o.only(&["0"], "lull has no memory hotplug")?,
            "hotplug_method" => o.note(notes, "lull has no memory hotplug"),
            "hugepage_size" | "zones" => return Err(o.refuse("lull has no hugepages or zones")),
            _ => return Err(o.refuse("not a --memory option lull knows")),
        }
    }
    Ok(size)
}

/// `--disk path=..[,readonly=on][,serial=..]`: a virtio-blk disk on a raw image.
pub fn disk(opts: &[Opt], notes: &mut Vec<String>) -> Result<DiskConfig, ChError> {
    let mut path = None;
    let mut readonly = false;
    for o in opts {
        match o.key.as_str() {
            "path" if o.value.is_empty() => return Err(ChError::EmptyPath(o.name.clone())),
            "path" => path = Some(PathBuf::from(&o.value)),
            "readonly" => readonly = o.toggle()?,
            "serial" | "id" => o.note(notes, "lull's virtio-blk has no serial or device ID"),
            "queue_size" => o.note(notes, "lull's virtio-blk queue takes up to 256"),
            "num_queues" => o.only(&["1"], "lull's virtio-blk has one queue")?,
            "image_type" => o.only(&["raw", "Raw"], "lull's disks are raw images")?,
            "pci_segment" => o.only(&["0"], "lull's devices are on virtio-mmio")?,
            "direct" => o.only_off("lull does not open images with O_DIRECT")?,
            "iommu" => o.only_off("lull has no virtual IOMMU")?,
            "vhost_user" => o.only_off("lull has no vhost-user")?,
            "sparse" => o.note(notes, "lull leaves the image as it is"),
            "disable_io_uring" | "disable_aio" => o.note(notes, "lull's disk I/O is synchronous"),
            "backing_files" => o.only_off("lull's disks are raw images")?,
            _ => return Err(o.refuse("not a --disk option lull knows")),
        }
    }
    let path = path.ok_or(ChError::Missing("--disk path"))?;
    Ok(DiskConfig {
        path,
        readonly,
        rate: Default::default(),
    })
}

/// Where a virtio-net device's tap comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TapSource {
    /// A tap device lull attaches to by name.
    Name(String),
    /// An open tap file descriptor (`fd=N`).
    Fd(i32),
}

/// One virtio-net device of Cloud Hypervisor's: where its tap comes from, and its MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChNet {
    /// The tap.
    pub source: TapSource,
    /// The device's address (`None`: lull's default for the tap).
    pub mac: Option<MacAddr>,
}

impl ChNet {
    /// lull's configuration of a device on a named tap; a tap fd is refused here (the caller
    /// checks an fd and uses [`fd_net`]).
    pub fn to_config(&self) -> Result<NetConfig, ChError> {
        match &self.source {
            TapSource::Name(name) => {
                let cfg: NetConfig = format!("tap={name}").parse().map_err(ChError::Net)?;
                Ok(NetConfig {
                    mac: self.mac,
                    ..cfg
                })
            }
            TapSource::Fd(fd) => Err(ChError::Refused {
                option: format!("--net fd={fd}"),
                why: "a tap fd is taken on the command line and with vm.add-net only",
            }),
        }
    }
}

/// lull's configuration of a device on the tap behind `fd`, named `tap` (as `TUNGETIFF`
/// says: the caller has checked the fd).
pub fn fd_net(fd: i32, tap: &str, mac: Option<MacAddr>) -> Result<NetConfig, ChError> {
    let cfg: NetConfig = format!("tap={tap}").parse().map_err(ChError::Net)?;
    Ok(NetConfig {
        mac,
        fd: Some(fd),
        ..cfg
    })
}

/// `--net tap=..|fd=N[,mac=..][,ip=..,mask=..]`: a virtio-net device; the tap and its MAC.
pub fn net(opts: &[Opt], notes: &mut Vec<String>) -> Result<ChNet, ChError> {
    let (source, mac) = net_options(opts, notes)?;
    let source = source.ok_or(ChError::Missing("--net tap or fd"))?;
    Ok(ChNet { source, mac })
}

/// A net's options: its tap, if they name one (`vm.add-net` may send it as an fd instead),
/// and its MAC.
pub fn net_options(
    opts: &[Opt],
    notes: &mut Vec<String>,
) -> Result<(Option<TapSource>, Option<MacAddr>), ChError> {
    let mut tap = None;
    let mut mac = None;
    for o in opts {
        match o.key.as_str() {
            "tap" if !o.value.is_empty() && o.value.len() <= TAP_NAME_MAX => {
                tap = Some(TapSource::Name(o.value.clone()))
            }
            "tap" => return Err(o.bad("a tap device name")),
            "fd" => {
                let list = o.value.trim_start_matches('[').trim_end_matches(']');
                let fds: Vec<&str> = list.split(',').filter(|s| !s.trim().is_empty()).collect();
                let [fd] = fds.as_slice() else {
                    return Err(o.refuse("lull takes one tap fd (one queue pair) per device"));
                };
                let fd = fd.trim().parse().map_err(|_| o.bad("a file descriptor"))?;
                tap = Some(TapSource::Fd(fd));
            }
            "mac" => mac = Some(o.value.parse::<MacAddr>().map_err(|_| o.bad("a MAC"))?),
            "ip" | "mask" => o.note(notes, "lull does not configure the host's tap: do it"),
            "host_mac" => o.note(notes, "lull does not set the tap's own address"),
            "id" => o.note(notes, "lull's devices have no ID"),
            "num_queues" => o.only(&["2"], "lull's virtio-net has one queue pair")?,
            "queue_size" => o.note(notes, "lull's virtio-net queues take up to 256"),
            "pci_segment" => o.only(&["0"], "lull's devices are on virtio-mmio")?,
            "mtu" => return Err(o.refuse("lull's virtio-net has no MTU setting")),
            "iommu" => o.only_off("lull has no virtual IOMMU")?,
            "vhost_user" => o.only_off("lull has no vhost-user")?,
            "vhost_mode" => o.note(notes, "lull has no vhost-user"),
            "offload_tso" | "offload_ufo" | "offload_csum" => {
                o.note(notes, "lull's virtio-net offers no offloads")
            }
            _ => return Err(o.refuse("not a --net option lull knows")),
        }
    }
    Ok((tap, mac))
}

/// A serial or console mode of Cloud Hypervisor (`off`, `null`, `tty`, `file=P`, `pty`,
/// `socket=P`), any case.
pub fn serial(option: &str, mode: &str, file: Option<&str>) -> Result<SerialMode, ChError> {
    let refuse = |why| ChError::Refused {
        option: format!("{option} {mode}"),
        why,
    };
    match mode.to_ascii_lowercase().as_str() {
        "off" | "null" => Ok(SerialMode::Off),
        "tty" => Ok(SerialMode::Stdio),
        "file" => match file {
            Some(path) if !path.is_empty() => Ok(SerialMode::File(path.into())),
            _ => Err(ChError::Missing("the serial file's path")),
        },
        "pty" => Ok(SerialMode::Pty),
        "socket" => Err(refuse(
            "lull's serial goes to the terminal, a file, a pty or nowhere",
        )),
        _ => Err(refuse(
            "not a serial mode: use off, null, tty, pty or file=PATH",
        )),
    }
}

/// The virtio console: lull has none, so `off` and `null` are taken, and `pty` (true), which
/// [`console_pty`] makes the serial port's pty.
pub fn console(option: &str, mode: &str) -> Result<bool, ChError> {
    match mode.to_ascii_lowercase().as_str() {
        "off" | "null" => Ok(false),
        "pty" => Ok(true),
        _ => Err(ChError::Refused {
            option: format!("{option} {mode}"),
            why: "lull has no virtio console: use off or pty (the serial port's pty), and the \
                  serial port (ttyS0) for output",
        }),
    }
}

/// A console in `Pty` mode (libvirt's `<console type='pty'>`): lull has no virtio console, so
/// the console's pty is the serial port's (`serial`, which must be off or a pty itself); the
/// guest's console is then ttyS0, and `vm.info` reports that pty as the console's file too.
pub fn console_pty(serial: &mut SerialMode) -> Result<(), ChError> {
    match serial {
        SerialMode::Off => {
            *serial = SerialMode::Pty;
            Ok(())
        }
        SerialMode::Pty => Ok(()),
        SerialMode::Stdio | SerialMode::File(_) => Err(ChError::Refused {
            option: format!("console Pty with serial {serial}"),
            why: "lull has no virtio console: a Pty console is the serial port's pty, so the \
                  serial port must be off, null or pty too",
        }),
    }
}

/// `--rng src=..`: lull has no virtio-rng; accepted with a note (the guest seeds from
/// RDRAND and its own entropy).
pub fn rng(opts: &[Opt], notes: &mut Vec<String>) -> Result<(), ChError> {
    for o in opts {
        match o.key.as_str() {
            "src" => o.note(notes, "lull has no virtio-rng: the guest uses RDRAND"),
            "iommu" => o.only_off("lull has no virtual IOMMU")?,
            _ => return Err(o.refuse("not a --rng option lull knows")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_split_on_commas_outside_brackets() {
        let opts = split("--net", "fd=[3],mac=52:54:00:00:00:01,,ip=1.2.3.4");
        let keys: Vec<_> = opts.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["fd", "mac", "ip"]);
        assert_eq!(opts[0].value, "[3]");
        assert_eq!(opts[0].name, "--net fd");
        assert_eq!(split("--net", "fd=[3,4]")[0].value, "[3,4]");
    }

    #[test]
    fn cpus_take_boot_and_refuse_hotplug() {
        let mut notes = Vec::new();
        assert_eq!(cpus(&split("--cpus", "boot=2,max=2"), &mut notes), Ok(2));
        let err = cpus(&split("--cpus", "boot=2,max=4"), &mut notes).unwrap_err();
        assert!(err.to_string().contains("--cpus max=4"), "{err}");
        let err = cpus(&split("--cpus", "boot=2,topology=1:2:1:1"), &mut notes).unwrap_err();
        assert!(err.to_string().contains("--cpus topology"), "{err}");
        assert!(cpus(&split("--cpus", "boot=x"), &mut notes).is_err());
    }

    #[test]
    fn memory_takes_size_and_shared_and_refuses_hugepages() {
        let mut notes = Vec::new();
        let size = memory(&split("--memory", "size=512M,shared=on"), &mut notes);
        assert_eq!(size, Ok(ByteSize::mib(512)));
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert_eq!(
            memory(&split("--memory", "size=268435456"), &mut notes),
            Ok(ByteSize::mib(256))
        );
        let err = memory(&split("--memory", "size=1G,hugepages=on"), &mut notes).unwrap_err();
        assert!(err.to_string().contains("--memory hugepages=on"), "{err}");
        assert!(memory(&split("--memory", "size=1G,hugepages=off"), &mut notes).is_ok());
    }

    #[test]
    fn disks_and_nets_map_onto_lull_s_devices() {
        let mut notes = Vec::new();
        let d = disk(
            &split("--disk", "path=/a.img,readonly=on,serial=s1"),
            &mut notes,
        )
        .unwrap();
        assert_eq!((d.path.to_str(), d.readonly), (Some("/a.img"), true));
        assert_eq!(notes.len(), 1);
        for refused in [
            "path=/a,vhost_user=on",
            "path=/a,num_queues=4",
            "path=/a,x=1",
        ] {
            let err = disk(&split("--disk", refused), &mut notes).unwrap_err();
            assert!(matches!(err, ChError::Refused { .. }), "{refused}: {err}");
        }
        assert_eq!(
            disk(&split("--disk", "readonly=on"), &mut notes),
            Err(ChError::Missing("--disk path"))
        );
        let n = net(&split("--net", "tap=t0,mac=52:54:00:00:00:02"), &mut notes).unwrap();
        assert_eq!(n.source, TapSource::Name("t0".into()));
        let n = n.to_config().unwrap();
        assert_eq!(
            (n.tap.as_str(), n.mac().to_string()),
            ("t0", "52:54:00:00:00:02".into())
        );
        let n = net(
            &split("--net", "fd=[7],ip=10.0.0.1,mask=255.0.0.0"),
            &mut notes,
        )
        .unwrap();
        assert_eq!(n.source, TapSource::Fd(7));
        assert!(net(&split("--net", "fd=[3,4]"), &mut notes).is_err());
        assert!(net(&split("--net", "tap=t0,mtu=9000"), &mut notes).is_err());
    }

    #[test]
    fn serial_and_console_modes() {
        assert_eq!(serial("--serial", "tty", None), Ok(SerialMode::Stdio));
        assert_eq!(serial("serial.mode", "Null", None), Ok(SerialMode::Off));
        assert_eq!(
            serial("--serial", "file", Some("/x")),
            Ok(SerialMode::File("/x".into()))
        );
        assert_eq!(serial("serial.mode", "Pty", None), Ok(SerialMode::Pty));
        assert!(serial("--serial", "socket", None).is_err());
        assert_eq!(console("--console", "off"), Ok(false));
        assert_eq!(console("console.mode", "Pty"), Ok(true));
        let mut off = SerialMode::Off;
        assert_eq!(console_pty(&mut off), Ok(()));
        assert_eq!(off, SerialMode::Pty);
        let mut tty = SerialMode::Stdio;
        assert!(console_pty(&mut tty).is_err());
        let err = console("--console", "tty").unwrap_err();
        assert!(err.to_string().contains("--console tty"), "{err}");
    }
}
