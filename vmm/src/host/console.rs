//! The guest's serial console on the host: where its output goes, how stdin reaches it, and
//! the terminal mode while lull runs.
//!
//! Input is passed through byte for byte, Ctrl-C included. Ctrl-A then `x` stops the VM;
//! Ctrl-A twice sends one Ctrl-A.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Told, once, that the console's file could not be written (with the message to stop on).
pub type SinkFailureHook = Box<dyn Fn(String) + Send + Sync>;

/// Where guest console output goes. Output is flushed at every newline.
pub enum ConsoleSink {
    /// lull's standard output.
    Stdout(io::Stdout),
    /// A file, appended to. A write that fails (a full disk, `/dev/full`) is not dropped in
    /// silence: the hook hears of the first one (lull stops the VM: its output is lost).
    File {
        /// The file.
        file: File,
        /// Its path, for the message.
        path: PathBuf,
        /// Set by the VM once it can be stopped.
        on_failure: Arc<OnceLock<SinkFailureHook>>,
    },
    /// A pseudo-terminal's main side (`super::pty`), written without blocking: output that
    /// does not fit (no client reads) is dropped, and a vCPU never waits for a client.
    Pty(Arc<File>),
    /// Dropped.
    Null,
}

impl ConsoleSink {
    /// Opens `path` for appending, as an output (`super::files::open_output`: no link
    /// followed, a regular file or a character device).
    pub fn file(path: &Path) -> io::Result<Self> {
        super::files::open_output(path, super::files::OutputMode::Append)
            .map(|file| Self::from_file(file, path.to_path_buf()))
    }

    /// A sink on `file`, opened elsewhere, named `path` in messages.
    pub fn from_file(file: File, path: PathBuf) -> Self {
        Self::File {
            file,
            path,
            on_failure: Arc::new(OnceLock::new()),
        }
    }

    /// Where to set the hook told of a failed write (`None`: this sink cannot fail).
    pub fn failure_hook(&self) -> Option<Arc<OnceLock<SinkFailureHook>>> {
        match self {
            Self::File { on_failure, .. } => Some(on_failure.clone()),
            _ => None,
        }
    }
}

/// Tells `hook` (if set) that writing `path` failed with `e`.
fn report_failure(hook: &OnceLock<SinkFailureHook>, path: &Path, e: &io::Error) {
    if let Some(hook) = hook.get() {
        hook(format!(
            "cannot write the serial console to {}: {e}; the guest's output would be lost \
             (free space or choose another --serial file=)",
            path.display()
        ));
    }
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Stdout(s) => {
                let mut lock = s.lock();
                let n = lock.write(buf)?;
                if buf[..n].contains(&b'\n') {
                    lock.flush()?;
                }
                Ok(n)
            }
            Self::File {
                file,
                path,
                on_failure,
            } => file
                .write(buf)
                .inspect_err(|e| report_failure(on_failure, path, e)),
            Self::Pty(main) => match (&**main).write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(buf.len()),
                // No client side (EIO): nobody to see it.
                Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(buf.len()),
                other => other,
            },
            Self::Null => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Stdout(s) => s.flush(),
            Self::File { file, .. } => file.flush(),
            Self::Pty(_) | Self::Null => Ok(()),
        }
    }
}

/// The console escape: Ctrl-A.
const ESCAPE: u8 = 0x01;

/// What the escape filter makes of host input.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Filtered {
    /// Bytes for the guest.
    pub to_guest: Vec<u8>,
    /// The user typed Ctrl-A x.
    pub quit: bool,
}

/// Strips the Ctrl-A escape sequences out of host input.
#[derive(Debug, Default)]
pub struct EscapeFilter {
    pending_escape: bool,
}

impl EscapeFilter {
    /// Filters one chunk of input.
    pub fn feed(&mut self, input: &[u8]) -> Filtered {
        let mut out = Filtered::default();
        for &b in input {
            if self.pending_escape {
                self.pending_escape = false;
                match b {
                    b'x' | b'X' => {
                        out.quit = true;
                        return out;
                    }
                    ESCAPE => out.to_guest.push(ESCAPE),
                    other => out.to_guest.extend_from_slice(&[ESCAPE, other]),
                }
            } else if b == ESCAPE {
                self.pending_escape = true;
            } else {
                out.to_guest.push(b);
            }
        }
        out
    }
}

/// Reads what is available on stdin without blocking forever (called when epoll says readable).
pub fn read_stdin(buf: &mut [u8]) -> io::Result<usize> {
    io::stdin().lock().read(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_file_write_is_reported_once_set() {
        let mut sink = ConsoleSink::file(Path::new("/dev/full")).unwrap();
        assert!(sink.write(b"lost\n").is_err());
        let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = heard.clone();
        let hook = sink.failure_hook().unwrap();
        assert!(hook
            .set(Box::new(move |m| into.lock().unwrap().push(m)))
            .is_ok());
        assert!(sink.write(b"lost\n").is_err());
        let heard = heard.lock().unwrap();
        assert_eq!(heard.len(), 1);
        assert!(heard[0].contains("/dev/full"), "{heard:?}");
        assert!(ConsoleSink::Null.failure_hook().is_none());
    }

    #[test]
    fn escape_sequences() {
        let mut f = EscapeFilter::default();
        assert_eq!(f.feed(b"ls\r").to_guest, b"ls\r");
        let out = f.feed(&[ESCAPE]);
        assert!(out.to_guest.is_empty() && !out.quit);
        assert_eq!(f.feed(&[ESCAPE]).to_guest, vec![ESCAPE]);
        assert_eq!(f.feed(&[ESCAPE, b'c']).to_guest, vec![ESCAPE, b'c']);
        let out = f.feed(&[b'a', ESCAPE, b'x', b'b']);
        assert_eq!(out.to_guest, b"a");
        assert!(out.quit);
    }

    #[test]
    fn null_sink_swallows() {
        let mut s = ConsoleSink::Null;
        assert_eq!(s.write(b"abc").unwrap(), 3);
    }
}
