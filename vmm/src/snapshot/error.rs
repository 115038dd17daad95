//! Why a snapshot cannot be written or read: one message per way it can go wrong, each saying
//! what to do.

use std::path::PathBuf;

/// The most a manifest or a vCPU file may hold.
pub const MAX_SMALL_FILE: u64 = 1 << 20;

/// Why a snapshot cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A file could not be read or written.
    #[error("Cannot {what} {path}: {source}")]
    Io {
        /// What lull did.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A manifest or vCPU file is larger than any lull writes.
    #[error("{path} is {bytes} bytes, more than a snapshot's {max} allows: not a lull snapshot file", max = MAX_SMALL_FILE)]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },
    /// The manifest is not JSON of a lull snapshot.
    #[error("The manifest is not a lull snapshot manifest (corrupt or not lull's): {0}")]
    ManifestJson(#[source] serde_json::Error),
    /// The snapshot's format is not this lull's.
    #[error("The snapshot's format is version {found}; this lull reads version {supported}: restore it with the lull that made it ({lull})")]
    FormatVersion {
        /// The snapshot's.
        found: u32,
        /// This lull's.
        supported: u32,
        /// The lull version that wrote it.
        lull: String,
    },
    /// The snapshot was made by another lull version.
    #[error("The snapshot was made by lull {found}; this is lull {running}: restore it with lull {found}")]
    LullVersion {
        /// The snapshot's.
        found: String,
        /// This lull's.
        running: &'static str,
    },
    /// The snapshot was made on a CPU of another vendor.
    #[error("The snapshot was made on a {found} CPU; this host's is {host}: restore it on a {found} host")]
    CpuVendor {
        /// The snapshot's.
        found: String,
        /// This host's.
        host: String,
    },
    /// This host's CPU lacks features the snapshot's had.
    #[error("This host's CPU lacks {count} feature(s) the snapshot's CPU had ({missing}): restore it on a host with them")]
    CpuFeatures {
        /// How many are missing.
        count: usize,
        /// The first of them.
        missing: String,
    },
    /// The memory file's size is not the manifest's.
    #[error("{path} is {found} bytes; the manifest says {want}: the memory file is truncated or not this snapshot's")]
    MemorySize {
        /// The file.
        path: PathBuf,
        /// Its size.
        found: u64,
        /// The manifest's.
        want: u64,
    },
    /// The memory file to map is not a regular file.
    #[error("{0} is not a regular file: a snapshot's memory is a file lull wrote")]
    NotRegular(PathBuf),
    /// Another lull is writing a snapshot over the memory file.
    #[error("{0} is being written by a lull taking a snapshot: restore once it has finished")]
    BeingWritten(PathBuf),
    /// The memory file could not be mapped.
    #[error("Cannot map {path} as guest memory: {source}")]
    Map {
        /// The file.
        path: PathBuf,
        /// Why.
        source: vm_memory::mmap::MmapRegionError,
    },
    /// The mapped regions do not make a guest memory (overlapping or out of order).
    #[error("The manifest's memory regions cannot be guest memory ({0}): corrupt manifest")]
    MapRegions(#[source] vm_memory::GuestRegionCollectionError),
    /// The manifest's memory regions do not add up to its memory size.
    #[error("The manifest's memory regions do not fill its {0} bytes of memory: corrupt manifest")]
    MemoryRegions(u64),
    /// The manifest's vCPU list does not match its VM.
    #[error(
        "The manifest lists {found} vCPU file(s) for a VM of {want} vCPU(s): corrupt manifest"
    )]
    VcpuCount {
        /// Listed.
        found: usize,
        /// In the configuration.
        want: u32,
    },
    /// A state file is not what the manifest says.
    #[error("{path} does not match the manifest's checksum: the saved state is corrupt")]
    VcpuChecksum {
        /// The file.
        path: PathBuf,
    },
    /// A state file does not hold the state it should.
    #[error("{path} is not a saved state of this lull: {source}")]
    VcpuJson {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A vCPU file holds another vCPU's state.
    #[error("vCPU file {index} holds the state of vCPU {found}: corrupt snapshot")]
    VcpuId {
        /// Its place in the manifest.
        index: usize,
        /// The vCPU it holds.
        found: u32,
    },
    /// The manifest names a file that is not a plain name in the snapshot's directory (a path,
    /// `..`, the manifest itself), or names one file twice.
    #[error("The manifest names file {0:?}, which is not a file of its own directory or is named twice: corrupt manifest")]
    VcpuFileName(String),
    /// The manifest's memory regions are not those of its VM's memory size.
    #[error("The manifest's memory regions are not the layout of a VM of {memory} bytes (overlapping, empty, out of order or moved): corrupt manifest")]
    MemoryLayout {
        /// The configuration's memory size.
        memory: u64,
    },
    /// The destination's current snapshot is mapped by a VM restored from it.
    #[error("The snapshot in {} is mapped by a running VM restored from it; write the snapshot elsewhere", dir.display())]
    InUse {
        /// The destination.
        dir: PathBuf,
    },
    /// The destination is not a directory.
    #[error("{} is not a directory: create the snapshot directory first", dir.display())]
    NotADirectory {
        /// The destination.
        dir: PathBuf,
    },
    /// A disk of the VM is missing.
    #[error("The VM's disk {path} cannot be found ({source}): put the image back where it was")]
    DiskMissing {
        /// The image.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A disk of the VM changed size.
    #[error("The VM's disk {path} is {found} bytes; it was {want} at the snapshot: restore the image the snapshot was taken with")]
    DiskResized {
        /// The image.
        path: PathBuf,
        /// Its size now.
        found: u64,
        /// Its size then.
        want: u64,
    },
    /// The snapshot is of an `--irqchip user` VM but lacks lull's LAPIC or IOAPIC state.
    #[error("The snapshot is of an --irqchip user VM but holds no state of lull's {0}: corrupt snapshot")]
    UserIrqchip(&'static str),
    /// lull's saved LAPIC, PV registrations or IOAPIC are refused.
    #[error("The saved interrupt controller state of {what} is refused: {why}")]
    IrqchipState {
        /// Whose (`vCPU N`, `the IOAPIC`).
        what: String,
        /// Why (the state's own error, which names the field).
        why: crate::irqchip::user::saved::ChipStateError,
    },
    /// A vCPU could not read its state.
    #[error("vCPU {id} could not read its state: {why}")]
    Save {
        /// The vCPU.
        id: u32,
        /// Why.
        why: crate::state::pause_gate::SaveError,
    },
    /// The devices' state does not list the VM's devices.
    #[error("The snapshot holds the state of {found} virtio device(s); its VM has {want}: corrupt snapshot")]
    DeviceCount {
        /// In the state file.
        found: usize,
        /// Disks and nets of the configuration.
        want: usize,
    },
    /// A virtio device's saved state does not fit the device or guest memory.
    #[error(
        "Virtio device {index} (disks first, then nets) cannot take its saved state: {source}"
    )]
    Device {
        /// Its place in window order.
        index: usize,
        /// Why.
        source: devices::virtio::mmio::TransportStateError,
    },
    /// The serial port's saved state cannot be restored.
    #[error(transparent)]
    Serial(#[from] devices::serial::SerialStateError),
    /// A tap the VM had is not on this host.
    #[error("The VM's tap {name} does not exist on this host: create it (ip tuntap add {name} mode tap) before restoring")]
    TapMissing {
        /// The interface.
        name: String,
    },
}
