//! Which LAPICs an IPI reaches, from the SDM's destination rules (Vol. 3A 11.6.2 and 11.12.10)
//! over what each LAPIC's registers read through the guest's interface: written from the
//! manual, not from `devices::lapic::route`, whose answer the target checks against this.
//!
//! | message                        | a LAPIC accepts it when                                     |
//! |--------------------------------|-------------------------------------------------------------|
//! | shorthand self                 | it is the sender                                            |
//! | shorthand all including self   | always                                                      |
//! | shorthand all excluding self   | it is not the sender                                        |
//! | xAPIC, destination 0xFF        | always (broadcast, physical or logical)                     |
//! | x2APIC, destination 0xFFFFFFFF | always (broadcast, physical or logical)                     |
//! | physical                       | its APIC ID is the destination                              |
//! | xAPIC logical, DFR flat (0xF)  | LDR[31:24] & MDA != 0                                       |
//! | xAPIC logical, DFR cluster (0) | LDR[31:28] = MDA[7:4] and LDR[27:24] & MDA[3:0] != 0        |
//! | x2APIC logical                 | LDR[31:16] = dest[31:16] and LDR[15:0] & dest[15:0] != 0,   |
//! |                                | LDR = (x2APIC ID[19:4] << 16) \| 1 << x2APIC ID[3:0]        |
//!
//! A globally disabled LAPIC accepts nothing. Where the SDM leaves the outcome open the answer
//! is [`Verdict::Open`] and either outcome passes: a sender and a receiver in different modes
//! (xAPIC and x2APIC), a DFR model other than flat or cluster, and an xAPIC cluster message to
//! cluster 15 other than the broadcast (the SDM's flat-cluster bus addresses 15 clusters and
//! says nothing of a message to the 16th; KVM matches it literally).

use std::sync::Arc;

use devices::lapic::{
    regs, route, ApicDestinationInfo, ApicMode, DeliveryMode, Ipi, Lapic, Shorthand,
};
use vmm::metrics::LapicNoise;

use super::check::read_reg;

/// How one LAPIC is addressed, read through its registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addressing {
    /// xAPIC or x2APIC (a disabled LAPIC has no addressing).
    pub x2apic: bool,
    /// The APIC ID: ID[31:24] in xAPIC mode, the 32-bit x2APIC ID in x2APIC mode.
    pub id: u32,
    /// The logical ID: LDR[31:24] in xAPIC mode; the x2APIC LDR, derived from the ID.
    pub ldr: u32,
    /// DFR[31:28] (xAPIC only).
    pub model: u32,
    /// SVR[8].
    pub software_enabled: bool,
}

/// Reads `lapic`'s addressing (None when globally disabled). In x2APIC mode the LDR it reads
/// must be the one the SDM derives from the ID (11.12.10.2).
pub fn addressing(lapic: &mut Lapic<Arc<LapicNoise>>) -> Option<Addressing> {
    let x2apic = match lapic.mode() {
        ApicMode::Disabled => return None,
        ApicMode::XApic => false,
        ApicMode::X2Apic => true,
    };
    let id_reg = read_reg(lapic, regs::ID)?;
    let ldr_reg = read_reg(lapic, regs::LDR)?;
    let software_enabled = read_reg(lapic, regs::SVR)? & (1 << 8) != 0;
    if x2apic {
        let ldr = (((id_reg >> 4) & 0xFFFF) << 16) | (1 << (id_reg & 0xF));
        assert_eq!(
            ldr_reg, ldr,
            "x2APIC {id_reg:#x}: LDR {ldr_reg:#x}, the SDM derives {ldr:#x}"
        );
        Some(Addressing {
            x2apic,
            id: id_reg,
            ldr,
            model: 0,
            software_enabled,
        })
    } else {
        Some(Addressing {
            x2apic,
            id: id_reg >> 24,
            ldr: ldr_reg >> 24,
            model: read_reg(lapic, regs::DFR)? >> 28,
            software_enabled,
        })
    }
}

/// An interrupt message as the sender's ICR encodes it.
#[derive(Debug, Clone, Copy)]
pub struct Message {
    /// ICR[19:18]: 0 none, 1 self, 2 all including self, 3 all excluding self.
    pub shorthand: u8,
    /// Logical destination mode (ICR[11]).
    pub logical: bool,
    /// The destination field: ICR[63:56] from an xAPIC, ICR[63:32] from an x2APIC.
    pub destination: u32,
    /// The sender is in x2APIC mode.
    pub x2apic: bool,
}

/// Whether one LAPIC accepts a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The SDM says it does.
    Yes,
    /// The SDM says it does not.
    No,
    /// The SDM leaves it open.
    Open,
}

impl Verdict {
    fn of(accepts: bool) -> Self {
        if accepts {
            Verdict::Yes
        } else {
            Verdict::No
        }
    }
}

/// Whether the LAPIC `target` (None: globally disabled), the sender itself if `is_sender`,
/// accepts `msg`.
pub fn accepts(msg: &Message, target: Option<&Addressing>, is_sender: bool) -> Verdict {
    let Some(t) = target else {
        return Verdict::No;
    };
    match msg.shorthand & 3 {
        1 => return Verdict::of(is_sender),
        2 => return Verdict::Yes,
        3 => return Verdict::of(!is_sender),
        _ => {}
    }
    let broadcast = if msg.x2apic { u32::MAX } else { 0xFF };
    if msg.destination == broadcast {
        return Verdict::Yes;
    }
    if msg.x2apic != t.x2apic {
        return Verdict::Open;
    }
    let dest = msg.destination;
    if !msg.logical {
        return Verdict::of(t.id == dest);
    }
    if t.x2apic {
        let same_cluster = dest >> 16 == t.ldr >> 16;
        return Verdict::of(same_cluster && dest & t.ldr & 0xFFFF != 0);
    }
    match t.model {
        0xF => Verdict::of(dest & t.ldr != 0),
        0x0 if dest >> 4 == 0xF => Verdict::Open,
        0x0 => Verdict::of(dest >> 4 == t.ldr >> 4 && dest & t.ldr & 0xF != 0),
        _ => Verdict::Open,
    }
}

/// `devices::lapic::route` (what the router calls) over the LAPICs' own addressing state
/// names the LAPICs the rules above accept, for `ipi` and for the same message
/// with lowest-priority delivery: then exactly one of the software-enabled LAPICs the rules
/// accept.
pub fn check_route(
    ipi: &Ipi,
    infos: &[ApicDestinationInfo],
    verdicts: &[Verdict],
    addressing: &[Option<Addressing>],
) {
    let routed = route(ipi, infos);
    for (j, verdict) in verdicts.iter().enumerate() {
        let got = routed.contains(j);
        assert!(
            *verdict == Verdict::Open || got == (*verdict == Verdict::Yes),
            "route {} LAPIC {j} ({:?}) of {ipi:?}; the SDM's rules say {verdict:?}",
            if got { "names" } else { "leaves out" },
            addressing[j]
        );
    }
    if ipi.shorthand != Shorthand::None || ipi.destination == u32::MAX || ipi.destination == 0xFF {
        // Lowest priority to a broadcast or shorthand is not defined (SDM 11.6.2.4).
        return;
    }
    let lowest = Ipi {
        delivery_mode: DeliveryMode::LowestPriority,
        ..*ipi
    };
    let candidates = |want: Verdict| {
        (0..verdicts.len())
            .filter(|&j| verdicts[j] == want && addressing[j].is_some_and(|a| a.software_enabled))
            .collect::<Vec<_>>()
    };
    let (yes, open) = (candidates(Verdict::Yes), candidates(Verdict::Open));
    let picked: Vec<_> = route(&lowest, infos).iter().collect();
    assert!(
        picked.len() <= 1 && picked.iter().all(|j| yes.contains(j) || open.contains(j)),
        "lowest priority {lowest:?} went to {picked:?}, not one of {yes:?} (or {open:?})"
    );
    assert!(
        yes.is_empty() || picked.len() == 1,
        "lowest priority {lowest:?} went nowhere; {yes:?} accept it"
    );
}
