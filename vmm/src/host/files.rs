//! How lull opens the files it writes and the files it reads from a snapshot: the one place of
//! the rule that no path can turn lull against the host.
//!
//! ```text
//!  output (--metrics, --serial file=, --log-file)    open_output: O_NOFOLLOW, O_NONBLOCK;
//!                                                      a regular file or a character device
//!  new snapshot file (DIR/memory.TOKEN ...)          create_new: O_CREAT|O_EXCL|O_NOFOLLOW
//!                                                      (never an existing file, never a link)
//!  snapshot file read back (manifest, state, memory) open_input: O_NOFOLLOW, O_NONBLOCK;
//!                                                      a regular file only
//!  --event-monitor path=P                            open_event_monitor: O_NOFOLLOW, O_TRUNC;
//!                                                      a regular file, a FIFO (waited on until
//!                                                      its reader opens it, as Cloud
//!                                                      Hypervisor does) or a character device
//! ```
//! A symbolic link at the last component is refused (ELOOP), not followed: a link planted where
//! lull writes cannot point it at another file. `O_NONBLOCK` makes opening a FIFO return at
//! once (a FIFO with no writer would block `open()` forever; one opened for writing with no
//! reader fails ENXIO), and the file's type is checked on the open descriptor, so what is
//! checked is what is used. Whether an output is one of the VM's inputs is `vm::paths`'
//! question, asked before these opens.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::stat::Mode;

/// `open(2)` flags of an output appended to (the seccomp filters allow exactly these).
pub const OUTPUT_APPEND: i32 = libc::O_WRONLY
    | libc::O_CREAT
    | libc::O_APPEND
    | libc::O_NOFOLLOW
    | libc::O_NONBLOCK
    | libc::O_CLOEXEC;
/// `open(2)` flags of an output replaced (the `--metrics` report).
pub const OUTPUT_REPLACE: i32 = libc::O_WRONLY
    | libc::O_CREAT
    | libc::O_TRUNC
    | libc::O_NOFOLLOW
    | libc::O_NONBLOCK
    | libc::O_CLOEXEC;
/// `open(2)` flags of the event monitor's file: blocking, so that a FIFO waits for its reader
/// (libvirt opens it once lull runs), then written without blocking.
pub const EVENT_MONITOR: i32 =
    libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC;
/// `open(2)` flags of a new snapshot file.
pub const CREATE_NEW: i32 =
    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
/// `open(2)` flags of a snapshot file read back.
pub const INPUT: i32 = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

/// Why lull refuses to open a file.
#[derive(Debug, thiserror::Error)]
pub enum FileRefused {
    /// The path's last component is a symbolic link.
    #[error("it is a symbolic link, which lull does not follow here: give the file's own path")]
    Symlink,
    /// The path is not a file of the kind expected.
    #[error("it is {found}, not {want}: give the path of {want}")]
    Kind {
        /// What it is (`a FIFO`, `a directory`...).
        found: &'static str,
        /// What lull wants there.
        want: &'static str,
    },
}

/// How an output is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Appended to (the serial console, the log).
    Append,
    /// Replaced (the `--metrics` report): a regular file is emptied (`O_TRUNC`; a FIFO or a
    /// device ignores it).
    Replace,
}

/// What `meta`'s file is, in words.
fn kind_of(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// Opens `path` with exactly `flags` (and `mode` if it creates it); ELOOP (`O_NOFOLLOW` met
/// a link) as [`FileRefused::Symlink`].
fn open(path: &Path, flags: i32, mode: u32) -> io::Result<File> {
    let mode = Mode::from_bits_truncate(mode);
    match nix::fcntl::open(path, OFlag::from_bits_retain(flags), mode) {
        Ok(fd) => Ok(File::from(fd)),
        Err(nix::errno::Errno::ELOOP) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            FileRefused::Symlink,
        )),
        Err(e) => Err(e.into()),
    }
}

/// Fails unless `file` is a regular file (or, with `char_device_ok`, a character device).
fn check_kind(file: &File, char_device_ok: bool) -> io::Result<()> {
    let file_type = file.metadata()?.file_type();
    if file_type.is_file() || (char_device_ok && file_type.is_char_device()) {
        return Ok(());
    }
    let want = if char_device_ok {
        "a regular file or a character device"
    } else {
        "a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        FileRefused::Kind {
            found: kind_of(file_type),
            want,
        },
    ))
}

/// Clears `O_NONBLOCK` on `file` once it is open (a character device such as a terminal is
/// then written as usual).
fn blocking(file: &File) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(file, FcntlArg::F_GETFL)?);
    fcntl(file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Opens the output `path` (created if missing) without following a link at its last
/// component; refuses what is neither a regular file nor a character device (`/dev/null`,
/// a terminal). With [`OutputMode::Replace`] the file is emptied once checked.
pub fn open_output(path: &Path, mode: OutputMode) -> io::Result<File> {
    let flags = match mode {
        OutputMode::Append => OUTPUT_APPEND,
        OutputMode::Replace => OUTPUT_REPLACE,
    };
    let file = open(path, flags, 0o644)?;
    check_kind(&file, true)?;
    blocking(&file)?;
    Ok(file)
}

/// Opens the event monitor's file `path` (`--event-monitor path=`), created if missing,
/// without following a link at its last component: a regular file (emptied), a character
/// device, or a FIFO, whose open waits until a reader opens it (Cloud Hypervisor's
/// `File::create` does the same; libvirt opens the FIFO's reading end once lull runs). The
/// file is then made non-blocking: a reader that stops reading costs it events, never a
/// stalled lull.
pub fn open_event_monitor(path: &Path) -> io::Result<File> {
    let file = open(path, EVENT_MONITOR, 0o600)?;
    let file_type = file.metadata()?.file_type();
    if !(file_type.is_file() || file_type.is_fifo() || file_type.is_char_device()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            FileRefused::Kind {
                found: kind_of(file_type),
                want: "a regular file, a FIFO or a character device",
            },
        ));
    }
    let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
    fcntl(&file, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(file)
}

/// Creates the new file `path`, owner-only, failing if anything (a file, a link) is there.
pub fn create_new(path: &Path) -> io::Result<File> {
    open(path, CREATE_NEW, 0o600)
}

/// Opens `path` to read it, refusing a link at its last component and anything but a regular
/// file (a FIFO, a device or a directory is refused at once, never waited on).
pub fn open_input(path: &Path) -> io::Result<File> {
    let file = open(path, INPUT, 0)?;
    check_kind(&file, false)?;
    blocking(&file)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("lull-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn refused(e: &io::Error) -> String {
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        e.to_string()
    }

    #[test]
    fn the_event_monitor_opens_a_fifo_once_read_and_refuses_links() {
        let dir = dir("events");
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        let mut file = open_event_monitor(&fifo).unwrap();
        file.write_all(b"{}").unwrap();
        drop(file);
        assert_eq!(reader.join().unwrap(), b"{}");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        let e = open_event_monitor(&link).unwrap_err();
        assert!(refused(&e).contains("symbolic link"), "{e}");
        let e = open_event_monitor(&dir).unwrap_err();
        assert!(e.raw_os_error() == Some(libc::EISDIR) || e.kind() == io::ErrorKind::InvalidInput);
    }

    #[test]
    fn links_fifos_and_directories_are_refused_and_not_followed() {
        let dir = dir("refused");
        let target = dir.join("kernel");
        std::fs::write(&target, b"kernel").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        for mode in [OutputMode::Append, OutputMode::Replace] {
            let e = open_output(&link, mode).unwrap_err();
            assert!(refused(&e).contains("symbolic link"), "{e}");
            // No reader: a FIFO opened for writing fails at once, whatever the error.
            assert!(open_output(&fifo, mode).is_err());
        }
        assert!(create_new(&link).is_err());
        assert!(create_new(&target).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"kernel");
        // Reading: a FIFO with no writer would block a plain open() forever.
        let e = open_input(&fifo).unwrap_err();
        assert!(refused(&e).contains("a FIFO, not a regular file"), "{e}");
        let e = open_input(&dir).unwrap_err();
        assert!(refused(&e).contains("a directory"), "{e}");
        let e = open_input(&link).unwrap_err();
        assert!(refused(&e).contains("symbolic link"), "{e}");
        assert!(open_input(Path::new("/dev/zero")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn outputs_append_or_replace_and_devices_are_written() {
        let dir = dir("outputs");
        let path = dir.join("out");
        open_output(&path, OutputMode::Append)
            .unwrap()
            .write_all(b"one\n")
            .unwrap();
        open_output(&path, OutputMode::Append)
            .unwrap()
            .write_all(b"two\n")
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"one\ntwo\n");
        open_output(&path, OutputMode::Replace)
            .unwrap()
            .write_all(b"3\n")
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"3\n");
        open_output(Path::new("/dev/null"), OutputMode::Replace)
            .unwrap()
            .write_all(b"x")
            .unwrap();
        let new = dir.join("new");
        create_new(&new).unwrap().write_all(b"n").unwrap();
        assert_eq!(open_input(&new).map(drop).ok(), Some(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
