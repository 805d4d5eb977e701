//! Branch records end to end through the vPMU's public API: a known sequence of taken
//! branches read back through the LBR MSRs of every preset, LBR_SELECT filtering, freeze on
//! PMI (v3 vs v4), BTS records in a paged DS buffer (threshold PMI, circular wrap, full buffer,
//! hostile DS areas), and the adaptive PEBS LBR group.

mod pebs_common;

use pebs_common::*;
use vpmu::Vpmu;
use vpmu::bts::{BTS_FLAG_PREDICTED, BtsDropCause};
use vpmu::counter::CounterId;
use vpmu::ds::{DS_BTS_ABSOLUTE_MAXIMUM, DS_BTS_INDEX, DS_BTS_INTERRUPT_THRESHOLD};
use vpmu::lbr::{self, BranchType, LbrAction, TakenBranch};
use vpmu::mem::{GuestMemory, VecMemory};
use vpmu::model::{CpuModel, LbrLayout, PRESET_NAMES};
use vpmu::msr::*;
use vpmu::paging::PageWalker;
use vpmu::pebs::read_pebs_buffer;
use vpmu::state::{EventInfo, GuestState, LbrEntry, PagingRegs};

const RAM: usize = 0x11_0000;
const DS_LA: u64 = 0xFFFF_FE00_0000_0000;
const DS_PA: u64 = 0x8000;
const BTS_LA: u64 = 0xFFFF_FE00_0001_0000;
/// BTS buffer pages: non-contiguous and out of order.
const BTS_PA: [u64; 2] = [0x20_000, 0x12_000];
const PEBS_LA: u64 = 0xFFFF_FE00_0004_0000;
const PEBS_PA: u64 = 0x30_000;
/// Never written by anything but BTS and PEBS; checked to stay untouched.
const KERNEL: u64 = 0xFFFF_FFFF_8100_0000;
const USER: u64 = 0x0000_0000_0040_1000;

struct Rig {
    pmu: Vpmu,
    g: Guest,
    paging: PagingRegs,
}

impl Rig {
    fn new(model: CpuModel) -> Rig {
        let mut g = Guest::new(RAM, 0x10_0000);
        let root = g.alloc();
        g.map_ia32e(root, 4, DS_LA, DS_PA, SIZE_4K, PW);
        for (i, pa) in BTS_PA.iter().enumerate() {
            g.map_ia32e(root, 4, BTS_LA + i as u64 * SIZE_4K, *pa, SIZE_4K, PW);
        }
        g.map_ia32e(root, 4, PEBS_LA, PEBS_PA, SIZE_4K, PW);
        let mut pmu = Vpmu::new(model);
        if pmu.model().ds {
            pmu.wrmsr(IA32_DS_AREA, DS_LA).unwrap();
        }
        Rig {
            pmu,
            g,
            paging: regs_ia32e(root, false),
        }
    }

    fn preset(name: &str) -> Rig {
        Rig::new(CpuModel::preset(name).unwrap())
    }

    fn w(&mut self, msr: u32, v: u64) {
        self.pmu.wrmsr(msr, v).unwrap();
    }

    fn r(&mut self, msr: u32) -> u64 {
        self.pmu.rdmsr(msr).unwrap()
    }

    fn branch(&mut self, b: &TakenBranch) -> vpmu::pmu::BranchOutcome {
        self.pmu.record_branch(b, &self.paging, &mut self.g.mem)
    }

    /// BTS window: base BTS_LA, `records` records of room, threshold after `thr` records.
    fn set_bts(&mut self, index_records: u64, records: u64, thr: u64) {
        let f = [
            (0, BTS_LA),
            (DS_BTS_INDEX, BTS_LA + 24 * index_records),
            (DS_BTS_ABSOLUTE_MAXIMUM, BTS_LA + 24 * records),
            (DS_BTS_INTERRUPT_THRESHOLD, BTS_LA + 24 * thr),
        ];
        for (off, v) in f {
            self.g.mem.write_u64(DS_PA + off, v).unwrap();
        }
    }

    fn bts_index(&self) -> u64 {
        self.g.mem.read_u64(DS_PA + DS_BTS_INDEX).unwrap()
    }

    /// BTS record `k` as (from, to, flags), read through the page tables.
    fn bts_record(&mut self, k: u64) -> (u64, u64, u64) {
        let walker = PageWalker::new(self.paging);
        let mut b = [0u8; 24];
        walker.read(&self.g.mem, BTS_LA + 24 * k, &mut b).unwrap();
        let q = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        (q(0), q(1), q(2))
    }
}

fn br(from: u64, to: u64, kind: BranchType, cpl: u8, cycles: u64) -> TakenBranch {
    TakenBranch {
        from,
        to,
        kind,
        cpl,
        cycles,
    }
}

/// A fixed sequence of `n` branches mixing kinds, rings and kernel/user addresses.
fn sequence(n: u64) -> Vec<TakenBranch> {
    use BranchType::*;
    let kinds = [
        Conditional,
        NearRelCall,
        NearRet,
        NearIndJmp,
        NearRelJmp,
        NearIndCall,
        Far,
        Interrupt,
    ];
    (0..n)
        .map(|k| {
            let kernel = k % 3 == 0;
            let base = if kernel { KERNEL } else { USER };
            br(
                base + 0x10 * k,
                base + 0x1000 + 0x10 * k,
                kinds[usize::try_from(k).unwrap() % kinds.len()],
                if kernel { 0 } else { 3 },
                1000 + 37 * k * k,
            )
        })
        .collect()
}

fn lbr_bases(m: &CpuModel) -> (u32, u32) {
    match m.lbr_layout {
        LbrLayout::Core2 => (CORE2_LASTBRANCH_0_FROM_IP, CORE2_LASTBRANCH_0_TO_IP),
        LbrLayout::Nehalem => (MSR_LASTBRANCH_0_FROM_IP, MSR_LASTBRANCH_0_TO_IP),
    }
}

/// The known sequence read back through the MSRs of every preset with LBRs, newest first
/// from TOS, decoded per the preset's LBR format (SDM 17.4.8.1).
#[test]
fn known_sequence_through_the_msrs_of_every_preset() {
    for name in PRESET_NAMES {
        let mut t = Rig::preset(name);
        let m = t.pmu.model().clone();
        let depth = u64::from(m.lbr_depth);
        if depth == 0 {
            assert!(t.pmu.lbr_entries().is_empty(), "{name}");
            continue;
        }
        t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
        let seq = sequence(depth + 3);
        for b in &seq {
            assert_eq!(t.branch(b).lbr, Some(LbrAction::Recorded), "{name}");
        }
        let tos = t.r(MSR_LASTBRANCH_TOS);
        assert_eq!(tos, (depth + 3) % depth, "{name}: TOS wraps at the depth");
        let (from_base, to_base) = lbr_bases(&m);
        let entries = t.pmu.lbr_entries();
        assert_eq!(entries.len() as u64, depth);
        for k in 0..depth {
            let slot = u32::try_from((tos + depth - k) % depth).unwrap();
            let raw = LbrEntry {
                from: t.r(from_base + slot),
                to: t.r(to_base + slot),
                info: if m.has_lbr_info() {
                    t.r(MSR_LBR_INFO_0 + slot)
                } else {
                    0
                },
            };
            assert_eq!(
                raw,
                entries[usize::try_from(k).unwrap()],
                "{name}: entry {k}"
            );
            let expect = &seq[seq.len() - 1 - usize::try_from(k).unwrap()];
            let d = lbr::decode(m.lbr_format, &raw);
            assert_eq!(
                (d.from, d.to),
                (expect.from, expect.to),
                "{name}: entry {k}"
            );
            assert!(!d.mispredict, "{name}: no mispredictions are modelled");
            if m.has_lbr_info() {
                let prev = &seq[seq.len() - 2 - usize::try_from(k).unwrap()];
                let elapsed = u16::try_from(expect.cycles - prev.cycles).unwrap();
                assert_eq!(d.cycles, Some(elapsed), "{name}: cycles since last update");
            }
        }
    }
}

#[test]
fn per_format_msr_values() {
    // Nehalem, format 3: bit 63 mispredict (0), 62:48 sign extension of bit 47.
    let mut t = Rig::preset("nehalem");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
    t.branch(&br(KERNEL, USER, BranchType::NearRelJmp, 0, 5));
    assert_eq!(t.r(MSR_LASTBRANCH_0_FROM_IP + 1), 0x7FFF_FFFF_8100_0000);
    assert_eq!(t.r(MSR_LASTBRANCH_0_TO_IP + 1), USER);
    // Haswell, format 4: bits 63:61 flags, 60:0 address.
    let mut t = Rig::preset("haswell");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
    t.branch(&br(KERNEL, KERNEL + 8, BranchType::NearRelJmp, 0, 5));
    assert_eq!(t.r(MSR_LASTBRANCH_0_FROM_IP + 1), 0x1FFF_FFFF_8100_0000);
    assert_eq!(t.r(MSR_LASTBRANCH_0_TO_IP + 1), KERNEL + 8);
    // Skylake, format 5: full addresses, LBR_INFO cycles [15:0] saturating at 0xFFFF.
    let mut t = Rig::preset("skylake");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
    t.branch(&br(KERNEL, USER, BranchType::Far, 0, 300));
    t.branch(&br(USER, KERNEL, BranchType::Far, 3, 300 + 0x12_3456));
    assert_eq!(t.r(MSR_LASTBRANCH_0_FROM_IP + 1), KERNEL);
    assert_eq!(t.r(MSR_LBR_INFO_0 + 1), 300);
    assert_eq!(t.r(MSR_LASTBRANCH_0_FROM_IP + 2), USER);
    assert_eq!(t.r(MSR_LBR_INFO_0 + 2), 0xFFFF);
    // Core 2, format 1 at 0x40/0x60: 64-bit linear addresses.
    let mut t = Rig::preset("core2");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
    t.branch(&br(KERNEL, USER, BranchType::Conditional, 0, 1));
    assert_eq!(t.r(CORE2_LASTBRANCH_0_FROM_IP + 1), KERNEL);
    assert_eq!(t.r(CORE2_LASTBRANCH_0_TO_IP + 1), USER);
    // A format-6 model (cycles in TO[63:48]) has no LBR_INFO MSRs.
    let mut m = CpuModel::preset("skylake").unwrap();
    m.lbr_format = LBR_FORMAT_TIME;
    let mut t = Rig::new(m);
    assert!(t.pmu.rdmsr(MSR_LBR_INFO_0).is_err());
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
    t.branch(&br(KERNEL, KERNEL + 4, BranchType::Far, 0, 0x42));
    assert_eq!(t.r(MSR_LASTBRANCH_0_TO_IP + 1), 0x0042_FFFF_8100_0004);
}

#[test]
fn lbr_msr_presence_and_reset_values() {
    let mut nhm = Vpmu::new(CpuModel::preset("nehalem").unwrap());
    assert_eq!(
        nhm.rdmsr(MSR_LASTBRANCH_0_FROM_IP + 15),
        Ok(0),
        "reset value 0"
    );
    assert!(
        nhm.rdmsr(MSR_LASTBRANCH_0_FROM_IP + 16).is_err(),
        "beyond depth"
    );
    assert!(nhm.wrmsr(MSR_LASTBRANCH_0_TO_IP + 16, 0).is_err());
    assert!(
        nhm.rdmsr(MSR_LBR_INFO_0).is_err(),
        "format 3 has no LBR_INFO"
    );
    assert!(
        nhm.rdmsr(CORE2_LASTBRANCH_0_FROM_IP).is_err(),
        "0x40 is Core 2 only"
    );
    assert!(
        nhm.wrmsr(MSR_LASTBRANCH_TOS, 16).is_err(),
        "TOS beyond the depth"
    );
    let mut hsw = Vpmu::new(CpuModel::preset("haswell").unwrap());
    assert!(
        hsw.rdmsr(MSR_LBR_INFO_0).is_err(),
        "format 4 has no LBR_INFO"
    );
    let mut c2 = Vpmu::new(CpuModel::preset("core2").unwrap());
    assert!(c2.rdmsr(MSR_LASTBRANCH_0_FROM_IP).is_err());
    assert!(c2.rdmsr(MSR_LBR_SELECT).is_err());
    assert!(c2.rdmsr(CORE2_LASTBRANCH_0_FROM_IP + 4).is_err());
    // Writes read back and become the stack's entries (Linux restores saved stacks).
    let mut skl = Vpmu::new(CpuModel::preset("skylake").unwrap());
    skl.wrmsr(MSR_LASTBRANCH_0_FROM_IP + 7, 0xDEAD).unwrap();
    skl.wrmsr(MSR_LASTBRANCH_0_TO_IP + 7, 0xBEEF).unwrap();
    skl.wrmsr(MSR_LBR_INFO_0 + 7, 0x8000_0000_0000_0011)
        .unwrap();
    skl.wrmsr(MSR_LASTBRANCH_TOS, 7).unwrap();
    assert_eq!(
        skl.lbr_entries()[0],
        LbrEntry {
            from: 0xDEAD,
            to: 0xBEEF,
            info: 0x8000_0000_0000_0011
        }
    );
}

#[test]
fn disabled_lbr_records_nothing() {
    let mut t = Rig::preset("skylake");
    for b in sequence(5) {
        assert_eq!(t.branch(&b).lbr, None);
    }
    assert!(!t.pmu.wants_branches());
    assert!(
        t.pmu
            .lbr_entries()
            .iter()
            .all(|e| *e == LbrEntry::default())
    );
    assert_eq!(t.r(MSR_LASTBRANCH_TOS), 0);
}

#[test]
fn lbr_select_filters_by_cpl_and_type() {
    let mut t = Rig::preset("nehalem");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
    // Only user-mode conditional branches and near returns.
    let select =
        LBR_SELECT_FILTER_MASK & !(LBR_SELECT_CPL_NEQ_0 | LBR_SELECT_JCC | LBR_SELECT_NEAR_RET);
    t.w(MSR_LBR_SELECT, select);
    let mut kept = Vec::new();
    for b in sequence(24) {
        let keep = b.cpl != 0 && matches!(b.kind, BranchType::Conditional | BranchType::NearRet);
        let expect = if keep {
            LbrAction::Recorded
        } else {
            LbrAction::Filtered
        };
        assert_eq!(t.branch(&b).lbr, Some(expect), "{b:?}");
        if keep {
            kept.push(b);
        }
    }
    assert!(kept.len() >= 3);
    assert_eq!(t.r(MSR_LASTBRANCH_TOS), kept.len() as u64);
    for (e, b) in t.pmu.lbr_entries().iter().zip(kept.iter().rev()) {
        assert_eq!(lbr::decode(LBR_FORMAT_EIP_FLAGS, e).from, b.from);
    }
    // Ring-0 only.
    let mut t = Rig::preset("skylake");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
    t.w(MSR_LBR_SELECT, LBR_SELECT_CPL_NEQ_0);
    assert_eq!(
        t.branch(&br(USER, USER + 4, BranchType::Far, 3, 0)).lbr,
        Some(LbrAction::Filtered)
    );
    assert_eq!(
        t.branch(&br(KERNEL, USER, BranchType::Far, 0, 0)).lbr,
        Some(LbrAction::Recorded)
    );
}

/// Makes PMC0 overflow with INT set and runs the overflow handling: a counter PMI.
fn counter_pmi(t: &mut Rig) {
    t.w(IA32_PMC0, (1u64 << t.pmu.model().gp_width) - 1);
    t.w(
        IA32_PERFEVTSEL0,
        0xC0 | EVTSEL_USR | EVTSEL_OS | EVTSEL_EN | EVTSEL_INT,
    );
    let wrapped = t.pmu.add_counts(&[(CounterId::Gp(0), 1)]);
    assert_eq!(wrapped, [CounterId::Gp(0)]);
    let out = t.pmu.handle_overflow(
        &wrapped,
        &GuestState::default(),
        &EventInfo::default(),
        &mut t.g.mem,
    );
    assert!(out.pmi);
    assert!(t.pmu.take_pmi_request());
}

#[test]
fn freeze_lbrs_on_pmi_v3_clears_lbr_v4_sets_lbr_frz() {
    // v3 (Haswell): the PMI clears DEBUGCTL.LBR (SDM 17.4.7).
    let mut t = Rig::preset("haswell");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR | DEBUGCTL_FREEZE_LBRS_ON_PMI);
    t.branch(&br(USER, USER + 0x40, BranchType::NearRelJmp, 3, 0));
    counter_pmi(&mut t);
    assert_eq!(t.r(IA32_DEBUGCTL) & DEBUGCTL_LBR, 0);
    assert_eq!(
        t.branch(&br(USER, USER + 0x80, BranchType::NearRelJmp, 3, 0))
            .lbr,
        None
    );
    assert_eq!(t.r(MSR_LASTBRANCH_TOS), 1, "frozen");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR | DEBUGCTL_FREEZE_LBRS_ON_PMI);
    assert!(
        t.branch(&br(USER, USER + 0x80, BranchType::NearRelJmp, 3, 0))
            .lbr
            .is_some()
    );
    assert_eq!(t.r(MSR_LASTBRANCH_TOS), 2);

    // v4 (Skylake): LBR_Frz (bit 58) freezes; DEBUGCTL.LBR stays; STATUS_RESET unfreezes.
    let mut t = Rig::preset("skylake");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR | DEBUGCTL_FREEZE_LBRS_ON_PMI);
    counter_pmi(&mut t);
    assert_ne!(t.r(IA32_DEBUGCTL) & DEBUGCTL_LBR, 0);
    assert_ne!(t.r(IA32_PERF_GLOBAL_STATUS) & GLOBAL_STATUS_LBR_FRZ, 0);
    assert_eq!(
        t.branch(&br(USER, USER + 0x40, BranchType::NearRelJmp, 3, 0))
            .lbr,
        None
    );
    assert!(!t.pmu.wants_branches());
    t.w(IA32_PERF_GLOBAL_OVF_CTRL, GLOBAL_STATUS_LBR_FRZ);
    assert!(
        t.branch(&br(USER, USER + 0x40, BranchType::NearRelJmp, 3, 0))
            .lbr
            .is_some()
    );
    assert_eq!(t.r(MSR_LASTBRANCH_TOS), 1);

    // Without FREEZE_LBRS_ON_PMI the stack keeps recording.
    let mut t = Rig::preset("skylake");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
    counter_pmi(&mut t);
    assert!(
        t.branch(&br(USER, USER + 0x40, BranchType::NearRelJmp, 3, 0))
            .lbr
            .is_some()
    );
}

#[test]
fn bts_is_available_on_every_preset() {
    for name in PRESET_NAMES {
        let mut p = Vpmu::new(CpuModel::preset(name).unwrap());
        assert_eq!(
            p.rdmsr(IA32_MISC_ENABLE).unwrap() & MISC_ENABLE_BTS_UNAVAILABLE,
            0
        );
        let bits = if *name == "netburst" {
            NETBURST_DEBUGCTLA_TR
                | NETBURST_DEBUGCTLA_BTS
                | NETBURST_DEBUGCTLA_BTINT
                | NETBURST_DEBUGCTLA_BTS_OFF_OS
                | NETBURST_DEBUGCTLA_BTS_OFF_USR
        } else {
            DEBUGCTL_TR | DEBUGCTL_BTS | DEBUGCTL_BTINT | DEBUGCTL_BTS_OFF_OS | DEBUGCTL_BTS_OFF_USR
        };
        p.wrmsr(IA32_DEBUGCTL, bits).unwrap();
        assert_eq!(p.rdmsr(IA32_DEBUGCTL), Ok(bits), "{name}");
    }
}

fn bts_bits(name: &str, btint: bool) -> u64 {
    if name == "netburst" {
        NETBURST_DEBUGCTLA_TR
            | NETBURST_DEBUGCTLA_BTS
            | if btint { NETBURST_DEBUGCTLA_BTINT } else { 0 }
    } else {
        DEBUGCTL_TR | DEBUGCTL_BTS | if btint { DEBUGCTL_BTINT } else { 0 }
    }
}

/// The same sequence as the LBR test lands in a paged BTS buffer, in order, on every preset.
#[test]
fn bts_records_in_a_paged_buffer() {
    for name in PRESET_NAMES {
        let mut t = Rig::preset(name);
        // 200 records of room: the buffer crosses into its second, non-contiguous page.
        t.set_bts(0, 200, 201);
        t.w(IA32_DEBUGCTL, bts_bits(name, false));
        assert!(t.pmu.wants_branches());
        let seq = sequence(180);
        for b in &seq {
            let o = t.branch(b);
            assert!(o.bts.unwrap().written, "{name}");
            assert!(!o.pmi);
        }
        assert_eq!(t.bts_index(), BTS_LA + 24 * 180);
        let predicted = if *name == "core2" {
            0
        } else {
            BTS_FLAG_PREDICTED
        };
        for (k, b) in seq.iter().enumerate() {
            assert_eq!(
                t.bts_record(k as u64),
                (b.from, b.to, predicted),
                "{name}: {k}"
            );
        }
    }
}

#[test]
fn bts_cpl_qualification_and_tr_alone() {
    let mut t = Rig::preset("skylake");
    t.set_bts(0, 10, 11);
    t.w(IA32_DEBUGCTL, DEBUGCTL_TR);
    assert_eq!(t.branch(&br(USER, USER, BranchType::Far, 3, 0)).bts, None);
    t.w(IA32_DEBUGCTL, DEBUGCTL_BTS);
    assert_eq!(t.branch(&br(USER, USER, BranchType::Far, 3, 0)).bts, None);
    t.w(
        IA32_DEBUGCTL,
        DEBUGCTL_TR | DEBUGCTL_BTS | DEBUGCTL_BTS_OFF_OS,
    );
    assert_eq!(
        t.branch(&br(KERNEL, KERNEL, BranchType::Far, 0, 0)).bts,
        None
    );
    assert!(
        t.branch(&br(USER, USER + 1, BranchType::Far, 3, 0))
            .bts
            .unwrap()
            .written
    );
    t.w(
        IA32_DEBUGCTL,
        DEBUGCTL_TR | DEBUGCTL_BTS | DEBUGCTL_BTS_OFF_USR,
    );
    assert_eq!(t.branch(&br(USER, USER, BranchType::Far, 3, 0)).bts, None);
    assert!(
        t.branch(&br(KERNEL, KERNEL + 1, BranchType::Far, 0, 0))
            .bts
            .unwrap()
            .written
    );
    assert_eq!(t.bts_index(), BTS_LA + 48);
    assert_eq!(t.bts_record(0).0, USER);
    assert_eq!(t.bts_record(1).0, KERNEL);
}

#[test]
fn bts_threshold_pmi_with_btint() {
    let mut t = Rig::preset("skylake");
    t.set_bts(0, 8, 3);
    t.w(
        IA32_DEBUGCTL,
        bts_bits("skylake", true) | DEBUGCTL_FREEZE_PERFMON_ON_PMI,
    );
    for k in 0..2 {
        assert!(!t.branch(&sequence(3)[k]).pmi);
    }
    assert!(!t.pmu.take_pmi_request());
    let o = t.branch(&sequence(3)[2]);
    assert!(o.pmi && o.bts.unwrap().threshold_reached);
    assert!(t.pmu.take_pmi_request());
    // No GLOBAL_STATUS bit for BTS; the PMI applies FREEZE_PERFMON_ON_PMI (v4: CTR_Frz).
    assert_eq!(t.r(IA32_PERF_GLOBAL_STATUS), GLOBAL_STATUS_CTR_FRZ);
    // The same window without BTINT never interrupts.
    let mut t = Rig::preset("skylake");
    t.set_bts(0, 8, 3);
    t.w(IA32_DEBUGCTL, bts_bits("skylake", false));
    for b in sequence(12) {
        assert!(!t.branch(&b).pmi);
    }
    assert!(!t.pmu.take_pmi_request());
}

#[test]
fn bts_circular_without_btint() {
    let mut t = Rig::preset("haswell");
    t.set_bts(0, 3, 100);
    t.w(IA32_DEBUGCTL, bts_bits("haswell", false));
    let seq = sequence(5);
    for (k, b) in seq.iter().enumerate() {
        let o = t.branch(b).bts.unwrap();
        assert!(o.written);
        assert_eq!(o.wrapped, k == 3, "wraps once the third slot is used");
    }
    assert_eq!(t.bts_index(), BTS_LA + 48);
    assert_eq!(t.bts_record(0).0, seq[3].from);
    assert_eq!(t.bts_record(1).0, seq[4].from);
    assert_eq!(t.bts_record(2).0, seq[2].from);
    assert_eq!(
        t.bts_record(3),
        (0, 0, 0),
        "nothing past the absolute maximum"
    );
}

#[test]
fn bts_full_buffer_with_btint_drops() {
    let mut t = Rig::preset("nehalem");
    t.set_bts(0, 2, 2);
    t.w(IA32_DEBUGCTL, bts_bits("nehalem", true));
    let seq = sequence(4);
    assert!(!t.branch(&seq[0]).pmi);
    assert!(t.branch(&seq[1]).pmi);
    for b in &seq[2..] {
        let o = t.branch(b);
        assert_eq!(o.bts.unwrap().dropped, Some(BtsDropCause::BufferFull));
        assert!(!o.pmi);
    }
    assert_eq!(t.bts_index(), BTS_LA + 48);
    assert_eq!(t.bts_record(2), (0, 0, 0));
    // Draining (Index back to base) resumes recording.
    t.g.mem.write_u64(DS_PA + DS_BTS_INDEX, BTS_LA).unwrap();
    assert!(t.branch(&seq[3]).bts.unwrap().written);
    assert_eq!(t.bts_record(0).0, seq[3].from);
}

/// Hostile DS contents write nothing at all.
#[test]
fn hostile_bts_ds_areas() {
    type Setup = fn(&mut Rig);
    let cases: Vec<(&str, Setup, BtsDropCause)> = vec![
        (
            "index below base",
            |t| t.g.mem.write_u64(DS_PA, BTS_LA + 24).unwrap(),
            BtsDropCause::IndexBelowBase,
        ),
        (
            "index past max",
            |t| t.set_bts(6, 4, 5),
            BtsDropCause::IndexPastMaximum,
        ),
        (
            "base above max",
            |t| {
                let max = DS_PA + DS_BTS_ABSOLUTE_MAXIMUM;
                t.g.mem.write_u64(max, BTS_LA - 24).unwrap();
            },
            BtsDropCause::BaseAboveMaximum,
        ),
        (
            "unmapped DS area",
            |t| t.w(IA32_DS_AREA, DS_LA + 0x10_0000),
            BtsDropCause::DsAreaNotPresent,
        ),
        (
            "buffer in an unmapped page",
            |t| {
                // The index lies just past the two mapped buffer pages.
                let la = BTS_LA + 2 * SIZE_4K - 24;
                for (off, v) in [
                    (0, la),
                    (DS_BTS_INDEX, la + 24),
                    (DS_BTS_ABSOLUTE_MAXIMUM, la + 96),
                ] {
                    t.g.mem.write_u64(DS_PA + off, v).unwrap();
                }
            },
            BtsDropCause::BufferNotPresent,
        ),
        (
            "non-canonical buffer",
            |t| {
                for off in [0, DS_BTS_INDEX] {
                    t.g.mem.write_u64(DS_PA + off, 1 << 63).unwrap();
                }
                let max = DS_PA + DS_BTS_ABSOLUTE_MAXIMUM;
                t.g.mem.write_u64(max, (1 << 63) + 0x1000).unwrap();
            },
            BtsDropCause::BufferNonCanonical,
        ),
    ];
    for (what, setup, cause) in cases {
        let mut t = Rig::preset("skylake");
        t.set_bts(0, 4, 5);
        setup(&mut t);
        t.w(IA32_DEBUGCTL, bts_bits("skylake", false));
        let before = t.g.mem.clone();
        let o = t.branch(&sequence(1)[0]);
        assert_eq!(o.bts.unwrap().dropped, Some(cause), "{what}");
        assert!(!o.pmi);
        assert!(t.g.mem == before, "{what}: memory changed");
    }
}

/// A random sweep of DS windows: every byte that changes lies in the BTS window (translated
/// page by page) or is the BTS Index field.
#[test]
fn bts_writes_stay_inside_the_window() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let mut written = 0;
    for _ in 0..300 {
        let mut t = Rig::preset("icelake-server");
        let pick = |r: &mut Rng| BTS_LA - 64 + r.next() % (2 * SIZE_4K + 128);
        let (base, index, max) = (pick(&mut rng), pick(&mut rng), pick(&mut rng));
        let threshold = pick(&mut rng);
        for (off, v) in [
            (0, base),
            (DS_BTS_INDEX, index),
            (DS_BTS_ABSOLUTE_MAXIMUM, max),
            (DS_BTS_INTERRUPT_THRESHOLD, threshold),
        ] {
            t.g.mem.write_u64(DS_PA + off, v).unwrap();
        }
        let btint = rng.next() & 1 == 1;
        t.w(IA32_DEBUGCTL, bts_bits("icelake-server", btint));
        let before = t.g.mem.clone();
        for b in sequence(4) {
            written += u32::from(t.branch(&b).bts.unwrap().written);
        }
        // Guest-physical ranges of [base, max) within the two mapped buffer pages.
        let allowed: Vec<(u64, u64)> = BTS_PA
            .iter()
            .enumerate()
            .filter_map(|(p, &pa)| {
                let page = BTS_LA + p as u64 * SIZE_4K;
                let (lo, hi) = (base.max(page), max.min(page + SIZE_4K));
                (lo < hi).then(|| (pa + (lo - page), pa + (hi - page)))
            })
            .collect();
        for (i, (x, y)) in before.bytes.iter().zip(&t.g.mem.bytes).enumerate() {
            if x == y {
                continue;
            }
            let gpa = i as u64;
            let in_index = (DS_PA + DS_BTS_INDEX..DS_PA + DS_BTS_INDEX + 8).contains(&gpa);
            let in_window = allowed.iter().any(|&(lo, hi)| (lo..hi).contains(&gpa));
            assert!(
                in_index || in_window,
                "write at {gpa:#x} outside [{base:#x}, {max:#x})"
            );
        }
    }
    assert!(written > 50, "the sweep must exercise writes: {written}");
}

/// Adaptive PEBS records carry the N newest LBR entries, as MSR_PEBS_DATA_CFG asks.
#[test]
fn adaptive_pebs_lbr_group_from_the_stack() {
    for (name, n) in [("icelake-server", 4u64), ("sapphire-rapids", 32)] {
        let mut t = Rig::preset(name);
        for (off, v) in [
            (0x20, PEBS_LA),
            (0x28, PEBS_LA),
            (0x30, PEBS_LA + SIZE_4K),
            (0x38, PEBS_LA + SIZE_4K),
        ] {
            t.g.mem.write_u64(DS_PA + off, v).unwrap();
        }
        t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
        let seq = sequence(40);
        for b in &seq {
            t.branch(b);
        }
        t.w(IA32_PEBS_ENABLE, 1);
        t.w(
            MSR_PEBS_DATA_CFG,
            PEBS_DATACFG_LBRS | ((n - 1) << PEBS_DATACFG_LBR_SHIFT),
        );
        t.w(IA32_PMC0, (1u64 << 48) - 1);
        t.w(
            IA32_PERFEVTSEL0,
            0xC0 | EVTSEL_USR | EVTSEL_OS | EVTSEL_EN | EVTSEL_ADAPTIVE,
        );
        let wrapped = t.pmu.add_counts(&[(CounterId::Gp(0), 1)]);
        let state = GuestState {
            paging: t.paging,
            ..GuestState::default()
        };
        let out = t
            .pmu
            .handle_overflow(&wrapped, &state, &EventInfo::default(), &mut t.g.mem);
        assert_eq!(out.records_written, 1, "{name}: {out:?}");
        let fmt = t.pmu.model().pebs_format;
        let recs = read_pebs_buffer(&mut t.g.mem, PageWalker::new(t.paging), DS_LA, fmt).unwrap();
        let l = recs[0].lbr.as_ref().unwrap();
        assert_eq!(l.len() as u64, n, "{name}");
        let stack = t.pmu.lbr_entries();
        assert_eq!(l[..], stack[..usize::try_from(n).unwrap()], "{name}");
        for (k, e) in l.iter().enumerate() {
            let b = &seq[seq.len() - 1 - k];
            assert_eq!((e.from, e.to), (b.from, b.to), "{name}: entry {k}");
        }
    }
}

#[test]
fn serde_keeps_the_stack() {
    let mut t = Rig::preset("skylake");
    t.w(IA32_DEBUGCTL, DEBUGCTL_LBR);
    for b in sequence(7) {
        t.branch(&b);
    }
    let text = serde_json::to_string(&t.pmu).unwrap();
    let mut q: Vpmu = serde_json::from_str(&text).unwrap();
    assert_eq!(q.lbr_entries(), t.pmu.lbr_entries());
    // The cycle reference survives: the next entry's count is relative to the last branch.
    let last = sequence(7)[6].cycles;
    let mut mem = VecMemory::new(16);
    let o = q.record_branch(
        &br(1, 2, BranchType::Far, 0, last + 9),
        &PagingRegs::default(),
        &mut mem,
    );
    assert_eq!(o.lbr, Some(LbrAction::Recorded));
    assert_eq!(q.lbr_entries()[0].info, 9);
}
