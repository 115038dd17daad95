//! Writing a snapshot into a directory so that a crash (SIGKILL, a full disk, a power cut)
//! leaves the old snapshot or the new one there, never a mix, and so that nothing already in
//! the directory (a planted link, another file under a snapshot's name) is written through:
//!
//! ```text
//!  begin:  the old manifest's file names (read leniently: any lull format); its memory file
//!          flock'd LOCK_EX|LOCK_NB (a VM restored from it holds LOCK_SH: refused, InUse)
//!  create: every new file under a name unique to this snapshot (NAME.TOKEN), O_EXCL and
//!          O_NOFOLLOW: never an existing file, never through a link; synced
//!  commit: manifest.TOKEN.tmp written and synced, renamed over manifest.json (atomic), the
//!          directory synced; then the old snapshot's files unlinked (plain names only, never
//!          the VM's own inputs or outputs, which a crafted old manifest could name)
//!  drop without commit: the new files unlinked; the old snapshot untouched
//! ```
//! A crash before the rename leaves the old manifest, which names only old files; after it,
//! the new manifest, which names only new ones. Files a crash leaves unnamed by either are
//! harmless leftovers with the `.TOKEN` of the snapshot that was being written.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::Deserialize;

use super::error::SnapshotError;
use super::error::MAX_SMALL_FILE;
use super::manifest::{is_plain_name, MANIFEST, MEMORY};
use crate::host::files;

/// A file's identity: device and inode.
pub type FileId = (u64, u64);

/// The file names of a manifest of any lull format, read without judging the rest.
#[derive(Deserialize)]
struct OldNames {
    #[serde(default = "default_memory")]
    memory_file: String,
    #[serde(default)]
    vcpus: Vec<OldFile>,
    kvm_vm: Option<OldFile>,
    devices: Option<OldFile>,
}

#[derive(Deserialize)]
struct OldFile {
    file: String,
}

/// The memory file's name before format 3.
fn default_memory() -> String {
    MEMORY.to_string()
}

/// A snapshot being written into a directory.
pub struct NewSnapshot {
    dir: PathBuf,
    token: String,
    /// The new files created so far (unlinked if the snapshot is not committed).
    created: Vec<String>,
    /// The old snapshot's files, removed once the new manifest is in place.
    old: Vec<String>,
    /// LOCK_EX on the old snapshot's memory file, held until the end.
    _lock: Option<Flock<File>>,
    committed: bool,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A token no other snapshot of this host has: the time, lull's PID, a count.
fn new_token() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:x}-{:x}-{count:x}", std::process::id())
}

/// The names the manifest in `dir` gives its files, if it is a readable manifest (plain names
/// only, never the manifest's own).
fn old_names(dir: &Path) -> Vec<String> {
    let read = || -> Option<OldNames> {
        let file = files::open_input(&dir.join(MANIFEST)).ok()?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_SMALL_FILE + 1),
            &mut bytes,
        )
        .ok()?;
        serde_json::from_slice(&bytes).ok()
    };
    let Some(names) = read() else {
        return Vec::new();
    };
    std::iter::once(names.memory_file)
        .chain(names.vcpus.into_iter().map(|f| f.file))
        .chain(names.kvm_vm.map(|f| f.file))
        .chain(names.devices.map(|f| f.file))
        .filter(|n| is_plain_name(n) && n != MANIFEST)
        .collect()
}

impl NewSnapshot {
    /// Starts a snapshot in the existing directory `dir`; refused if the directory's current
    /// snapshot is mapped by a VM restored from it (its memory file is flock'd shared).
    pub fn begin(dir: &Path) -> Result<Self, SnapshotError> {
        let meta = std::fs::metadata(dir).map_err(io("open the snapshot directory", dir))?;
        if !meta.is_dir() {
            return Err(SnapshotError::NotADirectory {
                dir: dir.to_path_buf(),
            });
        }
        let old = old_names(dir);
        // The memory file comes first; a name that is no regular file holds no lock.
        let lock = match old.first().map(|m| files::open_input(&dir.join(m))) {
            Some(Ok(memory)) => match Flock::lock(memory, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => Some(lock),
                Err((_, Errno::EWOULDBLOCK)) => {
                    return Err(SnapshotError::InUse {
                        dir: dir.to_path_buf(),
                    })
                }
                Err((_, e)) => return Err(io("lock", dir)(e.into())),
            },
            _ => None,
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            token: new_token(),
            created: Vec::new(),
            old,
            _lock: lock,
            committed: false,
        })
    }

    /// The new snapshot's name for a file called `stem` with `extension` (`""` for none):
    /// `stem.TOKEN.extension`.
    pub fn name(&self, stem: &str, extension: &str) -> String {
        match extension {
            "" => format!("{stem}.{}", self.token),
            ext => format!("{stem}.{}.{ext}", self.token),
        }
    }

    /// Creates the new file `name` (see [`Self::name`]); its path and the open file.
    pub fn create(&mut self, name: &str) -> Result<(PathBuf, File), SnapshotError> {
        let path = self.dir.join(name);
        let file = files::create_new(&path).map_err(io("create", &path))?;
        self.created.push(name.to_string());
        Ok((path, file))
    }

    /// Creates the new file `name` holding `bytes`, synced.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<(), SnapshotError> {
        let (path, mut file) = self.create(name)?;
        file.write_all(bytes).map_err(io("write", &path))?;
        file.sync_data().map_err(io("sync", &path))
    }

    /// Puts `manifest` in place (a new file renamed over `manifest.json`), syncs the
    /// directory, then removes the old snapshot's files but any whose identity is in
    /// `protected` (the VM's inputs and outputs: an old manifest is no proof of ownership).
    pub fn commit(mut self, manifest: &[u8], protected: &[FileId]) -> Result<(), SnapshotError> {
        let tmp = self.name(MANIFEST, "tmp");
        self.write(&tmp, manifest)?;
        let path = self.dir.join(MANIFEST);
        std::fs::rename(self.dir.join(&tmp), &path).map_err(io("rename into", &path))?;
        self.committed = true;
        File::open(&self.dir)
            .and_then(|d| d.sync_data())
            .map_err(io("sync", &self.dir))?;
        for name in &self.old {
            let old = self.dir.join(name);
            let Ok(meta) = std::fs::symlink_metadata(&old) else {
                continue;
            };
            if protected.contains(&(meta.dev(), meta.ino())) {
                tracing::warn!(
                    "the old snapshot in {} named {name}, one of the VM's own files: left as \
                     it is",
                    self.dir.display()
                );
                continue;
            }
            if let Err(e) = std::fs::remove_file(&old) {
                tracing::warn!("cannot remove the old snapshot's {}: {e}", old.display());
            }
        }
        Ok(())
    }
}

impl Drop for NewSnapshot {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for name in &self.created {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lull-commit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn manifest(memory: &str, vcpu: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "memory_file": memory,
            "vcpus": [{"file": vcpu}],
            "kvm_vm": {"file": "../outside"},
        }))
        .unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_commit_replaces_the_old_snapshot_and_spares_protected_files() {
        let dir = dir("replace");
        let outside = dir
            .parent()
            .unwrap()
            .join(format!("lull-commit-outside-{}", std::process::id()));
        std::fs::write(&outside, b"keep").unwrap();
        std::fs::write(dir.join("memory"), b"old memory").unwrap();
        std::fs::write(dir.join("disk.img"), b"disk").unwrap();
        std::fs::write(dir.join(MANIFEST), manifest("memory", "disk.img")).unwrap();
        let disk = std::fs::metadata(dir.join("disk.img")).unwrap();
        let mut new = NewSnapshot::begin(&dir).unwrap();
        let memory = new.name("memory", "");
        let vcpu = new.name("vcpu-0", "json");
        assert_ne!(memory, "memory");
        new.write(&memory, b"new memory").unwrap();
        new.write(&vcpu, b"{}").unwrap();
        new.commit(&manifest(&memory, &vcpu), &[(disk.dev(), disk.ino())])
            .unwrap();
        // The old memory is gone, the protected disk and the file outside stay.
        assert_eq!(
            names(&dir),
            [MANIFEST.to_string(), "disk.img".into(), memory, vcpu]
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
        );
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        std::fs::remove_file(&outside).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_uncommitted_snapshot_leaves_the_old_one_as_it_was() {
        let dir = dir("abandon");
        std::fs::write(dir.join("memory"), b"old").unwrap();
        std::fs::write(dir.join(MANIFEST), manifest("memory", "vcpu-0.json")).unwrap();
        let before = names(&dir);
        {
            let mut new = NewSnapshot::begin(&dir).unwrap();
            let name = new.name("memory", "");
            new.write(&name, b"half").unwrap();
        }
        assert_eq!(names(&dir), before);
        assert_eq!(std::fs::read(dir.join("memory")).unwrap(), b"old");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_snapshot_mapped_by_a_vm_is_not_replaced() {
        let dir = dir("mapped");
        std::fs::write(dir.join("memory.x"), b"old").unwrap();
        std::fs::write(dir.join(MANIFEST), manifest("memory.x", "vcpu-0.json")).unwrap();
        let mapped = File::open(dir.join("memory.x")).unwrap();
        let shared = Flock::lock(mapped, FlockArg::LockSharedNonblock).unwrap();
        let before = names(&dir);
        let err = NewSnapshot::begin(&dir).err().unwrap();
        assert!(matches!(err, SnapshotError::InUse { .. }), "{err}");
        assert!(err.to_string().contains("write the snapshot elsewhere"));
        assert_eq!(names(&dir), before);
        drop(shared);
        assert!(NewSnapshot::begin(&dir).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn new_files_are_never_written_through_links() {
        let dir = dir("links");
        let target = dir.join("target");
        std::fs::write(&target, b"target").unwrap();
        let mut new = NewSnapshot::begin(&dir).unwrap();
        let name = new.name("memory", "");
        std::os::unix::fs::symlink(&target, dir.join(&name)).unwrap();
        assert!(new.write(&name, b"guest memory").is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"target");
        let file = dir.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            NewSnapshot::begin(&file),
            Err(SnapshotError::NotADirectory { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
