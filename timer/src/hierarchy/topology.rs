//! Where the tree's nodes are: the NUMA node of a CPU or group, and the bookkeeping of levels
//! and children that only the builder (`grow.rs`) touches.

/// A NUMA node number.
pub type NodeId = usize;

/// Bookkeeping only touched while adding CPUs (under `Hierarchy::topo`).
#[derive(Debug, Default)]
pub(crate) struct Topology {
    pub(super) levels: Vec<Vec<usize>>,
    pub(super) nchildren: Vec<usize>,
    pub(super) ncpus: usize,
}
