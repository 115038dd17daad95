//! The MC146818 CMOS RTC and NVRAM at ports 0x70 (index) and 0x71 (data).
//!
//! Reads of the time registers return the host's UTC time in BCD, 24-hour mode; the status
//! registers say "valid, no update in progress"; everything else is 128 bytes of NVRAM that
//! keep what the guest writes (Linux writes the warm-reset code at 0x0F when it starts APs).

use crate::pio::{MachineRequest, PioDevice};

/// Base port of the CMOS.
pub const CMOS_PORT: u16 = 0x70;
/// Ports spanned (index, data).
pub const CMOS_PORT_COUNT: u16 = 2;

const REG_SECONDS: u8 = 0x00;
const REG_MINUTES: u8 = 0x02;
const REG_HOURS: u8 = 0x04;
const REG_WEEKDAY: u8 = 0x06;
const REG_DAY: u8 = 0x07;
const REG_MONTH: u8 = 0x08;
const REG_YEAR: u8 = 0x09;
const REG_A: u8 = 0x0a;
const REG_B: u8 = 0x0b;
const REG_C: u8 = 0x0c;
const REG_D: u8 = 0x0d;
const REG_CENTURY: u8 = 0x32;
/// 32.768 kHz time base, 1024 Hz rate; UIP clear.
const STATUS_A: u8 = 0x26;
/// 24-hour mode, BCD, no interrupts.
const STATUS_B: u8 = 0x02;
/// Valid RAM and time.
const STATUS_D: u8 = 0x80;

/// A calendar time, as the RTC shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: u64,
    month: u64,
    day: u64,
    weekday: u64,
    hour: u64,
    minute: u64,
    second: u64,
}

/// UTC calendar time of `unix` seconds (Howard Hinnant's days-to-civil algorithm).
fn civil(unix: u64) -> Civil {
    let days = unix / 86_400;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    Civil {
        year,
        month,
        day,
        weekday: (days + 4) % 7 + 1, // 1970-01-01 was a Thursday; RTC Sunday = 1
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
    }
}

fn bcd(v: u64) -> u8 {
    let v = v % 100;
    u8::try_from(((v / 10) << 4) | (v % 10)).unwrap_or(0)
}

/// The CMOS device; `now` gives the host's UTC time in Unix seconds.
pub struct Cmos {
    index: u8,
    nvram: [u8; 128],
    now: Box<dyn Fn() -> u64 + Send>,
}

impl Cmos {
    /// A CMOS whose clock reads `now()`.
    pub fn new(now: Box<dyn Fn() -> u64 + Send>) -> Self {
        Self {
            index: 0,
            nvram: [0; 128],
            now,
        }
    }

    /// A CMOS on the host's real-time clock.
    pub fn with_host_clock() -> Self {
        Self::new(Box::new(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        }))
    }

    fn register(&self, index: u8) -> u8 {
        let t = civil((self.now)());
        match index {
            REG_SECONDS => bcd(t.second),
            REG_MINUTES => bcd(t.minute),
            REG_HOURS => bcd(t.hour),
            REG_WEEKDAY => bcd(t.weekday),
            REG_DAY => bcd(t.day),
            REG_MONTH => bcd(t.month),
            REG_YEAR => bcd(t.year),
            REG_CENTURY => bcd(t.year / 100),
            REG_A => STATUS_A,
            REG_B => STATUS_B,
            REG_C => 0,
            REG_D => STATUS_D,
            other => self.nvram[usize::from(other & 0x7f)],
        }
    }
}

impl PioDevice for Cmos {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        data.fill(0);
        let value = if offset == 0 {
            self.index
        } else {
            self.register(self.index)
        };
        if let Some(first) = data.first_mut() {
            *first = value;
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<MachineRequest> {
        let value = *data.first()?;
        if offset == 0 {
            // Bit 7 is the NMI mask, not part of the index.
            self.index = value & 0x7f;
        } else if !matches!(self.index, REG_SECONDS..=REG_D) {
            self.nvram[usize::from(self.index)] = value;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(cmos: &mut Cmos, index: u8) -> u8 {
        cmos.write(0, &[index | 0x80]);
        let mut b = [0u8];
        cmos.read(1, &mut b);
        b[0]
    }

    #[test]
    fn time_registers_are_bcd_utc() {
        // 2026-11-30 14:05:09 UTC, a Monday.
        let mut cmos = Cmos::new(Box::new(|| 1_796_047_509));
        assert_eq!(read(&mut cmos, REG_SECONDS), 0x09);
        assert_eq!(read(&mut cmos, REG_MINUTES), 0x05);
        assert_eq!(read(&mut cmos, REG_HOURS), 0x14);
        assert_eq!(read(&mut cmos, REG_DAY), 0x30);
        assert_eq!(read(&mut cmos, REG_MONTH), 0x11);
        assert_eq!(read(&mut cmos, REG_YEAR), 0x26);
        assert_eq!(read(&mut cmos, REG_CENTURY), 0x20);
        assert_eq!(read(&mut cmos, REG_WEEKDAY), 2);
        assert_eq!(read(&mut cmos, REG_D), STATUS_D);
    }

    #[test]
    fn nvram_keeps_writes_and_clock_ignores_them() {
        let mut cmos = Cmos::new(Box::new(|| 0));
        cmos.write(0, &[0x0f]);
        cmos.write(1, &[0x0a]);
        assert_eq!(read(&mut cmos, 0x0f), 0x0a);
        cmos.write(0, &[REG_SECONDS]);
        cmos.write(1, &[0x59]);
        assert_eq!(read(&mut cmos, REG_SECONDS), 0);
        assert_eq!(civil(0).year, 1970);
        assert_eq!(
            civil(951_782_400),
            Civil {
                year: 2000,
                month: 2,
                day: 29,
                weekday: 3,
                hour: 0,
                minute: 0,
                second: 0
            }
        );
    }
}
