//! The guest's CPUID: what KVM supports, with the vendor, family/model/stepping and PMU leaves
//! the CPU model dictates, and the per-vCPU APIC IDs.

use kvm_bindings::{CpuId, kvm_cpuid_entry2};
use vpmu::model::CpuModel;

/// "GenuineIntel" in EBX, EDX, ECX order: Linux's perf driver only initialises on Intel.
const GENUINE_INTEL: [u32; 3] = [0x756e_6547, 0x4965_6e69, 0x6c65_746e];
/// Leaf 0xA must be reachable.
const MIN_MAX_LEAF: u32 = 0xa;

/// CPUID for vCPU `index` on `model`, starting from what KVM supports.
pub fn for_vcpu(supported: &CpuId, model: &CpuModel, index: u8) -> CpuId {
    let mut entries: Vec<kvm_cpuid_entry2> = supported.as_slice().to_vec();
    for e in entries.iter_mut() {
        match e.function {
            0 => {
                e.eax = e.eax.max(MIN_MAX_LEAF);
                [e.ebx, e.edx, e.ecx] = GENUINE_INTEL;
            }
            1 => {
                // Initial APIC ID in EBX[31:24].
                e.ebx = (e.ebx & 0x00ff_ffff) | (u32::from(index) << 24);
            }
            0xb | 0x1f => e.edx = u32::from(index),
            _ => {}
        }
    }
    for o in vpmu::cpuid::overrides(model) {
        let pos = entries
            .iter()
            .position(|e| (e.function, e.index) == (o.function, o.index));
        let e = match pos {
            Some(i) => &mut entries[i],
            None => {
                entries.push(kvm_cpuid_entry2 {
                    function: o.function,
                    index: o.index,
                    ..Default::default()
                });
                let last = entries.len() - 1;
                &mut entries[last]
            }
        };
        o.apply_regs([&mut e.eax, &mut e.ebx, &mut e.ecx, &mut e.edx]);
    }
    // The list comes from KVM_GET_SUPPORTED_CPUID, so it fits KVM_MAX_CPUID_ENTRIES.
    CpuId::from_entries(&entries).unwrap_or_else(|_| supported.clone())
}

/// The VMM's own CPUID leaf (in the hypervisor range, clear of KVM's 0x4000_0000 signature
/// leaf): EBX/ECX/EDX spell "vpmuvpmuvpmu", EAX carries [`VPMU_FLAG_DS_CLEARED`].
pub const VPMU_LEAF: u32 = 0x4000_0100;
/// EAX bit 0 of [`VPMU_LEAF`]: the host KVM cleared CPUID.1:EDX.DS although the CPU model has
/// it (PVM-based KVM does; CPUID does not exit to user space, so the VMM cannot answer it).
pub const VPMU_FLAG_DS_CLEARED: u32 = 1 << 0;
/// CPUID.1:EDX.DS.
const LEAF1_EDX_DS: u32 = 1 << 21;
const VPMU_SIGNATURE: u32 = u32::from_le_bytes(*b"vpmu");

/// Whether `set` asked for CPUID.1:EDX.DS and `got` (KVM_GET_CPUID2 after the set) lost it.
pub fn ds_cleared(set: &CpuId, got: &CpuId) -> bool {
    let ds = |c: &CpuId| {
        c.as_slice()
            .iter()
            .find(|e| e.function == 1)
            .is_some_and(|e| e.edx & LEAF1_EDX_DS != 0)
    };
    ds(set) && !ds(got)
}

/// `cpuid` with [`VPMU_LEAF`] carrying `flags`.
pub fn with_vpmu_leaf(cpuid: &CpuId, flags: u32) -> CpuId {
    let mut entries: Vec<kvm_cpuid_entry2> = cpuid
        .as_slice()
        .iter()
        .filter(|e| e.function != VPMU_LEAF)
        .copied()
        .collect();
    entries.push(kvm_cpuid_entry2 {
        function: VPMU_LEAF,
        eax: flags,
        ebx: VPMU_SIGNATURE,
        ecx: VPMU_SIGNATURE,
        edx: VPMU_SIGNATURE,
        ..Default::default()
    });
    CpuId::from_entries(&entries).unwrap_or_else(|_| cpuid.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf1(edx: u32) -> CpuId {
        CpuId::from_entries(&[kvm_cpuid_entry2 {
            function: 1,
            edx,
            ..Default::default()
        }])
        .unwrap()
    }

    #[test]
    fn detects_a_cleared_ds_bit() {
        assert!(ds_cleared(&leaf1(LEAF1_EDX_DS), &leaf1(0)));
        assert!(!ds_cleared(&leaf1(LEAF1_EDX_DS), &leaf1(LEAF1_EDX_DS)));
        assert!(!ds_cleared(&leaf1(0), &leaf1(0)));
    }

    #[test]
    fn vpmu_leaf_is_added_once() {
        let c = with_vpmu_leaf(&with_vpmu_leaf(&leaf1(0), 0), VPMU_FLAG_DS_CLEARED);
        let v: Vec<_> = c
            .as_slice()
            .iter()
            .filter(|e| e.function == VPMU_LEAF)
            .collect();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].eax, VPMU_FLAG_DS_CLEARED);
        assert_eq!(v[0].ebx.to_le_bytes(), *b"vpmu");
    }

    #[test]
    fn model_bits_reach_the_entries() {
        let model = CpuModel::preset("skylake").unwrap();
        let supported = CpuId::from_entries(&[
            kvm_cpuid_entry2 {
                function: 0,
                eax: 0xd,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 1,
                ..Default::default()
            },
        ])
        .unwrap();
        let c = for_vcpu(&supported, &model, 3);
        let e1 = c.as_slice().iter().find(|e| e.function == 1).unwrap();
        assert_eq!(e1.ebx >> 24, 3, "initial APIC ID");
        assert_ne!(e1.edx & LEAF1_EDX_DS, 0);
        let e0 = c.as_slice().iter().find(|e| e.function == 0).unwrap();
        assert_eq!([e0.ebx, e0.edx, e0.ecx], GENUINE_INTEL);
        let ea = c.as_slice().iter().find(|e| e.function == 0xa).unwrap();
        assert_eq!(ea.eax & 0xff, 4, "PMU version 4");
    }
}
