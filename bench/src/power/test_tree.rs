//! Test fixtures of the readers: a file tree under the temp directory, and a file system that
//! refuses a file as the kernel refuses a user.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::read_file::{ReadFile, RealFs};

/// Whether this host's CPU 0 has cpuidle states, read straight from sysfs: the tests that
/// probe the real host expect idle readings where it has them, and the reason where it has
/// none (a VM host with `cpuidle driver none`, or `idle=poll`).
pub(crate) fn host_has_cpuidle_states() -> bool {
    Path::new("/sys/devices/system/cpu/cpu0/cpuidle/state0").is_dir()
}

/// A directory tree under the temp directory, removed on drop.
pub(crate) struct TempTree(PathBuf);

impl TempTree {
    /// A new empty tree; `name` tells the tests' trees apart.
    pub(crate) fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("lull-power-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// Its root.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `text` to `rel`, creating its directories.
    pub(crate) fn file(&self, rel: &str, text: &str) {
        let path = self.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// Creates the directory `rel`.
    pub(crate) fn dir(&self, rel: &str) {
        std::fs::create_dir_all(self.0.join(rel)).unwrap();
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The real file system, but every file named `.0` fails with EACCES, as the kernel
/// answers a user (root, who runs the tests, is never refused by a file's mode).
pub(crate) struct DenyFile(pub(crate) &'static str);

impl ReadFile for DenyFile {
    fn read(&self, path: &Path) -> io::Result<String> {
        if path.file_name().is_some_and(|n| n == self.0) {
            return Err(io::Error::from_raw_os_error(libc::EACCES));
        }
        RealFs.read(path)
    }
}
