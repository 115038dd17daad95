//! A terminal on stdin in raw input mode, restored when dropped.

use std::io;
use std::os::fd::AsRawFd;

/// Puts a terminal on stdin into a mode that passes keys straight to the guest, and restores
/// it when dropped. Output processing stays on, so the guest's `\n` still moves to column 0.
pub struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    /// Switches stdin to raw input if it is a terminal; `None` if it is not.
    pub fn enable() -> Option<Self> {
        let fd = io::stdin().as_raw_fd();
        // SAFETY: isatty only inspects the descriptor number.
        if unsafe { libc::isatty(fd) } != 1 {
            return None;
        }
        // SAFETY: termios is plain old data; tcgetattr fills it for a valid terminal fd.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is a terminal (checked above) and `saved` is a valid termios to fill.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG | libc::IEXTEN);
        raw.c_iflag &= !(libc::IXON | libc::ICRNL | libc::INLCR | libc::IGNCR);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: `fd` is a terminal and `raw` a termios derived from its current settings.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(Self { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let fd = io::stdin().as_raw_fd();
        // SAFETY: restores the settings read from this same terminal in `enable`.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &self.saved) };
    }
}
