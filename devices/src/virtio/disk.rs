//! What a virtio-blk device stores its sectors on: a [`Disk`]. [`FileDisk`] is a raw image
//! file (positioned reads and writes, `fsync` for a flush); [`MemDisk`] is a byte vector for
//! tests and fuzz targets.
//!
//! A [`FileDisk`] keeps the size it was opened with (the guest's capacity). If the file
//! shrinks under the VM (someone truncates it), a request past the new end fails (the device
//! answers IOERR) and is counted ([`FileDisk::shrink_errors`]): a read there finds the end of
//! the file, and a write there is refused after an `fstat` rather than re-growing the file
//! with a hole before it, which would turn the lost sectors into zeros without a word.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes in a virtio-blk sector.
pub const SECTOR_SIZE: u64 = 512;

/// Sector storage.
pub trait Disk: Send {
    /// Size in bytes (a multiple of [`SECTOR_SIZE`]).
    fn size(&self) -> u64;
    /// Fills `buf` from byte `offset`; the range is within [`Self::size`].
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Stores `buf` at byte `offset`; the range is within [`Self::size`].
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&mut self) -> io::Result<()>;
}

/// Why a disk image cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The file cannot be opened.
    #[error("Cannot open disk image {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is not a regular file.
    #[error("Disk image {0} is not a regular file")]
    NotAFile(PathBuf),
    /// The file's size is zero or not a whole number of sectors.
    #[error("Disk image {path} is {size} bytes; use a non-empty file whose size is a multiple of 512 (e.g. `truncate -s 64M {path}`)")]
    BadSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
}

/// A raw disk image file.
#[derive(Debug, Clone)]
pub struct FileDisk {
    file: Arc<File>,
    size: u64,
    shrunk: Arc<AtomicU64>,
}

impl FileDisk {
    /// Opens `path` for reading, and for writing unless `readonly`.
    pub fn open(path: &Path, readonly: bool) -> Result<Self, DiskError> {
        let open_err = |source| DiskError::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(!readonly)
            .open(path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if !meta.is_file() {
            return Err(DiskError::NotAFile(path.to_path_buf()));
        }
        let size = meta.len();
        if size == 0 || size % SECTOR_SIZE != 0 {
            return Err(DiskError::BadSize {
                path: path.to_path_buf(),
                size,
            });
        }
        Ok(Self {
            file: Arc::new(file),
            size,
            shrunk: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Requests that failed because the file had shrunk below them (shared with clones).
    pub fn shrink_errors(&self) -> &Arc<AtomicU64> {
        &self.shrunk
    }

    /// An error for a request past the file's end, counted.
    fn shrank(&self) -> io::Error {
        self.shrunk.fetch_add(1, Ordering::Relaxed);
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the disk image shrank below the request",
        )
    }

    /// The open file (shared: the VMM syncs it when the VM stops).
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }
}

impl Disk for FileDisk {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self.file.read_exact_at(buf, offset) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(self.shrank()),
            other => other,
        }
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        if self.file.metadata()?.len() < end {
            return Err(self.shrank());
        }
        self.file.write_all_at(buf, offset)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// A disk in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemDisk {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Flushes so far.
    pub flushes: u64,
}

impl MemDisk {
    /// A zeroed disk of `sectors` sectors.
    pub fn new(sectors: u64) -> Self {
        let len = usize::try_from(sectors * SECTOR_SIZE).unwrap_or(0);
        Self {
            bytes: vec![0; len],
            flushes: 0,
        }
    }

    fn range(&self, offset: u64, len: usize) -> io::Result<std::ops::Range<usize>> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let end = start.checked_add(len).ok_or(io::ErrorKind::InvalidInput)?;
        if end > self.bytes.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(start..end)
    }
}

impl Disk for MemDisk {
    fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let range = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.bytes[range]);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let range = self.range(offset, buf.len())?;
        self.bytes[range].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flushes += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, size: u64) -> PathBuf {
        let path = std::env::temp_dir().join(format!("lull-disk-{}-{name}", std::process::id()));
        let f = File::create(&path).unwrap();
        f.set_len(size).unwrap();
        path
    }

    #[test]
    fn file_disk_checks_size_and_round_trips() {
        let bad = temp("bad", 1000);
        assert!(matches!(
            FileDisk::open(&bad, false),
            Err(DiskError::BadSize { size: 1000, .. })
        ));
        let empty = temp("empty", 0);
        assert!(matches!(
            FileDisk::open(&empty, false),
            Err(DiskError::BadSize { size: 0, .. })
        ));
        assert!(matches!(
            FileDisk::open(Path::new("/nonexistent/lull.img"), true),
            Err(DiskError::Open { .. })
        ));
        assert!(matches!(
            FileDisk::open(&std::env::temp_dir(), true),
            Err(DiskError::NotAFile(_))
        ));
        let good = temp("good", 4096);
        let mut disk = FileDisk::open(&good, false).unwrap();
        assert_eq!(disk.size(), 4096);
        disk.write_at(512, b"lull").unwrap();
        disk.flush().unwrap();
        let mut buf = [0u8; 4];
        disk.read_at(512, &mut buf).unwrap();
        assert_eq!(&buf, b"lull");
        assert_eq!(&std::fs::read(&good).unwrap()[512..516], b"lull");
        for p in [bad, empty, good] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn a_shrunk_file_fails_requests_past_its_end_and_counts_them() {
        let path = temp("shrink", 4096);
        let mut disk = FileDisk::open(&path, false).unwrap();
        disk.write_at(3584, &[7; 512]).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1024)
            .unwrap();
        assert!(disk.write_at(3584, &[7; 512]).is_err());
        assert!(disk.read_at(2048, &mut [0; 512]).is_err());
        assert_eq!(disk.shrink_errors().load(Ordering::Relaxed), 2);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1024, "re-grown");
        disk.write_at(512, &[9; 512]).unwrap();
        disk.read_at(0, &mut [0; 512]).unwrap();
        assert_eq!(disk.shrink_errors().load(Ordering::Relaxed), 2);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn mem_disk_refuses_out_of_range() {
        let mut disk = MemDisk::new(1);
        assert!(disk.write_at(510, &[1, 2, 3]).is_err());
        assert!(disk.read_at(u64::MAX, &mut [0]).is_err());
        disk.write_at(510, &[1, 2]).unwrap();
        assert_eq!(&disk.bytes[510..], &[1, 2]);
    }
}
