//! The tree of groups over all CPUs: its nodes (groups, CPUs, their event queues) and the
//! [`Hierarchy`] that holds them, with the lookups every walk makes. The walks are in
//! `ops.rs` and `duty.rs`, the building and growing in `grow.rs`; the model is in `mod.rs`.

use std::sync::OnceLock;

use super::state;
use super::topology::{NodeId, Topology};
use crate::base::CpuId;
use crate::clock::{Nanos, NEVER};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering};

/// "No group" / "no CPU" in index fields.
pub(super) const NONE: usize = usize::MAX;

/// One child slot of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Child {
    Cpu(CpuId),
    Group(usize),
}

/// A queued child event.
#[derive(Debug, Clone, Copy)]
pub(super) struct Event {
    pub(super) expiry: Nanos,
    pub(super) cpu: CpuId,
}

#[derive(Debug)]
pub(super) struct GroupQueue {
    pub(super) evts: Vec<Event>,
    pub(super) first_cpu: CpuId,
}

/// A node of the tree.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) id: usize,
    pub(super) level: usize,
    pub(super) node: NodeId,
    pub(super) state: AtomicU64,
    pub(super) next_expiry: AtomicU64,
    pub(super) parent: AtomicUsize,
    pub(super) slot_in_parent: AtomicUsize,
    pub(super) queue: Mutex<GroupQueue>,
    pub(super) ignore: Box<[AtomicBool]>,
    pub(super) members: Box<[OnceLock<Child>]>,
}

#[derive(Debug)]
pub(super) struct CpuState {
    pub(super) idle: bool,
    pub(super) remote: bool,
    pub(super) evt: Nanos,
}

#[derive(Debug)]
pub(super) struct CpuNode {
    pub(super) group: usize,
    pub(super) slot: u8,
    pub(super) node: NodeId,
    pub(super) state: Mutex<CpuState>,
    /// The wake-up duty this CPU holds (`NEVER` unless it is the duty holder); written only
    /// under [`Hierarchy::duty`], read lock-free by whoever (re-)arms its host wake-up.
    pub(super) wake: AtomicU64,
}

/// The tree of groups over all CPUs; shared by every vCPU thread (`Arc<Hierarchy>`).
#[derive(Debug)]
pub struct Hierarchy {
    pub(super) group_size: usize,
    pub(super) crossnode_level: usize,
    pub(super) groups: Box<[OnceLock<Group>]>,
    pub(super) cpus: Box<[OnceLock<CpuNode>]>,
    pub(super) topo: std::sync::Mutex<Topology>,
    /// The CPU holding the wake-up duty of an all-idle tree (see `duty.rs`).
    pub(super) duty: Mutex<Option<CpuId>>,
    pub(super) seq_step: u32,
}

impl Group {
    pub(super) fn new(id: usize, level: usize, node: NodeId, group_size: usize) -> Self {
        Self {
            id,
            level,
            node,
            state: AtomicU64::new(state::GroupState::IDLE),
            next_expiry: AtomicU64::new(NEVER),
            parent: AtomicUsize::new(NONE),
            slot_in_parent: AtomicUsize::new(NONE),
            queue: Mutex::new(GroupQueue {
                evts: vec![
                    Event {
                        expiry: NEVER,
                        cpu: NONE
                    };
                    group_size
                ],
                first_cpu: NONE,
            }),
            ignore: (0..group_size).map(|_| AtomicBool::new(true)).collect(),
            members: (0..group_size).map(|_| OnceLock::new()).collect(),
        }
    }

    pub(super) fn slot(&self) -> u8 {
        // Slots are below MAX_GROUP_SIZE (32).
        #[allow(clippy::cast_possible_truncation)]
        let s = self.slot_in_parent.load(Ordering::SeqCst) as u8;
        s
    }

    pub(super) fn is_active(&self) -> bool {
        state::load(&self.state).active != 0
    }
}

impl Hierarchy {
    pub(super) fn group(&self, id: usize) -> &Group {
        // Group ids are only handed out after the group is stored.
        self.groups[id]
            .get()
            .unwrap_or_else(|| unreachable!("group {id} not initialised"))
    }

    pub(super) fn cpu_node(&self, cpu: CpuId) -> &CpuNode {
        match self.cpus.get(cpu).and_then(OnceLock::get) {
            Some(c) => c,
            None => panic!("CPU {cpu} is not in the hierarchy"),
        }
    }

    /// `g`'s parent, if the state word `s` read from `g` says it is linked (the parent id is
    /// stored before the linked bit is set).
    pub(super) fn parent_of(&self, g: &Group, s: state::GroupState) -> Option<&Group> {
        if !s.linked {
            return None;
        }
        match g.parent.load(Ordering::SeqCst) {
            NONE => None,
            p => Some(self.group(p)),
        }
    }

    /// Turns off `seq` bumping, to let the model checker show what goes wrong without it.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn without_seq(mut self) -> Self {
        self.seq_step = 0;
        self
    }

    /// The number of children per group.
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// The first level whose groups may mix NUMA nodes.
    pub fn crossnode_level(&self) -> usize {
        self.crossnode_level
    }

    /// True if `cpu` is idle in the hierarchy.
    pub fn is_idle(&self, cpu: CpuId) -> bool {
        crate::sync::lock(&self.cpu_node(cpu).state).idle
    }

    /// The wake-up duty an idle `cpu` must honour (`NEVER` if none). Another CPU may move it
    /// at any time (it then names `cpu` for a retarget); read it again after that.
    pub fn wakeup(&self, cpu: CpuId) -> Nanos {
        self.cpu_node(cpu).wake.load(Ordering::SeqCst)
    }
}
