//! Why an input or output path of a VM cannot be used.

use super::paths::PathClash;

/// An input or output path that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// An output is an input.
    #[error(transparent)]
    Clash(#[from] PathClash),
    /// The kernel or initramfs is a directory, device or FIFO.
    #[error("{role} {path} is not a regular file: give the {what} image's file")]
    NotAFile {
        /// The flag.
        role: &'static str,
        /// What the flag names.
        what: &'static str,
        /// The path.
        path: std::path::PathBuf,
    },
}
