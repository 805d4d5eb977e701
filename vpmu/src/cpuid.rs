//! The CPUID bits a CPU model dictates: leaf 1 family/model/stepping, PDCM, DTES64 and DS, and
//! the architectural-PMU leaf 0xA. Leaf 0 (max leaf, vendor) and everything else is the VMM's.
//!
//! Each override replaces only the bits of its masks, so the rest of a leaf (the host's feature
//! bits in leaf 1) stays as the VMM built it.

use crate::model::{CpuModel, PmuArch};

/// CPUID.1:ECX bit 2: 64-bit DS area.
const LEAF1_ECX_DTES64: u32 = 1 << 2;
/// CPUID.1:ECX bit 15: IA32_PERF_CAPABILITIES present.
const LEAF1_ECX_PDCM: u32 = 1 << 15;
/// CPUID.1:EDX bit 21: debug store.
const LEAF1_EDX_DS: u32 = 1 << 21;
/// CPUID.1:EAX bits the model owns: stepping [3:0], model [7:4], family [11:8], type [13:12],
/// extended model [19:16], extended family [27:20].
const LEAF1_EAX_SIGNATURE: u32 = 0x0FFF_3FFF;
/// CPUID.0AH:EDX bit 15: AnyThread deprecation.
const LEAF_A_EDX_ANYTHREAD_DEPRECATED: u32 = 1 << 15;
/// The architectural performance-monitoring leaf.
pub const LEAF_PMU: u32 = 0xA;
/// The feature-information leaf.
pub const LEAF_FEATURES: u32 = 1;

/// One leaf/subleaf whose masked bits the model dictates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuidOverride {
    /// EAX input (leaf).
    pub function: u32,
    /// ECX input (subleaf).
    pub index: u32,
    /// Values of EAX, EBX, ECX, EDX (only the masked bits matter).
    pub values: [u32; 4],
    /// Which bits of EAX, EBX, ECX, EDX the model owns.
    pub masks: [u32; 4],
}

impl CpuidOverride {
    /// Replaces the owned bits of `regs` (EAX, EBX, ECX, EDX).
    pub fn apply_regs(&self, regs: [&mut u32; 4]) {
        for ((r, v), m) in regs.into_iter().zip(self.values).zip(self.masks) {
            *r = (*r & !m) | (v & m);
        }
    }
}

/// A CPUID entry the overrides can be applied to. Implemented for [`CpuidLeaf`]; a VMM with
/// its own entry type (kvm_cpuid_entry2) uses [`overrides`] and [`CpuidOverride::apply_regs`],
/// or converts to [`CpuidLeaf`].
pub trait CpuidEntry {
    /// (leaf, subleaf).
    fn key(&self) -> (u32, u32);
    /// EAX, EBX, ECX, EDX.
    fn regs_mut(&mut self) -> [&mut u32; 4];
}

/// A plain CPUID entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuidLeaf {
    /// Leaf.
    pub function: u32,
    /// Subleaf.
    pub index: u32,
    /// EAX.
    pub eax: u32,
    /// EBX.
    pub ebx: u32,
    /// ECX.
    pub ecx: u32,
    /// EDX.
    pub edx: u32,
}

impl CpuidEntry for CpuidLeaf {
    fn key(&self) -> (u32, u32) {
        (self.function, self.index)
    }
    fn regs_mut(&mut self) -> [&mut u32; 4] {
        [&mut self.eax, &mut self.ebx, &mut self.ecx, &mut self.edx]
    }
}

/// CPUID.1:EAX for a family/model/stepping (SDM vol. 2A, CPUID, Figure 3-6): the extended
/// family holds `family - 0xF` for family >= 0xF; the extended model holds model[7:4] for
/// families 6 and 0xF.
pub fn signature(model: &CpuModel) -> u32 {
    let (family, ext_family) = if model.family >= 0xF {
        (0xF, model.family - 0xF)
    } else {
        (model.family, 0)
    };
    let (mdl, ext_model) = (model.model & 0xF, (model.model >> 4) & 0xF);
    (model.stepping & 0xF)
        | mdl << 4
        | (family & 0xF) << 8
        | ext_model << 16
        | (ext_family & 0xFF) << 20
}

/// The leaf-0xA registers: version, counters, widths, event mask, fixed counters (SDM 18.2.1,
/// 18.2.2, 18.2.5). NetBurst (version 0) reports all zero.
pub fn leaf_0a(model: &CpuModel) -> [u32; 4] {
    if model.arch == PmuArch::Netburst || model.pmu_version == 0 {
        return [0; 4];
    }
    let eax = u32::from(model.pmu_version)
        | u32::from(model.num_gp) << 8
        | u32::from(model.gp_width) << 16
        | u32::from(model.events_mask_len) << 24;
    let mask_bits = crate::model::low_bits(u32::from(model.events_mask_len));
    let ebx = model.events_unavailable & u32::try_from(mask_bits).unwrap_or(u32::MAX);
    let ecx = if model.pmu_version >= 5 {
        model.fixed_bitmap
    } else {
        0
    };
    let mut edx = 0;
    if model.pmu_version >= 2 {
        edx = u32::from(model.num_fixed & 0x1F) | u32::from(model.fixed_width) << 5;
        if model.anythread_deprecated {
            edx |= LEAF_A_EDX_ANYTHREAD_DEPRECATED;
        }
    }
    [eax, ebx, ecx, edx]
}

/// Every override the model dictates.
pub fn overrides(model: &CpuModel) -> Vec<CpuidOverride> {
    let bit = |on: bool, b: u32| if on { b } else { 0 };
    vec![
        CpuidOverride {
            function: LEAF_FEATURES,
            index: 0,
            values: [
                signature(model),
                0,
                bit(model.pdcm, LEAF1_ECX_PDCM) | bit(model.dtes64, LEAF1_ECX_DTES64),
                bit(model.ds, LEAF1_EDX_DS),
            ],
            masks: [
                LEAF1_EAX_SIGNATURE,
                0,
                LEAF1_ECX_PDCM | LEAF1_ECX_DTES64,
                LEAF1_EDX_DS,
            ],
        },
        CpuidOverride {
            function: LEAF_PMU,
            index: 0,
            values: leaf_0a(model),
            masks: [u32::MAX; 4],
        },
    ]
}

/// Applies the model's overrides to `entries`, adding an entry made by `new_entry(leaf,
/// subleaf)` (all registers zero) for an overridden leaf the list lacks.
pub fn apply<E: CpuidEntry>(
    model: &CpuModel,
    entries: &mut Vec<E>,
    new_entry: impl Fn(u32, u32) -> E,
) {
    for o in overrides(model) {
        let pos = entries
            .iter()
            .position(|e| e.key() == (o.function, o.index));
        let e = match pos {
            Some(p) => &mut entries[p],
            None => {
                entries.push(new_entry(o.function, o.index));
                let last = entries.len() - 1;
                &mut entries[last]
            }
        };
        o.apply_regs(e.regs_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PRESET_NAMES;

    fn leaf(f: u32) -> impl Fn(u32, u32) -> CpuidLeaf {
        move |function, index| {
            assert_eq!(function, f);
            CpuidLeaf {
                function,
                index,
                ..Default::default()
            }
        }
    }

    #[test]
    fn signatures_of_known_parts() {
        let sig = |n: &str| signature(&CpuModel::preset(n).unwrap());
        assert_eq!(sig("skylake"), 0x0005_0654);
        assert_eq!(sig("icelake-server"), 0x0006_06A6);
        assert_eq!(sig("sapphire-rapids"), 0x0008_06F8);
        assert_eq!(sig("core2"), 0x0001_067A);
        assert_eq!(sig("netburst"), 0x0000_0F65);
        let mut m = CpuModel::preset("skylake").unwrap();
        m.family = 0x10E;
        assert_eq!(signature(&m) >> 20, 0xFF);
    }

    #[test]
    fn leaf_a_of_presets() {
        let a = |n: &str| leaf_0a(&CpuModel::preset(n).unwrap());
        // Skylake: v4, 4 GP x 48 bits, 7 events; 3 fixed x 48 bits.
        assert_eq!(a("skylake"), [0x0730_0404, 0, 0, 0x603]);
        assert_eq!(a("core2"), [0x0728_0202, 0, 0, 0x503]);
        let icx = a("icelake-server");
        assert_eq!(icx[0], 0x0830_0805);
        assert_eq!(icx[2], 0xF);
        assert_eq!(icx[3], 0x8604);
        assert_eq!(a("netburst"), [0; 4]);
    }

    #[test]
    fn apply_keeps_host_bits_and_adds_missing_leaves() {
        for name in PRESET_NAMES {
            let m = CpuModel::preset(name).unwrap();
            let host = CpuidLeaf {
                function: 1,
                index: 0,
                eax: 0xF000_C000 | 0x906EA,
                ebx: 0x1234_5678,
                ecx: 0xFFFF_FFFF,
                edx: 0,
            };
            let mut entries = vec![host];
            apply(&m, &mut entries, leaf(LEAF_PMU));
            assert_eq!(entries.len(), 2);
            let l1 = entries[0];
            assert_eq!(l1.eax, 0xF000_C000 | signature(&m), "{name}");
            assert_eq!(l1.ebx, host.ebx);
            assert_eq!(l1.ecx & LEAF1_ECX_PDCM != 0, m.pdcm);
            assert_eq!(l1.ecx & LEAF1_ECX_DTES64 != 0, m.dtes64);
            assert_eq!(l1.ecx | LEAF1_ECX_PDCM | LEAF1_ECX_DTES64, u32::MAX);
            assert_eq!(l1.edx & LEAF1_EDX_DS != 0, m.ds);
            let la = entries[1];
            assert_eq!([la.eax, la.ebx, la.ecx, la.edx], leaf_0a(&m));
        }
    }
}
