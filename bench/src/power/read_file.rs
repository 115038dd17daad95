//! How the readers read a file: the real file system, or a test's that fails as the kernel
//! would.

use std::io;
use std::path::Path;

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
