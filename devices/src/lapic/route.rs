//! Which vCPUs receive an interrupt message: a pure function over every LAPIC's addressing
//! state (SDM vol. 3 section 11.6.2).

use super::icr::{DeliveryMode, DestinationMode, Ipi, Shorthand};

/// Logical destination model of an xAPIC (DFR bits 31:28).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogicalModel {
    /// DFR 0xF: LDR bits 31:24 are a flat 8-bit mask.
    #[default]
    Flat,
    /// DFR 0x0: LDR bits 31:28 are a cluster, bits 27:24 a 4-bit mask.
    Cluster,
}

/// The addressing state of one vCPU's LAPIC, as [`Lapic::destination_info`] reports it.
///
/// [`Lapic::destination_info`]: super::Lapic::destination_info
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApicDestinationInfo {
    /// Current APIC ID (8-bit xAPIC ID or 32-bit x2APIC ID).
    pub apic_id: u32,
    /// The LDR as the guest reads it (xAPIC: bits 31:24; x2APIC: cluster 31:16, mask 15:0).
    pub ldr: u32,
    /// The xAPIC logical model (ignored in x2APIC mode).
    pub logical_model: LogicalModel,
    /// Whether the LAPIC is in x2APIC mode.
    pub x2apic: bool,
    /// IA32_APIC_BASE enable bit: a globally disabled LAPIC receives nothing.
    pub hardware_enabled: bool,
    /// SVR software enable: only software-enabled LAPICs win lowest-priority arbitration.
    pub software_enabled: bool,
    /// Arbitration priority for lowest-priority delivery (lower wins).
    pub priority: u8,
}

/// The vCPU indices (positions in the slice given to [`route`]) that receive a message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationSet {
    targets: Vec<usize>,
}

impl DestinationSet {
    /// The receiving vCPU indices, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.targets.iter().copied()
    }

    /// Whether vCPU `index` receives the message.
    pub fn contains(&self, index: usize) -> bool {
        self.targets.contains(&index)
    }

    /// Number of receivers.
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// Whether nobody receives the message.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

fn is_broadcast(ipi: &Ipi) -> bool {
    if ipi.x2apic_format {
        ipi.destination == u32::MAX
    } else {
        ipi.destination == 0xFF
    }
}

fn matches_destination(ipi: &Ipi, apic: &ApicDestinationInfo) -> bool {
    if is_broadcast(ipi) {
        return true;
    }
    let dest = ipi.destination;
    match (ipi.destination_mode, apic.x2apic) {
        (DestinationMode::Physical, true) => apic.apic_id == dest,
        (DestinationMode::Physical, false) => dest <= 0xFF && apic.apic_id & 0xFF == dest,
        (DestinationMode::Logical, true) => {
            dest >> 16 == apic.ldr >> 16 && dest & apic.ldr & 0xFFFF != 0
        }
        (DestinationMode::Logical, false) => {
            if dest > 0xFF {
                return false;
            }
            let ldr = apic.ldr >> 24;
            match apic.logical_model {
                LogicalModel::Flat => dest & ldr != 0,
                LogicalModel::Cluster => {
                    let cluster = dest >> 4;
                    (cluster == 0xF || cluster == ldr >> 4) && dest & ldr & 0xF != 0
                }
            }
        }
    }
}

fn matches(ipi: &Ipi, apic: &ApicDestinationInfo) -> bool {
    let is_source = ipi.source_apic_id == Some(apic.apic_id);
    match ipi.shorthand {
        Shorthand::None => matches_destination(ipi, apic),
        Shorthand::SelfOnly => is_source,
        Shorthand::AllIncludingSelf => true,
        Shorthand::AllExcludingSelf => !is_source,
    }
}

/// Returns the vCPUs that receive `ipi`, given every vCPU's LAPIC addressing state (index =
/// vCPU index).
///
/// Globally disabled LAPICs receive nothing. A lowest-priority message goes to the one
/// software-enabled match with the lowest `priority`; ties are broken by the vector (vector
/// modulo the number of tied candidates), which spreads device interrupts like KVM's vector
/// hashing.
///
/// ```
/// use devices::lapic::{route, ApicDestinationInfo, Ipi, LogicalModel};
/// let cpu = |apic_id| ApicDestinationInfo {
///     apic_id,
///     ldr: 0,
///     logical_model: LogicalModel::Flat,
///     x2apic: false,
///     hardware_enabled: true,
///     software_enabled: true,
///     priority: 0,
/// };
/// let targets = route(&Ipi::fixed(0x40, 1), &[cpu(0), cpu(1)]);
/// assert_eq!(targets.iter().collect::<Vec<_>>(), vec![1]);
/// ```
pub fn route(ipi: &Ipi, apics: &[ApicDestinationInfo]) -> DestinationSet {
    let mut targets: Vec<usize> = apics
        .iter()
        .enumerate()
        .filter(|(_, apic)| apic.hardware_enabled && matches(ipi, apic))
        .map(|(index, _)| index)
        .collect();
    if ipi.delivery_mode == DeliveryMode::LowestPriority {
        targets.retain(|&i| apics[i].software_enabled);
        let lowest = targets.iter().map(|&i| apics[i].priority).min();
        targets.retain(|&i| Some(apics[i].priority) == lowest);
        if !targets.is_empty() {
            let pick = targets[usize::from(ipi.vector) % targets.len()];
            targets = vec![pick];
        }
    }
    DestinationSet { targets }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lapic::icr::TriggerMode;

    fn xapic(apic_id: u32, ldr8: u32, logical_model: LogicalModel) -> ApicDestinationInfo {
        ApicDestinationInfo {
            apic_id,
            ldr: ldr8 << 24,
            logical_model,
            x2apic: false,
            hardware_enabled: true,
            software_enabled: true,
            priority: 0,
        }
    }

    fn x2apic(apic_id: u32) -> ApicDestinationInfo {
        ApicDestinationInfo {
            apic_id,
            ldr: ((apic_id >> 4) << 16) | (1 << (apic_id & 0xF)),
            logical_model: LogicalModel::Flat,
            x2apic: true,
            hardware_enabled: true,
            software_enabled: true,
            priority: 0,
        }
    }

    fn ipi(destination: u32, mode: DestinationMode, shorthand: Shorthand, x2: bool) -> Ipi {
        Ipi {
            delivery_mode: DeliveryMode::Fixed,
            vector: 0x40,
            destination,
            destination_mode: mode,
            shorthand,
            assert: true,
            trigger_mode: TriggerMode::Edge,
            x2apic_format: x2,
            source_apic_id: Some(1),
        }
    }

    fn targets(ipi: &Ipi, apics: &[ApicDestinationInfo]) -> Vec<usize> {
        route(ipi, apics).iter().collect()
    }

    #[test]
    fn physical_and_broadcast() {
        let apics: Vec<_> = (0..4).map(|i| xapic(i, 0, LogicalModel::Flat)).collect();
        let phys = DestinationMode::Physical;
        assert_eq!(targets(&ipi(2, phys, Shorthand::None, false), &apics), [2]);
        assert_eq!(
            targets(&ipi(7, phys, Shorthand::None, false), &apics),
            [0usize; 0]
        );
        assert_eq!(
            targets(&ipi(0xFF, phys, Shorthand::None, false), &apics),
            [0, 1, 2, 3]
        );
        let x2: Vec<_> = (0..4).map(x2apic).collect();
        assert_eq!(
            targets(&ipi(0xFF, phys, Shorthand::None, true), &x2),
            [0usize; 0]
        );
        assert_eq!(
            targets(&ipi(u32::MAX, phys, Shorthand::None, true), &x2),
            [0, 1, 2, 3]
        );
        assert_eq!(targets(&ipi(3, phys, Shorthand::None, true), &x2), [3]);
    }

    #[test]
    fn shorthands() {
        let apics: Vec<_> = (0..3).map(|i| xapic(i, 0, LogicalModel::Flat)).collect();
        let phys = DestinationMode::Physical;
        assert_eq!(
            targets(&ipi(0, phys, Shorthand::SelfOnly, false), &apics),
            [1]
        );
        assert_eq!(
            targets(&ipi(0, phys, Shorthand::AllIncludingSelf, false), &apics),
            [0, 1, 2]
        );
        assert_eq!(
            targets(&ipi(0, phys, Shorthand::AllExcludingSelf, false), &apics),
            [0, 2]
        );
    }

    #[test]
    fn logical_flat_and_cluster() {
        let flat: Vec<_> = (0..4)
            .map(|i| xapic(i, 1 << i, LogicalModel::Flat))
            .collect();
        let logical = DestinationMode::Logical;
        assert_eq!(
            targets(&ipi(0b1010, logical, Shorthand::None, false), &flat),
            [1, 3]
        );
        assert_eq!(
            targets(&ipi(0, logical, Shorthand::None, false), &flat),
            [0usize; 0]
        );
        let cluster = [
            xapic(0, 0x01, LogicalModel::Cluster),
            xapic(1, 0x02, LogicalModel::Cluster),
            xapic(2, 0x11, LogicalModel::Cluster),
            xapic(3, 0x12, LogicalModel::Cluster),
        ];
        assert_eq!(
            targets(&ipi(0x13, logical, Shorthand::None, false), &cluster),
            [2, 3]
        );
        assert_eq!(
            targets(&ipi(0x02, logical, Shorthand::None, false), &cluster),
            [1]
        );
        assert_eq!(
            targets(&ipi(0xF1, logical, Shorthand::None, false), &cluster),
            [0, 2]
        );
    }

    #[test]
    fn x2apic_logical_cluster() {
        let x2: Vec<_> = (0..20).map(x2apic).collect();
        let logical = DestinationMode::Logical;
        // Cluster 1 (IDs 16..32), members 0 and 2: IDs 16 and 18.
        assert_eq!(
            targets(&ipi(0x0001_0005, logical, Shorthand::None, true), &x2),
            [16, 18]
        );
        assert_eq!(
            targets(&ipi(0x0000_0003, logical, Shorthand::None, true), &x2),
            [0, 1]
        );
    }

    #[test]
    fn lowest_priority_picks_one() {
        let mut apics: Vec<_> = (0..4)
            .map(|i| xapic(i, 1 << i, LogicalModel::Flat))
            .collect();
        apics[0].priority = 0x20;
        apics[1].priority = 0x10;
        apics[2].priority = 0x10;
        apics[3].priority = 0x00;
        apics[3].software_enabled = false;
        let mut msg = ipi(0x0F, DestinationMode::Logical, Shorthand::None, false);
        msg.delivery_mode = DeliveryMode::LowestPriority;
        msg.vector = 0x41;
        assert_eq!(targets(&msg, &apics), [2]);
        msg.vector = 0x40;
        assert_eq!(targets(&msg, &apics), [1]);
    }

    #[test]
    fn disabled_apics_receive_nothing() {
        let mut apics: Vec<_> = (0..2).map(|i| xapic(i, 0, LogicalModel::Flat)).collect();
        apics[0].hardware_enabled = false;
        let msg = ipi(0xFF, DestinationMode::Physical, Shorthand::None, false);
        assert_eq!(targets(&msg, &apics), [1]);
    }

    fn arbitrary_apic() -> impl proptest::strategy::Strategy<Value = ApicDestinationInfo> {
        use proptest::prelude::*;
        (
            any::<u8>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<u8>(),
        )
            .prop_map(|(ldr8, cluster, hw, sw, priority)| ApicDestinationInfo {
                apic_id: 0,
                ldr: u32::from(ldr8) << 24,
                logical_model: if cluster {
                    LogicalModel::Cluster
                } else {
                    LogicalModel::Flat
                },
                x2apic: false,
                hardware_enabled: hw,
                software_enabled: sw,
                priority,
            })
    }

    proptest::proptest! {
        #[test]
        fn routing_invariants(
            mut apics in proptest::collection::vec(arbitrary_apic(), 0..20),
            destination in 0u32..0x100,
            logical: bool,
            lowest: bool,
            shorthand in 0u8..4,
            vector: u8,
        ) {
            for (i, apic) in apics.iter_mut().enumerate() {
                apic.apic_id = u32::try_from(i).unwrap();
            }
            let mut msg = ipi(
                destination,
                if logical { DestinationMode::Logical } else { DestinationMode::Physical },
                match shorthand {
                    0 => Shorthand::None,
                    1 => Shorthand::SelfOnly,
                    2 => Shorthand::AllIncludingSelf,
                    _ => Shorthand::AllExcludingSelf,
                },
                false,
            );
            msg.vector = vector;
            if lowest {
                msg.delivery_mode = DeliveryMode::LowestPriority;
            }
            let set = route(&msg, &apics);
            // Only hardware-enabled APICs, each at most once, in order.
            let targets: Vec<usize> = set.iter().collect();
            proptest::prop_assert!(targets.windows(2).all(|w| w[0] < w[1]));
            proptest::prop_assert!(targets.iter().all(|&t| apics[t].hardware_enabled));
            if lowest {
                proptest::prop_assert!(set.len() <= 1);
                if let Some(&t) = targets.first() {
                    proptest::prop_assert!(apics[t].software_enabled);
                    let matched = route(&Ipi { delivery_mode: DeliveryMode::Fixed, ..msg }, &apics);
                    let min = matched.iter().filter(|&i| apics[i].software_enabled)
                        .map(|i| apics[i].priority).min();
                    proptest::prop_assert_eq!(Some(apics[t].priority), min);
                }
            } else if shorthand == 0 && !logical && destination != 0xFF {
                proptest::prop_assert!(set.len() <= 1, "physical unicast");
            } else if shorthand == 2 || (shorthand == 0 && destination == 0xFF) {
                let enabled = apics.iter().filter(|a| a.hardware_enabled).count();
                proptest::prop_assert_eq!(set.len(), enabled, "broadcast");
            }
        }
    }
}
