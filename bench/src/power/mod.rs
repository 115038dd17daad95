//! What a window of a benchmark costs the host in power, read from files under a root path
//! (`/` for this host, a fixture tree in tests).
//!
//! A reading that cannot be had is a [`Reading`] with no value and the reason, never a 0: a
//! virtual machine has no RAPL, a user may not read `energy_uj`, a CPU may have no cpuidle.

pub mod cpuidle;
pub mod interrupts;
pub mod meter;
pub mod rapl;
pub mod threads;

use std::fmt::Display;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A measured value, or why there is none (in JSON: `{"value": null, "reason": "..."}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading<T> {
    /// The value, if it could be measured.
    pub value: Option<T>,
    /// Why there is no value.
    pub reason: Option<String>,
}

impl<T> Reading<T> {
    /// A measured value.
    pub fn ok(value: T) -> Self {
        Self {
            value: Some(value),
            reason: None,
        }
    }

    /// No value, for `reason`.
    pub fn missing(reason: impl Display) -> Self {
        Self {
            value: None,
            reason: Some(reason.to_string()),
        }
    }
}

impl<T, E: Display> From<Result<T, E>> for Reading<T> {
    fn from(result: Result<T, E>) -> Self {
        result.map_or_else(Self::missing, Self::ok)
    }
}

/// Reads a file; tests inject errors the kernel gives (EACCES) that root does not get.
pub trait ReadFile {
    /// The whole file as text.
    fn read(&self, path: &Path) -> io::Result<String>;
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl ReadFile for RealFs {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

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
}
