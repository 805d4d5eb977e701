//! The MSR ranges the VMM must route to the vPMU: every PMU MSR of every preset and of the
//! model at hand, so a guest probing an MSR its model lacks gets #GP from the vPMU rather than
//! whatever KVM would answer.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;
use std::sync::OnceLock;

use super::regs;
use crate::model::{CpuModel, PRESET_NAMES};

/// Highest MSR index any PMU register of any model may have (MSR_LBR_INFO_31 = 0xDDF).
const MAX_PMU_MSR: u32 = 0xFFF;

/// Gaps that may be swallowed when merging ranges: no MSR in them is one KVM or a Linux guest
/// needs answered other than with #GP (0x1A1-0x1D8: thermal/turbo/offcore MSRs Linux probes
/// with rdmsr_safe; 0x312-0x3F0: between the NetBurst and architectural PMU blocks). Gaps
/// holding SPEC_CTRL (0x48), PRED_CMD (0x49), PERF_STATUS (0x198), the CET MSRs (0x6A0+) or
/// TSC_DEADLINE (0x6E0) are never swallowed.
const FILLABLE_GAPS: &[RangeInclusive<u32>] = &[0x1A1..=0x1D8, 0x312..=0x3F0];

/// The PMU MSR indices of `model`.
pub fn model_msrs(model: &CpuModel) -> impl Iterator<Item = u32> + '_ {
    (0..=MAX_PMU_MSR).filter(move |&i| regs::decode(model, i).is_some())
}

fn preset_union() -> &'static BTreeSet<u32> {
    static UNION: OnceLock<BTreeSet<u32>> = OnceLock::new();
    UNION.get_or_init(|| {
        PRESET_NAMES
            .iter()
            .filter_map(|n| CpuModel::preset(n).ok())
            .flat_map(|m| model_msrs(&m).collect::<Vec<_>>())
            .collect()
    })
}

/// Every MSR index the VMM must route to [`super::Vpmu::rdmsr`] / [`super::Vpmu::wrmsr`] for
/// `model`, as few ranges (at most 14 for the presets). Indices in a range that are not PMU
/// MSRs of `model` are answered with #GP.
pub fn trapped_msrs(model: &CpuModel) -> Vec<RangeInclusive<u32>> {
    let mut all = preset_union().clone();
    all.extend(model_msrs(model));
    let mut ranges: Vec<RangeInclusive<u32>> = Vec::new();
    for i in all {
        if let Some(last) = ranges.last_mut() {
            let (start, end) = (*last.start(), *last.end());
            let contiguous = end.checked_add(1) == Some(i);
            let fillable = FILLABLE_GAPS
                .iter()
                .any(|g| g.contains(&(end + 1)) && g.contains(&(i - 1)));
            if contiguous || fillable {
                *last = start..=i;
                continue;
            }
        }
        ranges.push(i..=i);
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_fit_the_kvm_filter() {
        for name in PRESET_NAMES {
            let m = CpuModel::preset(name).unwrap();
            let r = trapped_msrs(&m);
            assert!(r.len() <= 14, "{name}: {} ranges: {r:x?}", r.len());
            for i in model_msrs(&m) {
                assert!(
                    r.iter().any(|r| r.contains(&i)),
                    "{name}: {i:#x} not trapped"
                );
            }
            for never in [0x48u32, 0x49, 0x198, 0x6A0, 0x6E0, 0x10] {
                assert!(
                    !r.iter().any(|r| r.contains(&never)),
                    "{name} traps {never:#x}"
                );
            }
        }
    }
}
