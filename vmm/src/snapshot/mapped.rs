//! Restoring guest memory by mapping the snapshot's memory file copy-on-write, as Firecracker
//! restores its fleets: every region of the new VM's memory is a `MAP_PRIVATE` mapping of its
//! part of the file.
//!
//! ```text
//!   DIR/memory (page cache: one copy on the host)      clone A             clone B
//!   ┌──────┬──────┬──────┬──────┐                 ┌──────┬──────┐     ┌──────┬──────┐
//!   │ p0   │ p1   │ hole │ p3   │ ◄── read faults │ p0   │ p1'  │     │ p0   │ p3   │
//!   └──────┴──────┴──────┴──────┘     share pages └──────┴──────┘     └──────┴──────┘
//!                                                   p1' written by A: A's own anonymous page
//! ```
//!
//! Nothing is read at restore: a page comes from the file when the guest (or a device) first
//! touches it, shared through the host's page cache with every other VM mapped from the same
//! snapshot, and becomes the VM's own anonymous page only when it is written. A hole of the
//! sparse file reads as zeros. With `prefault`, every page is read in at restore
//! (`MAP_POPULATE`), still shared.
//!
//! The file must not change while it is mapped (a page not yet copied would read the new
//! content; a truncated file faults): the mapping VM holds a shared `flock` on it for its whole
//! life, and lull refuses to write a snapshot over a memory file so locked. The file is opened
//! read-only: no write of the guest can reach it.

use std::fs::{OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

use super::error::SnapshotError;
use super::manifest::Region;

/// Maps the memory file at `path`, whose layout is `regions`, copy-on-write as a new VM's
/// guest memory; with `prefault`, reads every page in at once. Takes the file's shared flock
/// for as long as the returned memory lives.
pub fn map(
    path: &Path,
    regions: &[Region],
    prefault: bool,
) -> Result<GuestMemoryMmap, SnapshotError> {
    let io = |what| {
        move |source| SnapshotError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    // O_NONBLOCK: a FIFO planted in place of the file does not block the open; it is then
    // refused as not a regular file.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io("open"))?;
    let meta = file.metadata().map_err(io("inspect"))?;
    if !meta.file_type().is_file() {
        return Err(SnapshotError::NotRegular(path.to_path_buf()));
    }
    let total: u64 = regions.iter().map(|r| r.bytes).sum();
    if meta.len() < total {
        return Err(SnapshotError::MemorySize {
            path: path.to_path_buf(),
            found: meta.len(),
            want: total,
        });
    }
    match file.try_lock_shared() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            return Err(SnapshotError::BeingWritten(path.to_path_buf()))
        }
        Err(TryLockError::Error(source)) => return Err(io("lock")(source)),
    }
    let file = Arc::new(file);
    let mut flags = libc::MAP_PRIVATE | libc::MAP_NORESERVE;
    if prefault {
        flags |= libc::MAP_POPULATE;
    }
    let mut offset = 0u64;
    let mut mapped = Vec::with_capacity(regions.len());
    for r in regions {
        let size = usize::try_from(r.bytes).map_err(|_| SnapshotError::MemoryRegions(total))?;
        let region = MmapRegionBuilder::new(size)
            .with_file_offset(FileOffset::from_arc(Arc::clone(&file), offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(flags)
            .build()
            .map_err(|source| SnapshotError::Map {
                path: path.to_path_buf(),
                source,
            })?;
        let region = GuestRegionMmap::new(region, GuestAddress(r.guest_addr))
            .ok_or(SnapshotError::MemoryRegions(total))?;
        mapped.push(region);
        offset += r.bytes;
    }
    GuestMemoryMmap::from_regions(mapped).map_err(SnapshotError::MapRegions)
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::unix::fs::FileExt;

    use vm_memory::{Bytes, GuestMemoryBackend};

    use super::*;

    const MIB: u64 = 1 << 20;

    fn regions() -> Vec<Region> {
        vec![
            Region {
                guest_addr: 0,
                bytes: MIB,
            },
            Region {
                guest_addr: 4 * MIB,
                bytes: 2 * MIB,
            },
        ]
    }

    /// A sparse memory file of the two regions with a marker in each region's second page.
    fn memory_file(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("memory");
        let file = File::create(&path).unwrap();
        file.set_len(3 * MIB).unwrap();
        file.write_all_at(b"first", 4096).unwrap();
        file.write_all_at(b"second", MIB + 4096).unwrap();
        path
    }

    #[test]
    fn a_mapped_region_reads_the_file_and_writes_stay_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = memory_file(dir.path());
        for prefault in [false, true] {
            let a = map(&path, &regions(), prefault).unwrap();
            let b = map(&path, &regions(), prefault).unwrap();
            assert_eq!(a.num_regions(), 2);
            let mut word = [0u8; 6];
            a.read_slice(&mut word[..5], GuestAddress(4096)).unwrap();
            assert_eq!(&word[..5], b"first");
            a.read_slice(&mut word, GuestAddress(4 * MIB + 4096))
                .unwrap();
            assert_eq!(&word, b"second");
            // A hole reads as zeros.
            a.read_slice(&mut word, GuestAddress(5 * MIB)).unwrap();
            assert_eq!(word, [0; 6]);
            // A write is the writer's own: the other mapping and the file keep the old bytes.
            a.write_slice(b"CLONE", GuestAddress(4096)).unwrap();
            b.read_slice(&mut word[..5], GuestAddress(4096)).unwrap();
            assert_eq!(&word[..5], b"first");
            let mut on_disk = [0u8; 5];
            File::open(&path)
                .unwrap()
                .read_exact_at(&mut on_disk, 4096)
                .unwrap();
            assert_eq!(&on_disk, b"first");
            a.read_slice(&mut word[..5], GuestAddress(4096)).unwrap();
            assert_eq!(&word[..5], b"CLONE");
        }
    }

    #[test]
    fn a_mapped_file_is_locked_shared_while_the_memory_lives() {
        let dir = tempfile::tempdir().unwrap();
        let path = memory_file(dir.path());
        let mem = map(&path, &regions(), false).unwrap();
        let writer = File::open(&path).unwrap();
        assert!(matches!(writer.try_lock(), Err(TryLockError::WouldBlock)));
        // Another mapping shares it.
        let again = map(&path, &regions(), false).unwrap();
        drop((mem, again));
        writer.try_lock().unwrap();
        // And a file a writer holds cannot be mapped.
        let err = map(&path, &regions(), false).unwrap_err();
        assert!(matches!(err, SnapshotError::BeingWritten(_)), "{err}");
    }

    #[test]
    fn a_short_file_a_fifo_or_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = memory_file(dir.path());
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(MIB)
            .unwrap();
        let err = map(&path, &regions(), false).unwrap_err();
        assert!(matches!(err, SnapshotError::MemorySize { .. }), "{err}");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = map(&fifo, &regions(), false).unwrap_err();
        assert!(matches!(err, SnapshotError::NotRegular(_)), "{err}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(memory_file(dir.path()), &link).unwrap();
        assert!(map(&link, &regions(), false).is_err());
    }
}
