//! Guest memory in a snapshot: one file, the regions one after another, written page by page
//! with positioned writes so that a page of zeros stays a hole (a 256 MiB guest that touched
//! little takes little disk). The last page is always written, so the file has its full size.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::error::SnapshotError;
use super::manifest::Region;

/// The unit of the zero check.
const PAGE: usize = 4096;

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn guest_err(e: vm_memory::GuestMemoryError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Writes `mem` to a new file at `path`; its regions and total size.
pub fn write(mem: &GuestMemoryMmap, path: &Path) -> Result<(Vec<Region>, u64), SnapshotError> {
    let file = File::create(path).map_err(io("create", path))?;
    let mut regions = Vec::new();
    let mut offset = 0u64;
    let mut page = vec![0u8; PAGE];
    let total: u64 = mem.iter().map(|r| r.len()).sum();
    for region in mem.iter() {
        let start = region.start_addr().0;
        let len = region.len();
        let mut at = 0u64;
        while at < len {
            let n = usize::try_from((len - at).min(PAGE as u64)).unwrap_or(PAGE);
            let buf = &mut page[..n];
            mem.read_slice(buf, GuestAddress(start + at))
                .map_err(|e| io("read guest memory for", path)(guest_err(e)))?;
            let last = offset + at + n as u64 == total;
            if last || buf.iter().any(|&b| b != 0) {
                file.write_all_at(buf, offset + at)
                    .map_err(io("write", path))?;
            }
            at += n as u64;
        }
        regions.push(Region {
            guest_addr: start,
            bytes: len,
        });
        offset += len;
    }
    Ok((regions, offset))
}

/// Reads the memory file at `path` into `mem`, whose regions must be `regions`.
pub fn read_into(
    mem: &GuestMemoryMmap,
    path: &Path,
    regions: &[Region],
) -> Result<(), SnapshotError> {
    let file = File::open(path).map_err(io("open", path))?;
    let mut offset = 0u64;
    let mut page = vec![0u8; PAGE];
    for r in regions {
        let mut at = 0u64;
        while at < r.bytes {
            let n = usize::try_from((r.bytes - at).min(PAGE as u64)).unwrap_or(PAGE);
            let buf = &mut page[..n];
            file.read_exact_at(buf, offset + at)
                .map_err(io("read", path))?;
            mem.write_slice(buf, GuestAddress(r.guest_addr + at))
                .map_err(|e| io("write guest memory from", path)(guest_err(e)))?;
            at += n as u64;
        }
        offset += r.bytes;
    }
    Ok(())
}
