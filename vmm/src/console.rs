//! The guest's serial console on the host: where its output goes, how stdin reaches it, and
//! the terminal mode while lull runs.
//!
//! Input is passed through byte for byte, Ctrl-C included. Ctrl-A then `x` stops the VM;
//! Ctrl-A twice sends one Ctrl-A.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;

/// Where guest console output goes. Output is flushed at every newline.
pub enum ConsoleSink {
    /// lull's standard output.
    Stdout(io::Stdout),
    /// A file, appended to.
    File(File),
    /// Dropped.
    Null,
}

impl ConsoleSink {
    /// Opens `path` for appending.
    pub fn file(path: &Path) -> io::Result<Self> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(Self::File)
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
            Self::File(f) => f.write(buf),
            Self::Null => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Stdout(s) => s.flush(),
            Self::File(f) => f.flush(),
            Self::Null => Ok(()),
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
