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
