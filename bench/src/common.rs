//! What every experiment shares: its common flags, and where its lull binary, guests and logs
//! are.

use std::path::PathBuf;

use clap::Args;

use super::children;
use super::error::BenchError;

/// Flags of every experiment: where the VMs come from and where the results go.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Write the results as JSON here (schema in docs/bench/README.md).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// lull binary for the VMs. Default: this one.
    #[arg(long, value_name = "PATH")]
    pub lull: Option<PathBuf>,
    /// Guest kit directory. Default: as `lull run` finds it ($LULL_KIT, target/kit).
    #[arg(long, value_name = "DIR")]
    pub kit: Option<PathBuf>,
    /// Keep the VMs' consoles, stderr and metrics here. Default: a directory under /tmp.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
}

/// The lull binary to launch: `--lull`, else this very executable.
pub(crate) fn lull_binary(flag: Option<&PathBuf>) -> Result<PathBuf, BenchError> {
    match flag {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe().map_err(BenchError::NoLull),
    }
}

/// The directory for the VMs' logs: `--work-dir`, else a new one under the temp directory.
pub(crate) fn work_dir(flag: Option<&PathBuf>) -> Result<PathBuf, BenchError> {
    let dir = flag
        .cloned()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("lull-bench-{}", std::process::id())));
    std::fs::create_dir_all(&dir).map_err(|e| BenchError::Io(dir.clone(), e))?;
    Ok(dir)
}

/// lull's `--metrics` JSON of a run, if it wrote one that parses.
pub(crate) fn read_metrics(path: &std::path::Path) -> Option<lull_schema::RunReport> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// A guest given by name (looked up in the kit's `guests/`) or by path.
pub(crate) fn guest_path(name: &str, kit: Option<&PathBuf>) -> Result<PathBuf, BenchError> {
    let direct = PathBuf::from(name);
    let path = if name.contains('/') || name.ends_with(".elf") {
        direct
    } else {
        kit.cloned()
            .unwrap_or_else(kit::kit_dir)
            .join("guests")
            .join(format!("{name}.elf"))
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(BenchError::NoGuest(path))
    }
}

/// Whether `lull run --help` of `lull` offers `flag` (the idle manager's flags arrive
/// separately; the bench leaves out what the binary lacks and says so).
pub(crate) fn lull_has_flag(lull: &std::path::Path, flag: &str) -> bool {
    children::guard(&mut std::process::Command::new(lull))
        .args(["run", "--help"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}
