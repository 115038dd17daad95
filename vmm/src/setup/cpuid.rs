//! The CPUID each vCPU sees: KVM's supported set, plus what lull's guests rely on (APIC IDs,
//! x2APIC, TSC-deadline, ARAT, and the TSC and APIC-bus frequencies; docs/GUEST-ABI.md).

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

/// LAPIC timer input ("bus") frequency in kHz: 1 GHz, as KVM's in-kernel LAPIC.
pub const APIC_BUS_KHZ: u32 = 1_000_000;
const LEAF_FEATURES: u32 = 0x1;
const LEAF_THERMAL_POWER: u32 = 0x6;
const LEAF_TOPOLOGY: u32 = 0xb;
const LEAF_TOPOLOGY_V2: u32 = 0x1f;
const LEAF_TSC: u32 = 0x15;
const LEAF_FREQ: u32 = 0x16;
const LEAF_HV_SIGNATURE: u32 = 0x4000_0000;
const LEAF_HV_TIMING: u32 = 0x4000_0010;
const ECX_X2APIC: u32 = 1 << 21;
const ECX_TSC_DEADLINE: u32 = 1 << 24;
const ECX_HYPERVISOR: u32 = 1 << 31;
const EAX_ARAT: u32 = 1 << 2;

const LEAF_HV_FEATURES: u32 = 0x4000_0001;
/// KVM paravirtual features that need KVM's in-kernel LAPIC: ASYNC_PF (4), PV_EOI (6),
/// PV_UNHALT (7), PV_SEND_IPI (11), POLL_CONTROL (12), PV_SCHED_YIELD (13), ASYNC_PF_INT (14).
const PV_NEEDS_KERNEL_LAPIC: u32 =
    (1 << 4) | PV_EOI | (1 << 7) | (1 << 11) | (1 << 12) | (1 << 13) | (1 << 14);
/// KVM_FEATURE_PV_EOI, which lull's LAPIC implements itself (`irqchip::user::pv_eoi`).
const PV_EOI: u32 = 1 << 6;
/// lull's own hypervisor leaves (after KVM's, which Linux finds first): the signature...
pub const LEAF_LULL_SIGNATURE: u32 = 0x4000_0100;
/// ... and its features (EAX).
pub const LEAF_LULL_FEATURES: u32 = 0x4000_0101;
/// lull's signature in EBX, ECX, EDX of [`LEAF_LULL_SIGNATURE`].
pub const LULL_SIGNATURE: [u8; 12] = *b"LullLullLull";
/// Feature bit: the PV TSC deadline (`irqchip::user::pv_deadline`).
pub const LULL_FEATURE_PV_DEADLINE: u32 = 1 << 0;
/// KVM hint that makes Linux use haltpoll idle instead of HLT.
const PV_HINT_REALTIME: u32 = 1;

/// Frequencies, topology and features every vCPU's CPUID describes (each vCPU's own APIC ID
/// is given to [`adjust`] beside them).
#[derive(Debug, Clone, Copy)]
pub struct CpuidParams {
    /// vCPUs in the VM.
    pub cpus: u32,
    /// Guest TSC frequency in kHz.
    pub tsc_khz: u32,
    /// lull emulates the LAPIC (no in-kernel irqchip): hide the PV features that need KVM's.
    pub user_lapic: bool,
    /// With `user_lapic`: advertise PV EOI, which lull implements.
    pub pv_eoi: bool,
    /// With `user_lapic`: advertise lull's PV TSC deadline (lull's leaves).
    pub pv_deadline: bool,
    /// Advertise x2APIC (`--x2apic`); without it CPUID.1:ECX[21] is clear, whatever KVM
    /// supports, and KVM's LAPIC refuses x2APIC mode as lull's does.
    pub x2apic: bool,
}

fn upsert(entries: &mut Vec<kvm_cpuid_entry2>, function: u32, index: u32) -> &mut kvm_cpuid_entry2 {
    let pos = entries
        .iter()
        .position(|e| e.function == function && e.index == index);
    let pos = pos.unwrap_or_else(|| {
        entries.push(kvm_cpuid_entry2 {
            function,
            index,
            ..Default::default()
        });
        entries.len() - 1
    });
    &mut entries[pos]
}

/// Adjusts KVM's supported CPUID entries for the vCPU whose APIC ID is `apic_id`.
pub fn adjust(
    supported: &[kvm_cpuid_entry2],
    apic_id: u32,
    p: CpuidParams,
) -> Vec<kvm_cpuid_entry2> {
    let mut entries = supported.to_vec();
    set_features(&mut entries, apic_id, &p);
    set_frequencies(&mut entries, &p);
    set_hypervisor_leaves(&mut entries, &p);
    if p.user_lapic && p.pv_deadline {
        set_lull_leaves(&mut entries);
    }
    entries
}

/// Leaf 1 (APIC ID, logical CPUs, TSC deadline, hypervisor, x2APIC), ARAT, and the APIC ID
/// in the topology leaves.
fn set_features(entries: &mut Vec<kvm_cpuid_entry2>, apic_id: u32, p: &CpuidParams) {
    let apic_id_byte = apic_id & 0xff;
    let logical = p.cpus.clamp(1, 255);
    {
        let e = upsert(entries, LEAF_FEATURES, 0);
        e.ebx = (e.ebx & 0x0000_ffff) | (apic_id_byte << 24) | (logical << 16);
        e.ecx |= ECX_TSC_DEADLINE | ECX_HYPERVISOR;
        if p.x2apic {
            e.ecx |= ECX_X2APIC;
        } else {
            e.ecx &= !ECX_X2APIC;
        }
    }
    upsert(entries, LEAF_THERMAL_POWER, 0).eax |= EAX_ARAT;
    for e in entries.iter_mut() {
        if e.function == LEAF_TOPOLOGY || e.function == LEAF_TOPOLOGY_V2 {
            e.edx = apic_id;
        }
    }
}

/// Leaf 0x15: TSC = ECX * EBX / EAX with a 1 GHz crystal; leaf 0x16: MHz.
fn set_frequencies(entries: &mut Vec<kvm_cpuid_entry2>, p: &CpuidParams) {
    if let Some(max) = entries.iter_mut().find(|e| e.function == 0) {
        max.eax = max.eax.max(LEAF_FREQ);
    }
    *upsert(entries, LEAF_TSC, 0) = kvm_cpuid_entry2 {
        function: LEAF_TSC,
        eax: 1_000_000,
        ebx: p.tsc_khz,
        ecx: APIC_BUS_KHZ * 1000,
        ..Default::default()
    };
    let mhz = p.tsc_khz / 1000;
    *upsert(entries, LEAF_FREQ, 0) = kvm_cpuid_entry2 {
        function: LEAF_FREQ,
        eax: mhz,
        ebx: mhz,
        ecx: APIC_BUS_KHZ / 1000,
        ..Default::default()
    };
}

/// Hypervisor leaves: KVM's signature, its PV features (with a user-space LAPIC: none that
/// needs KVM's, PV EOI if asked), with the timing leaf.
fn set_hypervisor_leaves(entries: &mut Vec<kvm_cpuid_entry2>, p: &CpuidParams) {
    {
        let sig = upsert(entries, LEAF_HV_SIGNATURE, 0);
        sig.eax = LEAF_HV_TIMING;
        sig.ebx = u32::from_le_bytes(*b"KVMK");
        sig.ecx = u32::from_le_bytes(*b"VMKV");
        sig.edx = u32::from_le_bytes(*b"M\0\0\0");
    }
    if p.user_lapic {
        if let Some(features) = entries.iter_mut().find(|e| e.function == LEAF_HV_FEATURES) {
            features.eax &= !PV_NEEDS_KERNEL_LAPIC;
            if p.pv_eoi {
                features.eax |= PV_EOI;
            }
            features.edx &= !PV_HINT_REALTIME;
        }
    }
    *upsert(entries, LEAF_HV_TIMING, 0) = kvm_cpuid_entry2 {
        function: LEAF_HV_TIMING,
        eax: p.tsc_khz,
        ebx: APIC_BUS_KHZ,
        ..Default::default()
    };
}

/// lull's own leaves: its signature and the PV TSC deadline feature.
fn set_lull_leaves(entries: &mut Vec<kvm_cpuid_entry2>) {
    let word = |i: usize| {
        u32::from_le_bytes([
            LULL_SIGNATURE[i],
            LULL_SIGNATURE[i + 1],
            LULL_SIGNATURE[i + 2],
            LULL_SIGNATURE[i + 3],
        ])
    };
    *upsert(entries, LEAF_LULL_SIGNATURE, 0) = kvm_cpuid_entry2 {
        function: LEAF_LULL_SIGNATURE,
        eax: LEAF_LULL_FEATURES,
        ebx: word(0),
        ecx: word(4),
        edx: word(8),
        ..Default::default()
    };
    *upsert(entries, LEAF_LULL_FEATURES, 0) = kvm_cpuid_entry2 {
        function: LEAF_LULL_FEATURES,
        eax: LULL_FEATURE_PV_DEADLINE,
        ..Default::default()
    };
}

/// Builds the `CpuId` for KVM_SET_CPUID2.
pub fn to_kvm(entries: &[kvm_cpuid_entry2]) -> Result<CpuId, vmm_sys_util::fam::Error> {
    CpuId::from_entries(entries)
}

/// True if the entry's `index` selects a sub-leaf.
pub fn has_index(e: &kvm_cpuid_entry2) -> bool {
    e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(v: &[kvm_cpuid_entry2], f: u32) -> kvm_cpuid_entry2 {
        *v.iter().find(|e| e.function == f).unwrap()
    }

    #[test]
    fn advertises_timers_and_frequencies() {
        let supported = vec![
            kvm_cpuid_entry2 {
                function: 0,
                eax: 0xd,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 1,
                ebx: 0x0000_0800,
                ..Default::default()
            },
        ];
        let v = adjust(
            &supported,
            3,
            CpuidParams {
                cpus: 4,
                tsc_khz: 2_100_000,
                user_lapic: false,
                pv_eoi: false,
                pv_deadline: true,
                x2apic: true,
            },
        );
        let l1 = find(&v, 1);
        assert_eq!(l1.ebx >> 24, 3);
        assert_eq!((l1.ebx >> 16) & 0xff, 4);
        assert_eq!(l1.ebx & 0xffff, 0x0800);
        assert_ne!(l1.ecx & ECX_TSC_DEADLINE, 0);
        assert_ne!(l1.ecx & ECX_X2APIC, 0);
        assert_ne!(find(&v, 6).eax & EAX_ARAT, 0);
        assert_eq!(find(&v, 0).eax, 0x16);
        let timing = find(&v, LEAF_HV_TIMING);
        assert_eq!((timing.eax, timing.ebx), (2_100_000, 1_000_000));
        let tsc = find(&v, LEAF_TSC);
        assert_eq!(
            u64::from(tsc.ecx) * u64::from(tsc.ebx) / u64::from(tsc.eax),
            2_100_000_000
        );
        assert_eq!(find(&v, LEAF_HV_SIGNATURE).eax, LEAF_HV_TIMING);
        assert!(!has_index(&timing));
        // KVM's LAPIC: lull's PV deadline is not offered, whatever was asked.
        assert!(!v.iter().any(|e| e.function == LEAF_LULL_SIGNATURE));
    }

    /// A one-vCPU VM at 1 GHz with lull's LAPIC, x2APIC on, PV EOI off.
    fn user_lapic_params() -> CpuidParams {
        CpuidParams {
            cpus: 1,
            tsc_khz: 1_000_000,
            user_lapic: true,
            pv_eoi: false,
            pv_deadline: false,
            x2apic: true,
        }
    }

    #[test]
    fn lulls_leaves_offer_the_pv_deadline_behind_kvms() {
        let p = user_lapic_params();
        let without = adjust(&[], 0, p);
        assert!(!without.iter().any(|e| e.function == LEAF_LULL_SIGNATURE));
        let v = adjust(
            &[],
            0,
            CpuidParams {
                pv_deadline: true,
                ..p
            },
        );
        let sig = find(&v, LEAF_LULL_SIGNATURE);
        assert_eq!(sig.eax, LEAF_LULL_FEATURES);
        let mut bytes = Vec::new();
        for w in [sig.ebx, sig.ecx, sig.edx] {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        assert_eq!(bytes, b"LullLullLull");
        assert_eq!(find(&v, LEAF_LULL_FEATURES).eax, LULL_FEATURE_PV_DEADLINE);
        // KVM's signature stays first: Linux and KVM's PV features find it.
        assert_eq!(
            find(&v, LEAF_HV_SIGNATURE).ebx,
            u32::from_le_bytes(*b"KVMK")
        );
    }

    #[test]
    fn user_lapic_hides_pv_features_that_need_kvms_lapic() {
        let supported = vec![kvm_cpuid_entry2 {
            function: LEAF_HV_FEATURES,
            eax: 0xffff,
            edx: 1,
            ..Default::default()
        }];
        let p = user_lapic_params();
        let f = find(&adjust(&supported, 0, p), LEAF_HV_FEATURES);
        assert_eq!(f.eax & PV_NEEDS_KERNEL_LAPIC, 0);
        assert_ne!(f.eax & 1, 0); // kvmclock stays
        assert_eq!(f.edx, 0);
        // PV EOI is lull's own: advertised when asked for, alone of the LAPIC features.
        let with_pv_eoi = CpuidParams { pv_eoi: true, ..p };
        let f = find(&adjust(&supported, 0, with_pv_eoi), LEAF_HV_FEATURES);
        assert_eq!(f.eax & PV_NEEDS_KERNEL_LAPIC, PV_EOI);
        let p = CpuidParams {
            user_lapic: false,
            ..p
        };
        assert_eq!(
            find(&adjust(&supported, 0, p), LEAF_HV_FEATURES).eax,
            0xffff
        );
    }

    #[test]
    fn x2apic_off_clears_the_bit_kvm_supports() {
        let supported = vec![kvm_cpuid_entry2 {
            function: 1,
            ecx: ECX_X2APIC | 1,
            ..Default::default()
        }];
        let p = CpuidParams {
            x2apic: false,
            ..user_lapic_params()
        };
        let l1 = find(&adjust(&supported, 0, p), 1);
        assert_eq!(l1.ecx & ECX_X2APIC, 0);
        assert_eq!(l1.ecx & 1, 1, "other feature bits stay");
        let on = CpuidParams { x2apic: true, ..p };
        assert_ne!(find(&adjust(&supported, 0, on), 1).ecx & ECX_X2APIC, 0);
    }
}
