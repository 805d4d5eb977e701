//! Routes PMU MSRs to user space: KVM_X86_SET_MSR_FILTER ranges whose bitmaps deny every MSR
//! the vPMU owns, with KVM_CAP_X86_USER_SPACE_MSR turning those denials into exits.

use std::ops::RangeInclusive;

use kvm_bindings::KVM_MSR_EXIT_REASON_FILTER;
use kvm_ioctls::{Cap, Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VmFd};
use thiserror::Error;

/// KVM accepts at most this many filter ranges.
pub const MAX_RANGES: usize = 16;

/// The filter could not be installed.
#[derive(Debug, Error)]
pub enum MsrFilterError {
    /// The host KVM lacks user-space MSR exits or MSR filters.
    #[error(
        "this host's KVM lacks {0} (needed to trap PMU MSRs to user space); use Linux 5.10 or newer"
    )]
    Unsupported(&'static str),
    /// More ranges than KVM accepts.
    #[error("{0} MSR ranges to trap, KVM accepts at most {MAX_RANGES}")]
    TooManyRanges(usize),
    /// An ioctl failed.
    #[error("{what} failed: {err}")]
    Kvm {
        /// Which call.
        what: &'static str,
        /// The error.
        err: kvm_ioctls::Error,
    },
}

/// One filter range with an all-deny bitmap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenyRange {
    /// First MSR.
    pub base: u32,
    /// Number of MSRs.
    pub count: u32,
    /// Bitmap: all zero = every MSR in the range exits to user space.
    pub bitmap: Vec<u8>,
}

/// Builds deny ranges for `msrs`, merging overlapping and adjacent ranges.
pub fn deny_ranges(msrs: &[RangeInclusive<u32>]) -> Result<Vec<DenyRange>, MsrFilterError> {
    let mut sorted: Vec<(u32, u32)> = msrs.iter().map(|r| (*r.start(), *r.end())).collect();
    sorted.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::new();
    for (s, e) in sorted {
        match merged.last_mut() {
            Some(last) if s <= last.1.saturating_add(1) => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    if merged.len() > MAX_RANGES {
        return Err(MsrFilterError::TooManyRanges(merged.len()));
    }
    Ok(merged
        .into_iter()
        .map(|(s, e)| {
            let count = e - s + 1;
            DenyRange {
                base: s,
                count,
                bitmap: vec![0u8; count.div_ceil(8) as usize],
            }
        })
        .collect())
}

/// Installs the filter and enables user-space exits for filtered MSRs.
pub fn install(kvm: &Kvm, vm: &VmFd, ranges: &[DenyRange]) -> Result<(), MsrFilterError> {
    if !kvm.check_extension(Cap::X86UserSpaceMsr) {
        return Err(MsrFilterError::Unsupported("KVM_CAP_X86_USER_SPACE_MSR"));
    }
    if !kvm.check_extension(Cap::X86MsrFilter) {
        return Err(MsrFilterError::Unsupported("KVM_CAP_X86_MSR_FILTER"));
    }
    let cap = kvm_bindings::kvm_enable_cap {
        cap: kvm_bindings::KVM_CAP_X86_USER_SPACE_MSR,
        args: [u64::from(KVM_MSR_EXIT_REASON_FILTER), 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&cap).map_err(|err| MsrFilterError::Kvm {
        what: "enabling user-space MSR exits",
        err,
    })?;
    let kranges: Vec<MsrFilterRange<'_>> = ranges
        .iter()
        .map(|r| MsrFilterRange {
            flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
            base: r.base,
            msr_count: r.count,
            bitmap: &r.bitmap,
        })
        .collect();
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &kranges)
        .map_err(|err| MsrFilterError::Kvm {
            what: "KVM_X86_SET_MSR_FILTER",
            err,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_and_sizes_bitmaps() {
        let r = deny_ranges(&[
            0xc1..=0xc8,
            0x186..=0x18d,
            0xc9..=0xc9,
            0x600..=0x600,
            0xc3..=0xc4,
        ])
        .unwrap();
        assert_eq!(
            r,
            vec![
                DenyRange {
                    base: 0xc1,
                    count: 9,
                    bitmap: vec![0, 0]
                },
                DenyRange {
                    base: 0x186,
                    count: 8,
                    bitmap: vec![0]
                },
                DenyRange {
                    base: 0x600,
                    count: 1,
                    bitmap: vec![0]
                },
            ]
        );
    }

    #[test]
    fn too_many_ranges_is_an_error() {
        let many: Vec<_> = (0..17u32).map(|i| i * 10..=i * 10).collect();
        assert!(matches!(
            deny_ranges(&many),
            Err(MsrFilterError::TooManyRanges(17))
        ));
    }
}
