//! A terminal on stdin in raw input mode, restored when dropped.
//!
//! Not vmm-sys-util's `Terminal`: its `set_raw_mode` clears only `ICANON | ECHO | ISIG`, so
//! the tty would still turn Enter into `\n` (`ICRNL`), swallow Ctrl-S/Ctrl-Q (`IXON`) and
//! Ctrl-V (`IEXTEN`) before the guest sees them, and its `set_canon_mode` sets those three
//! flags again instead of restoring the settings lull found. nix's termios calls do the same
//! `tcgetattr`/`tcsetattr` as before, without `unsafe` here.

use std::io::{self, IsTerminal};

use nix::sys::termios::{
    tcgetattr, tcsetattr, InputFlags, LocalFlags, SetArg, SpecialCharacterIndices, Termios,
};

/// Puts a terminal on stdin into a mode that passes keys straight to the guest, and restores
/// it when dropped. Output processing stays on, so the guest's `\n` still moves to column 0.
pub struct RawTerminal {
    saved: Termios,
}

impl RawTerminal {
    /// Switches stdin to raw input if it is a terminal; `None` if it is not.
    pub fn enable() -> Option<Self> {
        let stdin = io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG | LocalFlags::IEXTEN);
        raw.input_flags
            .remove(InputFlags::IXON | InputFlags::ICRNL | InputFlags::INLCR | InputFlags::IGNCR);
        raw.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
        raw.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(Self { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // Restores the settings read from this same terminal in `enable`.
        let _ = tcsetattr(io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}
