//! Building the tree: configuration, placing CPUs and groups, and growing a new root at run
//! time while other CPUs keep going idle and active.
//!
//! A CPU joins the first level-0 group of its NUMA node that has room, else a new group. A new
//! group needs a parent one level up, found or created the same way (groups below the
//! cross-node level only take children of their own node). When the top level would get a
//! second group, a new root is created above the old one first:
//!
//! ```text
//!   before:      [R]              after:          [N]          new root, one level up
//!               / .. \                           /    \
//!              c0 .. c7                        [R]    [G]       G: new group for the new CPU
//!                                             / .. \     \
//!                                            c0 .. c7    c8
//! ```
//!
//! Adopting the old root `R` is the only step that races with the hot paths, and it needs no
//! lock on them: fill `N`'s slot for `R` and store `R.parent = N`, then set `R`'s *linked*
//! bit with a compare-exchange on `R`'s state word that first initialises `N`'s state from
//! the state it replaces (`R` active: `N` has `R`'s bit and `R` as migrator; idle: `N` is
//! idle). Every walker's update of `R` is ordered against that exchange on the same word:
//! before it, the walker treated `R` as the root and `N` was initialised from its result;
//! after it, the walker sees the linked bit and updates `N` itself. Last, `R`'s first event
//! is queued in `N` under both queue locks, as any walk does.

use std::sync::OnceLock;

use super::ops::TRACE_TARGET;
use super::state::{self, GroupState, MAX_GROUP_SIZE};
use super::topology::{NodeId, Topology};
use super::tree::{Child, CpuNode, CpuState, Group, Hierarchy, NONE};
use crate::base::CpuId;
use crate::clock::NEVER;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// Errors from building or growing a [`Hierarchy`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HierarchyError {
    /// The group size is unusable.
    #[error("group size {0} is not a power of two between 2 and 32; use 8")]
    BadGroupSize(usize),
    /// No room for another CPU.
    #[error("the hierarchy already holds its maximum of {0} CPUs; raise max_cpus")]
    TooManyCpus(usize),
    /// The group table is exhausted (too many NUMA nodes for the configured size).
    #[error("no room for another timer group; raise max_cpus or max_nodes")]
    NoGroupSlots,
}

/// Shape of a [`Hierarchy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HierarchyConfig {
    /// Children per group: a power of two in 2..=32 (default 8).
    pub group_size: usize,
    /// Most CPUs the hierarchy can ever hold (default 4096); sizes the lock-free tables.
    pub max_cpus: usize,
    /// Most NUMA nodes expected (default 8); sizes the group table.
    pub max_nodes: usize,
    /// CPUs per node used to place the cross-node level; `None` derives it from the CPUs
    /// given to [`Hierarchy::new`].
    pub cpus_per_node: Option<usize>,
}

impl Default for HierarchyConfig {
    fn default() -> Self {
        Self {
            group_size: 8,
            max_cpus: 4096,
            max_nodes: 8,
            cpus_per_node: None,
        }
    }
}

/// Levels of groups needed so that one group holds `n` leaves.
fn levels_for(n: usize, gs: usize) -> usize {
    let (mut levels, mut span) = (0, 1);
    while span < n {
        span = span.saturating_mul(gs);
        levels += 1;
    }
    levels
}

impl Hierarchy {
    /// A hierarchy over CPUs `0..nodes.len()`, CPU `i` on NUMA node `nodes[i]`. Every CPU
    /// starts idle with no timers; a vCPU thread calls [`Hierarchy::activate`] before running.
    pub fn new(config: HierarchyConfig, nodes: &[NodeId]) -> Result<Self, HierarchyError> {
        let gs = config.group_size;
        if !gs.is_power_of_two() || !(2..=MAX_GROUP_SIZE).contains(&gs) {
            return Err(HierarchyError::BadGroupSize(gs));
        }
        let per_node = config.cpus_per_node.unwrap_or_else(|| {
            let mut counts = std::collections::HashMap::new();
            for n in nodes {
                *counts.entry(*n).or_insert(0usize) += 1;
            }
            counts.values().copied().max().unwrap_or(1)
        });
        let max_groups = 2 * (config.max_cpus / (gs - 1) + 1) + (config.max_nodes + 1) * 8;
        let h = Self {
            group_size: gs,
            crossnode_level: levels_for(per_node, gs).max(1),
            groups: (0..max_groups).map(|_| OnceLock::new()).collect(),
            cpus: (0..config.max_cpus).map(|_| OnceLock::new()).collect(),
            topo: std::sync::Mutex::new(Topology::default()),
            duty: Mutex::new(None),
            seq_step: 1,
        };
        for &n in nodes {
            h.add_cpu(n)?;
        }
        Ok(h)
    }

    /// A single-node hierarchy of `n` CPUs with groups of 8.
    pub fn with_cpus(n: usize) -> Result<Self, HierarchyError> {
        Self::new(HierarchyConfig::default(), &vec![0; n])
    }

    /// Most CPUs this hierarchy can hold (its configured `max_cpus`).
    pub fn max_cpus(&self) -> usize {
        self.cpus.len()
    }

    /// Number of CPUs added so far.
    pub fn num_cpus(&self) -> usize {
        self.topo().ncpus
    }

    /// Number of levels of groups.
    pub fn num_levels(&self) -> usize {
        self.topo().levels.len()
    }

    fn topo(&self) -> std::sync::MutexGuard<'_, Topology> {
        crate::lock(&self.topo)
    }

    /// Adds a CPU on `node` at run time and returns its id. The CPU starts idle. Safe while
    /// other CPUs activate, deactivate and handle remote timers.
    pub fn add_cpu(&self, node: NodeId) -> Result<CpuId, HierarchyError> {
        let mut topo = self.topo();
        let cpu = topo.ncpus;
        if cpu >= self.cpus.len() {
            return Err(HierarchyError::TooManyCpus(self.cpus.len()));
        }
        let (gid, slot, created) = self.find_or_create(&mut topo, 0, node)?;
        let g = self.group(gid);
        let _ = self.cpus[cpu].set(CpuNode {
            group: gid,
            slot,
            node,
            state: Mutex::new(CpuState {
                idle: true,
                remote: false,
                evt: NEVER,
            }),
            wake: AtomicU64::new(NEVER),
        });
        let _ = g.members[usize::from(slot)].set(Child::Cpu(cpu));
        topo.ncpus += 1;
        if created {
            self.attach(&mut topo, gid)?;
        }
        tracing::debug!(target: TRACE_TARGET, event = "cpu_added", cpu, node,
            group = gid, levels = topo.levels.len());
        Ok(cpu)
    }

    /// A group at `level` with room for a child of `node`, creating one if needed.
    fn find_or_create(
        &self,
        topo: &mut Topology,
        level: usize,
        node: NodeId,
    ) -> Result<(usize, u8, bool), HierarchyError> {
        if topo.levels.len() <= level {
            topo.levels.push(Vec::new());
        }
        let mixed = level >= self.crossnode_level;
        let found = topo.levels[level].iter().copied().find(|&id| {
            topo.nchildren[id] < self.group_size && (mixed || self.group(id).node == node)
        });
        let (id, created) = match found {
            Some(id) => (id, false),
            None => {
                let id = topo.nchildren.len();
                let slot = self.groups.get(id).ok_or(HierarchyError::NoGroupSlots)?;
                let _ = slot.set(Group::new(id, level, node, self.group_size));
                topo.nchildren.push(0);
                topo.levels[level].push(id);
                (id, true)
            }
        };
        // Slots are below the group size (at most 32).
        #[allow(clippy::cast_possible_truncation)]
        let slot = topo.nchildren[id] as u8;
        topo.nchildren[id] += 1;
        Ok((id, slot, created))
    }

    /// Gives the parentless group `gid` a parent, growing a new root first if `gid` is a
    /// second group on the top level.
    fn attach(&self, topo: &mut Topology, gid: usize) -> Result<(), HierarchyError> {
        let level = self.group(gid).level;
        if topo.levels.len() == level + 1 {
            if topo.levels[level].len() == 1 {
                return Ok(()); // The very first group: it is the root.
            }
            let old_root = topo.levels[level][0];
            let node = self.group(old_root).node;
            let (rid, slot, _) = self.find_or_create(topo, level + 1, node)?;
            self.adopt_old_root(old_root, rid, slot);
        }
        let node = self.group(gid).node;
        let (pid, slot, created) = self.find_or_create(topo, level + 1, node)?;
        self.link(gid, pid, slot);
        if created {
            self.attach(topo, pid)?;
        }
        Ok(())
    }

    /// Links a fresh (idle, event-less, not yet reachable) group under `pid`.
    fn link(&self, gid: usize, pid: usize, slot: u8) {
        let (g, p) = (self.group(gid), self.group(pid));
        let _ = p.members[usize::from(slot)].set(Child::Group(gid));
        g.slot_in_parent.store(usize::from(slot), Ordering::SeqCst);
        g.parent.store(pid, Ordering::SeqCst);
        state::link(&g.state, &|_| {});
    }

    /// Puts the old root under the new one while CPUs keep running (see the module comment).
    fn adopt_old_root(&self, old: usize, new_root: usize, slot: u8) {
        let (r, n) = (self.group(old), self.group(new_root));
        debug_assert_eq!(r.parent.load(Ordering::SeqCst), NONE);
        let _ = n.members[usize::from(slot)].set(Child::Group(old));
        r.slot_in_parent.store(usize::from(slot), Ordering::SeqCst);
        r.parent.store(new_root, Ordering::SeqCst);
        let was = state::link(&r.state, &|s| {
            let init = if s.active != 0 {
                GroupState {
                    active: 1 << slot,
                    migrator: Some(slot),
                    seq: 0,
                    linked: false,
                }
                .pack()
            } else {
                GroupState::IDLE
            };
            n.state.store(init, Ordering::SeqCst);
        });
        let (_, first) = self.propagate_group(n, r);
        tracing::debug!(target: TRACE_TARGET, event = "new_root", old, new_root,
            old_root_active = was.active, first);
    }
}
