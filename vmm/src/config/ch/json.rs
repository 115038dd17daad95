//! Cloud Hypervisor's `VmConfig` (the body its clients send to `vm.create`) onto lull's
//! [`VmConfig`]. Told apart from lull's own configuration by its fields ([`is_ch_shape`]).
//!
//! Cloud Hypervisor's clients send the whole structure, defaults included (`"iommu": false`,
//! `"num_queues": 1`, `"fs": null`): a field at its default, `null` or empty is accepted; a
//! field that asks for something lull does not have is refused, named by its path
//! (`disks[0].vhost_user=on`), and so is a field lull does not know.

use serde_json::{Map, Value};

use super::options::{self, Opt, TapSource};
use super::restore::ChRestore;
use super::ChError;
use crate::config::{MacAddr, SerialMode, VmConfig};

/// True if `body` is Cloud Hypervisor's `VmConfig` rather than lull's: it has a field only
/// Cloud Hypervisor's has (`payload`, `net`, `console`, `rng`, ...), or `cpus`, `memory` or
/// `serial` as an object, or disks as objects. lull's own fields are flat strings and numbers.
pub fn is_ch_shape(body: &Map<String, Value>) -> bool {
    const ONLY_CH: [&str; 8] = [
        "payload", "net", "console", "rng", "fs", "pmem", "vsock", "platform",
    ];
    ONLY_CH.iter().any(|k| body.contains_key(*k))
        || ["cpus", "memory", "serial"]
            .iter()
            .any(|k| body.get(*k).is_some_and(Value::is_object))
        || body
            .get("disks")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(Value::is_object))
}

/// The configuration `body` describes, and the notes of what was accepted without effect.
pub fn to_config(body: &Map<String, Value>) -> Result<(VmConfig, Vec<String>), ChError> {
    let mut notes = Vec::new();
    let mut cfg = VmConfig {
        // Cloud Hypervisor's defaults: 512 MiB, the serial port to nowhere.
        memory: options::memory(&[], &mut notes)?,
        serial: SerialMode::Off,
        ..VmConfig::default()
    };
    let mut console_pty = false;
    for (key, value) in body {
        if is_empty(value) {
            continue;
        }
        match key.as_str() {
            "payload" => payload(object(key, value)?, &mut cfg)?,
            "cpus" => cfg.cpus = options::cpus(&opts(key, value)?, &mut notes)?,
            "memory" => cfg.memory = options::memory(&opts(key, value)?, &mut notes)?,
            "disks" => {
                for (i, disk) in array(key, value)?.iter().enumerate() {
                    let opts = opts(&format!("disks[{i}]"), disk)?;
                    cfg.disks.push(options::disk(&opts, &mut notes)?);
                }
            }
            "net" => nets(array(key, value)?, &mut cfg, &mut notes)?,
            "rng" => options::rng(&opts(key, value)?, &mut notes)?,
            "serial" => {
                let o = object(key, value)?;
                let mode = o.get("mode").and_then(Value::as_str).unwrap_or("Null");
                let file = o.get("file").and_then(Value::as_str);
                cfg.serial = options::serial("serial.mode", mode, file)?;
            }
            "console" => {
                let o = object(key, value)?;
                let mode = o.get("mode").and_then(Value::as_str).unwrap_or("Off");
                console_pty = options::console("console.mode", mode)?;
            }
            "debug_console" => debug_console(key, value)?,
            "platform" => {
                notes.push("platform: lull has no PCI segments, UUID or OEM strings".into())
            }
            "iommu" | "watchdog" | "pvpanic" | "gdb" | "landlock_enable" => {
                return Err(refused(
                    key,
                    value,
                    "lull has none of iommu, watchdog, pvpanic, gdb or landlock",
                ))
            }
            "fs" | "pmem" | "vsock" | "devices" | "user_devices" | "vdpa" | "numa" | "sgx_epc"
            | "balloon" | "tpm" | "landlock_rules" | "rate_limit_groups" | "preserved_fds"
            | "pci_segments" | "ivshmem" => {
                return Err(refused(
                    key,
                    value,
                    "lull has no such device: leave the field out",
                ))
            }
            _ => return Err(refused(key, value, "not a field lull knows")),
        }
    }
    if console_pty {
        options::console_pty(&mut cfg.serial)?;
    }
    cfg.validate()?;
    Ok((cfg, notes))
}

/// `net`: each a tap by name (fds come with `vm.add-net`).
fn nets(nets: &[Value], cfg: &mut VmConfig, notes: &mut Vec<String>) -> Result<(), ChError> {
    for (i, net) in nets.iter().enumerate() {
        let opts = opts(&format!("net[{i}]"), net)?;
        let net = options::net(&opts, notes)?;
        if let TapSource::Fd(_) = net.source {
            return Err(ChError::Refused {
                option: format!("net[{i}].fds"),
                why: "vm.create takes taps by name: send the fds with vm.add-net",
            });
        }
        cfg.nets.push(net.to_config()?);
    }
    Ok(())
}

/// `debug_console`: off, as lull has none.
fn debug_console(key: &str, value: &Value) -> Result<(), ChError> {
    let o = object(key, value)?;
    let mode = o.get("mode").and_then(Value::as_str).unwrap_or("Off");
    if options::console("debug_console.mode", mode)? {
        return Err(refused(
            key,
            value,
            "lull has no debug console: leave it off",
        ));
    }
    Ok(())
}

/// What `vm.add-net`'s body (Cloud Hypervisor's `NetConfig`) asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddNet {
    /// The tap it names, if any (its fd may come with the request instead).
    pub tap: Option<String>,
    /// The device's MAC.
    pub mac: Option<MacAddr>,
    /// The body has fd numbers (`fds`): Cloud Hypervisor replaces them by the fds sent with
    /// the request; lull never uses a number from the body.
    pub body_fds: bool,
}

/// `vm.add-net`'s body.
pub fn add_net(body: &Map<String, Value>) -> Result<AddNet, ChError> {
    let mut notes = Vec::new();
    let opts = opts("vm.add-net", &Value::Object(body.clone()))?;
    let (source, mac) = options::net_options(&opts, &mut notes)?;
    for note in notes {
        tracing::info!("vm.add-net: accepted without effect: {note}");
    }
    Ok(match source {
        None => AddNet {
            tap: None,
            mac,
            body_fds: false,
        },
        Some(TapSource::Name(tap)) => AddNet {
            tap: Some(tap),
            mac,
            body_fds: false,
        },
        Some(TapSource::Fd(_)) => AddNet {
            tap: None,
            mac,
            body_fds: true,
        },
    })
}

/// `vm.restore`'s body (Cloud Hypervisor's `RestoreConfig`), and what it accepted without
/// effect.
pub fn restore(body: &Map<String, Value>) -> Result<(ChRestore, Vec<String>), ChError> {
    let mut notes = Vec::new();
    let opts = opts("vm.restore", &Value::Object(body.clone()))?;
    let restore = super::restore::restore(&opts, super::restore::Front::Api, &mut notes)?;
    Ok((restore, notes))
}

/// `null`, `false`, `[]` and `{}`: a field at Cloud Hypervisor's "none" default.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn refused(key: &str, value: &Value, why: &'static str) -> ChError {
    ChError::Refused {
        option: format!("{key}={value}"),
        why,
    }
}

fn object<'a>(key: &str, value: &'a Value) -> Result<&'a Map<String, Value>, ChError> {
    value
        .as_object()
        .ok_or_else(|| ChError::Json(format!("{key} must be an object")))
}

fn array<'a>(key: &str, value: &'a Value) -> Result<&'a Vec<Value>, ChError> {
    value
        .as_array()
        .ok_or_else(|| ChError::Json(format!("{key} must be an array")))
}

/// An object's fields as options named `path.key`, its nulls dropped, and the keys renamed
/// to the command line's (`boot_vcpus` is `boot`, `fds` is `fd`).
fn opts(path: &str, value: &Value) -> Result<Vec<Opt>, ChError> {
    let mut out = Vec::new();
    for (key, value) in object(path, value)? {
        let text = match value {
            Value::Null => continue,
            Value::String(s) => s.clone(),
            Value::Bool(true) => "on".to_string(),
            Value::Bool(false) => "off".to_string(),
            other => other.to_string(),
        };
        let key = match key.as_str() {
            "boot_vcpus" => "boot",
            "max_vcpus" => "max",
            "fds" => "fd",
            k => k,
        };
        out.push(Opt {
            key: key.to_string(),
            name: format!("{path}.{key}"),
            value: text,
        });
    }
    Ok(out)
}

/// `payload{kernel, cmdline, initramfs}`; firmware and IGVM are refused.
fn payload(p: &Map<String, Value>, cfg: &mut VmConfig) -> Result<(), ChError> {
    for (key, value) in p {
        if value.is_null() {
            continue;
        }
        let text = value
            .as_str()
            .ok_or_else(|| ChError::Json(format!("payload.{key} must be a string")))?;
        match key.as_str() {
            "kernel" => cfg.kernel = Some(text.into()),
            "initramfs" => cfg.initramfs = Some(text.into()),
            "cmdline" => cfg.cmdline = Some(text.to_string()),
            "firmware" | "igvm" | "host_data" => {
                return Err(refused(
                    &format!("payload.{key}"),
                    value,
                    "lull boots a kernel directly",
                ))
            }
            _ => {
                return Err(refused(
                    &format!("payload.{key}"),
                    value,
                    "not a field lull knows",
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::ByteSize;

    fn map(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    /// The body the Go driver sends (a VmConfig of cloud-hypervisor's OpenAPI client, its
    /// defaults included: see cloud-hypervisor/vmm/src/api/openapi/cloud-hypervisor.yaml).
    const FULL: &str = r#"{
        "payload": {"kernel": "/k", "cmdline": "console=ttyS0", "initramfs": "/i", "firmware": null},
        "cpus": {"boot_vcpus": 2, "max_vcpus": 2, "topology": null, "kvm_hyperv": false,
                 "max_phys_bits": 46, "affinity": null, "features": {"amx": false}},
        "memory": {"size": 268435456, "mergeable": false, "hotplug_method": "Acpi",
                   "hotplug_size": null, "shared": true, "hugepages": false, "prefault": false,
                   "thp": true, "zones": null},
        "disks": [{"path": "/d.img", "readonly": true, "direct": false, "iommu": false,
                   "num_queues": 1, "queue_size": 128, "vhost_user": false, "id": null,
                   "serial": "disk0", "pci_segment": 0}],
        "net": [{"tap": "tap0", "ip": "192.168.249.1", "mask": "255.255.255.0",
                 "mac": "52:54:00:00:00:07", "num_queues": 2, "queue_size": 256,
                 "iommu": false, "vhost_user": false, "vhost_mode": "Client", "fds": null}],
        "rng": {"src": "/dev/urandom", "iommu": false},
        "serial": {"mode": "File", "file": "/s.log", "iommu": false, "socket": null},
        "console": {"mode": "Off", "file": null, "iommu": false},
        "fs": null, "pmem": null, "devices": null, "vsock": null, "iommu": false,
        "watchdog": false, "pvpanic": false, "numa": null
    }"#;

    #[test]
    fn cloud_hypervisor_s_config_is_told_from_lull_s() {
        assert!(is_ch_shape(&map(FULL)));
        assert!(is_ch_shape(&map(r#"{"cpus": {"boot_vcpus": 1}}"#)));
        assert!(!is_ch_shape(&map(
            r#"{"cpus": 2, "memory": "64M", "disks": ["path=/a"]}"#
        )));
        assert!(!is_ch_shape(&map(
            r#"{"serial": "off", "nets": ["tap=t"]}"#
        )));
    }

    #[test]
    fn a_full_body_maps_onto_lull_s_config() {
        let (cfg, notes) = to_config(&map(FULL)).unwrap();
        assert_eq!(cfg.kernel.as_deref(), Some(std::path::Path::new("/k")));
        assert_eq!(cfg.initramfs.as_deref(), Some(std::path::Path::new("/i")));
        assert_eq!(cfg.cmdline.as_deref(), Some("console=ttyS0"));
        assert_eq!((cfg.cpus, cfg.memory), (2, ByteSize::mib(256)));
        assert_eq!(cfg.disks.len(), 1);
        assert!(cfg.disks[0].readonly);
        assert_eq!(cfg.nets[0].tap, "tap0");
        assert_eq!(cfg.nets[0].mac().to_string(), "52:54:00:00:00:07");
        assert_eq!(cfg.serial, SerialMode::File("/s.log".into()));
        for said in ["memory.shared", "disks[0].serial", "net[0].ip", "rng.src"] {
            assert!(
                notes.iter().any(|n| n.starts_with(said)),
                "{said}: {notes:?}"
            );
        }
        let (bare, _) = to_config(&map(r#"{"payload": {"kernel": "/k"}}"#)).unwrap();
        assert_eq!((bare.cpus, bare.memory), (1, ByteSize::mib(512)));
        assert_eq!(bare.serial, SerialMode::Off);
    }

    /// Each field lull refuses, alone in an otherwise good body: one refusal naming it.
    const REFUSED: [(&str, &str); 17] = [
        ("payload", r#"{"kernel": "/k", "firmware": "/fw"}"#),
        ("cpus", r#"{"boot_vcpus": 1, "max_vcpus": 4}"#),
        (
            "cpus",
            r#"{"boot_vcpus": 1, "topology": {"threads_per_core": 2}}"#,
        ),
        ("memory", r#"{"size": 268435456, "hugepages": true}"#),
        (
            "memory",
            r#"{"size": 268435456, "hotplug_size": 1073741824}"#,
        ),
        ("disks", r#"[{"path": "/d", "vhost_user": true}]"#),
        ("disks", r#"[{"path": "/d", "num_queues": 4}]"#),
        ("net", r#"[{"tap": "t0", "mtu": 9000}]"#),
        ("net", r#"[{"fds": [3, 4]}]"#),
        ("serial", r#"{"mode": "Socket", "socket": "/s"}"#),
        ("console", r#"{"mode": "Tty"}"#),
        ("debug_console", r#"{"mode": "Pty"}"#),
        ("fs", r#"[{"tag": "x", "socket": "/s"}]"#),
        ("pmem", r#"[{"file": "/p"}]"#),
        ("vsock", r#"{"cid": 3, "socket": "/v"}"#),
        ("iommu", "true"),
        ("balloon", r#"{"size": 0}"#),
    ];

    #[test]
    fn every_refused_field_is_named() {
        for (field, value) in REFUSED {
            let body = format!(r#"{{"payload": {{"kernel": "/k"}}, "{field}": {value}}}"#);
            let err = to_config(&map(&body)).unwrap_err();
            assert!(matches!(err, ChError::Refused { .. }), "{body}: {err}");
            assert!(err.to_string().contains(field), "{body}: {err}");
        }
        let err = to_config(&map(r#"{"payload": {}, "wat": 1}"#)).unwrap_err();
        assert!(err.to_string().contains("wat=1"), "{err}");
    }
}
