//! An output path must never be an input: `--metrics` pointed at the kernel would replace the
//! kernel with JSON, `--serial file=` pointed at a disk image would append to it. Paths are
//! compared by what they are, not how they are spelled: the device and inode of the file each
//! one names (symlinks followed), so `./vmlinux`, a link to it and a hard link all clash.
//! An output that does not exist yet clashes with nothing; character devices (`/dev/null`)
//! are never compared, as writing them destroys nothing.
//!
//! The outputs are then opened by `host::files::open_output` (no link followed at the last
//! component, a regular file or a character device only). The log file (`lull ch
//! --log-file`) is lull's own output rather than a VM's: [`open_log_file`] keeps its path, and
//! every VM of the process checks its files against it ([`process_outputs`]).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::host::files::{self, OutputMode};

/// The log file of this process, once opened.
static LOG_FILE: OnceLock<PathBuf> = OnceLock::new();

/// Opens the log file `path` (appended to, as an output: see `host::files::open_output`) and
/// keeps its path as an output of every VM of this process.
pub fn open_log_file(path: &Path) -> std::io::Result<std::fs::File> {
    let file = files::open_output(path, OutputMode::Append)?;
    let _ = LOG_FILE.set(path.to_path_buf());
    Ok(file)
}

/// lull's outputs besides a VM's own: the log file, if any.
pub fn process_outputs() -> Option<PathBuf> {
    LOG_FILE.get().cloned()
}

/// The identities of those of `paths` that exist (see [`first_clash`] for what counts).
pub fn identities(paths: &[PathBuf]) -> Vec<FileId> {
    paths.iter().filter_map(|p| file_id(p)).collect()
}

/// A path and the flag that named it.
#[derive(Debug, Clone)]
pub struct NamedPath<'a> {
    /// The flag (`--kernel`, `--metrics`...).
    pub role: &'static str,
    /// The path.
    pub path: &'a Path,
}

impl<'a> NamedPath<'a> {
    /// `path`, named by `role`.
    pub fn new(role: &'static str, path: &'a Path) -> Self {
        Self { role, path }
    }
}

/// Two flags name the same file.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{output_role} {output} is the same file as {input_role} {input}: lull would overwrite it; \
     give {output_role} another path"
)]
pub struct PathClash {
    /// The output's flag.
    pub output_role: &'static str,
    /// The output's path.
    pub output: PathBuf,
    /// The other flag.
    pub input_role: &'static str,
    /// Its path.
    pub input: PathBuf,
}

/// A file's identity: device and inode.
pub type FileId = (u64, u64);

/// The identity of the file `path` names, if it exists and is not a character device.
fn file_id(path: &Path) -> Option<FileId> {
    let meta = std::fs::metadata(path).ok()?;
    (!meta.file_type().is_char_device()).then(|| (meta.dev(), meta.ino()))
}

/// The first output whose identity is that of an input or of an earlier output: (output index,
/// and the index of what it clashes with, inputs first then outputs). `None` identities
/// clash with nothing.
pub fn first_clash(
    inputs: &[Option<FileId>],
    outputs: &[Option<FileId>],
) -> Option<(usize, usize)> {
    outputs.iter().enumerate().find_map(|(o, id)| {
        let id = (*id)?;
        let mut earlier = inputs.iter().chain(&outputs[..o]);
        earlier.position(|other| *other == Some(id)).map(|i| (o, i))
    })
}

/// Refuses the first output that is an input or another output.
pub fn refuse_clashes(
    inputs: &[NamedPath<'_>],
    outputs: &[NamedPath<'_>],
) -> Result<(), PathClash> {
    let ids = |paths: &[NamedPath<'_>]| paths.iter().map(|p| file_id(p.path)).collect::<Vec<_>>();
    let Some((o, i)) = first_clash(&ids(inputs), &ids(outputs)) else {
        return Ok(());
    };
    let other = inputs.get(i).unwrap_or_else(|| &outputs[i - inputs.len()]);
    Err(PathClash {
        output_role: outputs[o].role,
        output: outputs[o].path.to_path_buf(),
        input_role: other.role,
        input: other.path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_clashes_with_an_input_or_an_earlier_output_only() {
        let (a, b, c) = (Some((1, 10)), Some((1, 11)), Some((2, 10)));
        assert_eq!(first_clash(&[a, b], &[c]), None);
        assert_eq!(first_clash(&[a, b], &[c, b]), Some((1, 1)));
        assert_eq!(first_clash(&[a], &[None, c, c]), Some((2, 2)));
        assert_eq!(first_clash(&[None], &[None]), None);
        assert_eq!(first_clash(&[], &[]), None);
    }

    #[test]
    fn links_and_spellings_of_one_file_clash() {
        let dir = std::env::temp_dir().join(format!("lull-paths-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = dir.join("vmlinux");
        std::fs::write(&kernel, b"kernel").unwrap();
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&kernel, &link).unwrap();
        let dotted = dir.join(".").join("vmlinux");
        let fresh = dir.join("metrics.json");
        let inputs = [NamedPath::new("--kernel", &kernel)];
        for clash in [&link, &dotted, &kernel] {
            let err = refuse_clashes(&inputs, &[NamedPath::new("--metrics", clash)]).unwrap_err();
            assert_eq!(err.input_role, "--kernel");
            assert!(err.to_string().contains("--metrics"), "{err}");
        }
        assert!(refuse_clashes(&inputs, &[NamedPath::new("--metrics", &fresh)]).is_ok());
        let null = Path::new("/dev/null");
        let outputs = [
            NamedPath::new("--metrics", null),
            NamedPath::new("--serial", null),
        ];
        assert!(refuse_clashes(&inputs, &outputs).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
