//! A dump of the whole tree (for debugging and checks; not a VM snapshot) and the structural
//! invariants it must satisfy when no operation is in flight. Used by the property tests,
//! handy when debugging a VMM.

use super::state::{self, GroupState};
use super::tree::{Child, Hierarchy, NONE};
use crate::base::CpuId;
use crate::clock::{Nanos, NEVER};
use crate::sync::{lock, Ordering};

/// A child slot's live (queued, not ignored) event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventDump {
    /// The child's slot in the group.
    pub slot: usize,
    /// When it is due.
    pub expiry: Nanos,
    /// The CPU owning the timer.
    pub cpu: CpuId,
}

/// A member as its group should see it: whether it is active, and the event (expiry, first
/// CPU) it wants queued in the group while idle.
type Member = (bool, Option<(Nanos, Option<CpuId>)>);

/// A child of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberDump {
    /// A CPU.
    Cpu(CpuId),
    /// A group, by id.
    Group(usize),
}

/// One group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDump {
    /// Index in `HierarchyDump::groups`.
    pub id: usize,
    /// 0 for groups of CPUs.
    pub level: usize,
    /// NUMA node it was created for.
    pub node: usize,
    /// Parent group and this group's slot in it.
    pub parent: Option<(usize, usize)>,
    /// Children, by slot.
    pub members: Vec<MemberDump>,
    /// Decoded state word.
    pub state: GroupState,
    /// The lock-free mirror of the first event.
    pub next_expiry: Nanos,
    /// The CPU named by the first event.
    pub first_cpu: Option<CpuId>,
    /// Live events.
    pub events: Vec<EventDump>,
}

/// One CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuDump {
    /// Level-0 group and slot.
    pub group: usize,
    /// Slot in the group.
    pub slot: usize,
    /// NUMA node.
    pub node: usize,
    /// Idle in the hierarchy.
    pub idle: bool,
    /// Wake-up duty it must honour while idle (`NEVER` unless it is the duty holder).
    pub wakeup: Nanos,
    /// The global expiry it last reported.
    pub evt: Nanos,
}

/// The whole tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HierarchyDump {
    /// Children per group.
    pub group_size: usize,
    /// First level whose groups may mix nodes.
    pub crossnode_level: usize,
    /// Groups by id.
    pub groups: Vec<GroupDump>,
    /// CPUs by id.
    pub cpus: Vec<CpuDump>,
    /// The CPU holding the wake-up duty of the all-idle tree.
    pub duty_holder: Option<CpuId>,
}

impl Hierarchy {
    /// Reads the whole tree. Consistent only when no operation is in flight.
    pub fn dump(&self) -> HierarchyDump {
        let ncpus = self.num_cpus();
        let mut groups = Vec::new();
        for slot in self.groups.iter() {
            let Some(g) = slot.get() else { break };
            let q = lock(&g.queue);
            let gs = state::load(&g.state);
            let parent = match g.parent.load(Ordering::SeqCst) {
                p if p == NONE || !gs.linked => None,
                p => Some((p, g.slot_in_parent.load(Ordering::SeqCst))),
            };
            let members = g
                .members
                .iter()
                .filter_map(|m| m.get())
                .map(|m| match *m {
                    Child::Cpu(c) => MemberDump::Cpu(c),
                    Child::Group(id) => MemberDump::Group(id),
                })
                .collect();
            let events = q
                .evts
                .iter()
                .enumerate()
                .filter(|(i, e)| e.expiry != NEVER && !g.ignore[*i].load(Ordering::SeqCst))
                .map(|(slot, e)| EventDump {
                    slot,
                    expiry: e.expiry,
                    cpu: e.cpu,
                })
                .collect();
            groups.push(GroupDump {
                id: g.id,
                level: g.level,
                node: g.node,
                parent,
                members,
                state: state::load(&g.state),
                next_expiry: g.next_expiry.load(Ordering::SeqCst),
                first_cpu: (q.first_cpu != NONE).then_some(q.first_cpu),
                events,
            });
        }
        let cpus = (0..ncpus)
            .map(|c| {
                let n = self.cpu_node(c);
                let st = lock(&n.state);
                CpuDump {
                    group: n.group,
                    slot: usize::from(n.slot),
                    node: n.node,
                    idle: st.idle,
                    wakeup: n.wake.load(Ordering::SeqCst),
                    evt: st.evt,
                }
            })
            .collect();
        HierarchyDump {
            group_size: self.group_size,
            crossnode_level: self.crossnode_level,
            groups,
            cpus,
            duty_holder: self.duty_holder(),
        }
    }
}

impl HierarchyDump {
    /// The root group's id.
    pub fn root(&self) -> Option<usize> {
        self.groups
            .iter()
            .find(|g| g.parent.is_none())
            .map(|g| g.id)
    }

    /// Checks the structural invariants; the error names the first one broken.
    pub fn check(&self) -> Result<(), String> {
        let roots = self.groups.iter().filter(|g| g.parent.is_none()).count();
        if roots != 1 && !self.groups.is_empty() {
            return Err(format!("{roots} roots"));
        }
        for g in &self.groups {
            self.check_group(g)
                .map_err(|e| format!("group {}: {e}", g.id))?;
        }
        self.check_duty()
    }

    /// The wake-up duty (see `duty.rs`): an idle root with a first event has exactly one
    /// holder, an idle CPU waking for exactly that event; otherwise nobody has a wake-up.
    fn check_duty(&self) -> Result<(), String> {
        let Some(root) = self.root().map(|r| &self.groups[r]) else {
            return Ok(());
        };
        let want = if root.state.active == 0 && root.next_expiry != NEVER {
            Some(root.next_expiry)
        } else {
            None
        };
        for (c, cpu) in self.cpus.iter().enumerate() {
            let holds = self.duty_holder == Some(c);
            let expect = if holds { want } else { None };
            if (cpu.wakeup != NEVER).then_some(cpu.wakeup) != expect {
                return Err(format!(
                    "CPU {c} wakes at {} (holder {:?}), root first {:?}",
                    cpu.wakeup, self.duty_holder, want
                ));
            }
            if holds && !cpu.idle {
                return Err(format!("active CPU {c} holds the wake-up duty"));
            }
        }
        if want.is_none() && self.duty_holder.is_some() {
            return Err(format!(
                "CPU {:?} holds a duty nobody needs",
                self.duty_holder
            ));
        }
        if want.is_some() && self.duty_holder.is_none() {
            return Err(format!("all idle, nobody wakes for {}", root.next_expiry));
        }
        Ok(())
    }

    fn check_group(&self, g: &GroupDump) -> Result<(), String> {
        Self::check_group_state(g, self.group_size)?;
        for (slot, m) in g.members.iter().enumerate() {
            self.check_member(g, slot, m)?;
        }
        Ok(())
    }

    /// The group's own state: its size, migrator and active bits, and its next expiry
    /// against its events.
    fn check_group_state(g: &GroupDump, group_size: usize) -> Result<(), String> {
        if g.members.len() > group_size {
            return Err(format!("{} children", g.members.len()));
        }
        let s = g.state;
        if s.migrator.is_none() != (s.active == 0) {
            return Err(format!(
                "migrator {:?} with active {:#b}",
                s.migrator, s.active
            ));
        }
        if let Some(m) = s.migrator {
            if s.active & (1 << m) == 0 {
                return Err(format!("migrator {m} is not active ({:#b})", s.active));
            }
        }
        if s.active >> g.members.len() != 0 {
            return Err(format!("active bits {:#b} beyond children", s.active));
        }
        let live_min = g.events.iter().map(|e| e.expiry).min().unwrap_or(NEVER);
        if s.active == 0 && g.next_expiry != live_min {
            return Err(format!(
                "idle, next {} != min event {live_min}",
                g.next_expiry
            ));
        }
        if g.next_expiry > live_min {
            return Err(format!(
                "next {} later than event {live_min}",
                g.next_expiry
            ));
        }
        Ok(())
    }

    /// The member in `slot` of `g`: in its place, active as its bit says, and (idle) with
    /// the event it asks for queued in `g`.
    fn check_member(&self, g: &GroupDump, slot: usize, m: &MemberDump) -> Result<(), String> {
        let bit = g.state.active & (1 << slot) != 0;
        let evt = g.events.iter().find(|e| e.slot == slot);
        let (active, want) = match *m {
            MemberDump::Cpu(c) => self.cpu_member(g, slot, c)?,
            MemberDump::Group(id) => self.group_member(g, slot, id)?,
        };
        if bit != active {
            return Err(format!("slot {slot} bit {bit} but child active {active}"));
        }
        if !active {
            let got = evt.map(|e| (e.expiry, Some(e.cpu)));
            if got != want {
                return Err(format!(
                    "idle slot {slot} has event {got:?}, child says {want:?}"
                ));
            }
        }
        Ok(())
    }

    /// CPU `c` in `slot` of `g`: whether it is active, and the event it wants queued.
    fn cpu_member(&self, g: &GroupDump, slot: usize, c: CpuId) -> Result<Member, String> {
        let cpu = self.cpus.get(c).ok_or("unknown CPU")?;
        if (cpu.group, cpu.slot) != (g.id, slot) || g.level != 0 {
            return Err(format!("CPU {c} misplaced"));
        }
        if g.level < self.crossnode_level && cpu.node != g.node {
            return Err(format!("CPU {c} of node {} in node {}", cpu.node, g.node));
        }
        Ok((!cpu.idle, (cpu.evt != NEVER).then_some((cpu.evt, Some(c)))))
    }

    /// Group `id` in `slot` of `g`: whether it is active, and the event it wants queued.
    fn group_member(&self, g: &GroupDump, slot: usize, id: usize) -> Result<Member, String> {
        let child = self.groups.get(id).ok_or("unknown group")?;
        if child.parent != Some((g.id, slot)) || child.level + 1 != g.level {
            return Err(format!("group {id} misplaced"));
        }
        if g.level < self.crossnode_level && child.node != g.node {
            return Err(format!(
                "group {id} crosses nodes below the cross-node level"
            ));
        }
        let first = child
            .events
            .iter()
            .filter(|e| e.expiry == child.next_expiry);
        let owners: Vec<_> = first.map(|e| e.cpu).collect();
        if child.state.active == 0
            && child.next_expiry != NEVER
            && !owners.contains(&child.first_cpu.unwrap_or(NONE))
        {
            return Err(format!(
                "group {id} names CPU {:?} as first",
                child.first_cpu
            ));
        }
        let want = (child.next_expiry != NEVER).then_some((child.next_expiry, child.first_cpu));
        Ok((child.state.active != 0, want))
    }
}
