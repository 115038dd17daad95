use super::manifest::{vcpu_file_name, Region, CONTENTS};
use super::*;
use crate::config::VmConfig;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

fn manifest(cpus: u32) -> Manifest {
    Manifest {
        format_version: FORMAT_VERSION,
        lull_version: env!("CARGO_PKG_VERSION").to_string(),
        cpu_vendor: "GenuineIntel".to_string(),
        cpu_flags: vec!["fpu".to_string(), "sse2".to_string()],
        contents: CONTENTS.iter().map(|c| c.to_string()).collect(),
        config: VmConfig {
            cpus,
            memory: crate::size::ByteSize(8192),
            ..VmConfig::default()
        },
        given_config: None,
        memory_file: "memory.t".to_string(),
        memory_bytes: 8192,
        regions: vec![Region {
            guest_addr: 0,
            bytes: 8192,
        }],
        vcpus: (0..cpus)
            .map(|i| VcpuFile {
                file: vcpu_file_name(usize::try_from(i).unwrap()),
                bytes: 0,
                fnv64: 0,
            })
            .collect(),
        disks: Vec::new(),
        kvm_vm: VcpuFile {
            file: kvm_vm::FILE.to_string(),
            bytes: 0,
            fnv64: 0,
        },
        devices: VcpuFile {
            file: devices::FILE.to_string(),
            bytes: 0,
            fnv64: 0,
        },
    }
}

fn parse(m: &Manifest, vendor: &str) -> Result<Manifest, SnapshotError> {
    Manifest::parse(&serde_json::to_vec(m).unwrap(), vendor)
}

#[test]
fn a_manifest_goes_through_and_another_vendor_or_lull_is_refused_by_name() {
    let m = manifest(2);
    assert_eq!(parse(&m, "GenuineIntel").unwrap().vcpus, m.vcpus);
    let err = parse(&m, "AuthenticAMD").unwrap_err();
    assert!(matches!(err, SnapshotError::CpuVendor { .. }), "{err}");
    assert!(err
        .to_string()
        .contains("restore it on a GenuineIntel host"));

    let newer = Manifest {
        format_version: FORMAT_VERSION + 1,
        lull_version: "9.9.9".into(),
        ..m.clone()
    };
    let err = parse(&newer, "GenuineIntel").unwrap_err();
    assert!(matches!(err, SnapshotError::FormatVersion { .. }), "{err}");
    assert!(err.to_string().contains("9.9.9"), "{err}");
    let other_lull = Manifest {
        lull_version: "0.0.1-other".into(),
        ..m.clone()
    };
    let err = parse(&other_lull, "GenuineIntel").unwrap_err();
    assert!(matches!(err, SnapshotError::LullVersion { .. }), "{err}");
}

#[test]
fn a_manifest_naming_a_file_outside_its_directory_is_refused() {
    let m = manifest(2);
    for bad in [
        "../../etc/passwd",
        "a/b",
        "..",
        ".",
        "",
        MANIFEST,
        "memory.t",
        "kvm-vm.json",
    ] {
        let mut escape = m.clone();
        escape.vcpus[1].file = bad.into();
        assert!(
            matches!(
                parse(&escape, "GenuineIntel"),
                Err(SnapshotError::VcpuFileName(_))
            ),
            "{bad:?}"
        );
    }
    let mut memory_outside = m.clone();
    memory_outside.memory_file = "/dev/sda".into();
    assert!(matches!(
        parse(&memory_outside, "GenuineIntel"),
        Err(SnapshotError::VcpuFileName(_))
    ));
    let mut other_vm_file = m.clone();
    other_vm_file.kvm_vm.file = "/etc/shadow".into();
    assert!(matches!(
        parse(&other_vm_file, "GenuineIntel"),
        Err(SnapshotError::VcpuFileName(_))
    ));
    let mut other_devices_file = m.clone();
    other_devices_file.devices.file = "../devices.json".into();
    assert!(matches!(
        parse(&other_devices_file, "GenuineIntel"),
        Err(SnapshotError::VcpuFileName(_))
    ));
}

#[test]
fn a_manifest_whose_memory_vcpus_or_json_do_not_add_up_is_refused() {
    let m = manifest(2);
    let short = Manifest {
        memory_bytes: 4096,
        ..m.clone()
    };
    assert!(matches!(
        parse(&short, "GenuineIntel"),
        Err(SnapshotError::MemoryRegions(4096))
    ));
    let one = Manifest {
        vcpus: m.vcpus[..1].to_vec(),
        ..m.clone()
    };
    assert!(matches!(
        parse(&one, "GenuineIntel"),
        Err(SnapshotError::VcpuCount { found: 1, want: 2 })
    ));
    for junk in [
        &b""[..],
        b"{",
        b"[]",
        b"{\"format_version\": \"1\"}",
        &[0xff; 16],
    ] {
        assert!(matches!(
            Manifest::parse(junk, "GenuineIntel"),
            Err(SnapshotError::ManifestJson(_))
        ));
    }
}

#[test]
fn regions_must_be_the_layout_of_the_memory_size() {
    let m = manifest(1);
    let region = |guest_addr, bytes| Region { guest_addr, bytes };
    for regions in [
        // Overlapping, out of order, empty, moved: each adds up to the memory size.
        vec![region(0, 4096), region(0, 4096)],
        vec![region(4096, 4096), region(0, 4096)],
        vec![region(0, 8192), region(8192, 0)],
        vec![region(1 << 20, 8192)],
    ] {
        let bad = Manifest {
            regions: regions.clone(),
            ..m.clone()
        };
        let err = parse(&bad, "GenuineIntel").unwrap_err();
        assert!(
            matches!(err, SnapshotError::MemoryLayout { memory: 8192 }),
            "{regions:?}: {err}"
        );
    }
    let big = Manifest {
        config: VmConfig {
            memory: crate::size::ByteSize(4 << 30),
            ..m.config.clone()
        },
        memory_bytes: 4 << 30,
        regions: crate::setup::layout::ram_ranges(4 << 30)
            .into_iter()
            .map(|(a, b)| region(a, b))
            .collect(),
        ..m.clone()
    };
    assert!(parse(&big, "GenuineIntel").is_ok());
}

#[test]
fn a_fifo_or_a_link_in_a_snapshot_is_refused_without_waiting() {
    let dir = std::env::temp_dir().join(format!("lull-snapshot-fifo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A FIFO with no writer: a plain open() of it would never return.
    nix::unistd::mkfifo(&dir.join(MANIFEST), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let err = read(&dir).unwrap_err();
    assert!(
        err.to_string().contains("a FIFO, not a regular file"),
        "{err}"
    );
    std::fs::remove_file(dir.join(MANIFEST)).unwrap();
    let elsewhere = dir.join("elsewhere.json");
    std::fs::write(&elsewhere, serde_json::to_vec(&manifest(1)).unwrap()).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dir.join(MANIFEST)).unwrap();
    let err = read(&dir).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_vcpu_file_must_match_its_checksum_and_its_place() {
    let state = crate::vcpu::state::tests_support::blank(1);
    let bytes = serde_json::to_vec(&state).unwrap();
    let entry = VcpuFile {
        file: vcpu_file_name(1),
        bytes: u64::try_from(bytes.len()).unwrap(),
        fnv64: fnv64(&bytes),
    };
    let path = Path::new("vcpu-1.json");
    assert_eq!(parse_vcpu(1, &entry, path, &bytes).unwrap().id, 1);
    assert!(matches!(
        parse_vcpu(0, &entry, path, &bytes),
        Err(SnapshotError::VcpuId { index: 0, found: 1 })
    ));
    let mut flipped = bytes.clone();
    flipped[10] ^= 1;
    assert!(matches!(
        parse_vcpu(1, &entry, path, &flipped),
        Err(SnapshotError::VcpuChecksum { .. })
    ));
    let truncated = &bytes[..bytes.len() - 1];
    assert!(matches!(
        parse_vcpu(1, &entry, path, truncated),
        Err(SnapshotError::VcpuChecksum { .. })
    ));
}

#[test]
fn memory_goes_to_a_sparse_file_and_back() {
    let dir = std::env::temp_dir().join(format!("lull-snapshot-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(MEMORY);
    let ranges = [
        (GuestAddress(0), 1 << 20),
        (GuestAddress(1 << 30), 64 << 10),
    ];
    let mem = GuestMemoryMmap::from_ranges(&ranges).unwrap();
    mem.write_slice(b"lull", GuestAddress(0x1234)).unwrap();
    mem.write_slice(b"end", GuestAddress((1 << 30) + 100))
        .unwrap();
    let file = std::fs::File::create(&path).unwrap();
    let (regions, bytes) = memory::write(&mem, &file, &path).unwrap();
    assert_eq!(bytes, (1 << 20) + (64 << 10));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), bytes);
    use std::os::unix::fs::MetadataExt;
    let blocks = std::fs::metadata(&path).unwrap().blocks();
    assert!(
        blocks * 512 < bytes / 2,
        "zero pages are holes: {blocks} blocks"
    );
    let back = GuestMemoryMmap::from_ranges(&ranges).unwrap();
    memory::read_into(&back, &path, &regions).unwrap();
    let mut word = [0u8; 4];
    back.read_slice(&mut word, GuestAddress(0x1234)).unwrap();
    assert_eq!(&word, b"lull");
    back.read_slice(&mut word[..3], GuestAddress((1 << 30) + 100))
        .unwrap();
    assert_eq!(&word[..3], b"end");
    for (addr, len) in ranges {
        let (mut was, mut is) = (vec![1u8; len], vec![2u8; len]);
        mem.read_slice(&mut was, addr).unwrap();
        back.read_slice(&mut is, addr).unwrap();
        assert!(was == is, "region {addr:?} restored unchanged");
    }
    // Only the data is read back: the pages written, not the holes.
    let file = std::fs::File::open(&path).unwrap();
    let data = memory::data_ranges(&file, bytes);
    let in_data = |at: u64| data.iter().any(|r| r.contains(&at));
    assert!(in_data(0x1234) && in_data((1 << 20) + 100), "{data:?}");
    let read: u64 = data.iter().map(|r| r.end - r.start).sum();
    assert!(read < bytes / 2, "holes are skipped: {data:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_host_without_the_snapshots_cpu_features_is_refused() {
    let m = manifest(1);
    let flags = |list: &[&str]| list.iter().map(|f| f.to_string()).collect::<Vec<_>>();
    m.check_cpu_flags(&flags(&["fpu", "sse2", "avx"])).unwrap();
    let err = m.check_cpu_flags(&flags(&["fpu"])).unwrap_err();
    assert!(
        matches!(&err, SnapshotError::CpuFeatures { count: 1, missing } if missing == "sse2"),
        "{err}"
    );
    assert!(
        host_cpu_flags().iter().any(|f| f == "fpu"),
        "this host has an FPU"
    );
}

#[test]
fn a_missing_or_resized_disk_is_refused() {
    let dir = std::env::temp_dir().join(format!("lull-snapshot-disk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 1024]).unwrap();
    let mut m = manifest(1);
    m.disks = vec![manifest::DiskRecord {
        path: image.clone(),
        bytes: 1024,
    }];
    m.check_disks().unwrap();
    std::fs::write(&image, vec![0u8; 512]).unwrap();
    let err = m.check_disks().unwrap_err();
    assert!(
        matches!(
            err,
            SnapshotError::DiskResized {
                found: 512,
                want: 1024,
                ..
            }
        ),
        "{err}"
    );
    std::fs::remove_file(&image).unwrap();
    let err = m.check_disks().unwrap_err();
    assert!(matches!(err, SnapshotError::DiskMissing { .. }), "{err}");
    assert!(err.to_string().contains("put the image back"), "{err}");
    // A FIFO of the recorded size (0) would pass a size check and block the open after it.
    nix::unistd::mkfifo(&image, nix::sys::stat::Mode::S_IRWXU).unwrap();
    m.disks[0].bytes = 0;
    let err = m.check_disks().unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_tap_is_refused_and_a_passed_tap_is_recorded_by_name() {
    let mut m = manifest(1);
    m.config.nets = vec![
        "tap=lulltap0".parse().unwrap(),
        "tap=lulltap1".parse().unwrap(),
    ];
    m.check_taps(|name| name == "lulltap0" || name == "lulltap1")
        .unwrap();
    let err = m.check_taps(|name| name == "lulltap0").unwrap_err();
    assert!(
        matches!(&err, SnapshotError::TapMissing { name } if name == "lulltap1"),
        "{err}"
    );
    assert!(err.to_string().contains("ip tuntap add lulltap1"), "{err}");
    m.config.nets[1].fd = Some(7);
    let recorded = manifest::recorded_config(&m.config);
    assert_eq!(recorded.nets[1].fd, None);
    assert_eq!(recorded.nets[1].tap, "lulltap1");
    // What a manifest holds parses back (an fd would not: no configuration may name one).
    let back = parse(
        &Manifest {
            config: recorded,
            ..m.clone()
        },
        "GenuineIntel",
    )
    .unwrap();
    assert_eq!(back.config.nets[1].tap, "lulltap1");
}

#[test]
fn a_devices_file_must_match_its_checksum_and_the_vms_devices() {
    use ::devices::serial::SerialPort;
    let serial = SerialPort::new(NoIrq, Vec::new()).save();
    let state = devices::DevicesState {
        serial,
        virtio: Vec::new(),
        restores: 2,
    };
    let bytes = serde_json::to_vec(&state).unwrap();
    let entry = VcpuFile {
        file: devices::FILE.to_string(),
        bytes: u64::try_from(bytes.len()).unwrap(),
        fnv64: fnv64(&bytes),
    };
    let path = Path::new(devices::FILE);
    let cfg = VmConfig::default();
    assert_eq!(parse_devices(&entry, path, &bytes, &cfg).unwrap(), state);
    let mut flipped = bytes.clone();
    flipped[5] ^= 1;
    assert!(matches!(
        parse_devices(&entry, path, &flipped, &cfg),
        Err(SnapshotError::VcpuChecksum { .. })
    ));
    let with_disk = VmConfig {
        disks: vec!["path=/nonexistent.img".parse().unwrap()],
        ..VmConfig::default()
    };
    assert!(matches!(
        parse_devices(&entry, path, &bytes, &with_disk),
        Err(SnapshotError::DeviceCount { found: 0, want: 1 })
    ));
}

/// An interrupt that goes nowhere.
struct NoIrq;
impl ::devices::serial::Trigger for NoIrq {
    type E = ();
    fn trigger(&self) -> Result<(), ()> {
        Ok(())
    }
}

#[test]
fn a_devices_file_of_an_older_lull_reads_as_never_restored() {
    use ::devices::serial::SerialPort;
    let state = devices::DevicesState {
        serial: SerialPort::new(NoIrq, Vec::new()).save(),
        virtio: Vec::new(),
        restores: 5,
    };
    let mut json = serde_json::to_value(&state).unwrap();
    assert_eq!(json["restores"], 5);
    json.as_object_mut().unwrap().remove("restores");
    let older: devices::DevicesState = serde_json::from_value(json).unwrap();
    assert_eq!(older.restores, 0);
}
