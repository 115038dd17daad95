//! Host interrupts per CPU from `<root>/proc/interrupts`: local timer (`LOC`) and rescheduling
//! (`RES`) interrupts per second over a window.
//!
//! ```text
//!            CPU0       CPU1                         a header of the online CPUs
//!  24:          1          0  IO-APIC   5-edge      ACPI:Ged      IRQ: a count per CPU, then
//! LOC:    3841433    3787801   Local timer interrupts               who raised it
//! RES:     397193     264095   Rescheduling interrupts
//! ERR:          0                                                 one system-wide count
//! ```
//!
//! The kernel keeps these counts in 32 bits (`%10u`): a delta across one wrap is corrected.
//! Where a row's label is not `LOC` or `RES` (arm64 numbers its IPIs: `IPI0: ... Rescheduling
//! interrupts`) the description finds it.

use std::path::Path;

use super::read_file::ReadFile;

/// One row: a label, its counts (per CPU, or one), and its description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The label before the colon (`24`, `LOC`, `ERR`).
    pub label: String,
    /// The counts: one per CPU of the header, or fewer (`ERR`, `MIS`: one).
    pub counts: Vec<u64>,
    /// What follows the counts (chip, hardware IRQ, name), blanks folded.
    pub description: String,
}

/// `/proc/interrupts` at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interrupts {
    /// The CPU numbers of the header's columns.
    pub cpus: Vec<u32>,
    /// Every row, in file order.
    pub rows: Vec<Row>,
}

/// The interrupts that wake host CPUs that are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Local timer interrupts (`LOC`).
    LocalTimer,
    /// Rescheduling interrupts (`RES`): an IPI that wakes a CPU for a task.
    Reschedule,
    /// Function call interrupts (`CAL`): an IPI that runs a function on another CPU.
    FunctionCall,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::LocalTimer => "LOC",
            Kind::Reschedule => "RES",
            Kind::FunctionCall => "CAL",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Kind::LocalTimer => "Local timer interrupts",
            Kind::Reschedule => "Rescheduling interrupts",
            Kind::FunctionCall => "Function call interrupts",
        }
    }
}

/// Why interrupts are not counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterruptsError {
    /// The file could not be read.
    #[error("cannot read {0}: {1}")]
    Read(String, String),
    /// The header of CPUs is missing.
    #[error("/proc/interrupts has no header of CPUs: {0:?}")]
    NoHeader(String),
    /// A row is malformed.
    #[error("/proc/interrupts line {0} is not `LABEL: counts description`: {1:?}")]
    BadRow(usize, String),
    /// No row of that kind.
    #[error("/proc/interrupts has no {0} row ({1}) on this architecture")]
    NoRow(&'static str, &'static str),
    /// The CPUs changed during the window.
    #[error("the online CPUs changed during the window (CPU hotplug): interrupts not counted")]
    CpusChanged,
    /// A count went back further than a 32-bit wrap explains.
    #[error("the {0} count of CPU {1} went back from {2} to {3}")]
    WentBack(&'static str, u32, u64, u64),
    /// The window has no length.
    #[error("the window has no length")]
    EmptyWindow,
}

/// Reads `<root>/proc/interrupts`.
pub fn sample(root: &Path, fs: &dyn ReadFile) -> Result<Interrupts, InterruptsError> {
    let path = root.join("proc/interrupts");
    let text = fs
        .read(&path)
        .map_err(|e| InterruptsError::Read(path.display().to_string(), e.to_string()))?;
    parse(&text)
}

/// Parses the text of `/proc/interrupts`.
pub fn parse(text: &str) -> Result<Interrupts, InterruptsError> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let cpus: Vec<u32> = header
        .split_whitespace()
        .map(|t| t.strip_prefix("CPU").and_then(|n| n.parse().ok()))
        .collect::<Option<_>>()
        .filter(|c: &Vec<u32>| !c.is_empty())
        .ok_or_else(|| InterruptsError::NoHeader(header.to_string()))?;
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || InterruptsError::BadRow(i + 2, line.to_string());
        let (label, rest) = line.split_once(':').ok_or_else(bad)?;
        let mut tokens = rest.split_whitespace().peekable();
        let mut counts = Vec::new();
        // At most one count per CPU: a description may start with a number (arm's GIC).
        while counts.len() < cpus.len() {
            match tokens.peek().and_then(|t| t.parse::<u64>().ok()) {
                Some(n) => {
                    counts.push(n);
                    tokens.next();
                }
                None => break,
            }
        }
        if counts.is_empty() {
            return Err(bad());
        }
        rows.push(Row {
            label: label.trim().to_string(),
            counts,
            description: tokens.collect::<Vec<_>>().join(" "),
        });
    }
    Ok(Interrupts { cpus, rows })
}

impl Interrupts {
    /// The row of `kind`: by its x86 label, else by its description.
    pub fn row(&self, kind: Kind) -> Result<&Row, InterruptsError> {
        self.rows
            .iter()
            .find(|r| r.label == kind.label())
            .or_else(|| {
                self.rows
                    .iter()
                    .find(|r| r.description == kind.description())
            })
            .filter(|r| r.counts.len() == self.cpus.len())
            .ok_or(InterruptsError::NoRow(kind.label(), kind.description()))
    }
}

/// A 32-bit counter's increase from `before` to `after`, across one wrap.
fn delta32(before: u64, after: u64) -> Option<u64> {
    if after >= before {
        return Some(after - before);
    }
    let (b, a) = (u32::try_from(before).ok()?, u32::try_from(after).ok()?);
    Some(u64::from(a.wrapping_sub(b)))
}

/// Interrupts of `kind` per second over all CPUs from `before` to `after`, `seconds` apart.
pub fn per_second(
    before: &Interrupts,
    after: &Interrupts,
    kind: Kind,
    seconds: f64,
) -> Result<f64, InterruptsError> {
    if seconds <= 0.0 {
        return Err(InterruptsError::EmptyWindow);
    }
    if before.cpus != after.cpus {
        return Err(InterruptsError::CpusChanged);
    }
    let (from, to) = (before.row(kind)?, after.row(kind)?);
    let mut total = 0;
    for ((&cpu, &a), &b) in after.cpus.iter().zip(&from.counts).zip(&to.counts) {
        total += delta32(a, b).ok_or(InterruptsError::WentBack(kind.label(), cpu, a, b))?;
    }
    Ok(total as f64 / seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/power");
        std::fs::read_to_string(dir.join(name)).unwrap()
    }

    #[test]
    fn a_real_two_cpu_host_over_one_second() {
        let a = parse(&fixture("interrupts-2cpu-a.txt")).unwrap();
        let b = parse(&fixture("interrupts-2cpu-b.txt")).unwrap();
        assert_eq!(a.cpus, [0, 1]);
        assert_eq!(a.rows.len(), 35);
        assert_eq!(
            a.rows[0],
            Row {
                label: "24".into(),
                counts: vec![1, 0],
                description: "IO-APIC 5-edge ACPI:Ged".into(),
            }
        );
        let err = a.rows.iter().find(|r| r.label == "ERR").unwrap();
        assert_eq!(
            (err.counts.as_slice(), err.description.as_str()),
            (&[0][..], "")
        );
        assert_eq!(
            a.row(Kind::LocalTimer).unwrap().counts,
            [3_870_659, 3_818_623]
        );
        // LOC: 3870943 - 3870659 + 3818906 - 3818623; RES: 400795 - 400754 + 266884 - 266797.
        assert_eq!(per_second(&a, &b, Kind::LocalTimer, 1.0), Ok(567.0));
        assert_eq!(per_second(&a, &b, Kind::Reschedule, 0.5), Ok(256.0));
    }

    #[test]
    fn a_real_four_cpu_host_and_its_counts_wrapping_at_32_bits() {
        let a = parse(&fixture("interrupts-4cpu.txt")).unwrap();
        assert_eq!(a.cpus, [0, 1, 2, 3]);
        assert_eq!(
            a.row(Kind::Reschedule).unwrap().counts,
            [525_229_423, 2_791_640_970, 427_214_674, 1_986_396_041]
        );
        let irq = a.rows.iter().find(|r| r.label == "58").unwrap();
        assert_eq!(irq.counts, [3_587_929_355, 0, 0, 0]);
        assert_eq!(irq.description, "IR-PCI-MSI-edge eth3-TxRx-3");
        // CPU2's LOC count (4134846029) wraps: 2^32 - 4134846029 + 100 = 160121367, and CPU0 4 more.
        let mut b = a.clone();
        let loc = b.rows.iter_mut().find(|r| r.label == "LOC").unwrap();
        loc.counts[2] = 100;
        loc.counts[0] += 4;
        assert_eq!(per_second(&a, &b, Kind::LocalTimer, 1.0), Ok(160_121_371.0));
        assert_eq!(delta32(5, 1), Some(u64::from(u32::MAX) - 3));
        assert_eq!(delta32(1 << 33, 1), None, "not a 32-bit count");
    }

    #[test]
    fn arm64_numbers_its_ipis_and_is_found_by_description() {
        let text = "\
           CPU0       CPU1       CPU2       CPU3
 11:       3426         66        291        243     GICv3  27 Level     arch_timer
IPI0:         5         20          8         23       Rescheduling interrupts
IPI1:       530        204         91        155       Function call interrupts
Err:          0
";
        let t = parse(text).unwrap();
        assert_eq!(
            t.rows[0].description, "GICv3 27 Level arch_timer",
            "27 is no count"
        );
        assert_eq!(t.row(Kind::Reschedule).unwrap().counts, [5, 20, 8, 23]);
        assert_eq!(
            t.row(Kind::LocalTimer).unwrap_err().to_string(),
            "/proc/interrupts has no LOC row (Local timer interrupts) on this architecture"
        );
    }

    #[test]
    fn malformed_files_and_hotplug_say_why() {
        assert!(matches!(parse(""), Err(InterruptsError::NoHeader(_))));
        assert!(matches!(
            parse("garbage\n"),
            Err(InterruptsError::NoHeader(_))
        ));
        assert_eq!(
            parse("  CPU0\nLOC: x\n"),
            Err(InterruptsError::BadRow(2, "LOC: x".into()))
        );
        let a = parse("  CPU0 CPU1\nLOC: 5 6 Local timer interrupts\n").unwrap();
        let b = parse("  CPU0 CPU2\nLOC: 7 8 Local timer interrupts\n").unwrap();
        assert_eq!(
            per_second(&a, &b, Kind::LocalTimer, 1.0),
            Err(InterruptsError::CpusChanged)
        );
        let c = parse("  CPU0 CPU1\nLOC: 5 1099511627776 Local timer interrupts\n").unwrap();
        assert!(matches!(
            per_second(&c, &a, Kind::LocalTimer, 1.0),
            Err(InterruptsError::WentBack("LOC", 1, _, 6))
        ));
        assert_eq!(
            per_second(&a, &a, Kind::LocalTimer, 0.0),
            Err(InterruptsError::EmptyWindow)
        );
    }
}
