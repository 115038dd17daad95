//! How a restore gives the new VM its snapshot's memory (`lull run --memory-restore`,
//! `vm.restore`'s and `--restore`'s `memory_restore_mode`).

use serde::{Deserialize, Serialize};

/// How a restored VM gets the snapshot's guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum MemoryRestoreMode {
    /// Map the snapshot's memory file copy-on-write (`MAP_PRIVATE`): a page is read from the
    /// file (the host's page cache, shared by every VM restored from the same snapshot) when
    /// the guest first touches it and copied only when the guest writes it. Restoring costs
    /// no copy, and clones of one snapshot share what they have not written. The snapshot
    /// must stay as it is while a VM maps it (lull refuses to write over it).
    #[default]
    Map,
    /// Copy the snapshot's data into fresh anonymous memory (Cloud Hypervisor's `copy`): the
    /// VM owns every page at once and the snapshot may be changed or deleted afterwards.
    Copy,
}

impl MemoryRestoreMode {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Map => "map",
            Self::Copy => "copy",
        }
    }
}

/// What a restore asks of the snapshot's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryRestore {
    /// Map or copy.
    pub mode: MemoryRestoreMode,
    /// Read every page of the snapshot in at restore (Cloud Hypervisor's `prefault`): with
    /// [`MemoryRestoreMode::Map`] the mapping is populated at once, still shared; a copy reads
    /// every page of data anyway.
    pub prefault: bool,
}
