//! lull's own machine code on 2 MiB pages.
//!
//! A vCPU thread of `--irqchip user` sleeps between guest timer events; when it wakes, the code
//! of its wake path (the exit dispatch, the LAPIC, the timer queue, the idle decisions) has left
//! the CPU's caches and TLBs, and each 4 KiB page of it touched costs a page walk. Measured with
//! one timer event per 100 ms (`resources/bench/interval_cost.py`, docs/PERFORMANCE.md), lull's
//! own code took ~30 us per event, most of it such cold misses; with its text on 2 MiB pages
//! (a preloaded shim, on an earlier host) the same path took ~25 us.
//!
//! Linux backs a file mapping such as a program's text with small pages unless the kernel was
//! built with `CONFIG_READ_ONLY_THP_FOR_FS`, which ours is not (`MADV_COLLAPSE` on the text
//! answers `EINVAL`). So at start-up, while lull is still one thread, [`move_own_text_to_huge_pages`]
//! copies the 2 MiB-aligned span of its text mapping into an anonymous mapping advised
//! `MADV_HUGEPAGE`, checks in `/proc/self/smaps` that transparent huge pages back it, makes it
//! read-only and executable, and moves it over the old text with one `mremap(MREMAP_FIXED)`:
//! the kernel swaps the mapping in one step and the bytes at every address stay the same. The
//! binary is linked with `-z max-page-size=0x200000` (`vmm/build.rs`): its segments then load
//! 2 MiB apart, so the huge pages at both ends of the text, which it only partly fills, hold
//! no other mapping and can be taken whole.
//!
//! The price is memory: each lull process holds a private copy of its text (4 MiB of huge
//! pages for a release build, ~2 MiB more resident than the file pages it touched) instead of
//! sharing the page cache's, and profilers that name functions by file offset (`perf`) see
//! anonymous code. Measured on later hosts the gain was smaller than with the shim (2-3 us of
//! lull's ~30 us handling per event, too little to show in `lull bench density`), so it is
//! opt-in: `lull run --huge-text on`. Every failure leaves the text as it was and is reported
//! as a [`HugeTextError`].

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use procfs_core::process::{MMPermissions, MMapPath, MemoryMaps, Status};
use procfs_core::{FromBufRead, FromRead};

/// The size of an x86-64 huge page (a PMD mapping).
pub const HUGE_PAGE: usize = 2 << 20;

/// Set once the text was moved: until then it is the file's, which huge pages never back.
static MOVED: AtomicBool = AtomicBool::new(false);

/// Why lull's text stays on small pages.
#[derive(Debug, thiserror::Error)]
pub enum HugeTextError {
    /// Another thread could be running the code being moved.
    #[error("lull already runs {0} threads; its text can only be moved while it runs one")]
    NotSingleThreaded(u64),
    /// A `/proc/self` file could not be read or parsed.
    #[error("cannot read /proc/self/{file}: {reason}")]
    Proc {
        /// The file under `/proc/self`.
        file: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The host's transparent huge pages are off (`/sys/kernel/mm/transparent_hugepage/enabled`).
    #[error("transparent huge pages are disabled on this host")]
    ThpDisabled,
    /// No executable mapping of lull's binary holds this function.
    #[error("lull's text mapping was not found in /proc/self/maps")]
    NoTextMapping,
    /// The text fills no 2 MiB page even half (see [`huge_span`]).
    #[error("lull's text ({0:#x} bytes) fills no 2 MiB page even half")]
    TooSmall(usize),
    /// The host gave small pages to the new mapping (no free huge page, or THP refused).
    #[error("the host backed only {huge} of {len} bytes with huge pages")]
    NotHuge {
        /// Bytes backed by huge pages.
        huge: u64,
        /// Bytes of the span.
        len: usize,
    },
    /// A memory-management system call failed.
    #[error("{call} failed: {source}")]
    Syscall {
        /// The call (`mmap`, `madvise`, `mprotect`, `mremap`).
        call: &'static str,
        /// The error it returned.
        #[source]
        source: io::Error,
    },
}

/// The span of lull's text to put on huge pages: the whole 2 MiB pages inside the text mapping
/// `text`, plus the page at either end that the text only partly covers when the text fills at
/// least half of it and the rest of it is free address space (`free_below`/`free_above`: where
/// the mappings before and after the text end and start). A page mostly outside the text would
/// cost a huge page of memory for a few small pages of code. `None` if no page remains.
pub fn huge_span(text: Range<usize>, free_below: usize, free_above: usize) -> Option<Range<usize>> {
    if text.is_empty() {
        return None;
    }
    let mostly_text = |page: usize| {
        let covered = text
            .end
            .min(page.saturating_add(HUGE_PAGE))
            .saturating_sub(text.start.max(page));
        covered >= HUGE_PAGE / 2
    };
    let first = text.start & !(HUGE_PAGE - 1);
    let start = if first == text.start || (first >= free_below && mostly_text(first)) {
        first
    } else {
        first.checked_add(HUGE_PAGE)?
    };
    let whole_end = text.end & !(HUGE_PAGE - 1);
    let end = if whole_end == text.end {
        whole_end
    } else {
        match whole_end.checked_add(HUGE_PAGE) {
            Some(up) if up <= free_above && mostly_text(whole_end) => up,
            _ => whole_end,
        }
    };
    (end > start).then_some(start..end)
}

fn proc_error(file: &'static str, e: impl std::fmt::Display) -> HugeTextError {
    HugeTextError::Proc {
        file,
        reason: e.to_string(),
    }
}

fn syscall(call: &'static str) -> HugeTextError {
    HugeTextError::Syscall {
        call,
        source: io::Error::last_os_error(),
    }
}

fn thp_enabled() -> bool {
    // "always [madvise] never": the bracketed word is the mode in force.
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|mode| !mode.contains("[never]"))
}

fn self_maps(file: &'static str) -> Result<MemoryMaps, HugeTextError> {
    let f = std::fs::File::open(format!("/proc/self/{file}")).map_err(|e| proc_error(file, e))?;
    MemoryMaps::from_buf_read(io::BufReader::new(f)).map_err(|e| proc_error(file, e))
}

/// Bytes of the mapping holding `addr` that transparent huge pages back, per
/// `/proc/self/smaps`.
fn anon_huge_bytes_at(addr: usize) -> Result<u64, HugeTextError> {
    let addr = u64::try_from(addr).map_err(|_| HugeTextError::NoTextMapping)?;
    Ok(self_maps("smaps")?
        .0
        .iter()
        .find(|m| (m.address.0..m.address.1).contains(&addr))
        .and_then(|m| m.extension.map.get("AnonHugePages").copied())
        .unwrap_or(0))
}

/// The text mapping holding `addr` and the free space around it.
fn text_mapping(maps: &MemoryMaps, addr: usize) -> Option<(Range<usize>, usize, usize)> {
    let at = |a: u64| usize::try_from(a).ok();
    let addr = u64::try_from(addr).ok()?;
    let i = maps.0.iter().position(|m| {
        (m.address.0..m.address.1).contains(&addr)
            && m.perms
                .contains(MMPermissions::READ | MMPermissions::EXECUTE)
            && matches!(m.pathname, MMapPath::Path(_))
    })?;
    let below = if i > 0 {
        at(maps.0[i - 1].address.1)?
    } else {
        0
    };
    let above = maps
        .0
        .get(i + 1)
        .map_or(Some(usize::MAX), |m| at(m.address.0))?;
    let m = &maps.0[i];
    Some((at(m.address.0)?..at(m.address.1)?, below, above))
}

/// An anonymous read-write mapping of `len` bytes starting on a 2 MiB boundary, unmapped when
/// dropped unless it was moved.
struct AlignedAnon {
    addr: *mut libc::c_void,
    len: usize,
}

impl AlignedAnon {
    fn new(len: usize) -> Result<Self, HugeTextError> {
        let over = len + HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping at an address of the kernel's choosing;
        // it overlaps nothing of ours.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(syscall("mmap"));
        }
        let base = raw as usize;
        let start = (base + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
        let head = start - base;
        let tail = over - head - len;
        // SAFETY: both ranges lie inside the mapping just made, which nothing else uses; what
        // remains is [start, start + len).
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
        }
        Ok(Self {
            addr: start as *mut libc::c_void,
            len,
        })
    }
}

impl Drop for AlignedAnon {
    fn drop(&mut self) {
        if !self.addr.is_null() {
            // SAFETY: the mapping is ours and nothing points into it any more.
            unsafe { libc::munmap(self.addr, self.len) };
        }
    }
}

/// Moves lull's text onto 2 MiB pages (see the module comment); returns how many bytes of it
/// huge pages back.
///
/// Call it at the top of `main`, before any thread starts: it refuses when the process runs
/// more than one thread.
pub fn move_own_text_to_huge_pages() -> Result<u64, HugeTextError> {
    let status = Status::from_file("/proc/self/status").map_err(|e| proc_error("status", e))?;
    if status.threads != 1 {
        return Err(HugeTextError::NotSingleThreaded(status.threads));
    }
    if !thp_enabled() {
        return Err(HugeTextError::ThpDisabled);
    }
    let here = move_own_text_to_huge_pages as *const () as usize;
    let (text, below, above) =
        text_mapping(&self_maps("maps")?, here).ok_or(HugeTextError::NoTextMapping)?;
    let span = huge_span(text.clone(), below, above)
        .ok_or(HugeTextError::TooSmall(text.end - text.start))?;
    let len = span.end - span.start;
    let mut copy = AlignedAnon::new(len)?;
    // SAFETY: `copy` is our own fresh mapping of `len` bytes.
    if unsafe { libc::madvise(copy.addr, len, libc::MADV_HUGEPAGE) } != 0 {
        return Err(syscall("madvise"));
    }
    // The part of the span the text mapping covers; the rest (padding up to the huge-page
    // boundaries, free address space before) stays zero.
    let from = span.start.max(text.start);
    let to = span.end.min(text.end);
    // SAFETY: [from, to) lies inside the text mapping, which is readable and stays mapped (one
    // thread, nothing unmaps it); the destination is the same offset into `copy`, inside its
    // `len` bytes; the two mappings are distinct, so the ranges do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            from as *const u8,
            (copy.addr as usize + (from - span.start)) as *mut u8,
            to - from,
        );
    }
    let huge = anon_huge_bytes_at(copy.addr as usize)?;
    if huge == 0 {
        return Err(HugeTextError::NotHuge { huge, len });
    }
    // SAFETY: `copy` is our own mapping of `len` bytes; no reference into it exists.
    if unsafe { libc::mprotect(copy.addr, len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
        return Err(syscall("mprotect"));
    }
    // SAFETY: the destination is lull's text span (or free address space next to it) and
    // `copy` holds the same bytes at the same offsets, so this one call replaces the code the
    // only thread runs, this function included, with identical code; no Rust object lives in
    // the text. The kernel checks the arguments before it touches either mapping; should it
    // fail after unmapping the destination (out of memory for the move itself), lull dies of
    // SIGSEGV at start-up, before it runs anything else.
    let moved = unsafe {
        libc::mremap(
            copy.addr,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            span.start as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        return Err(syscall("mremap"));
    }
    copy.addr = std::ptr::null_mut();
    MOVED.store(true, Ordering::Relaxed);
    Ok(huge)
}

/// Bytes of the mapping that holds lull's code backed by transparent huge pages, as
/// `/proc/self/smaps` shows them now: 0 while the text is the file's (then without reading
/// smaps, whose cost grows with the guest memory mapped).
pub fn own_text_on_huge_pages() -> u64 {
    if !MOVED.load(Ordering::Relaxed) {
        return 0;
    }
    anon_huge_bytes_at(own_text_on_huge_pages as *const () as usize).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: usize = 1 << 20;

    #[test]
    fn a_test_binary_runs_from_its_file() {
        let here = a_test_binary_runs_from_its_file as *const () as usize;
        assert_eq!(anon_huge_bytes_at(here).unwrap(), 0);
        assert_eq!(own_text_on_huge_pages(), 0);
    }

    #[test]
    fn the_span_widens_into_free_space_on_both_sides() {
        // A text mapping at 2 MiB with 5.5 MiB of code, nothing near it.
        assert_eq!(
            huge_span(2 * M..7 * M + M / 2, 0, usize::MAX),
            Some(2 * M..8 * M)
        );
        // Unaligned start with free space below: widened down.
        assert_eq!(huge_span(3 * M..9 * M, M, 12 * M), Some(2 * M..10 * M));
    }

    #[test]
    fn an_end_page_mostly_outside_the_text_stays_small() {
        // lull's own layout: text from 0x2f5000 to 0x604000; the last 16 KiB stay on 4 KiB
        // pages rather than cost a whole huge page.
        assert_eq!(
            huge_span(0x2f_5000..0x60_4000, 0xf_6000, 0x80_3000),
            Some(2 * M..6 * M)
        );
        // Less than half of the first page: it is left out too.
        assert_eq!(
            huge_span(3 * M + M / 2..8 * M, 0, usize::MAX),
            Some(4 * M..8 * M)
        );
    }

    #[test]
    fn the_span_narrows_where_a_neighbour_mapping_sits() {
        // The mapping before ends inside the lower huge page, the one after starts inside the
        // upper: only whole pages inside the text remain.
        assert_eq!(
            huge_span(3 * M..9 * M, 3 * M, 9 * M + 4096),
            Some(4 * M..8 * M)
        );
    }

    #[test]
    fn a_text_inside_one_huge_page_between_neighbours_has_no_span() {
        assert_eq!(huge_span(2 * M + 4096..3 * M, 2 * M + 4096, 3 * M), None);
    }

    #[test]
    fn a_text_ending_at_the_top_of_the_address_space_does_not_overflow() {
        assert_eq!(
            huge_span(usize::MAX - 4095..usize::MAX, 0, usize::MAX),
            None
        );
    }

    #[test]
    fn a_process_with_threads_keeps_its_text() {
        let (release, parked) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || parked.recv());
        let err = move_own_text_to_huge_pages().unwrap_err();
        release.send(()).unwrap();
        other.join().unwrap().unwrap();
        assert!(
            matches!(err, HugeTextError::NotSingleThreaded(n) if n > 1),
            "{err}"
        );
    }
}
