//! Guest memory in a snapshot: one file, the regions one after another, written page by page
//! with positioned writes so that a page of zeros stays a hole (a 256 MiB guest that touched
//! little takes little disk). The last page is always written, so the file has its full size.
//! Reading it back reads only its data ([`data_ranges`]): a restored VM's memory is fresh and
//! zero, so a hole needs no copy, and a guest that touched little restores in little time.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use nix::errno::Errno;
use nix::unistd::{lseek, Whence};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::error::SnapshotError;
use super::manifest::Region;

/// The unit of the zero check.
const PAGE: usize = 4096;
/// The unit of reading data back.
const CHUNK: usize = 1 << 20;

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

/// The byte ranges below `len` of `file` that hold data, in order; the rest are holes (read
/// as zeros). Where the file system cannot say (no `SEEK_DATA`), all of it.
pub fn data_ranges(file: &File, len: u64) -> Vec<Range<u64>> {
    let seek = |at: u64, whence| {
        let at = i64::try_from(at).map_err(|_| Errno::EOVERFLOW)?;
        lseek(file, at, whence).map(|to| u64::try_from(to).unwrap_or(len))
    };
    let mut ranges = Vec::new();
    let mut at = 0;
    while at < len {
        let start = match seek(at, Whence::SeekData) {
            Ok(start) => start,
            // No data at or after `at`.
            Err(Errno::ENXIO) => break,
            Err(_) => at,
        };
        if start >= len {
            break;
        }
        let end = seek(start, Whence::SeekHole).unwrap_or(len).min(len);
        if end <= start {
            ranges.push(start..len);
            break;
        }
        ranges.push(start..end);
        at = end;
    }
    ranges
}

/// Reads the memory file at `path` into `mem`, whose regions must be `regions` and whose
/// memory must be zero (a new VM's): the file's holes are not copied.
pub fn read_into(
    mem: &GuestMemoryMmap,
    path: &Path,
    regions: &[Region],
) -> Result<(), SnapshotError> {
    let file = File::open(path).map_err(io("open", path))?;
    let total: u64 = regions.iter().map(|r| r.bytes).sum();
    let mut buf = vec![0u8; CHUNK];
    for data in data_ranges(&file, total) {
        let mut offset = 0u64;
        for r in regions {
            // The part of this region the data range covers, as file offsets.
            let from = data.start.max(offset);
            let to = data.end.min(offset + r.bytes);
            let mut at = from;
            while at < to {
                let n = usize::try_from((to - at).min(CHUNK as u64)).unwrap_or(CHUNK);
                let chunk = &mut buf[..n];
                file.read_exact_at(chunk, at).map_err(io("read", path))?;
                mem.write_slice(chunk, GuestAddress(r.guest_addr + (at - offset)))
                    .map_err(|e| io("write guest memory from", path)(guest_err(e)))?;
                at += n as u64;
            }
            offset += r.bytes;
        }
    }
    Ok(())
}
