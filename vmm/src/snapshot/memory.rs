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
/// The unit of reading guest memory out and data back in.
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

/// Writes `mem` to `file`, new and empty, at `path` (for messages), and syncs it; its regions
/// and total size. Memory is read a [`CHUNK`] at a time and each run of pages that hold data
/// goes out in one write.
pub fn write(
    mem: &GuestMemoryMmap,
    file: &File,
    path: &Path,
) -> Result<(Vec<Region>, u64), SnapshotError> {
    let mut regions = Vec::new();
    let mut offset = 0u64;
    let mut chunk = vec![0u8; CHUNK];
    let total: u64 = mem.iter().map(|r| r.len()).sum();
    for region in mem.iter() {
        let start = region.start_addr().0;
        let len = region.len();
        let mut at = 0u64;
        while at < len {
            let n = usize::try_from((len - at).min(CHUNK as u64)).unwrap_or(CHUNK);
            let buf = &mut chunk[..n];
            mem.read_slice(buf, GuestAddress(start + at))
                .map_err(|e| io("read guest memory for", path)(guest_err(e)))?;
            let file_at = offset + at;
            let ends_file = file_at + n as u64 == total;
            for run in data_runs(buf, ends_file) {
                file.write_all_at(&buf[run.clone()], file_at + run.start as u64)
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
    file.sync_data().map_err(io("sync", path))?;
    Ok((regions, offset))
}

/// The runs of [`PAGE`]s of `buf` to write: those holding a byte other than zero, and the
/// last page if `ends_file` (so that the file has its full length); adjacent ones merged.
fn data_runs(buf: &[u8], ends_file: bool) -> Vec<Range<usize>> {
    let pages = buf.len().div_ceil(PAGE);
    let mut runs: Vec<Range<usize>> = Vec::new();
    for (i, page) in buf.chunks(PAGE).enumerate() {
        // No early exit: the compiler turns the fold into wide ORs.
        let data = page.iter().fold(0u8, |acc, &b| acc | b) != 0;
        let last = ends_file && i + 1 == pages;
        if !(data || last) {
            continue;
        }
        let at = i * PAGE;
        match runs.last_mut() {
            Some(run) if run.end == at => run.end = at + page.len(),
            _ => runs.push(at..at + page.len()),
        }
    }
    runs
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Every byte that is not zero is in a run, every run is whole pages of `buf` that
        /// hold data (or the last page, when it ends the file), runs neither touch nor
        /// overlap, and the last page is written when it ends the file.
        #[test]
        fn data_runs_cover_the_data_and_only_it(
            pages in proptest::collection::vec(proptest::option::of((0usize..PAGE, 1u8..)), 1..40),
            tail in 1usize..=PAGE,
            ends_file: bool,
        ) {
            let len = (pages.len() - 1) * PAGE + tail;
            let mut buf = vec![0u8; len];
            for (i, byte) in pages.iter().enumerate() {
                if let Some((at, value)) = byte {
                    if let Some(b) = buf.get_mut(i * PAGE + at) {
                        *b = *value;
                    }
                }
            }
            let runs = data_runs(&buf, ends_file);
            let written = |at: usize| runs.iter().any(|r| r.contains(&at));
            for (at, &b) in buf.iter().enumerate() {
                prop_assert!(b == 0 || written(at), "byte {at} ({b}) not written");
            }
            for pair in runs.windows(2) {
                prop_assert!(pair[0].end < pair[1].start, "runs touch: {runs:?}");
            }
            for run in &runs {
                prop_assert!(run.start % PAGE == 0 && (run.end % PAGE == 0 || run.end == len));
                for page in run.clone().step_by(PAGE) {
                    let last = page + PAGE >= len;
                    let data = buf[page..(page + PAGE).min(len)].iter().any(|&b| b != 0);
                    prop_assert!(data || (ends_file && last), "page {page} is zero: {runs:?}");
                }
            }
            let last_page_data = buf[(len - 1) / PAGE * PAGE..].iter().any(|&b| b != 0);
            prop_assert_eq!(written(len - 1), ends_file || last_page_data);
        }
    }
}
